"""Reading and comparing answers: the text a reward judges (the last assistant message), the answer in it (<answer>,
\\boxed, GSM8K's '####', one number), and whether it equals the gold answer as a whole (`answers_match`: a fast exact
path for numbers, math-verify in a killable child process for other expressions, within a per-batch time budget).
rewards.py's correctness rewards use these; a reward of your own can too."""

import math
import re
import time
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

from grpo_recipes.math_verify_process import MathVerifyProcess



def completion_text(completion) -> str:
    """The text a reward should judge: the last assistant message of a chat completion, or a plain-string completion.

    Anything else (None, numbers, malformed messages) reads as "" so that it earns nothing instead of crashing.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role") == "assistant":
                return content_text(message.get("content"))
    return ""


def content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal-style content: [{"type": "text", "text": ...}, ...]
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def after_thinking(text: str, think_tag: str = "think") -> str:
    """The text after the last `</think>`, where thinking models put their final answer; all of it when it does not
    think, and "" when its thinking never ended (cut off by the token budget: an answer in there is not final)."""
    if f"</{think_tag}>" in text:
        return text.rsplit(f"</{think_tag}>", 1)[-1]
    return "" if f"<{think_tag}>" in text else text


@lru_cache(maxsize=64)
def _block_pattern(tag: str) -> re.Pattern:
    return re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL)


def _outside_reasoning(text: str, reasoning_tag: str) -> str:
    """`text` with its one reasoning block cut out, so that tags written inside the reasoning don't count."""
    if text.count(f"<{reasoning_tag}>") == 1 and text.count(f"</{reasoning_tag}>") == 1:
        return _block_pattern(reasoning_tag).sub(" ", text)
    return text


def extract_xml_answer(text: str, answer_tag: str = "answer", reasoning_tag: str = "reasoning") -> str | None:
    """The stripped content of the single `<answer>…</answer>` block outside the reasoning, else None.

    None when there is no answer block, when there are several (a model must commit to one answer), or when a stray
    opening or closing tag makes the structure ambiguous. A thinking model's `<think>` block never counts, even for
    a template TRL cannot parse it out of (see after_thinking).
    """
    rest = _outside_reasoning(after_thinking(text), reasoning_tag)
    if rest.count(f"<{answer_tag}>") != 1 or rest.count(f"</{answer_tag}>") != 1:
        return None
    block = _block_pattern(answer_tag).search(rest)
    return block.group(1).strip() if block else None


def extract_boxed_answer(text: str) -> str | None:
    r"""The content of the single `\boxed{…}` in text (nested braces allowed), else None (none, several, unclosed)."""
    starts = [m.end() for m in re.finditer(r"\\boxed\s*\{", text)]
    if len(starts) != 1:
        return None
    depth = 1
    for i in range(starts[0], len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[starts[0]:i].strip()
    return None


def extract_hash_answer(text: str) -> str | None:
    """GSM8K's gold answer: the text after '####', thousands separators removed ('#### 1,800' -> '1800')."""
    if not isinstance(text, str) or "####" not in text:
        return None
    return text.split("####")[-1].strip().replace(",", "")


# A number as people write it: optional sign, ASCII digits, thousands separators, decimals. A token with commas must
# group them by three ('1,800'); '17,18,19' and '1,80' are not numbers. Other scripts' digits ('١٨') are not read.
_NUMBER_TOKEN = re.compile(r"-?\d[\d,]*(?:\.\d+)?", re.ASCII)
_GROUPED_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)


def number_tokens(text: str) -> list[str]:
    return [token.rstrip(",") for token in _NUMBER_TOKEN.findall(text)]


def parse_number(text: str | None) -> float | None:
    r"""The one number in a short answer, ignoring units and wrappers: '$18', '18 dollars', '\boxed{18}', '1,800'.

    None when the text holds no number or more than one ('17, 18, 19', '2 + 2 = 4'): a list of candidates is not an
    answer.
    """
    if not isinstance(text, str) or len(text) > 1000:
        return None
    numbers = number_tokens(text.replace("\u2212", "-"))  # U+2212 is a minus sign too: '−18' is not 18
    if len(numbers) != 1 or ("," in numbers[0] and not _GROUPED_NUMBER.fullmatch(numbers[0])):
        return None
    value = float(numbers[0].replace(",", ""))
    return value if math.isfinite(value) else None


# ------------------------------------------------------------------------------------------------------ equivalence
# answers_match credits a prediction only when the WHOLE answer is one expression equal to the gold. Both sides are
# first read the same way (`read_answer`): delimiters, \boxed, \left/\right, spacing and thousands separators go; a
# trailing unit is split off (and must not change the value: '5 thousand' is not 5); a leading `x =` goes. Then:
# equal text, or two plain numbers compared exactly (fast path), or math-verify on one LaTeX expression each, checked
# to have read all of it (slow path). Before the slow path, anything that makes the answer more than one expression is
# refused: prose, lists, `\pm`, dots, relations or separators the gold does not have.

VERIFY_STATS: Counter = Counter()  # how answers_match decided: fast, slow, rejected; timeout, over_budget
MAX_ANSWER_CHARS = 200  # longer is not one final answer
# Seconds one reward call (one batch) may spend on the slow path; answers past it are not equal ("over_budget").
# math-verify gives up on one side after math_verify_process.PARSE_SECONDS, counted as "timeout".
SLOW_PATH_SECONDS_PER_BATCH = 10.0
_SLOW_PATH_DEADLINE: ContextVar[float | None] = ContextVar("slow_path_deadline", default=None)


@contextmanager
def slow_path_budget(seconds: float | None = None):
    """Within it, answers_match spends at most `seconds` (SLOW_PATH_SECONDS_PER_BATCH) in all on math-verify: the
    correctness rewards score each batch inside one, so degenerate answers cannot stall a training step."""
    token = _SLOW_PATH_DEADLINE.set(time.monotonic() + (SLOW_PATH_SECONDS_PER_BATCH if seconds is None else seconds))
    try:
        yield
    finally:
        _SLOW_PATH_DEADLINE.reset(token)

# Non-ASCII a model may write for LaTeX; any other (√, ², ½, other scripts' digits) makes an answer unreadable here.
_UNICODE_MATH = {"\u2212": "-", "\u2013": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u00d7": r"\times ",
                 "\u00f7": r"\div ", "\u22c5": r"\cdot ", "\u00b7": r"\cdot ", "\u03c0": r"\pi ", "\u2264": r"\le ",
                 "\u2265": r"\ge ", "\u2260": r"\ne ",
                 "\u00b0": r"^\circ", "\u20ac": r"\euro ", "\u00a3": r"\pound ", "\u221e": r"\infty "}
_THOUSANDS = re.compile(r"(?<![\d.])([1-9]\d{0,2}(?:,\d{3})+)(?![\d,]|\.\d*,)", re.ASCII)  # '1,800' (not '0,111')
# 32,\!349  32,\! 349  14{,}916  1\,000  1~000: LaTeX's thousands separators, a digit group of three after each
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\\[,;:! ]|\{\\,\}|~)\s*(?=\d{3}(?!\d))")
_SPACE_THOUSANDS = re.compile(r"(?<![\d.,] )(?<![\d.,])[1-9]\d{0,2}(?: \d{3})+(?:\.\d+)?(?![\d,.]| \d)", re.ASCII)
_CURRENCY_CODE = re.compile(r"^(USD|US|EUR|GBP|INR|Rs\.?)\s*(?=[\d.])")  # 'USD 18', 'Rs. 18' ('US$ 18' reads 'US 18')
_CURRENCY_CODES = {"USD": "$", "US": "$", "EUR": "€", "GBP": "£", "INR": "rs", "Rs": "rs", "Rs.": "rs"}
_MATH_DELIMITER = re.compile(r"(?<!\\)\$+|\\[()\[\]]")
_SPACING = re.compile(r"\\(?:[,;:! ]|quad|qquad|enspace|thinspace)|~")
_SIZING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)[lr]?(?![A-Za-z])|\\displaystyle|\\textstyle")
_TEXT_COMMAND = re.compile(r"\\(?:textbf|textrm|textit|textnormal|mbox|mathrm|mathbf|mathit|rm|text)\s*(?=\{)")
# What may stand left of the one '=' of an answer and be dropped: 'x = 5', 'a_1 = 5', 'f(x) = 5', '(p, q) = (3, 2)'.
# A gold answer (trusted) may name anything there without digits: '|AB| = 1', 'V_{1}:V_{2} = 11:21'.
_ASSIGNMENT = re.compile(r"^(?:[A-Za-z](?:_\{?\w+\}?)?(?:\([A-Za-z]\))?|\([A-Za-z](?:,[A-Za-z])*\))(?:=(?=[^=]+$)|\\in"
                         r"(?![A-Za-z]))", re.ASCII)
_NAMED = re.compile(r"^([^=,;]+)=(?=[^=]+$)")
_CURRENCY = {r"\$": "$", r"\euro": "€", r"\pound": "£"}
_PERCENT = re.compile(r"\s*(?:\\%|%|(?<=[\d\s])per ?cent|\\text\{\s*per ?cent\s*\})$")
_DEGREES = re.compile(r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree)$")
_UNIT_TEXT = re.compile(r"\s*(?:\\text\{([^{}]*)\}|(?<=[\d}\s])([A-Za-z][A-Za-z ./-]*?))(\^\{?[23]\}?)?$", re.ASCII)
# Units shorter than three letters are read only from this list: '5x' and '5 ab' are products, not units.
_SHORT_UNITS = {"cm", "mm", "km", "kg", "mg", "ml", "ft", "in", "lb", "oz", "mi", "hr", "yd", "sq", "m2", "rs"}
_RATE_LETTERS = {"h", "s", "m", "g", "l", "d"}  # read as units only in a rate: 'km/h', 'm/s', 'g/l', 'l/d'
# Words that change what the number means, so they can never be a unit: '5 thousand' is not 5, 'not 5' is not 5.
_NOT_UNITS = set("""
zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen
eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion trillion
dozen score lakh crore bn mn mil bil k grand gross myriad thousandth hundredth tenth half halves third quarter fourth
fifth sixth seventh eighth ninth squared cubed square cube root factorial times plus minus over divided by power less
more fewer than least most about approx approximately around roughly nearly almost under above below at or and then
not no never nope wrong incorrect false except but instead maybe perhaps possibly either neither nor to from between
per each negative positive th st nd rd""".split())  # noqa: SIM905 - a word list reads better as words
_WORDS = re.compile(r"[A-Za-z]+", re.ASCII)
_FUNCTION_NAMES = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
                   "log", "ln", "exp", "sqrt", "pi", "infty", "inf", "gcd", "lcm", "max", "min", "det", "mod"}
_RELATIONS = re.compile(r"<|>|=|\\(?:le|leq|ge|geq|lt|gt|ne|neq|leqslant|geqslant|approx|sim|simeq|equiv|cong|"
                        r"propto|in|notin|ni|subset|subseteq|supset|supseteq|to|rightarrow|Rightarrow|implies|iff|"
                        r"Leftrightarrow|mid)(?![A-Za-z])")
# Marks a prediction may use only where the gold does: separators of several answers, '\pm', dots, a base ('5_{8}').
_ONLY_WHERE_GOLD_HAS = re.compile(r"[,;&']|\\\\|\\(?:pm|mp|ldots|cdots|dots|vdots|lor|vee|land|wedge|cup|cap|prime)"
                                  r"(?![A-Za-z])|\.\.|(?<=\d)_")
PLAIN_NUMBER = re.compile(r"([+-]?)((?:\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d{1,3})?)", re.ASCII)  # '1.6e3' too
_PLAIN_FRACTION = re.compile(r"([+-]?)(?:\\frac(?:\{(\d+)\}|(\d))(?:\{(\d+)\}|(\d))|(\d+)\s*/\s*(\d+))", re.ASCII)


def _tidy(text: str) -> str | None:
    """An answer without the wrapping that does not change its value, or None if it cannot be one answer."""
    text = "".join(_UNICODE_MATH.get(ch, ch) for ch in text)
    text = text.replace(">=", r"\ge ").replace("<=", r"\le ").replace("!=", r"\ne ")
    if not text.isascii():
        return None
    delimiters = _MATH_DELIMITER.findall(text)
    if len(delimiters) > 2:  # '$5$ or $6$': several math segments
        return None
    text = _MATH_DELIMITER.sub(" ", text)  # one segment: '$28$ percent' reads as '28 percent'
    for _ in range(4):  # wrappers nest: '**\boxed{18}**.'
        text = text.strip().strip("*_").strip()
        text = text[:-1] if text.endswith(".") and not text.endswith("..") else text  # a full stop, not '5...'
        if re.fullmatch(r"\\(?:boxed|fbox)\s*\{.*\}", text, re.DOTALL):
            text = extract_boxed_answer(text.replace(r"\fbox", r"\boxed"))
            if text is None:
                return None
    text = _SIZING.sub("", text).replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac").replace(r"\cfrac", r"\frac")
    if text.lstrip().startswith("~"):  # '~18': approximately 18 is not an answer ('about 18' is not either)
        return None
    text = _SPACING.sub(" ", _LATEX_THOUSANDS.sub(",", text))
    text = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), _TEXT_COMMAND.sub(r"\\text", text))
    text = re.sub(r"(?<![\d.])\.(?=\d)", "0.", text)  # '.5' is 0.5
    text = re.sub(r"\s+", " ", text).strip()
    text = _SPACE_THOUSANDS.sub(lambda m: m.group().replace(" ", ""), text)  # '1 000 000'
    if re.search(r"\d \.?\d", text):  # '5 6': two numbers
        return None
    return re.sub(r" (?=[^A-Za-z0-9])|(?<=[^A-Za-z0-9]) ", "", text)  # spaces matter only between two words


def _is_unit(words: str) -> bool:
    """A unit ('miles', 'cm^2'), or a rate of two ('km/h', 'm/s', 'miles per hour'; single letters only there)."""
    parts = re.split(r"\s*/\s*|(?:^|\s+)per\s+", words.strip().lower())
    if len(parts) == 2:
        return all(_unit_words(part, _SHORT_UNITS | _RATE_LETTERS) for part in parts if part) and bool(parts[1])
    return _unit_words(words.lower(), _SHORT_UNITS)


def _unit_words(words: str, short: set) -> bool:
    names = _WORDS.findall(words)
    return 0 < len(names) <= 4 and all((len(name) >= 3 or name in short) and not {
        name, name.removesuffix("s")} & _NOT_UNITS for name in names)  # 'lakhs' is 'lakh'


def _split_unit(text: str) -> tuple[str, str]:
    """(the expression, its unit): '\\$5' -> ('5', '$'), '125\\text{ miles}' -> ('125', 'mile'), '5x' -> ('5x', '')."""
    for prefix, unit in _CURRENCY.items():
        if text.startswith(prefix):
            return text[len(prefix):].strip(), unit
    if code := _CURRENCY_CODE.match(text):
        return text[code.end():].strip(), _CURRENCY_CODES[code.group(1)]
    for pattern, unit in ((_PERCENT, "%"), (_DEGREES, "°")):
        if pattern.search(text):
            return pattern.sub("", text), unit
    found = _UNIT_TEXT.search(text)
    words = found and (found.group(1) if found.group(1) is not None else found.group(2))
    if found and found.start() > 0 and _is_unit(words):
        names = [name.removesuffix("s") for name in _WORDS.findall(words.lower())]
        unit = {"dollar": "$", "euro": "€", "pound": "£", "degree": "°", "percent": "%", "pct": "%",
                "percentage": "%"}.get(" ".join(names))
        return text[:found.start()].strip(), unit or " ".join(names) + (found.group(3) or "").replace("{", "")
    return text, ""


class _Answer(NamedTuple):
    expression: str  # '\frac{1}{2}', '125', '2x-3'
    unit: str  # '', '%', '°', '$', 'mile', 'cm^2'
    name: str  # what stood left of '=': 'x' in 'x = 5'


def read_answer(text, is_gold: bool = False) -> _Answer | None:
    """An answer as answers_match compares it, or None when it is not one answer."""
    if text is None or len(str(text)) > MAX_ANSWER_CHARS * 5:
        return None
    tidy = _tidy(str(text))
    if not tidy:
        return None
    expression, unit = _split_unit(tidy)
    named = _NAMED.match(expression) if is_gold else None
    if not (named and not re.search(r"\d", re.sub(r"_\{?\w+\}?", "", named.group(1)))):
        named = _ASSIGNMENT.match(expression)
    name = named.group().removesuffix("=").removesuffix("\\in") if named else ""
    expression = expression[named.end():] if named else expression
    if expression.startswith("\\text{") and expression.endswith("}") and expression.count("{") == 1:
        expression = expression[6:-1].strip()  # a text answer: '\text{Evelyn}', '\text{(C)}'
    return _Answer(expression, unit, name) if expression else None


def plain_value(expression: str) -> Fraction | None:
    """The exact value of a plain number or a fraction of two integers ('18', '-0.5', '\\frac{1}{2}', '3/4')."""
    if number := PLAIN_NUMBER.fullmatch(expression):
        return Fraction(number.group(1) + number.group(2))
    if fraction := _PLAIN_FRACTION.fullmatch(expression):
        sign, *parts = fraction.groups()
        numerator, denominator = [int(p) for p in parts if p is not None]
        return Fraction(-numerator if sign == "-" else numerator, denominator) if denominator else None
    return None


def _is_prose(expression: str) -> bool:
    """Words beyond single-letter variables and function names: 'the answer is 5', '5 or 6', '5\\text{ thousand}'."""
    return any(word not in _FUNCTION_NAMES for word in re.findall(r"(?<![\\A-Za-z])[A-Za-z]{2,}",
                                                                   re.sub(r"\\[A-Za-z]+", " ", expression)))


def _units_agree(predicted: str, gold: str) -> bool:
    return not predicted or not gold or predicted == gold  # a unit the gold leaves implicit is not checked


def _percent_of(gold: Fraction) -> Fraction:
    """What 1% of a percent answer is worth against this plain gold: one reading per gold, never two. Below 1 in
    absolute value the gold is a fraction (75% is 0.75); otherwise the answer is the number (18% is 18)."""
    return Fraction(1, 100) if abs(gold) < 1 else Fraction(1)


def _values_agree(predicted: Fraction, predicted_unit: str, gold: Fraction, gold_unit: str) -> bool:
    if predicted_unit == "%" and gold_unit != "%":
        return predicted * _percent_of(gold) == gold
    return predicted == gold  # a percent gold with a bare number: the unit left implicit ('28' for 28%)


def answers_match(predicted: str | None, gold) -> bool:
    r"""Whether a predicted answer, as a whole, is one expression mathematically equal to the gold one.

    Equal: '18', '18.0', '$18', '18 dollars', '\boxed{18}', '1,800' (gold 1800), '.5' and '\frac12' (gold 0.5),
    '\frac{36}{2}', '2 * 9', '\sqrt{324}' (gold 18), 'x = \frac{1}{2}', '125\text{ miles}', '90^\circ' (gold 90),
    '18\%' (gold 18), '75\%' (gold 0.75: one reading of a percent per gold, a fraction below 1), '32,\! 349',
    '1 000' (gold 1000), '1.6e3' (gold 1600), '60 km/h', 'USD 18', symbolic answers ('\pi', 'y+x' for 'x+y'), tuples
    and intervals when the gold is one. Never equal: several answers ('17, 18', '17 or 18', '\pm 3', '17 \\ 18'),
    prose around a number ('the answer is 18', 'AZYUK2A'), a relation the gold does not have ('x < 5' for 5 or for
    'x > 5'), a different value ('5!', '2\sqrt{3}' for 2, '5\text{ thousand}' for 5, '0,111' for 111, '1800\%' for
    18), an approximation ('~18'), units that differ from the gold's. Plain numbers are compared exactly in-process
    (fast path); other expressions go to math-verify (slow path), in a killable child process, which must read the
    whole answer, within the batch's slow_path_budget. Answers over MAX_ANSWER_CHARS are never one answer.
    """
    if not isinstance(predicted, str) or gold is None or len(predicted) > MAX_ANSWER_CHARS:
        return False
    simple, simple_gold = PLAIN_NUMBER.fullmatch(predicted.strip()), PLAIN_NUMBER.fullmatch(str(gold).strip())
    if simple and simple_gold:  # GSM8K's common case, before any other reading: '18' against '18'
        VERIFY_STATS["fast"] += 1
        return Fraction(simple.group()) == Fraction(simple_gold.group())
    read_predicted, read_gold = read_answer(predicted), read_answer(gold, is_gold=True)
    if read_predicted is None or read_gold is None:
        VERIFY_STATS["rejected"] += 1
        return False
    (expression, unit, name), (gold_expression, gold_unit, gold_name) = read_predicted, read_gold
    if not _units_agree(unit, gold_unit) or (name and gold_name and name != gold_name):  # 'y = 5' for 'x = 5'
        VERIFY_STATS["rejected"] += 1
        return False
    value, gold_value = plain_value(expression), plain_value(gold_expression)
    if value is not None and gold_value is not None:
        VERIFY_STATS["fast"] += 1
        return _values_agree(value, unit, gold_value, gold_unit)
    if expression == gold_expression or _is_prose(gold_expression):  # text answers ('Evelyn') are compared as text
        VERIFY_STATS["fast"] += 1
        return expression.casefold() == gold_expression.casefold() and unit in ("", gold_unit)
    allowed = {m.group() for m in _ONLY_WHERE_GOLD_HAS.finditer(gold_expression)}
    if _RELATIONS.search(gold_expression) or r"\pm" in allowed:  # '0 < x < 1' is '(0,1)'; '\pm 2' is '\{-2, 2\}'
        allowed |= {",", r"\cup"}
    if (_is_prose(expression) or len(_RELATIONS.findall(expression)) > len(_RELATIONS.findall(gold_expression))
            or any(m.group() not in allowed for m in _ONLY_WHERE_GOLD_HAS.finditer(expression))):
        VERIFY_STATS["rejected"] += 1  # more than one expression, or a relation the gold lacks
        return False
    deadline = _SLOW_PATH_DEADLINE.get()
    left = MATH_VERIFY.timeout if deadline is None else deadline - time.monotonic()
    if left <= 0:
        VERIFY_STATS["over_budget"] += 1  # this batch spent its slow-path time: not equal
        return False
    VERIFY_STATS["slow"] += 1
    # Percents, one reading per gold (see _percent_of): math-verify itself would credit both 18% and 1800% for 18.
    scale = "percent" if unit == "%" and gold_unit != "%" else ""
    return _math_verify_equal(expression, gold_expression, scale, min(left, MATH_VERIFY.timeout)) is True


def _math_verify_equal(predicted: str, gold: str, scale: str, timeout: float) -> bool | None:
    result = _math_verify_cached(predicted, gold, scale, timeout)
    if result is None:
        VERIFY_STATS["timeout"] += 1
    return result


@lru_cache(maxsize=8192)  # a group of completions often repeats an answer; a hang is cached too, not retried
def _math_verify_cached(predicted: str, gold: str, scale: str, timeout: float) -> bool | None:
    return MATH_VERIFY.equal(predicted, gold, scale, timeout)


MATH_VERIFY = MathVerifyProcess()  # started on first use, in each process that compares


@lru_cache(maxsize=4096)
def readable_gold(gold: str | None) -> bool:
    """Whether a gold answer can be compared at all (answers_match reads it as one answer); the correctness rewards
    give None, no opinion, where it cannot, as TRL's accuracy_reward does."""
    return isinstance(gold, str) and read_answer(gold, is_gold=True) is not None


def gold_text(gold) -> str | None:
    """Gold answers may be GSM8K solutions ('... #### 1,800'), numbers, or expression strings."""
    if isinstance(gold, str) and "####" in gold:
        return extract_hash_answer(gold)
    return None if gold is None else str(gold)


# Arithmetic left to do: an operator between two numbers, a root or a power; a fraction is judged on its own below.
_UNDONE_ARITHMETIC = re.compile(r"[\d.)}]\s*(?:[-+*×·÷^]|\*\*|\\times|\\cdot|\\div)\s*[\d.(\\{]|\\sqrt|[\d)}]\s*!|"
                                r"\\binom|\\choose|\\d?binom")


def arithmetic_left_undone(predicted: str) -> bool:
    r"""Whether an answer still holds arithmetic to do: '150 - 45', '2 * 9', '3^2', '\sqrt{324}', '\frac{36}{2}', '5!',
    '\binom{5}{2}'.

    A fraction in lowest terms ('1/2', '\frac{3}{4}') is a final answer; '36/2' or '\frac{4}{2}' is not. A sign
    ('-5'), thousands separators ('1,800'), units and LaTeX wrapping are not arithmetic."""
    if len(predicted) > MAX_ANSWER_CHARS:  # never one answer (answers_match), and no regex time on megabytes
        return True
    text = predicted.replace(",", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if _UNDONE_ARITHMETIC.search(text):
        return True
    for fraction in _PLAIN_FRACTION.finditer(text):
        numerator, denominator = [int(g) for g in fraction.groups()[1:] if g is not None]
        if denominator in (0, 1) or math.gcd(numerator, denominator) != 1:
            return True
    return False
