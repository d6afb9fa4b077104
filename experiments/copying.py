"""Pre-training the demos' tiny models to copy from their context, as any pretrained language model can: the first stage
of experiments/agent_demo.py and experiments/merge_demo.py."""

import random
from pathlib import Path


def teach_copying(model_dir: str | Path, out_dir: str | Path, words: list[str], steps: int = 500,
                  seed: int = 0) -> Path:
    """Pre-train the tiny model to copy from its context, as any pretrained language model can (induction heads).

    Each example lists items between filler words and asks for them back: "347 apples Biru crates 28 ... copy:" →
    " 347 Biru 28", where an item is a number or a capitalised word (a name) and the fillers are lower-case words.
    A random tiny model cannot copy, and SFT alone does not teach it in minutes: on the agent demo's tool task, 800
    SFT steps left every digit of the tool call and of the answer at chance (loss 0.5), while after this stage 150
    SFT steps brought the loss to 0.07. The items are random, so nothing about a task is learned here.
    """
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rng = random.Random(seed)
    names, fillers = [w for w in words if w[:1].isupper()], [w for w in words if w.islower()]

    def item() -> str:
        if names and rng.random() < 0.5:
            return rng.choice(names)
        return str(rng.randint(0, 10 ** rng.randint(1, 5) - 1))

    rows = []
    for _ in range(32 * steps):
        items = [item() for _ in range(rng.randint(1, 4))]
        listed = " ".join(f"{x} {rng.choice(fillers)}" for x in items)
        filler = " ".join(rng.choice(fillers) for _ in range(rng.randint(0, 30)))
        rows.append({"prompt": f"{listed} {filler} copy:", "completion": " " + " ".join(items)})
    args = SFTConfig(output_dir=str(Path(out_dir) / "copy-run"), max_steps=steps, per_device_train_batch_size=32,
                     learning_rate=1e-3, lr_scheduler_type="cosine", warmup_steps=0.05, completion_only_loss=True,
                     use_cpu=True, bf16=False, gradient_checkpointing=False, logging_steps=100, save_strategy="no",
                     report_to="none", seed=seed, dataloader_num_workers=0, disable_tqdm=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=args,
                         train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return Path(out_dir)
