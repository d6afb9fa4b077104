"""grpo_recipes/contract.py: what a recipe offers the scripts that run it, checked in one line; and each recipe's
setup(), whose rewards and tools pickle into a fresh process (as TRL's async trainer spawns one) with the run's
options applied there."""

import json
import pickle
import subprocess
import sys

import pytest

import rewards
from conftest import ROOT
from grpo_recipes import contract, kit_judge, options
from grpo_recipes.refusal import Refusal


@pytest.mark.parametrize("name", contract.RECIPES)
def test_every_recipe_offers_the_whole_contract_and_its_setup_builds_without_starting_anything(name):
    recipe = contract.load_recipe(name)
    task = contract.checked_setup(recipe, recipe.ScriptArguments())
    assert len(task.reward_funcs) == len(task.reward_weights) > 0
    tool_recipes = ("tool_use_grpo", "search_agent_grpo", "game_grpo", "mcp_grpo")
    assert (task.environment_factory is not None) == (name in tool_recipes)
    for service in task.services:  # started by training.prepare, not by setup()
        assert getattr(service, "_zygote", None) is None and getattr(service, "retriever", None) is None
    for reward, _, pays_for, gaming in rewards.describe(task.reward_funcs, task.reward_weights):
        assert pays_for and gaming, f"{name}'s {reward} lacks a first line or a 'Gaming it:' sentence"


FORK = '''from dataclasses import dataclass

RECIPE_DEFAULTS = {}
SYSTEM_PROMPT = "Answer."


@dataclass
class ScriptArguments:
    num_eval_examples: int = 8


def build_dataset(split, dataset_path=None):
    return []
'''


def test_a_fork_that_lacks_parts_of_the_contract_is_told_every_missing_part_in_one_line(tmp_path):
    (tmp_path / "my_fork.py").write_text(FORK)
    with pytest.raises(Refusal) as refusal:
        contract.load_recipe(str(tmp_path / "my_fork.py"))
    message = str(refusal.value)
    assert "\n" not in message
    assert message.startswith("recipe my_fork does not offer setup, ScriptArguments.dataset_path: ")
    assert "grpo_recipes/contract.py lists what a recipe offers" in message


def test_a_setup_whose_weights_do_not_match_its_rewards_is_refused(tmp_path):
    source = FORK.replace("num_eval_examples: int = 8", "num_eval_examples: int = 8\n    dataset_path: str = None")
    source += ("\n\ndef setup(script_args):\n    from grpo_recipes.contract import Setup\n\n"
               "    return Setup([lambda completions, **kwargs: [0.0] * len(completions)], [1.0, 2.0])\n")
    (tmp_path / "two_weights.py").write_text(source)
    recipe = contract.load_recipe(str(tmp_path / "two_weights.py"))
    with pytest.raises(Refusal, match=r"two_weights.setup gives 2 reward weights for 1 reward functions"):
        contract.checked_setup(recipe, recipe.ScriptArguments())


def test_an_unknown_recipe_is_one_line():
    with pytest.raises(Refusal, match="unknown recipe 'gsm9k_grpo': use one of gsm8k_grpo, tool_use_grpo"):
        contract.load_recipe("gsm9k_grpo")


def test_evaluate_takes_the_recipes_own_flags_and_names_the_recipe_for_one_it_does_not_know():
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "tool_use_grpo", "--base_url",
                           "http://127.0.0.1:9", "--model", "m", "--tool_timout", "3", "--out", "/dev/null"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert last.startswith("unknown option(s) --tool_timout 3: not evaluate.py's (--help) nor tool_use_grpo's (")
    assert "--tool_timeout" in last


# Non-default options of every recipe: a spawned process must apply these, not the defaults.
OPTIONS = {"gsm8k_grpo": [],
           "tool_use_grpo": ["--tool_timeout", "1", "--tool_seconds_per_step", "7"],
           "search_agent_grpo": ["--search_top_k", "1", "--snippet_chars", "20"],
           "code_grpo": ["--seconds_per_test", "1", "--test_workers", "3"],
           "judge_grpo": ["--judge_timeout", "7", "--max_answer_words", "5"],  # + the test's judge server
           "reasoning_gym_grpo": ["--tasks", "chain_sum:3,basic_arithmetic", "--curriculum_window", "5"],
           "game_grpo": ["--max_number", "4", "--turn_limit", "2", "--max_tool_calling_iterations", "2"],
           "mcp_grpo": ["--mcp_session", "rollout", "--mcp_max_result_chars", "3", "--mcp_tools", "calculate"]}
# In a fresh interpreter, what TRL's async trainer does with them: unpickle, make an environment, call its tools and
# score with the rewards; report what it found.
PROBE = """
import json, pickle, sys
sys.path.insert(0, sys.argv[1])
from grpo_recipes.contract import environment_tools
from trl.trainer.utils import get_callable_name

found = {}
for recipe, (reward_funcs, factory) in pickle.loads(sys.stdin.buffer.read()).items():
    report = found[recipe] = {"rewards": [get_callable_name(f) for f in reward_funcs]}
    if factory is not None:
        environment = factory()
        report["first"] = environment.reset(prompt=[], answer="1", seed=3)
        report["tools"] = [tool.__name__ for tool in environment_tools(environment)]
    if recipe == "tool_use_grpo":
        report["calls"] = [environment.python("print(6 * 7)"), environment.python("while True:\\n    pass")]
        report["budget"] = [environment.budget.seconds_per_step, environment.budget.training]
    if recipe == "search_agent_grpo":
        report["search"] = environment.search("born")
    if recipe == "code_grpo":
        def add(name, body):
            return [f"```python\\ndef {name}(a, b):\\n{body}\\n    return a + b\\n```"]
        tests = [["assert add(1, 2) == 3"]]
        scores = [reward_funcs[1](add("add", body), tests=tests, setup=[""], entry_point=["add"],
                                  shown_examples=["[]"])[0]
                  for body in ("    pass", "    import time\\n    time.sleep(2)")]
        report["scores"] = scores
        report["workers"] = reward_funcs[1].keywords["code_tests"].tester.workers
    if recipe == "judge_grpo":
        task = "Passage:\\nAva's kite is red.\\n\\nQuestion: What colour is Ava's kite?"
        answer = [[{"role": "assistant", "content": "It is red, as the passage says."}]]
        report["scores"] = [func(completions=answer, prompts=[task]) for func in reward_funcs]
        report["timeout"] = reward_funcs[0].timeout
    if recipe == "reasoning_gym_grpo":
        tasks, curriculum = reward_funcs[0].tasks, reward_funcs[0].curriculum
        row = tasks.row("chain_sum", 0, "train", 0)  # generated here, from the seed the run set
        answers = [[{"role": "assistant", "content": f"<answer>{text}</answer>"}] for text in (row["answer"], "x")]
        report["scores"] = reward_funcs[0](completions=answers, **{key: [row[key]] * 2 for key in (
            "task", "level", "split", "index")})
        report["weights"], report["window"] = tasks.weights, curriculum.window
    if recipe == "mcp_grpo":  # the server started again from out there, with the run's session and result length
        report["calls"] = [environment.calculate(expression="6 * 7"), environment.calculate(expression="10 ** 6")]
        report["session"] = factory.server.session
    if recipe == "game_grpo":  # the secret of seed 3, guessed at once: a win in one of --max_turns 2
        call = {"type": "function", "function": {"name": "guess", "arguments": {"number": environment.secret}}}
        won = [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "Correct!"}]
        report["scores"] = [func(completions=[won], seed=[3])[0] for func in reward_funcs]
print(json.dumps(found))
"""


def test_every_recipes_rewards_and_tools_rebuild_in_a_spawned_process_with_the_runs_options(kit, code_kit):
    """The async trainer scores and runs tools in a spawned process, which imports each recipe afresh: what setup()
    built from the run's flags must arrive there and start there (a sandbox, an index), its options applied (the
    tool's 1 s timeout, not 2; one search result, not 3; a 1 s test budget, not 3, and 3 test workers, not 2)."""
    tasks = {}
    judge_server, judge_url = kit_judge.start()
    for name in contract.RECIPES:
        recipe = contract.load_recipe(name)
        folder = code_kit if name == "code_grpo" else kit
        judge = ["--judge_base_url", judge_url] if name == "judge_grpo" else []
        script_args = options.parse_args(recipe.ScriptArguments, recipe.RECIPE_DEFAULTS, [
            "--config", str(folder / f"{name}.yaml"), *OPTIONS[name], *judge])[0]
        task = contract.checked_setup(recipe, script_args)
        task.start()  # as training.prepare does in the trainer: started here, restarted in the other process
        tasks[name] = (task.reward_funcs, task.environment_factory)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(ROOT)], input=pickle.dumps(tasks), capture_output=True,
                          timeout=300, check=False)
    judge_server.shutdown()
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    found = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert found["gsm8k_grpo"]["rewards"][0] == "correctness_reward"
    assert found["code_grpo"]["rewards"][:2] == ["all_tests_passed_reward", "tests_passed_reward"]
    tool = found["tool_use_grpo"]
    assert tool["tools"] == ["python"] and tool["calls"][0] == "42"
    assert tool["calls"][1] == "Error: timed out after 1 s"  # --tool_timeout 1, not the default 2
    assert tool["budget"] == [7.0, False]  # the run's budget, and no steps to share out there
    search = found["search_agent_grpo"]
    assert search["tools"] == ["read", "search"] and search["search"].count("\n") == 0  # --search_top_k 1
    assert len(search["search"].split("] ", 1)[1]) == 20  # --snippet_chars 20, from the kit's corpus
    code = found["code_grpo"]
    assert code["scores"] == [1.0, 0.0] and code["workers"] == 3  # the 2 s function ran out of the 1 s test budget
    judged = found["judge_grpo"]  # the judge asked from there (a right answer, in 7 words: 2 over --max_answer_words)
    assert judged["scores"] == [[0.9], [pytest.approx(-2 / 15)]] and judged["timeout"] == 7.0
    gym = found["reasoning_gym_grpo"]
    assert gym["scores"] == [1.0, 0.0] and gym["weights"] == {"chain_sum": 3.0, "basic_arithmetic": 1.0}
    assert gym["window"] == 5
    mcp = found["mcp_grpo"]  # --mcp_tools calculate, --mcp_max_result_chars 3, --mcp_session rollout
    assert mcp["tools"] == ["calculate"] and mcp["session"] == "rollout"
    assert mcp["calls"][0] == "42" and mcp["calls"][1].startswith("100\n[4 more characters cut")
    game = found["game_grpo"]  # the game the options chose, replayed by the rewards out there
    assert game["tools"] == ["guess"] and "from 1 to 4. You have 2 guesses" in game["first"]
    assert game["scores"][:2] == [1.0, 1.0]  # won, with one of 2 turns used


class Notes:
    def reset(self, **row) -> None:
        return None

    def add(self, text: str) -> str:
        """Add a note.

        Args:
            text: The note.
        """
        return "added"

    def no_docstring(self, text: str) -> str:
        return text

    def no_type_hint(self, text) -> str:
        """Read a note.

        Args:
            text: The note.
        """
        return text

    def no_args_section(self, text: str) -> str:
        """Count notes."""
        return text


@pytest.mark.parametrize(("missing", "says"), [("no_docstring", "no docstring"), ("no_type_hint", "type hint"),
                                                ("no_args_section", "no description for the argument")])
def test_a_tool_the_model_cannot_be_shown_is_one_line_naming_it_before_the_model_loads(missing, says):
    broken = type("Broken", (Notes,), {name: None for name in ("no_docstring", "no_type_hint", "no_args_section")
                                       if name != missing})
    recipe = type(sys)("my_recipe")
    recipe.build_dataset = lambda split="train", dataset_path=None: None
    recipe.setup = lambda script_args: contract.Setup([rewards.correctness_reward], [1.0], environment_factory=broken)
    task = contract.checked_setup(recipe, None)
    with pytest.raises(Refusal) as refused:
        contract.check_tools(task.environment_factory)  # as training.prepare and evaluate.py do, before loading
    message = str(refused.value)
    assert message.startswith(f"the tool {missing} cannot be described to the model: ") and says in message
    assert "`Args:`" in message and "\n" not in message
    fixed = type("Fixed", (Notes,), dict.fromkeys(("no_docstring", "no_type_hint", "no_args_section")))
    contract.check_tools(fixed)
    with pytest.raises(Refusal, match=f"the tool {missing} "):  # a dict of factories: each environment's tools
        contract.check_tools({"fixed": fixed, "broken": broken})
