"""grpo_recipes/logs.py: what a run reports: the run summary read off the trainer's own args and model, and the curves
it saves (the compact step line and the completions printer run through the recipes' own tests)."""

import gsm8k_grpo
from grpo_recipes import logs, options


def parse_args(argv: list[str]):
    return options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv)


def test_plot_training_draws_every_reward_component_the_total_and_the_length(tmp_path):
    history = [{"step": s, "loss": 0.1, "reward": s / 10, "completions/mean_length": 30 - s,
                "rewards/correctness_reward/mean": s / 20, "rewards/strict_format_reward/mean": 0.5} for s in (1, 2, 3)]
    history.append({"step": 3, "eval_reward": 0.2, "eval_rewards/correctness_reward/mean": 0.1})
    path = logs.plot_training(history, tmp_path / "curves.png")
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000
    sft = logs.plot_training([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}], tmp_path / "sft.png")
    assert sft.stat().st_size > 5_000


def test_the_run_summary_says_what_runs_read_off_the_model_and_the_effective_learning_rate(kit):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(kit / "tiny-qwen2")
    _, args, _ = parse_args([])
    lora = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    assert (f"model {kit / 'tiny-qwen2'} | LoRA r=16 | learning_rate 5e-05 (lora_learning_rate: --use_peft without "
            "--learning_rate) | max_completion_length 512") in logs.run_summary(args, lora)
    _, args, _ = parse_args(["--learning_rate", "3e-5", "--use_peft", "false"])
    summary = logs.run_summary(args, AutoModelForCausalLM.from_pretrained(kit / "tiny-qwen2"))
    assert ("| full fine-tune | learning_rate 3e-05 | max_completion_length 512 | max_steps -1 | precision fp32"
            in summary)
