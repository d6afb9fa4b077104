"""reasoning_gym_grpo.py: every task it offers pays its gold answer in full and wrong answers nothing, the tasks it
refuses are one line, training never asks a held-out question, the curriculum follows the pass rate, and the recipe
trains through its entry point on the kit with its levels in the log."""

import json
import pickle
import signal
import subprocess
import sys
from fractions import Fraction

import pytest

import reasoning_gym_grpo as recipe
from grpo_recipes import gym_tasks
from grpo_recipes.gym_scorer import GRAMMARS as GYM_GRAMMARS, GymScorer
from conftest import ROOT
from grpo_recipes import options
from grpo_recipes.refusal import Refusal

# Answers that are wrong for any item whose gold differs from them: the guesses a policy tries first.
GUESSES = ["", "0", "1", "-1", "yes", "no", "True", "False", "None", "A", "[]", "24", "<answer></answer>"]


SCORER = GymScorer()  # one sandbox for a worker's walk (its zygote starts in seconds: reasoning-gym imported once)


def answered(text: str) -> list[dict]:
    return [{"role": "assistant", "content": f"Let me think.\n<answer>{text}</answer>"}]


def scorer_for(task: str, level: int = 0):
    tasks = gym_tasks.TaskSet(task, 0, recipe.SYSTEM_PROMPT, SCORER)
    curriculum = recipe.Curriculum(tasks, level, window=64, promote_at=0.75, demote_at=0.1, enabled=True)
    return tasks, curriculum, recipe.TaskScorer(tasks, curriculum)


def same(guess: str, gold: str) -> bool:
    """The guess is the gold answer written another way: the same text, the same number to 4 significant digits
    (0 for 0.0, 211552. for 211552.53), or the gold's number without its unit or with it shortened (1 d for 1 days)."""
    guess, gold = guess.strip().lower(), gold.strip().lower()
    try:
        return guess == gold or abs(Fraction(guess) - Fraction(gold)) <= abs(Fraction(gold)) / 10_000
    except (ValueError, ZeroDivisionError):
        number, _, unit = gold.partition(" ")
        return unit.isalpha() and guess.split(" ")[0] == number and unit.startswith(guess.partition(" ")[2])


# Answers that would pay 1.0 wherever a scorer ran them as Python: they make float() answer 1.0, or patch the scorer.
FORGERIES = ['exec("import builtins; builtins.float = lambda *a: 1.0")',
             "__import__('builtins').__setattr__('float', lambda *a: 1.0)",
             "[__import__('sys').modules['builtins'].__dict__.update(float=lambda *a: 1.0)]"]
# Numbers that are not finite, or not computable in a step's time; and the gold where a scorer parses an expression.
NOT_NUMBERS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e999", "oo", "zoo", "9**9**9", "x**(9**9**9)",
               "(((9**64)**64)**64)**64", "9" * 400]


def hostile(gold: str, row: dict) -> list[str]:
    """The attack classes of issue 66 for an item: code, non-finite and huge numbers, calls that make the scorer do
    the task (on the gold and on the question's own expression), and the gold with junk after or before it."""
    metadata = row.get("metadata") or {}
    question = metadata.get("polynomial_expr") or metadata.get("integrand") or gold
    variable = metadata.get("variable") or "x"
    work = [f"expand({question})", f"simplify({gold})", f"integrate({question}, {variable})", f"S({gold!r})",
            f"sympify({gold!r})", f"eval({gold!r})", f"(lambda: {gold})()", f"__import__('sympy').expand({gold})"]
    junk = [f"{gold}, extra words", f"{gold} or 0", f"{gold}\n{gold}", f"{gold} junk", f"{gold};0",
            f"0 {gold}", f"junk or {gold}"]
    task = metadata.get("source_dataset")
    if task in GYM_GRAMMARS:  # one expression: "0 <gold>" is 0 - (...), the same value, and the rest do not parse
        junk = []
    return [*FORGERIES, *NOT_NUMBERS, *work, *junk]


def hedges(gold: str, wrong: str) -> list[str]:
    """Wrong answers that carry the gold after them (a scorer that searches the answer for its gold pays these), and
    the first half of the gold."""
    return [f"{wrong} or {gold}", f"{wrong}\n{gold}", f"{wrong}, {gold}", gold[:max(1, len(gold) // 2)]]


class Hung(BaseException):
    """Not an Exception: the recipe skips items whose generator raises one."""


class within:
    """Fail the test, naming what hung, where a reasoning-gym generator or scorer runs past `seconds`."""

    def __init__(self, seconds: int, what: str):
        self.seconds, self.what = seconds, what

    def __enter__(self):
        def hung(*_):
            raise Hung(f"{self.what} ran past {self.seconds} s")

        signal.signal(signal.SIGALRM, hung)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)


def wrong_answers_earn_nothing(task: str, level: int, items: int = 4) -> None:
    tasks, _, correctness = scorer_for(task, level)
    rows = [tasks.row(task, level, "train", i) for i in range(items)]
    for row in rows:  # the attacks on the first item: each answer is a sandboxed child
        gold = row["answer"]
        # another item's gold is wrong here, except on tasks with many right answers; the question itself, the
        # guesses and the hedges are wrong everywhere
        others = [] if task in MANY_RIGHT_ANSWERS else [o["answer"] for o in rows if not same(o["answer"], gold)][:2]
        hedged = [] if task in MANY_RIGHT_ANSWERS else hedges(gold, (others or ["0"])[0])
        attacks = hostile(gold, tasks.item(task, level, "train", row["index"])) if row is rows[0] else []
        wrong = [w for w in [*GUESSES, row["prompt"][1]["content"], *others, *hedged, *attacks] if not same(w, gold)]
        scores = correctness(completions=[answered(gold), *map(answered, wrong)], **{
            key: [row[key]] * (1 + len(wrong)) for key in ("task", "level", "split", "index")})
        assert scores[0] == 1.0, f"{task} level {level}: its gold {gold!r} earns {scores[0]}"
        paid = {w: s for w, s in zip(wrong, scores[1:], strict=True) if s != 0.0}
        assert not paid, f"{task} level {level}: wrong answers earn {paid} (gold {gold!r})"


# Tasks with many right answers: an n_queens board can solve two puzzles; a sokoban answer is the moves in it, whatever
# else it says, and still solves after moves into walls.
MANY_RIGHT_ANSWERS = ("n_queens", "sokoban")


@pytest.mark.slow  # minutes in all (a sandboxed child per answer); reasoning-gym is not the other tiers' business
@pytest.mark.parametrize("task", gym_tasks.offered_tasks())
def test_every_offered_task_pays_its_gold_answer_in_full_and_wrong_answers_nothing_at_its_easiest(task):
    with within(120, f"{task} at level 0"):  # arc_agi: 46 s on 2 loaded cores (2.7 MB pickled per answer)
        wrong_answers_earn_nothing(task, level=0)


@pytest.mark.slow
@pytest.mark.parametrize("task", gym_tasks.offered_tasks())
def test_every_offered_task_pays_its_gold_answer_in_full_and_wrong_answers_nothing_at_its_hardest(task):
    tasks = gym_tasks.TaskSet(task, 0, recipe.SYSTEM_PROMPT)
    with within(240, f"{task} at its hardest level"):  # n_queens: 64 s on 2 loaded cores
        wrong_answers_earn_nothing(task, level=tasks.max_level(task), items=3)


def test_partial_credit_earns_nothing():
    """countdown's own scorer pays a wrong expression 0.05 (and an empty answer 0.01, which the rubric refuses before
    the scorer sees it); the recipe pays neither."""
    tasks, _, correctness = scorer_for("countdown")
    row = tasks.row("countdown", 0, "train", 0)
    address = {key: row[key] for key in ("task", "level", "split", "index")}
    assert tasks.score("1+1", **address) > 0  # what the recipe must not pay
    assert correctness([answered("1+1"), answered("")], **{k: [v] * 2 for k, v in address.items()}) == [0.0, 0.0]


@pytest.mark.parametrize(("flags", "says"), [
    ("--tasks countdwn", "--tasks countdwn: reasoning-gym has no such task with a curriculum; choose from "),
    ("--tasks puzzle24", "--tasks puzzle24: its scorer pays any expression equal to 24"),
    ("--tasks rush_hour", "--tasks rush_hour: its scorer gives its own gold answer 0"),
    ("--tasks countdown:two", "--tasks countdown:two: the weight after ':' must be a number"),
    ("--tasks countdown:0", "name at least one task, each weight above 0"),
    ("--tasks chain_sum --level 99", "--level 99: chain_sum's levels are 0 (easiest) to "),
    ("--tasks chain_sum --level -1", "--level -1: chain_sum's levels are 0 (easiest) to "),
])
def test_a_task_the_recipe_cannot_train_on_is_one_line(flags, says):
    script_args = options.parse_args(recipe.ScriptArguments, recipe.RECIPE_DEFAULTS, flags.split())[0]
    with pytest.raises(Refusal) as refusal:
        recipe.setup(script_args)
    assert says in str(refusal.value) and "\n" not in str(refusal.value)


def test_the_entry_point_refuses_before_any_model_loads():
    proc = subprocess.run([sys.executable, str(ROOT / "reasoning_gym_grpo.py"), "--tasks", "puzzle24",
                           "--model_name_or_path", "/nonexistent-model"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("--tasks puzzle24: its scorer pays any expression")


def test_async_grpo_refuses_the_curriculum_its_rollout_process_would_never_move(tmp_path):
    """async_grpo.py generates and scores in a spawned process: the levels there are a copy the trainer's steps never
    move, so the curriculum is one line before any server or model, and a fixed level passes that check."""
    import async_grpo

    argv = ["reasoning_gym_grpo", "--tasks", "chain_sum", "--output_dir", str(tmp_path), "--model_name_or_path",
            "/nonexistent-model", "--vllm_server_base_url", "http://127.0.0.1:9"]
    with pytest.raises(Refusal) as refusal:
        async_grpo.main(argv)
    assert str(refusal.value) == ("reasoning_gym_grpo's Curriculum moves what the rollouts read as training steps, "
                                  "and here the rollouts are generated and scored in another process: pass "
                                  "--curriculum false (a fixed --level)")
    with pytest.raises(Refusal) as refusal:  # the next check's: the server
        async_grpo.main([*argv, "--curriculum", "false"])
    assert "Curriculum" not in str(refusal.value)


def test_the_curriculum_steps_over_levels_reasoning_gym_cannot_generate():
    """caesar_cipher's two hardest curriculum levels ask for a rotation its own config check forbids; modulo_grid's
    level 1 fails its check while 0 and 2 pass."""
    tasks = gym_tasks.TaskSet("caesar_cipher,modulo_grid", 0, recipe.SYSTEM_PROMPT)
    with pytest.raises(Refusal, match="cannot generate it at level"):
        tasks.row("caesar_cipher", tasks.top_level("caesar_cipher"), "train", 0)
    assert 0 < tasks.max_level("caesar_cipher") < tasks.top_level("caesar_cipher")
    assert tasks.next_level("caesar_cipher", tasks.max_level("caesar_cipher"), 1) == tasks.max_level("caesar_cipher")
    assert not tasks.generates("modulo_grid", 1)
    assert tasks.next_level("modulo_grid", 0, 1) == 2 and tasks.next_level("modulo_grid", 2, -1) == 0
    curriculum = recipe.Curriculum(tasks, 0, window=2, promote_at=0.75, demote_at=0.1, enabled=True)
    for _ in range(2):
        curriculum.record("modulo_grid", True)
    curriculum.on_step_end(None, None, None)
    assert curriculum.levels == {"caesar_cipher": 0, "modulo_grid": 2}


def test_training_never_asks_a_held_out_question_even_where_the_task_repeats_itself():
    tasks = gym_tasks.TaskSet("basic_arithmetic", 0, recipe.SYSTEM_PROMPT)
    held_out = recipe.build_dataset("test", tasks=tasks)  # 200 prompts at level 0
    questions = {prompt[1]["content"] for prompt in held_out["prompt"]}
    before = [tasks.row("basic_arithmetic", 0, "train", i)["prompt"][1]["content"] for i in range(2000)]
    assert questions & set(before), "the task never repeats a question at level 0: this test checks nothing"
    tasks.held_out = questions
    after = [tasks.row("basic_arithmetic", 0, "train", i) for i in range(2000)]
    assert not questions & {row["prompt"][1]["content"] for row in after}
    # a skipped prompt keeps the index it used, so the scorer regenerates the item that was asked
    moved = next(row for row in after if row["index"] >= gym_tasks.STRIDE)
    assert tasks.score(moved["answer"], "basic_arithmetic", 0, "train", moved["index"]) == 1.0


def test_the_curriculum_raises_a_level_the_model_passes_lowers_one_it_fails_and_logs_both():
    tasks, curriculum, correctness = scorer_for("chain_sum,basic_arithmetic", level=1)
    curriculum.window = 4
    rows = {task: tasks.row(task, 1, "train", 0) for task in ("chain_sum", "basic_arithmetic")}
    for _ in range(4):  # chain_sum always right, basic_arithmetic always wrong
        for task, row in rows.items():
            text = row["answer"] if task == "chain_sum" else "wrong"
            correctness([answered(text)], **{key: [row[key]] for key in ("task", "level", "split", "index")})
    held = tasks.row("chain_sum", 1, "test", 0)  # held-out outcomes never move a level
    correctness([answered("wrong")] * 8, **{key: [held[key]] * 8 for key in ("task", "level", "split", "index")})
    logs = {}
    curriculum.on_step_end(None, None, None)
    curriculum.on_log(None, None, None, logs=logs)
    assert logs == {"curriculum/chain_sum/level": 2, "curriculum/basic_arithmetic/level": 0}  # windows start afresh
    rendered = recipe.build_dataset("train", tasks=tasks, levels=curriculum.levels)[:16]  # read at today's levels
    assert {(task, level) for task, level in zip(rendered["task"], rendered["level"], strict=True)} == {
        ("chain_sum", 2), ("basic_arithmetic", 0)}
    eval_logs = {"eval_loss": 1.0}
    curriculum.on_log(None, None, None, logs=eval_logs)
    assert eval_logs == {"eval_loss": 1.0}


def test_the_rubric_pickles_into_another_process_and_scores_there():
    task = recipe.setup(recipe.ScriptArguments(tasks="chain_sum"))
    row = task.callbacks[0].tasks.row("chain_sum", 0, "train", 3)
    code = ("import pickle, sys; funcs = pickle.load(sys.stdin.buffer); "
            f"print(funcs[0](completions=[[{{'role': 'assistant', 'content': '<answer>{row['answer']}</answer>'}}]], "
            f"task=['chain_sum'], level=[0], split=['train'], index=[{row['index']}]))")
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(task.reward_funcs), capture_output=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().strip() == "[1.0]"


def test_it_trains_through_its_entry_point_on_the_kit_and_the_curriculum_climbs(base_kit, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "reasoning_gym_grpo.py"), "--config",
                           str(base_kit / "reasoning_gym_grpo.yaml"), "--tasks", "chain_sum:2,basic_arithmetic",
                           "--promote_at", "0", "--curriculum_window", "4", "--output_dir", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=base_kit, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    steps = [log for log in state["log_history"] if "loss" in log]
    levels = [log["curriculum/chain_sum/level"] for log in steps]
    assert len(steps) == 4 and levels == sorted(levels) and levels[-1] >= 2, levels  # every full window promotes
    assert all("rewards/correctness_reward/mean" in log for log in steps)
    evals = [log for log in state["log_history"] if "eval_loss" in log]
    assert evals and not any(key.startswith("curriculum/") for log in evals for key in log)


@pytest.mark.slow  # two launches of two processes: 26 s
def test_two_processes_train_at_a_fixed_level_and_the_curriculum_is_refused_there(base_kit, tmp_path):
    """Under `accelerate launch` each process scores its own completions: levels moved by them would differ between
    processes, and a group's copies would be rendered at two levels. So the curriculum is one line there, and a fixed
    --level trains."""
    def launch(*flags):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               str(ROOT / "reasoning_gym_grpo.py"), "--config", str(base_kit / "reasoning_gym_grpo.yaml"),
               "--output_dir", str(tmp_path / "ddp"), "--max_steps", "1", "--per_device_train_batch_size", "2",
               "--eval_strategy", "no", "--save_strategy", "no", *flags]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=base_kit, check=False)

    refused = launch()
    # each process refuses in one line; the launcher then reports the failed processes with a traceback of its own
    assert refused.returncode != 0 and 'reasoning_gym_grpo.py", line' not in refused.stderr, refused.stderr[-3000:]
    assert "--curriculum: its levels follow the completions one process scores, and here are 2" in refused.stderr
    fixed = launch("--curriculum", "false", "--level", "1")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "process 1 of 2 ready" in fixed.stderr


def test_the_readme_rubric_table_is_the_recipe_rubric():
    import rewards

    task = recipe.setup(recipe.ScriptArguments(tasks="chain_sum"))
    assert rewards.rubric_table(task.reward_funcs, task.reward_weights) in (ROOT / "README.md").read_text()


# Issue 66's measured failures, one test each: through the recipe's own rubric, in the default tier.
ATTACKED = "countdown,polynomial_multiplication,simple_integration,intermediate_integration,complex_arithmetic," \
           "n_queens,spiral_matrix,binary_matrix,string_insertion,word_sorting,letter_jumble,time_intervals," \
           "fraction_simplification,advanced_geometry"


@pytest.fixture(scope="module")
def attacked():
    """The recipe's rubric over the tasks the audit attacked, at level 0, one sandbox for them all."""
    task = recipe.setup(recipe.ScriptArguments(tasks=ATTACKED))
    tasks = task.callbacks[0].tasks

    def score(name: str, answers: list[str], level: int = 0, item: int = 0) -> list[float]:
        row = tasks.row(name, level, "train", item)
        return task.reward_funcs[0](completions=[answered(a) for a in answers], **{
            key: [row[key]] * len(answers) for key in ("task", "level", "split", "index")})

    score.tasks = tasks
    yield score
    tasks.scorer.close()


@pytest.mark.parametrize("name", ["countdown", "polynomial_multiplication", "simple_integration",
                                  "intermediate_integration", "n_queens", "spiral_matrix", "binary_matrix",
                                  "string_insertion"])
def test_an_answer_that_is_code_runs_nowhere_near_the_trainer_and_earns_nothing(attacked, name, tmp_path):
    """Eight scorers eval the answer: a file write from the answer never happens on the host, and forging float()
    pays nothing."""
    marker = tmp_path / "written"
    code = [f"exec(\"open('{marker}','w').write('x')\")", f"__import__('pathlib').Path('{marker}').write_text('x')",
            *FORGERIES]
    assert attacked(name, code) == [0.0] * len(code)
    assert not marker.exists()


def test_one_answer_cannot_rewrite_the_scorer_for_the_answers_after_it(attacked):
    tasks = attacked.tasks
    wrong = [tasks.row("countdown", 0, "train", i) for i in range(5)]
    patch = ["exec(\"import reasoning_gym.games.countdown as m; m.CountdownDataset.score_answer = "
             "lambda *a, **k: 1.0\")", "exec(\"import sympy; sympy.simplify = lambda *a, **k: 0\")"]
    assert attacked("countdown", patch) == [0.0, 0.0]
    assert [attacked("countdown", ["0"], item=i)[0] for i in range(5)] == [0.0] * 5
    assert all(attacked("countdown", [row["answer"]], item=i) == [1.0] for i, row in enumerate(wrong))
    integral = tasks.row("simple_integration", 0, "train", 0)
    assert attacked("simple_integration", ["0", integral["answer"]]) == [0.0, 1.0]  # sympy.simplify is sympy's own


@pytest.mark.parametrize("level", [0, "top"])
def test_a_constant_that_is_not_a_number_earns_nothing(attacked, level):
    """complex_arithmetic's scorer computes min(1.0, exp(-distance)), and min(1.0, nan) is 1.0."""
    level = attacked.tasks.max_level("complex_arithmetic") if level == "top" else level
    for item in range(4):
        assert attacked("complex_arithmetic", ["nan", "NaN", "inf", "nan + nani", "1e999"], level, item) == [0.0] * 5


def test_the_scorer_does_not_do_the_task_for_an_answer(attacked):
    tasks = attacked.tasks
    for name in ("polynomial_multiplication", "simple_integration", "intermediate_integration"):
        for item in range(5):
            metadata = tasks.item(name, 0, "train", tasks.row(name, 0, "train", item)["index"])["metadata"]
            variable = metadata.get("variable", "x")
            integral = f"integrate({metadata.get('integrand')}, {variable})"
            answers = [f"expand({metadata['polynomial_expr']})"] if "polynomial_expr" in metadata else \
                [integral, f"{integral} + C"]
            assert attacked(name, answers, item=item) == [0.0] * len(answers), (name, answers)


def test_an_answer_that_would_hang_the_scorer_costs_its_time_limit_and_leaves_the_others_scores(attacked):
    import time

    tasks = attacked.tasks
    for name, bomb in [("countdown", "9**9**9"), ("polynomial_multiplication", "9**9**9"),
                       ("simple_integration", "x**(9**9**9)"),
                       ("intermediate_integration", "sin(cos(tan(exp(sin(cos(tan(exp(x))))))))**77 + C")]:
        gold = tasks.row(name, 0, "train", 0)["answer"]
        start = time.monotonic()
        assert attacked(name, [gold, bomb, gold, "0", gold]) == [1.0, 0.0, 1.0, 0.0, 1.0], name
        assert time.monotonic() - start < 2 * 2.0 + 3, f"{name}: {bomb} held the batch"  # --scorer_timeout 2


@pytest.mark.parametrize("name", ["word_sorting", "letter_jumble", "time_intervals", "fraction_simplification",
                                  "advanced_geometry"])
def test_the_gold_with_junk_after_or_before_it_earns_nothing(attacked, name):
    for item in range(3):
        gold = attacked.tasks.row(name, 0, "train", item)["answer"]
        junk = [f"{gold}, more words", f"{gold} or ...", f"{gold} junk", f"{gold}\n0", f"junk {gold}"]
        assert attacked(name, [gold, *junk], item=item) == [1.0] + [0.0] * len(junk), (name, gold)


def test_no_model_text_is_run_as_code_in_the_trainer_while_the_rubric_scores(attacked):
    """An audit hook in this (the trainer's) process sees every string compiled to run (eval, exec, compile: ast.parse,
    which reads the grammar's answers, compiles to a tree under the name '<unknown>') and every code object run: none
    comes from an answer."""
    ran = []
    marker = "grpo_marker_7f3e"

    def watch(event, args):
        if event == "compile" and marker in str(args[0]) and args[1] != "<unknown>":
            ran.append(("compiled", str(args[0])))
        if event == "exec" and marker in " ".join(map(str, (*args[0].co_names, *args[0].co_consts))):
            ran.append(("ran", args[0]))

    sys.addaudithook(watch)
    for name in ATTACKED.split(","):
        attacked(name, [f"{marker} + 1", f"[{marker}]", f"exec('{marker} = 1')"])
    assert ran == []
    eval(compile(f"{marker} = 1", "<string>", "exec"), {})  # what the hook sees where code does run
    assert [what for what, _ in ran] == ["compiled", "ran"]
