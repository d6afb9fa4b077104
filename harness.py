"""The contract between a recipe and the scripts that run it outside its own script: evaluate.py, sft_warmstart.py,
offline.py, async_grpo.py and the demos. A recipe (or your fork of one) offers these module-level names:

| name | what it is |
|---|---|
| `ScriptArguments` | a dataclass of the recipe's own flags, with `dataset_path` and `num_eval_examples` |
| `RECIPE_DEFAULTS` | a dict of GRPOConfig and ModelConfig defaults (`max_tool_calling_iterations` for a tool recipe) |
| `SYSTEM_PROMPT` | the system prompt its rows carry |
| `build_dataset(split, dataset_path=None)` | a Dataset with a conversational `prompt` column and the columns its rewards read (`answer`, ...) |
| `REWARD_FUNCS`, `REWARD_WEIGHTS` | the rubric: reward functions in TRL's signature and one weight each |
| `TOOLS` (optional) | the tool functions TRL calls; none: a single-turn recipe |
| `setup_tools(script_args)` (with `TOOLS`) | readies the tools from the recipe's flags (starts the sandbox, loads the index) before any call, and returns the tools to run with; async_grpo.py calls it again in its rollout process, a fresh import of the recipe |
| `setup_rubric(script_args)` (optional) | readies what the rewards need from the recipe's flags (code_grpo.py: the test sandboxes) before any is scored |

`load_recipe` imports a recipe by name or path and checks the contract, so a fork that lacks a name is one line that
says which, not an AttributeError halfway through a run. The recipes' own `main()` uses the same names.
"""

import dataclasses
import importlib
import sys
from pathlib import Path

RECIPES = ("gsm8k_grpo", "tool_use_grpo", "search_agent_grpo", "code_grpo")
REQUIRED = ("ScriptArguments", "RECIPE_DEFAULTS", "SYSTEM_PROMPT", "build_dataset", "REWARD_FUNCS", "REWARD_WEIGHTS")
SCRIPT_FIELDS = ("dataset_path", "num_eval_examples")


def load_recipe(name: str):
    """A recipe module by name (gsm8k_grpo) or by the path of its file (my_recipe.py), its contract checked; an
    unknown recipe or a broken contract is one line."""
    if name.endswith(".py"):
        if not Path(name).is_file():
            sys.exit(f"recipe {name}: no such file")
        sys.path.insert(0, str(Path(name).resolve().parent))
        name = Path(name).stem
    try:
        recipe = importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise  # the recipe exists but imports something missing: that is its own error
        sys.exit(f"unknown recipe {name!r}: use one of {', '.join(RECIPES)}, or the path of a recipe file")
    check_contract(recipe)
    return recipe


def check_contract(recipe) -> None:
    """Exit in one line naming every part of the contract (this module's docstring) that the recipe lacks."""
    missing = [part for part in REQUIRED if not hasattr(recipe, part)]
    script_arguments = getattr(recipe, "ScriptArguments", None)
    if script_arguments is not None:
        fields = {f.name for f in dataclasses.fields(script_arguments)} if dataclasses.is_dataclass(
            script_arguments) else set()
        missing += [f"ScriptArguments.{name}" for name in SCRIPT_FIELDS if name not in fields]
    if getattr(recipe, "TOOLS", None) and not callable(getattr(recipe, "setup_tools", None)):
        missing.append("setup_tools (it has TOOLS)")
    weights, funcs = getattr(recipe, "REWARD_WEIGHTS", None), getattr(recipe, "REWARD_FUNCS", None)
    if not missing and len(weights) != len(funcs):
        missing.append(f"one weight per reward (REWARD_WEIGHTS has {len(weights)} for {len(funcs)} REWARD_FUNCS)")
    if missing:
        sys.exit(f"recipe {recipe.__name__} does not offer {', '.join(missing)}: harness.py lists what a recipe "
                 "offers the scripts that run it")


def setup_rubric(recipe, script_args) -> None:
    """Ready the recipe's rewards from its flags, where it needs that (setup_rubric); nothing otherwise."""
    if callable(getattr(recipe, "setup_rubric", None)):
        recipe.setup_rubric(script_args)


def tools_of(recipe) -> list:
    """The recipe's tools; none for a single-turn recipe."""
    return list(getattr(recipe, "TOOLS", None) or [])
