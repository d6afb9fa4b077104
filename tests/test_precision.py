"""Precision that trains: float32 master weights for a full fine-tune under bf16 (a bf16 copy loses small updates),
a half-precision base only where it is frozen (LoRA), and a vLLM weight sync that never writes into that base."""

import copy

import pytest
import torch

import gsm8k_grpo
from grpo_recipes import configs, options, training, trl_patches
from grpo_recipes.contract import Setup


def parse_args(*argv: str):
    return options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, list(argv))


@pytest.mark.parametrize("gpu, dtype", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")])
def test_a_lora_base_loads_in_the_half_precision_the_run_computes_in_and_a_full_fine_tune_in_float32(gpu, dtype):
    def dtype_chosen(*flags: str) -> str:
        _, args, model_args = parse_args(*flags)
        args.bf16, args.fp16 = gpu == "bf16", gpu == "fp16"  # what default_precision picks on such a GPU
        configs.apply_dependent_defaults(args, model_args, {flag[2:] for flag in flags if flag.startswith("--")})
        return model_args.dtype

    assert dtype_chosen("--use_peft", "true") == dtype  # a T4 (fp16) gets an fp16 base, not fp32 at fp32 speed
    assert dtype_chosen("--use_peft", "false") == "float32"  # the master weights: autocast computes in half
    assert dtype_chosen("--use_peft", "false", "--dtype", "bfloat16") == "bfloat16"  # a choice is kept (warned)


def completion_length(completions, **kwargs) -> list[float]:
    """A reward that differs within every group of random-model completions: GRPO's advantages are never all zero."""
    return [float(len(completion[0]["content"])) for completion in completions]


def fraction_moved(kit, tmp_path, *flags: str) -> float:
    """One GRPO step of a bf16 full fine-tune at the gsm8k recipe's learning rate (5e-6); the share of weights that
    changed."""
    from trl import GRPOTrainer

    model = str(kit / "tiny-qwen2")
    _, args, model_args = parse_args(
        "--model_name_or_path", model, "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--bf16", "true",
        "--use_peft", "false", "--lr_scheduler_type", "constant", "--warmup_steps", "0", "--max_steps", "1",
        "--num_generations", "4", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1",
        "--max_completion_length", "16", "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
        *flags)
    assert args.learning_rate == 5e-6
    tokenizer = training.prepare(args, model_args, Setup([completion_length], [1.0]))
    dataset = gsm8k_grpo.build_dataset("train", str(kit / "gsm8k_toy")).select(range(4))
    trainer = GRPOTrainer(model=model, reward_funcs=[completion_length], args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    moved = sum((p.detach() != before[name]).sum().item() for name, p in trainer.model.named_parameters())
    return moved / sum(p.numel() for p in before.values())


def test_a_bf16_full_fine_tune_step_at_the_recipes_learning_rate_moves_every_weight(kit, tmp_path):
    assert fraction_moved(kit, tmp_path) >= 0.99  # float32 masters under bf16 autocast
    # The failing case, what the recipes did before: bf16 weights round away updates of 5e-6 on weights of ~0.02.
    assert fraction_moved(kit, tmp_path, "--dtype", "bfloat16") < 0.5


def tiny_bf16_lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True)
    model = get_peft_model(Qwen2ForCausalLM(config).to(torch.bfloat16),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    for name, param in model.named_parameters():
        if "lora_B" in name:  # a trained adapter (PEFT starts B at zero, which would merge nothing)
            torch.nn.init.normal_(param, std=0.02)
    return model


def frozen_base(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}


def test_a_thousand_weight_syncs_leave_a_bf16_lora_base_bitwise_unchanged_and_send_the_merged_weights():
    model = tiny_bf16_lora_model()
    base = frozen_base(model)
    for _ in range(1000):
        sent = dict(trl_patches.lora_weights_for_vllm(model))
    assert all(torch.equal(p, base[name]) for name, p in frozen_base(model).items())
    merged = copy.deepcopy(model).merge_and_unload().state_dict()  # PEFT's own merge: what vLLM should receive
    assert sent.keys() == {name for name in merged if name != "lm_head.weight"}  # tied to the embeddings
    assert all(torch.equal(sent[name], merged[name]) for name in sent)
    # The failing case, TRL's own sync: merge the adapter into the base and unmerge it, in place, in bf16.
    for _ in range(1000):
        model.merge_adapter()
        model.unmerge_adapter()
    changed = sum((p != base[name]).sum().item() for name, p in frozen_base(model).items() if "layers" in name)
    assert changed / sum(p.numel() for name, p in base.items() if "layers" in name) > 0.1


def qlora_fraction_moved(kit, tmp_path, through_the_recipes_run: bool) -> tuple[float, set]:
    """One GRPO step of a LoRA adapter on a model flagged as 4-bit (what TRL 1.16's GRPOTrainer reads to cast a
    QLoRA adapter to bf16; bitsandbytes itself needs CUDA), at the tool recipes' Colab LoRA rate (2e-5): the share of
    lora_A's entries that changed, and the adapter's dtypes when it trained."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    out = tmp_path / ("run" if through_the_recipes_run else "trl")
    _, args, model_args = parse_args(
        "--model_name_or_path", str(kit / "tiny-qwen2"), "--output_dir", str(out), "--use_cpu", "true",
        "--bf16", "true", "--learning_rate", "2e-5", "--lr_scheduler_type", "constant", "--warmup_steps", "0",
        "--max_steps", "1", "--num_generations", "4", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "1", "--max_completion_length", "16", "--eval_strategy", "no",
        "--save_strategy", "no", "--report_to", "none")
    tokenizer = training.prepare(args, model_args, Setup([completion_length], [1.0]))
    model = AutoModelForCausalLM.from_pretrained(kit / "tiny-qwen2", dtype=torch.bfloat16)
    model.is_loaded_in_4bit = True  # as transformers marks a bitsandbytes model
    dataset = gsm8k_grpo.build_dataset("train", str(kit / "gsm8k_toy")).select(range(4))
    trainer = GRPOTrainer(model=model, reward_funcs=[completion_length], args=args, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=LoraConfig(r=8, target_modules="all-linear"))
    lora_a = {name: p for name, p in trainer.model.named_parameters() if "lora_A" in name}
    before = {name: p.detach().float().clone() for name, p in lora_a.items()}
    if through_the_recipes_run:
        training.run(trainer)
    else:
        trainer.train()
    moved = sum((p.detach().float() != before[name]).sum().item() for name, p in lora_a.items())
    return moved / sum(p.numel() for p in before.values()), {p.dtype for p in lora_a.values()}


def test_a_qlora_adapter_trains_in_float32_and_every_entry_moves(kit, tmp_path):
    fraction, dtypes = qlora_fraction_moved(kit, tmp_path, through_the_recipes_run=True)
    assert dtypes == {torch.float32} and fraction >= 0.99
    # The failing case, TRL's own cast: the bf16 adapter rounds most of AdamW's first step (~lr per entry) away.
    fraction, dtypes = qlora_fraction_moved(kit, tmp_path, through_the_recipes_run=False)
    assert dtypes == {torch.bfloat16} and fraction < 0.5
