"""plumbing.py: the config class, the pre-flight checks, notebook arguments and plots that every recipe shares.

The checks are exercised through gsm8k_grpo's options, as its main() parses them; the recipes' own tests run them
end to end.
"""

import dataclasses
import importlib
import importlib.util
import sys
import types
from types import SimpleNamespace

import pytest
import yaml
from trl import ModelConfig

import gsm8k_grpo
import plumbing


def parse_args(argv: list[str]):
    return plumbing.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv,
                               reward_weights=gsm8k_grpo.REWARD_WEIGHTS)


# ----------------------------------------------------------------------------------------------------------- config
def test_on_cpu_the_config_picks_fp32_and_transformers_generation():
    _, args, _ = parse_args([])
    assert (args.bf16, args.fp16, args.use_vllm) == (False, False, False)


@pytest.mark.parametrize("gpu, native_bf16, expected", [("T4", False, "fp16"), ("A100", True, "bf16")])
def test_a_gpu_that_only_emulates_bf16_gets_fp16(gpu, native_bf16, expected, monkeypatch):
    # torch.cuda.is_bf16_supported() says True on a T4 (Colab's free GPU) because it can emulate bf16, slowly.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def is_bf16_supported(including_emulation=True):
        return including_emulation or native_bf16

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    args = SimpleNamespace(use_cpu=False, bf16=None, fp16=False)
    assert plumbing.default_precision(args) and ("bf16" if args.bf16 else "fp16" if args.fp16 else "fp32") == expected


@pytest.mark.parametrize("recipe", ["gsm8k_grpo", "tool_use_grpo", "search_agent_grpo", "sft_warmstart"])
def test_every_recipe_default_names_a_real_option(recipe):
    # TrlParser drops an unknown default silently: a renamed TRL option (warmup_ratio, gone in transformers 5) would
    # quietly stop applying. Each default must be a field of the recipe's dataclasses.
    module = importlib.import_module(recipe)
    config = plumbing.RecipeSFTConfig if recipe == "sft_warmstart" else plumbing.RecipeGRPOConfig
    fields = {f.name for cls in (module.ScriptArguments, config, ModelConfig) for f in dataclasses.fields(cls)}
    assert set(module.RECIPE_DEFAULTS) - fields == set()


def test_yaml_overrides_recipe_defaults_and_the_command_line_overrides_yaml(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"learning_rate": 1e-4, "num_generations": 4, "beta": 0.04, "lora_r": 8}))
    _, args, model_args = parse_args(["--config", str(config), "--learning_rate", "3e-6"])
    assert args.learning_rate == 3e-6 and args.num_generations == 4 and args.beta == 0.04
    assert model_args.lora_r == 8
    assert args.max_completion_length == gsm8k_grpo.RECIPE_DEFAULTS["max_completion_length"]


# ------------------------------------------------------------------------------------------------------- pre-flight
def test_the_gists_batch_of_one_with_sixteen_generations_is_rejected_with_the_fix():
    argv = ["--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "4", "--num_generations", "16"]
    with pytest.raises(SystemExit, match=r"1 × 1 × 4 is not a multiple of num_generations=16: pass "
                                         r"--per_device_train_batch_size 4 "):
        parse_args(argv)
    _, args, _ = parse_args([*argv, "--per_device_train_batch_size", "4"])
    assert args.generation_batch_size == 16


def test_an_eval_batch_that_cannot_hold_whole_groups_is_rejected_with_the_fix():
    with pytest.raises(SystemExit, match=r"num_generations_eval=4: pass --per_device_eval_batch_size 4"):
        parse_args(["--per_device_eval_batch_size", "6"])


def test_batch_divisibility_accounts_for_the_number_of_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit, match=r"8 × 3 × 4 is not a multiple of num_generations=7: pass "
                                         r"--per_device_train_batch_size 14 "):
        parse_args(["--num_generations", "7"])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_use_vllm_without_vllm_says_how_to_install_it():
    with pytest.raises(SystemExit, match=r"vLLM is not installed; `pip install 'trl\[vllm\]'`"):
        parse_args(["--use_vllm"])


# -------------------------------------------------------------------------------------------------------- notebooks
@pytest.mark.parametrize("recipe", ["gsm8k_grpo", "tool_use_grpo", "search_agent_grpo", "sft_warmstart"])
def test_on_colab_the_t4_defaults_go_first_are_printed_and_parse(recipe, monkeypatch, capsys):
    module = importlib.import_module(recipe)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))  # what Colab's runtime imports
    argv = plumbing.notebook_argv(["--max_steps", "7"], module.COLAB_ARGS)
    assert argv == module.COLAB_ARGS + ["--max_steps", "7"] and "T4-sized defaults" in capsys.readouterr().out
    config = plumbing.RecipeSFTConfig if recipe == "sft_warmstart" else plumbing.RecipeGRPOConfig
    _, training_args, model_args = plumbing.parse_args(module.ScriptArguments, module.RECIPE_DEFAULTS, argv,
                                                       config_class=config)  # the batch checks pass on T4 defaults
    assert training_args.max_steps == 7 and model_args.use_peft  # the notebook's own flags win
    if recipe != "sft_warmstart":
        assert "0.5B" in model_args.model_name_or_path


def test_outside_colab_the_notebook_flags_are_used_as_they_are():
    assert plumbing.notebook_argv(["--max_steps", "7"], gsm8k_grpo.COLAB_ARGS) == ["--max_steps", "7"]


def test_plot_training_draws_every_reward_component_the_total_and_the_length(tmp_path):
    history = [{"step": s, "loss": 0.1, "reward": s / 10, "completions/mean_length": 30 - s,
                "rewards/correctness_reward/mean": s / 20, "rewards/strict_format_reward/mean": 0.5} for s in (1, 2, 3)]
    history.append({"step": 3, "eval_reward": 0.2, "eval_rewards/correctness_reward/mean": 0.1})
    path = plumbing.plot_training(history, tmp_path / "curves.png")
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000
    sft = plumbing.plot_training([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}], tmp_path / "sft.png")
    assert sft.stat().st_size > 5_000
