"""math-verify in a child process that can be killed: `MathVerifyProcess.equal(predicted, gold)` in the parent,
`serve()` in the child (started as `python -m grpo_recipes.math_verify_process`)."""

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
import warnings
from functools import lru_cache
from pathlib import Path

PARSE_SECONDS = 1  # math-verify gives up on one side after this (a huge factorial or binomial), counted as "timeout"
ROOT = Path(__file__).resolve().parent.parent  # the folder that holds the package, for the child's import


class MathVerifyProcess:
    """math-verify in a child process that can be killed.

    math-verify's own timeouts use signal.alarm, which only works on the main thread (TRL runs async rewards in an
    event-loop thread), and signals cannot interrupt a parse stuck in C code (a huge power). So parsing runs in a
    child with math-verify's timeouts on, behind a wall-clock timeout here; a child that overruns is killed and
    restarted, and that answer counts as not equal.
    """

    def __init__(self, timeout: float = 5.0, startup_timeout: float = 120.0):
        self.timeout, self.startup_timeout = timeout, startup_timeout
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        atexit.register(self.close)

    def _start(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "grpo_recipes.math_verify_process"], cwd=ROOT, text=True, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if self._read_line(self.startup_timeout) != "ready":
            self._stop()
            raise RuntimeError("the math-verify worker did not start (is math-verify installed?)")

    def _read_line(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        return self._process.stdout.readline().strip() if ready else None

    def close(self) -> None:
        """Stop the child (also done at exit)."""
        with self._lock:
            if self._process is not None:
                self._stop()

    def _stop(self) -> None:
        self._process.kill()
        self._process.wait()
        self._process.stdin.close()
        self._process.stdout.close()
        self._process = None

    def equal(self, predicted: str, gold: str, scale: str = "", timeout: float | None = None) -> bool | None:
        """True/False from math-verify, or None when it timed out (here, or inside math-verify) or failed. `scale`
        "percent": the prediction is a percent, read as _percent_of says."""
        with self._lock:
            try:
                if self._process is None or self._process.poll() is not None:
                    self._start()
                self._process.stdin.write(json.dumps([predicted, gold, scale]) + "\n")
                self._process.stdin.flush()
                line = self._read_line(self.timeout if timeout is None else timeout)
            except (OSError, RuntimeError, ValueError) as err:
                warnings.warn(f"math-verify unavailable, treating the answer as wrong: {err}", RuntimeWarning,
                              stacklevel=2)
                return None
            if line is None:
                self._stop()  # hung: kill it; the next call starts a fresh one
                return None
            return json.loads(line)



def serve() -> None:
    """The child side of MathVerifyProcess: JSON [predicted, gold] lines in, true/false/null lines out.

    Both sides are parsed as LaTeX and must be read WHOLE: math-verify returns the text it parsed, normalised, and
    that must be the whole answer normalised the same way. Its unit stripping is off: it reads '5h' and
    '5\\text{ thousand}' as 5; answers_match splits off the units it accepts before asking.
    """
    import logging

    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex
    from math_verify import LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeouts are counted (VERIFY_STATS), not printed

    normalization = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True,
                                        boxed="all", equations=False)
    config = LatexExtractionConfig(normalization_config=normalization)

    @lru_cache(maxsize=1024)
    def read_whole(expression: str) -> list:
        parsed = parse(f"${expression}$", [config], parsing_timeout=PARSE_SECONDS)
        return parsed if len(parsed) == 2 and parsed[1] == normalize_latex(expression, normalization) else []

    def below_one(value) -> bool:
        try:
            return abs(complex(value.evalf())) < 1
        except (TypeError, ValueError, AttributeError):  # a set, an interval, a symbol: not a number below one
            return False

    def timed(step, *args, **kwargs):
        """step(*args, **kwargs), and whether it ran into math-verify's own time limit (it returns [] or False then)."""
        start = time.monotonic()
        value = step(*args, **kwargs)
        return value, time.monotonic() - start >= 0.95 * PARSE_SECONDS

    verify(read_whole("x^2 + \\frac{1}{2}"), read_whole("\\frac{1}{2} + x^2"))  # first use loads parts of sympy
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            predicted_text, gold_text, scale = json.loads(line)
            predicted, slow_predicted = timed(read_whole, predicted_text)
            gold, slow_gold = timed(read_whole, gold_text)
            if predicted and gold and scale == "percent":
                predicted = [predicted[0] / 100 if below_one(gold[0]) else predicted[0]]
            equal, slow_verify = timed(verify, gold, predicted, timeout_seconds=PARSE_SECONDS) \
                if predicted and gold else (False, False)
            result = None if slow_predicted or slow_gold or slow_verify else bool(equal)
        except Exception:  # noqa: BLE001 - a bad answer is a wrong answer, never a dead worker
            result = None
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    serve()
