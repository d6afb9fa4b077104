"""The contract between a recipe and the scripts that run it outside its own `main()`: evaluate.py, sft_warmstart.py,
async_grpo.py, offline.py, the notebooks and the demos. A recipe (or your fork of one) offers these module-level names:

- `ScriptArguments`: a dataclass of the recipe's own flags, with `dataset_path` and `num_eval_examples`
- `RECIPE_DEFAULTS`: a dict of GRPOConfig and ModelConfig defaults (`max_tool_calling_iterations` for a tool recipe)
- `SYSTEM_PROMPT`: the system prompt its rows carry
- `build_dataset(split, dataset_path=None)`: a Dataset with a conversational `prompt` column and the columns its rewards
  read (`answer`, ...)
- `setup(script_args)`: a `Setup`: the rubric and tools of one run, built from the recipe's flags (and its prompts,
  where they depend on them)

`Setup` holds everything a run's rewards and tools need, built from its options: no module global is set at run time,
so what it holds can be pickled into another process (TRL's async trainer scores rewards and runs tools in a spawned
one) and rebuilds its state there on first use. A reward that needs no state is a plain function; one that does takes
its state as an argument, bound with functools.partial (TRL logs it under the function's name). A tool recipe's tools
are the public methods of the environment `environment_factory` makes, one per rollout (TRL's `environment_factory`).
`Setup.start()` readies its services (a sandbox, an index) before training, so a machine that cannot run them is one
line, not an error in every tool call.

`RECIPES` is the one list of the recipes; `load_recipe` imports a recipe by name or path and checks the contract, so a
fork that lacks a name is one line that says which, not an AttributeError halfway through a run.
"""

import dataclasses
import importlib
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_recipes.refusal import Refusal

logger = logging.getLogger("grpo-recipes")
# every test, tool and notebook uses these
RECIPES = ("gsm8k_grpo", "tool_use_grpo", "search_agent_grpo", "code_grpo", "judge_grpo", "reasoning_gym_grpo",
           "game_grpo", "mcp_grpo")
REQUIRED = ("ScriptArguments", "RECIPE_DEFAULTS", "SYSTEM_PROMPT", "build_dataset", "setup")
SCRIPT_FIELDS = ("dataset_path", "num_eval_examples")
NOT_TOOLS = ("reset", "get_reward")  # an environment's methods TRL calls itself, never as tools


@dataclass
class Setup:
    """What a recipe's `setup(script_args)` returns: its rubric and tools for one run (the module docstring says what
    each must be). `services` are what must be running before training (each has `start()`, raising a Refusal where it
    cannot, and `describe()`, one line for the log)."""

    reward_funcs: list
    reward_weights: list[float]
    environment_factory: Callable | None = None  # a tool recipe: makes one environment per rollout
    callbacks: list = field(default_factory=list)  # StepHooks its tools need (tool_use_grpo's time budget)
    services: list = field(default_factory=list)
    # prompts that depend on the run's flags (reasoning_gym_grpo's tasks): the recipe's build_dataset with them bound;
    # checked_setup puts the module's build_dataset here when a recipe leaves it None
    build_dataset: Callable | None = None

    def start(self) -> None:
        """Start every service now, each logged in one line."""
        for service in self.services:
            service.start()
            logger.info(service.describe())


class StepHooks:
    """The trainer's events that a recipe's own state follows (tool_use_grpo's tool-time budget), as transformers'
    TrainerCallback names them, without importing transformers (its Trainer loads torch: evaluate.py builds a recipe's
    Setup without it). A subclass overrides the ones it needs; `training.trainer_callbacks` hands them to a trainer."""

    # Hooks that move what the rollouts read (a curriculum's levels) must run in the process that generates and
    # scores them: where that is another process (async_grpo.py), they are refused, and this names the flag that
    # turns them off. Empty: the hooks move nothing the rollouts read.
    moves_rollouts: str = ""

    def on_train_begin(self, args, state, control, **kwargs):
        pass

    def on_train_end(self, args, state, control, **kwargs):
        pass

    def on_step_begin(self, args, state, control, **kwargs):
        pass

    def on_step_end(self, args, state, control, **kwargs):
        pass

    def on_prediction_step(self, args, state, control, **kwargs):
        pass

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def environment_tools(environment) -> list:
    """An environment's tools, as TRL 1.16 lists them (GRPOTrainer and the async trainer alike): the public functions
    of its class but reset and get_reward, bound to it."""
    return [getattr(environment, name) for name, _ in inspect.getmembers(type(environment), inspect.isfunction)
            if name not in NOT_TOOLS and not name.startswith("_")]


def load_recipe(name: str):
    """A recipe module by name (gsm8k_grpo) or by the path of its file (my_recipe.py), its contract checked; an
    unknown recipe or a broken contract is one line."""
    if name.endswith(".py"):
        if not Path(name).is_file():
            raise Refusal(f"recipe {name}: no such file")
        sys.path.insert(0, str(Path(name).resolve().parent))
        name = Path(name).stem
    try:
        recipe = importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise  # the recipe exists but imports something missing: that is its own error
        raise Refusal(f"unknown recipe {name!r}: use one of {', '.join(RECIPES)}, or the path of a recipe file") \
            from None
    check_contract(recipe)
    return recipe


def check_contract(recipe) -> None:
    """One line naming every part of the contract (this module's docstring) that the recipe lacks."""
    missing = [part for part in REQUIRED if not hasattr(recipe, part)]
    script_arguments = getattr(recipe, "ScriptArguments", None)
    if script_arguments is not None:
        names = {f.name for f in dataclasses.fields(script_arguments)} if dataclasses.is_dataclass(
            script_arguments) else set()
        missing += [f"ScriptArguments.{name}" for name in SCRIPT_FIELDS if name not in names]
    if "setup" not in missing and not callable(recipe.setup):
        missing.append("setup as a function of the script arguments")
    if missing:
        raise Refusal(f"recipe {recipe.__name__} does not offer {', '.join(missing)}: grpo_recipes/contract.py lists "
                      "what a recipe offers the scripts that run it")


def checked_setup(recipe, script_args) -> Setup:
    """recipe.setup(script_args), checked: a Setup with one weight per reward function, else one line."""
    run = recipe.setup(script_args)
    if not isinstance(run, Setup):
        raise Refusal(f"{recipe.__name__}.setup returned a {type(run).__name__}, not a grpo_recipes.contract.Setup")
    if len(run.reward_weights) != len(run.reward_funcs):
        raise Refusal(f"{recipe.__name__}.setup gives {len(run.reward_weights)} reward weights for "
                      f"{len(run.reward_funcs)} reward functions: one weight per reward")
    if run.build_dataset is None:
        run.build_dataset = recipe.build_dataset
    return run


def check_tools(environment_factory) -> None:
    """Each tool's schema, built now as TRL builds it (transformers' get_json_schema), so that a tool the model cannot
    be shown (no docstring, an argument without a type hint or without its line under `Args:`) is one line naming the
    tool and the missing piece before the model loads (training.prepare) or the first request (evaluate.py). One
    environment is made for it (a dict of factories: one of each); None: no tools."""
    if environment_factory is None:
        return
    from transformers.utils import get_json_schema  # imports torch: not at a recipe's import

    factories = environment_factory.values() if isinstance(environment_factory, dict) else [environment_factory]
    for factory in factories:
        for tool in environment_tools(factory()):
            try:
                get_json_schema(tool)
            except Exception as err:  # noqa: BLE001 - transformers' message names the missing piece
                raise Refusal(f"the tool {tool.__name__} cannot be described to the model: {err} "
                              "(TRL builds each tool's description from its docstring, a summary line then `Args:` "
                              "with a `name: description` line per argument, and a type hint on every argument)"
                              ) from None
