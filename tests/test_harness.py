"""harness.py: the contract a recipe offers evaluate.py, sft_warmstart.py and the notebooks, checked in one line."""

import subprocess
import sys

import pytest

import harness
from conftest import ROOT


@pytest.mark.parametrize("name", harness.RECIPES)
def test_every_recipe_offers_the_whole_contract(name):
    recipe = harness.load_recipe(name)
    assert len(recipe.REWARD_FUNCS) == len(recipe.REWARD_WEIGHTS)
    assert bool(harness.tools_of(recipe)) == (name in ("tool_use_grpo", "search_agent_grpo"))  # the multi-turn ones


FORK = '''from dataclasses import dataclass

RECIPE_DEFAULTS = {}
SYSTEM_PROMPT = "Answer."
REWARD_FUNCS = [lambda completions, **kwargs: [0.0] * len(completions)]
TOOLS = [print]


@dataclass
class ScriptArguments:
    num_eval_examples: int = 8


def build_dataset(split, dataset_path=None):
    return []
'''


def test_a_fork_that_lacks_parts_of_the_contract_is_told_every_missing_part_in_one_line(tmp_path):
    (tmp_path / "my_fork.py").write_text(FORK)
    with pytest.raises(SystemExit) as refusal:
        harness.load_recipe(str(tmp_path / "my_fork.py"))
    message = str(refusal.value)
    assert "\n" not in message and message.startswith("recipe my_fork does not offer REWARD_WEIGHTS, ")
    assert "ScriptArguments.dataset_path" in message and "setup_tools (it has TOOLS)" in message
    assert "harness.py lists what a recipe offers" in message


def test_weights_that_do_not_match_the_rewards_are_refused(tmp_path):
    source = FORK.replace("TOOLS = [print]", "REWARD_WEIGHTS = [1.0, 2.0]").replace(
        "num_eval_examples: int = 8", "num_eval_examples: int = 8\n    dataset_path: str = None")
    (tmp_path / "two_weights.py").write_text(source)
    with pytest.raises(SystemExit, match=r"one weight per reward \(REWARD_WEIGHTS has 2 for 1 REWARD_FUNCS\)"):
        harness.load_recipe(str(tmp_path / "two_weights.py"))


def test_an_unknown_recipe_is_one_line():
    with pytest.raises(SystemExit, match="unknown recipe 'gsm9k_grpo': use one of gsm8k_grpo, tool_use_grpo"):
        harness.load_recipe("gsm9k_grpo")


def test_evaluate_takes_the_recipes_own_flags_and_names_the_recipe_for_one_it_does_not_know():
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "tool_use_grpo", "--base_url", "http://127.0.0.1:9",
                           "--model", "m", "--tool_timout", "3", "--out", "/dev/null"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert last.startswith("unknown option(s) --tool_timout 3: not evaluate.py's (--help) nor tool_use_grpo's (")
    assert "--tool_timeout" in last
