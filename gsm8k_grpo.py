"""GRPO on GSM8K with the <reasoning>/<answer> format: the classic one-file recipe, on TRL 1.16.

One GPU (vLLM colocate when installed):   python gsm8k_grpo.py
QLoRA (12 GB), or a full fine-tune (80 GB): python gsm8k_grpo.py --load_in_4bit  |  --use_peft false
Any GRPOConfig field, CLI or YAML:        python gsm8k_grpo.py --config my.yaml --learning_rate 1e-6
Offline on CPU, tiny model (< 1 min):     python offline.py && python gsm8k_grpo.py --config offline/gsm8k_grpo.yaml
Jupyter or Colab (free T4):              notebooks/gsm8k_grpo.ipynb, generated from this file
"""

# %%
from dataclasses import dataclass

from datasets import Dataset
from trl import GRPOTrainer

import plumbing
import rewards
from plumbing import arg

# %% [markdown]
# ## Config
# GRPO samples a group of completions for each prompt, scores each one with the rubric, and raises the probability of
# those that beat their group's mean: no value model, no reference answers beyond the final number. The defaults are
# sized for one GPU; any field can be changed from the command line, a `--config` YAML, or `NOTEBOOK_ARGS` below.

# %%
MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"
# A notebook on Colab's free T4 puts these first: 0.5B with LoRA, fewer and shorter steps ("--load_in_4bit" for 1.5B).
COLAB_ARGS = plumbing.COLAB_T4_ARGS + ["--max_completion_length", "256"]

# Valid on ONE GPU: per_device_train_batch_size × GPUs × steps_per_generation must be a multiple of num_generations.
RECIPE_DEFAULTS = dict(
    model_name_or_path=MODEL_NAME, output_dir="runs/gsm8k_grpo",
    learning_rate=5e-6, adam_beta2=0.99, weight_decay=0.1,
    warmup_steps=0.1, lr_scheduler_type="cosine", max_grad_norm=0.1,
    gradient_checkpointing=True,  # trades ~20% speed for memory; off: --gradient_checkpointing false (or --activation_)
    num_generations=8,  # completions per prompt; GRPO's advantage is each one's reward relative to its group
    # Rewards minus the group mean, not divided by the group std (Dr. GRPO): an all-correct group's formatting noise
    # then stays small. Best mean held-out gain of group/batch/none on cpu_demo's 3 seeds (README, ablate_grpo.py).
    scale_rewards="none",
    per_device_train_batch_size=8, max_completion_length=512,
    gradient_accumulation_steps=4,  # 32 completions (4 prompts × 8) per optimizer step
    num_train_epochs=1, logging_steps=1, save_steps=100, save_total_limit=3,
    eval_strategy="steps", eval_steps=100, per_device_eval_batch_size=16, num_generations_eval=4,
    vllm_gpu_memory_utilization=0.3,  # colocate mode (TRL's default): vLLM shares the GPU with training
    num_completions_to_print=2,  # used with --log_completions
    use_peft=True, lora_r=16, lora_alpha=32, lora_target_modules=["all-linear"],  # LoRA: one 24 GB GPU (README)
)


@dataclass
class ScriptArguments:
    dataset_path: str | None = arg(None, "Local GSM8K-form data: a JSON/JSONL/parquet file or a folder of split files.")
    num_eval_examples: int = arg(200, "Held-out test problems scored with the same rewards at each evaluation.")


# %% [markdown]
# ## Data
# GSM8K's grade-school word problems. The prompt is the system prompt plus the question; the gold answer is the number
# after `####` in the worked solution, which the correctness reward compares against.

# %%
def build_dataset(split: str = "train", dataset_path: str | None = None) -> Dataset:
    """GSM8K as conversational `prompt`s (system + question) and numeric `answer`s (the text after '####')."""
    raw = plumbing.load_split(split, dataset_path)
    if missing := {"question", "answer"} - set(raw.column_names):
        raise ValueError(f"{dataset_path or 'openai/gsm8k'} ({split}) lacks column(s) {sorted(missing)}: it has "
                         f"{raw.column_names}; rename them to `question` and `answer` ('<solution> #### <number>').")
    return raw.map(lambda row: {
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
        "answer": rewards.extract_hash_answer(row["answer"]),
    }, remove_columns=raw.column_names)


# %% [markdown]
# ## System prompt
# The model must think inside `<reasoning>` and answer inside `<answer>`, so the answer can be read without guessing.

# %%
SYSTEM_PROMPT = """Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""

# %% [markdown]
# ## Rewards
# `correctness_reward` pays 1 when the number in `<answer>` equals the gold answer; `integer_answer_reward` pays for a
# plain number there; the three format rewards pay for the tags. Format alone is cheap to farm, so its weights are
# small: a model cannot out-earn a correct answer with tags. `rewards.py` documents how each one could be gamed.

# %%
# A correct, well-formatted answer scores 2 + 0.5 × 4 = 4.0; the best any wrong or malformed completion can reach is
# 2.0 (tests/test_rewards.py probes this with adversarial completions).
REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({
    rewards.correctness_reward: 2.0,
    rewards.integer_answer_reward: 0.5,
    rewards.strict_format_reward: 0.5,
    rewards.soft_format_reward: 0.5,
    rewards.xml_tag_count_reward: 0.5,
})


# %% [markdown]
# ## Trainer
# Pre-flight checks that fail in one line before any model is loaded, then TRL's `GRPOTrainer`: generation (vLLM on a
# GPU when installed), the rubric, the GRPO loss, logging, checkpoints, and a plot of the rewards when it is done.

# %%
def main(argv: list[str] | None = None) -> GRPOTrainer:
    script_args, training_args, model_args = plumbing.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv,
                                                                 reward_weights=REWARD_WEIGHTS)
    tokenizer = plumbing.prepare(training_args, model_args, REWARD_FUNCS)
    train_dataset, eval_dataset = plumbing.load_splits(build_dataset, script_args, training_args)
    return plumbing.train(model_args, training_args, tokenizer, train_dataset, eval_dataset, REWARD_FUNCS)


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags.
# Then look at the curves: correctness should rise while the format rewards saturate early. A total reward that climbs
# while correctness stays flat means the model found a way to farm the cheap rewards.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/gsm8k_grpo.yaml"]

# %% tags=["active-ipynb"]
# trainer = main(plumbing.notebook_argv(NOTEBOOK_ARGS, COLAB_ARGS))
# plumbing.show_training(trainer.args.output_dir, trainer)

# %% tags=["active-py"]
if __name__ == "__main__":
    main()
