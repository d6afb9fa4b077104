"""reasoning-gym's scorers behind the sandbox: the policy's answer never reaches a task's scorer in the trainer.

    scorer = GymScorer(timeout=2)
    scorer.score(dataset, entry, "6*(67 - 3) + 43", task="countdown")   # 1.0, 0.0, or 0.0 for a hostile answer

A task's scorer is code this project did not write, and the policy's text is its input: eight of reasoning-gym
0.1.25's scorers run the answer as Python (`eval`, or sympy's `parse_expr`, which is eval), one pays `nan` in full,
several pay the gold followed by anything. So each answer is scored:

- in a forked, confined child of the project's sandbox (sandbox.py), under a time and memory limit, one child per
  answer: whatever an answer does there (patching the scorer, sympy, the process) is gone before the next answer,
  and an answer that hangs is that answer's 0 (counted), never a stalled step;
- with no string compiled as code unless the task's grammar admitted the answer first: in the child an audit hook
  refuses eval/exec/compile of source text, and `eval` reads Python literals only (scorers that eval a list of
  characters still read it). The four tasks whose scorer must parse an expression get one GRAMMARS entry each
  (arithmetic.py: numbers, their operators and symbols; no attribute, no call but elementary functions, no step
  beyond 10**1000), so `expand(<the question>)`, `integrate(...)` or `9**9**9` is refused unread;
- as a rubric: an answer that names a non-finite number (nan, inf, oo, 1e999) or a numeral of over MAX_NUMERAL
  digits the gold does not is 0; and an answer paid in full is cut where each word, comma or line begins: where a
  part of it is paid in full too (the scorer reads less than the whole answer), the answer is paid only if its words
  are the gold's ("1 days" where the scorer reads "1"), so the gold followed by junk, junk then the gold, or a hedge
  earns 0; and so does the gold wrapped in other words (`simplify(<gold>)`), which a scorer that searches its answer
  for the gold pays.
"""

import base64
import json
import math
import pickle
import re
import threading

from grpo_recipes import arithmetic
from grpo_recipes.sandbox import PRELOAD, Sandbox, SandboxFailed

MAX_NUMERAL = 300  # digits: a longer numeral, where the gold has none, is an overflow attempt, not an answer
MAX_ANSWER = 4000  # characters: a longer answer than this, and twice its gold, is not scored
PAYLOAD_BYTES = 8 << 20  # a dataset pickled larger is rebuilt in the child (arc_agi, the largest, pickles to 2.7 MB)
ELEMENTARY = frozenset(("sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                        "exp", "log", "ln", "sqrt"))

# What an answer must be before the scorer parses it as an expression: (operators, names, functions, whole numbers
# only). Names are those of the item (its variables, read from its metadata by `names`) and these constants.
GRAMMARS = {
    "countdown": (("+", "-", "*", "/"), (), (), True),
    "polynomial_multiplication": (("+", "-", "*", "**"), (), (), True),
    "simple_integration": (("+", "-", "*", "/", "**"), ("C",), ELEMENTARY, False),
    "intermediate_integration": (("+", "-", "*", "/", "**"), ("C", "E", "pi"), ELEMENTARY, False),
}
NON_FINITE = re.compile(r"(?i)(?<![a-z])(nan|inf|infinity|oo|zoo)(?![a-z])")
NUMERAL = re.compile(r"\d[\d_]*(?:\.\d*)?(?:[eE][+-]?\d+)?")
CUTS = re.compile(r"[\s,;|]+")  # where an answer's parts begin: a word, a list item, a line
LETTER = re.compile(r"[^\W\d_]")
EDGE_CUTS = 32  # a long answer is cut near each end (and where the gold would end), not at every word

# Imported once in the sandbox's zygote, so each child has reasoning-gym for free (importing it takes a second). One of
# its tasks imports matplotlib, which wants a cache directory, and nothing is writable there before a call: it is
# given a name it never writes to (scoring draws nothing).
_WARMUP = """import tempfile
make_directory, tempfile.mkdtemp = tempfile.mkdtemp, lambda *args, **kwargs: "/nonexistent/matplotlib"
try:
    import reasoning_gym
finally:
    tempfile.mkdtemp = make_directory
"""

# The child's program (trusted; the answer arrives as data): build the dataset, guard against code, score the answer
# and each of its parts.
_PROGRAM = r'''
import ast, base64, builtins, json, math, pickle, sys
request = json.loads(channel.receive())
dataset = pickle.loads(base64.b64decode(request["dataset"])) if request["dataset"] else None
entry = pickle.loads(base64.b64decode(request["entry"]))
if dataset is None:  # too large or not picklable: built here from its address, as TaskSet.dataset builds it
    from reasoning_gym.factory import DATASETS, create_curriculum
    task, level, seed = request["address"]
    curriculum = create_curriculum(task)
    curriculum.set_global_level(level)
    dataset = DATASETS[task][0](curriculum.generate_configuration({"seed": seed, "size": 10_000}))
answer = request["answer"]
if not request["compiles"]:
    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from strings(item)
    trusted = set(strings(entry)) - {answer}  # the generator's own text (a problem, the gold) may run as code
    def no_code(event, args):
        # source text compiled to run is refused unless trusted; imports compile files, ast.parse "<unknown>"
        source = args[0].decode("utf-8", "replace") if event == "compile" and isinstance(args[0], bytes) else args[0]
        if event == "compile" and source not in trusted and not (
                isinstance(args[1], str) and (args[1] == "<unknown>" or args[1].endswith(".py"))):
            raise RuntimeError("this answer's scorer may not compile source text")
    def literal(source, *args, run=builtins.eval):  # eval of anything but the generator's text reads literals only
        return run(source, *args) if isinstance(source, str) and source in trusted else ast.literal_eval(source)
    sys.addaudithook(no_code)
    builtins.eval, builtins.exec = literal, lambda *args: (_ for _ in ()).throw(RuntimeError("exec"))
scores, number, finite, dumps, send = [], float, math.isfinite, json.dumps, channel.send  # bound before any scorer
for start, end in [(len(answer), len(answer)), *request["cuts"]]:  # the answer, then its parts
    try:
        value = number(dataset.score_answer(answer=answer[:start] + answer[end:], entry=entry))
    except Exception:
        value = 0.0
    scores.append(value if finite(value) else 0.0)
    if scores[0] < 1.0:
        break  # not paid in full: its parts need no look
send(dumps(scores))
'''


class GymScorer:
    """Scores answers with reasoning-gym's scorers, one confined child per answer (the module docstring says how).
    Thread-safe; pickles its options only (a spawned process starts a sandbox of its own)."""

    def __init__(self, timeout: float = 2.0, memory_mb: int = 4096, engine: str = "bubblewrap",
                 unsafe_without_isolation: bool = False):
        self.timeout = timeout
        self.sandbox = Sandbox(timeout=timeout, memory_mb=memory_mb, engine=engine, max_output=200, preload=PRELOAD,
                               warmup=_WARMUP, unsafe_without_isolation=unsafe_without_isolation)
        self.stats = {"scored": 0, "timed_out": 0, "refused": 0}
        self._payloads: dict = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"timeout": self.timeout, "sandbox": self.sandbox}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, stats={"scored": 0, "timed_out": 0, "refused": 0}, _payloads={},
                             _lock=threading.Lock())

    def start(self) -> dict:
        """Start the sandbox (raises SandboxUnavailable, one line, where this machine cannot confine the scorers)."""
        return self.sandbox.start()

    def describe(self) -> str:
        return f"reasoning-gym scorers: one confined child per answer, {self.timeout:g} s each; " \
               f"{self.sandbox.describe()}"

    def close(self) -> None:
        self.sandbox.close()

    def score(self, dataset, entry: dict, answer: str | None, task: str, address: tuple) -> float:
        """The task's score of `answer` (0-1), or 0.0 where the rubric refuses it, it ran out of time or the child
        failed. `address` (task, level, seed) rebuilds the dataset where it does not pickle."""
        gold = str(entry["answer"])
        if answer is None or len(answer) > max(MAX_ANSWER, 2 * len(gold)) or refused(answer, gold, task, entry):
            with self._lock:
                self.stats["refused"] += answer is not None
            return 0.0
        cuts = [] if task in GRAMMARS or words(answer) == words(gold) else list(CUTS.finditer(answer))
        if len(cuts) > 2 * EDGE_CUTS:  # the cuts near each end, and where the gold's length in words ends or begins
            length = len(words(gold))
            cuts = cuts[:EDGE_CUTS] + cuts[-EDGE_CUTS:] + [cuts[i] for i in (length - 1, -length) if -len(cuts) <= i
                                                           < len(cuts)]
        parts = [(cut.start(), len(answer)) for cut in cuts if cut.start() > 0] + \
                [(0, cut.end()) for cut in cuts if cut.end() < len(answer)]  # (start, end) of what is cut
        request = {"dataset": self._dataset(dataset, address), "address": list(address),
                   "entry": base64.b64encode(pickle.dumps(entry)).decode(), "answer": answer,
                   "cuts": parts, "compiles": task in GRAMMARS}
        scores = self._ask(json.dumps(request))
        if not scores:
            return 0.0
        if any(paid >= 1.0 for paid in scores[1:]) and words(answer) != words(gold):
            return 0.0  # a part is paid in full, and the rest is not the gold's own words: junk, or a hedge
        if scores[0] >= 1.0 and task not in GRAMMARS and wrapped(answer, gold):
            return 0.0  # the scorer found the gold inside other words: simplify(<gold>), "the answer is <gold>"
        return min(max(scores[0], 0.0), 1.0)

    def _dataset(self, dataset, address: tuple) -> str | None:
        """The dataset pickled for the child, once per address; None where it does not pickle small (the child
        builds it from its address)."""
        with self._lock:
            if address not in self._payloads:
                try:
                    kept = pickle.dumps(dataset)
                    self._payloads[address] = base64.b64encode(kept).decode() if len(kept) <= PAYLOAD_BYTES else None
                except Exception:  # noqa: BLE001 - a lambda in its config: the child builds it
                    self._payloads[address] = None
            return self._payloads[address]

    def _ask(self, request: str) -> list[float] | None:
        try:
            with self.sandbox.session(_PROGRAM, self.timeout) as session:
                answer = session.ask(request, self.timeout)
                ended = session.ended
        except SandboxFailed:
            answer, ended = None, "the sandbox failed"
        with self._lock:
            self.stats["scored"] += 1
            self.stats["timed_out"] += answer is None and ended is not None and "timed out" in ended
        try:
            scores = json.loads(answer) if answer else None
            return [float(s) for s in scores] if isinstance(scores, list) else None
        except (ValueError, TypeError):
            return None


def words(text: str) -> list[str]:
    """The text's parts, as CUTS separates them."""
    return [word for word in CUTS.split(text) if word]


def wrapped(answer: str, gold: str) -> bool:
    """Whether the answer is the gold with letters around it (a scorer that searches its answer for the gold pays
    that; one that reads the answer whole does not)."""
    answer, gold = " ".join(answer.split()), " ".join(gold.split())
    return bool(gold) and answer != gold and gold in answer and LETTER.search(answer.replace(gold, "", 1)) is not None


def refused(answer: str, gold: str, task: str, entry: dict) -> str:
    """Why the rubric pays `answer` nothing before any scorer sees it, or '': a non-finite number, a numeral too
    long, or (GRAMMARS) an expression outside the task's form."""
    non_finite = {word.lower() for word in NON_FINITE.findall(answer)} - {w.lower() for w in NON_FINITE.findall(gold)}
    if non_finite:
        return f"names a number that is not finite ({', '.join(sorted(non_finite))})"
    longest_gold = max((len(n) for n in NUMERAL.findall(gold)), default=0)
    for numeral in NUMERAL.findall(answer):
        if len(numeral) > max(MAX_NUMERAL, longest_gold) or not math.isfinite(float(numeral.replace("_", "")
                                                                                       or 0)):
            return "a numeral beyond any finite answer"
    if task in GRAMMARS:
        operators, constants, functions, integers_only = GRAMMARS[task]
        try:
            arithmetic.admit(answer, operators, set(constants) | names(entry), functions, integers_only)
        except arithmetic.NotAllowed as err:
            return str(err)
    return ""


def names(entry: dict) -> set[str]:
    """The item's own symbols (polynomial_multiplication's variables, an integral's variable)."""
    metadata = entry.get("metadata") or {}
    found = metadata.get("variables") or []
    found = [found] if isinstance(found, str) else list(found)
    if isinstance(metadata.get("variable"), str):
        found.append(metadata["variable"])
    return {str(name) for name in found}
