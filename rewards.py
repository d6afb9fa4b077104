"""The rubric library every recipe imports: parsers and reward functions in TRL's reward signature.

A reward function is `f(completions, **kwargs) -> list[float | None]`, one value per completion. `completions` are
chat message lists (or plain strings for non-chat datasets); dataset columns such as `answer` arrive as keyword
lists of the same length. In a multi-turn completion the final answer is the LAST assistant message.

Rules every function here keeps, tested in tests/test_rewards.py:
- it never raises and returns exactly one float per completion, whatever the model wrote;
- it pays for one thing, named in its `__name__` (TRL logs `rewards/<name>/mean`), in the range its docstring says;
- with the recipe's weights, no adversarial completion (several answers, answer lists, tags in the wrong place,
  answer hidden in the reasoning, trailing garbage, giant or empty outputs) scores as high as a genuine correct,
  well-formatted one: doing the task must be easier than gaming the score.
"""

import math
import re
import warnings

# ---------------------------------------------------------------------------------------------------------- parsers


def completion_text(completion) -> str:
    """The text a reward should judge: the last assistant message of a chat completion, or a plain-string completion.

    Anything else (None, numbers, malformed messages) reads as "" so that it earns nothing instead of crashing.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role") == "assistant":
                return _content_text(message.get("content"))
    return ""


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal-style content: [{"type": "text", "text": ...}, ...]
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _blocks(text: str, tag: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)


def _outside_reasoning(text: str, reasoning_tag: str) -> str:
    """`text` with its one reasoning block cut out, so that tags written inside the reasoning don't count."""
    if text.count(f"<{reasoning_tag}>") == 1 and text.count(f"</{reasoning_tag}>") == 1:
        return re.sub(rf"<{reasoning_tag}>.*?</{reasoning_tag}>", " ", text, flags=re.DOTALL)
    return text


def extract_xml_answer(text: str, answer_tag: str = "answer", reasoning_tag: str = "reasoning") -> str | None:
    """The stripped content of the single `<answer>…</answer>` block outside the reasoning, else None.

    None when there is no answer block, when there are several (a model must commit to one answer), or when a stray
    opening or closing tag makes the structure ambiguous.
    """
    rest = _outside_reasoning(text, reasoning_tag)
    if rest.count(f"<{answer_tag}>") != 1 or rest.count(f"</{answer_tag}>") != 1:
        return None
    blocks = _blocks(rest, answer_tag)
    return blocks[0].strip() if len(blocks) == 1 else None


def extract_hash_answer(text: str) -> str | None:
    """GSM8K's gold answer: the text after '####', thousands separators removed ('#### 1,800' -> '1800')."""
    if not isinstance(text, str) or "####" not in text:
        return None
    return text.split("####")[-1].strip().replace(",", "")


# A number as people write it: optional sign, digits, thousands separators, decimals. A token with commas must group
# them by three ('1,800'); '17,18,19' and '1,80' are not numbers.
_NUMBER_TOKEN = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_GROUPED_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def parse_number(text: str | None) -> float | None:
    """The one number in a short answer, ignoring units and wrappers: '$18', '18 dollars', '\\boxed{18}', '1,800'.

    None when the text holds no number or more than one ('17, 18, 19', '2 + 2 = 4'): a list of candidates is not an
    answer.
    """
    if not isinstance(text, str) or len(text) > 1000:
        return None
    numbers = [token.rstrip(",") for token in _NUMBER_TOKEN.findall(text)]
    if len(numbers) != 1 or ("," in numbers[0] and not _GROUPED_NUMBER.fullmatch(numbers[0])):
        return None
    value = float(numbers[0].replace(",", ""))
    return value if math.isfinite(value) else None


def numbers_equal(predicted: float | None, gold: float | None) -> bool:
    """Numeric equality with a relative tolerance for float noise (18 == 18.0; 0.1 + 0.2 == 0.3)."""
    if predicted is None or gold is None:
        return False
    return math.isclose(predicted, gold, rel_tol=1e-9, abs_tol=1e-9)


# ---------------------------------------------------------------------------------------------------------- rewards


def _safely(score, *args) -> float:
    """Run one scorer; a bug in it costs that completion its reward (with a warning), never the training run."""
    try:
        return float(score(*args))
    except Exception as err:  # noqa: BLE001 - the training run must survive any completion
        warnings.warn(f"{score.__qualname__} failed on one completion and gave it 0.0: {err!r}", RuntimeWarning)
        return 0.0


def correctness_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the single answer block holds a number equal to the gold answer, else 0.0.

    Gold answers may be GSM8K solutions ('... #### 1,800') or bare numbers. Gaming it: listing several numbers, writing
    several answer blocks, or hiding the answer in the reasoning all earn 0.0, so guessing does not pay.
    """
    def score(completion, gold) -> float:
        gold_text = extract_hash_answer(gold) if isinstance(gold, str) and "####" in gold else gold
        gold_value = parse_number(str(gold_text)) if gold_text is not None else None
        predicted = parse_number(extract_xml_answer(completion_text(completion)))
        return 1.0 if numbers_equal(predicted, gold_value) else 0.0

    return [_safely(score, c, gold) for c, gold in zip(completions, answer, strict=True)]


def integer_answer_reward(completions, **kwargs) -> list[float]:
    """1.0 when the single answer block is a bare integer ('18', '-3'), else 0.0.

    Teaches the answer format GSM8K grades. Gaming it: any integer earns it, right or wrong, so its weight must stay
    well below correctness.
    """
    def score(completion) -> float:
        answer = extract_xml_answer(completion_text(completion))
        return 1.0 if answer is not None and re.fullmatch(r"-?\d+", answer) else 0.0

    return [_safely(score, c) for c in completions]


def strict_format_reward(completions, reasoning_tag="reasoning", answer_tag="answer", **kwargs) -> list[float]:
    """1.0 when the completion is exactly the system prompt's template, else 0.0.

    Template: `<reasoning>\\n…\\n</reasoning>\\n<answer>\\n…\\n</answer>`, each tag once, both blocks non-empty,
    nothing before or after (surrounding whitespace is fine: the gist's version demanded a trailing newline and its
    regexes without DOTALL never matched multi-line reasoning). Gaming it: an empty-minded but well-formed completion
    earns it, so it is worth little next to correctness.
    """
    r, a = reasoning_tag, answer_tag
    pattern = re.compile(rf"<{r}>\n(?P<reasoning>.+?)\n</{r}>\n<{a}>\n(?P<answer>.+?)\n</{a}>", re.DOTALL)

    def score(completion) -> float:
        text = completion_text(completion).strip()
        match = pattern.fullmatch(text)
        if not match or not _each_tag_once(text, r, a):
            return 0.0
        return 1.0 if match["reasoning"].strip() and match["answer"].strip() else 0.0

    return [_safely(score, c) for c in completions]


def soft_format_reward(completions, reasoning_tag="reasoning", answer_tag="answer", **kwargs) -> list[float]:
    """1.0 when one reasoning block is followed by one answer block, with any whitespace, else 0.0.

    Looser than strict_format_reward (no newline rules; text before or after is allowed) so a model gets a signal
    before it masters the exact template. Gaming it: like strict_format_reward, it pays for form only.
    """
    r, a = reasoning_tag, answer_tag
    pattern = re.compile(rf"<{r}>.*?</{r}>\s*<{a}>.*?</{a}>", re.DOTALL)

    def score(completion) -> float:
        text = completion_text(completion)
        return 1.0 if _each_tag_once(text, r, a) and pattern.search(text) else 0.0

    return [_safely(score, c) for c in completions]


def xml_tag_count_reward(completions, reasoning_tag="reasoning", answer_tag="answer", **kwargs) -> list[float]:
    """Partial credit in [0, 1]: 0.25 for each of the four tags that appears exactly once, minus 0.25 for text after
    the closing answer tag (floored at 0).

    A dense signal for a model still learning the tags. Gaming it: repeating a tag earns nothing for that tag (the
    gist's version could be farmed that way), and the trailing-text penalty is bounded, unlike the gist's, which could
    subtract a whole completion's length.
    """
    tags = [f"<{reasoning_tag}>", f"</{reasoning_tag}>", f"<{answer_tag}>", f"</{answer_tag}>"]

    def score(completion) -> float:
        text = completion_text(completion)
        credit = 0.25 * sum(text.count(tag) == 1 for tag in tags)
        closing = f"</{answer_tag}>"
        if closing in text and text.rsplit(closing, 1)[1].strip():
            credit -= 0.25
        return max(credit, 0.0)

    return [_safely(score, c) for c in completions]


def _each_tag_once(text: str, *tag_names: str) -> bool:
    return all(text.count(f"<{t}>") == 1 and text.count(f"</{t}>") == 1 for t in tag_names)
