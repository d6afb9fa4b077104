"""grpo_recipes/options.py, configs.py and ranges.py: a recipe's options, the config classes' machine defaults, the
defaults that depend on other options, and the batch checks.

The checks are exercised through gsm8k_grpo's options, as its main() parses them; the recipes' own tests and
test_mistakes.py run them end to end.
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
import sft_warmstart
from grpo_recipes import configs, contract, options
from grpo_recipes.refusal import Refusal


def parse_args(argv: list[str]):
    return options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv)


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
    assert configs.default_precision(args) and ("bf16" if args.bf16 else "fp16" if args.fp16 else "fp32") == expected


@pytest.mark.parametrize("recipe", [*contract.RECIPES, "sft_warmstart"])
def test_every_recipe_default_names_a_real_option(recipe):
    # TrlParser drops an unknown default silently: a renamed TRL option (warmup_ratio, gone in transformers 5) would
    # quietly stop applying. Each default must be a field of the recipe's dataclasses.
    module = importlib.import_module(recipe)
    config = sft_warmstart.RecipeSFTConfig if recipe == "sft_warmstart" else configs.RecipeGRPOConfig
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
    with pytest.raises(Refusal, match=r"1 × 1 × 4 is not a multiple of num_generations=16: pass "
                                         r"--per_device_train_batch_size 4 "):
        parse_args(argv)
    _, args, _ = parse_args([*argv, "--per_device_train_batch_size", "4"])
    assert args.generation_batch_size == 16


def test_an_eval_batch_that_cannot_hold_whole_groups_is_rejected_with_the_fix():
    with pytest.raises(Refusal, match=r"num_generations_eval=4: pass --per_device_eval_batch_size 4"):
        parse_args(["--per_device_eval_batch_size", "6"])


def test_batch_divisibility_accounts_for_the_number_of_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(Refusal, match=r"8 × 3 × 4 is not a multiple of num_generations=7: pass "
                                         r"--per_device_train_batch_size 14 "):
        parse_args(["--num_generations", "7"])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_use_vllm_without_vllm_says_how_to_install_it():
    with pytest.raises(Refusal, match=r"vLLM is not installed; `pip install 'trl\[vllm\]'`"):
        parse_args(["--use_vllm"])


# ------------------------------------------------------------------------------------------------------------ Colab
@pytest.mark.parametrize("recipe", [*contract.RECIPES, "sft_warmstart"])
def test_on_colab_each_recipe_takes_its_visible_t4_values_and_its_own_flags_still_win(recipe, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))  # what Colab's runtime imports
    module = importlib.reload(importlib.import_module(recipe))  # its config reads ON_COLAB when imported
    try:
        assert module.ON_COLAB
        config = sft_warmstart.RecipeSFTConfig if recipe == "sft_warmstart" else configs.RecipeGRPOConfig
        _, training_args, model_args = options.parse_args(module.ScriptArguments, module.RECIPE_DEFAULTS,
                                                          ["--max_steps", "7"], config_class=config)  # batches pass
        assert training_args.max_steps == 7 and model_args.use_peft  # the notebook's own flags win
        if recipe != "sft_warmstart":
            assert "0.5B" in model_args.model_name_or_path
            assert training_args.max_completion_length == module.RECIPE_DEFAULTS["max_completion_length"]
    finally:
        monkeypatch.delitem(sys.modules, "google.colab")
        importlib.reload(module)


def test_outside_colab_the_recipe_defaults_are_the_one_gpu_ones():
    assert not gsm8k_grpo.ON_COLAB and gsm8k_grpo.RECIPE_DEFAULTS["model_name_or_path"] == gsm8k_grpo.MODEL_NAME
    assert "1.5B" in gsm8k_grpo.MODEL_NAME and gsm8k_grpo.RECIPE_DEFAULTS["max_steps"] == -1


# ----------------------------------------------------------------------------------------------- options that combine
def test_lora_takes_the_recipes_visible_lora_learning_rate_unless_a_learning_rate_is_given(tmp_path):
    full_rate, lora_rate = gsm8k_grpo.RECIPE_DEFAULTS["learning_rate"], gsm8k_grpo.RECIPE_DEFAULTS["lora_learning_rate"]
    assert lora_rate != full_rate
    assert parse_args([])[1].learning_rate == pytest.approx(lora_rate)  # LoRA is the default
    assert parse_args(["--use_peft", "false"])[1].learning_rate == pytest.approx(full_rate)
    assert parse_args(["--learning_rate", "3e-5"])[1].learning_rate == pytest.approx(3e-5)
    assert parse_args(["--lora_learning_rate", "2e-4"])[1].learning_rate == pytest.approx(2e-4)
    config = tmp_path / "c.yaml"
    config.write_text("learning_rate: 7.0e-6\n")
    assert parse_args(["--config", str(config)])[1].learning_rate == pytest.approx(7e-6)  # given in YAML counts
    defaults = {**gsm8k_grpo.RECIPE_DEFAULTS, "lora_learning_rate": None}  # a fork without one: no hidden multiplier
    assert options.parse_args(gsm8k_grpo.ScriptArguments, defaults, [])[1].learning_rate == pytest.approx(full_rate)


@pytest.mark.parametrize("bits", ["4", "8"])
def test_a_quantized_base_never_runs_beside_vllm_and_asking_for_both_is_one_line(bits):
    """TRL cannot sync an adapter on a quantized base to vLLM (8-bit: it raises once the model has loaded)."""
    flag = f"--load_in_{bits}bit"
    _, args, model_args = parse_args([flag])
    args.use_vllm, args.use_vllm_chosen = True, True  # what a GPU with vLLM installed would have chosen
    configs.apply_dependent_defaults(args, model_args, {flag[2:]})
    assert args.use_vllm is False
    args.use_vllm, args.use_vllm_chosen = True, False  # asked for, with --use_vllm
    with pytest.raises(Refusal, match=f"--use_vllm with {flag}: TRL cannot sync a LoRA adapter on a quantized base"):
        configs.apply_dependent_defaults(args, model_args, {flag[2:], "use_vllm"})


@pytest.mark.parametrize(("yaml_text", "says"), [
    ("max_steps: 4.5\n", "max_steps: 4.5 in {path} is not a whole number"),
    ("lora_target_modules: q_proj, v_proj\n", "lora_target_modules: 'q_proj, v_proj' in {path} is one string; write a "
                                              "YAML list, e.g. lora_target_modules: [q_proj, v_proj]"),
    ("learning_rate: [0.1]\n", "learning_rate: [0.1] in {path} is a list; it takes one value"),
    ("use_peft: 1\n", "use_peft: 1 in {path} is not true or false"),
    ("learning_rate: fast\n", "argument --learning_rate/--learning-rate: invalid float value: 'fast' (--help lists the "
                              "options)"),
    ("num_generations: [4, 8]\n", "num_generations: [4, 8] in {path} is a list; it takes one value"),
])
def test_a_config_value_of_the_wrong_type_is_one_line_before_anything_loads(tmp_path, yaml_text, says):
    """A flag's text goes through argparse's conversion; a YAML value reaches the run as YAML typed it."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml_text)
    with pytest.raises(Refusal) as refused:
        parse_args(["--config", str(path)])
    assert str(refused.value) == says.format(path=path)


def test_config_values_of_the_right_type_pass_as_yaml_writes_them(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("max_steps: 4\nlearning_rate: 1e-5\nlora_target_modules: [q_proj, v_proj]\nuse_peft: true\n"
                    "warmup_steps: 0.05\n")
    _, training_args, model_args = parse_args(["--config", str(path)])
    assert (training_args.max_steps, training_args.learning_rate) == (4, 1e-5)  # "1e-5": YAML's string, converted
    assert model_args.lora_target_modules == ["q_proj", "v_proj"]
    path.write_text("lora_target_modules: all-linear\n")  # one module name, or PEFT's all-linear, as a string
    assert parse_args(["--config", str(path)])[2].lora_target_modules == "all-linear"


def test_two_config_files_are_one_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("max_steps: 4\n")
    with pytest.raises(Refusal, match=r"^--config given 2 times: pass one YAML file \(options on the command line "
                                      r"override it\)$"):
        parse_args(["--config", str(path), f"--config={path}"])
