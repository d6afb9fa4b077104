"""grpo_recipes/answers.py: reading the answer in a completion, and whether it equals the gold one as a whole: the
spellings of one value are equal, lists, guesses and near misses are not, and math-verify's slow path is bounded.
(The rewards that use it, and their ceilings for a wrong answer, are tested in test_rewards.py and the recipes'.)"""

import pytest

import rewards
from grpo_recipes import answers, math_verify_process


def chat(text):
    return [{"role": "assistant", "content": text}]


def answer_block(inner: str) -> str:
    return f"<reasoning>\nworking\n</reasoning>\n<answer>\n{inner}\n</answer>"


@pytest.mark.parametrize("predicted, gold", [
    ("\\frac{36}{2}", "18"), ("2 * 9", "18"), ("$\\frac{1}{2}$", "\\frac{1}{2}"), ("0.5", "\\frac{1}{2}"),
    ("1/2", "0.5"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("18", "18"), ("1,800", "1800"), ("\\sqrt{324}", "18"),
    ("2^{4} + 2", "18"), ("**18**", "18"), ("18\\%", "18"),
])
def test_answers_match_mathematically_equal_answers(predicted, gold):
    assert answers.answers_match(predicted, gold)


@pytest.mark.parametrize("predicted, gold", [
    ("-18", "18"), ("\u221218", "18"), ("١٨", "18"), ("\\sqrt{323}", "323"), ("17 \\\\ 18", "18"), ("17, 18, 19", "18"),
    ("{17, 18}", "18"), ("17 then 18", "18"), ("18 or 19", "18"),
    ("2+2=4", "18"), ("eighteen", "18"), ("", "18"), (None, "18"), ("18", None), ("1" * 300, "18"),
])
def test_answers_match_refuses_lists_guesses_and_near_misses(predicted, gold):
    assert not answers.answers_match(predicted, gold)


# MATH-style answers: the spellings of one value that must be equal, and wrong answers that share a number with the
# gold, each of which a policy could learn to write (a reward hack if it paid).
MATH_EQUIVALENTS = [
    ("\\frac13", "\\frac{1}{3}"), ("\\dfrac{1}{3}", "1/3"), ("\\cfrac{1}{3}", "\\frac{1}{3}"), ("\\sqrt3", "\\sqrt{3}"),
    ("\\left(\\frac{1}{3}\\right)", "\\frac{1}{3}"), ("2x-3", "2x-3"), ("-3+2x", "2x-3"),
    ("x = \\frac{1}{2}", "\\frac{1}{2}"),
    ("125\\text{ miles}", "125"), ("\\pi", "\\pi"), ("e", "e"), ("y+x", "x+y"), (".5", "0.5"), ("32,\\!349", "32349"),
    ("14{,}916", "14916"), ("1\\,000", "1000"), ("90^\\circ", "90"), ("90", "90^{\\circ}"), ("28\\%", "28"),
    ("28", "28\\%"), ("28\\%", "0.28"), ("28 percent", "28\\%"), ("\\$5", "5"), ("5 dollars", "\\$5"),
    ("\\sqrt{12}", "2\\sqrt{3}"), ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("[0,1)", "[0,1)"), ("(0,1)", "0<x<1"), ("\\{-2, 2\\}", "\\pm 2"), ("Evelyn", "\\text{Evelyn}"),
    ("\\text{(C)}", "\\text{(C)}"),
    ("f(y) = y", "f(y) = y"), ("1", "|AB| = 1"), ("11:21", "V_{1}:V_{2}=11:21"), ("x \\in [-2,7]", "[-2,7]"),
    ("15\\mbox{ cm}^2", "15\\text{ cm}^2"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("$\\frac{9}{4}\\pi$", "\\frac94\\pi"),
]
MATH_WRONG = [  # (prediction, gold)
    ("2", "2\\sqrt{3}"), ("3", "3\\pi"), ("x < 5", "x > 5"), ("x < 5", "5"), ("x \\ge 5", "x > 5"), ("5!", "5"),
    ("\u221a25", "25"), ("\\sqrt{25}", "25"), ("0.5", "5"), (".5", "5"), ("AZYUK2A", "2"), ("0,111", "111"),
    ("5\\text{ thousand}", "5"), ("5 million", "5"), ("5 dozen", "5"), ("5 squared", "5"), ("5 thirds", "5"),
    ("5h", "5"), ("5x", "5"), ("5 ab", "5"), ("5k", "5"), ("5\\,000", "5"), ("5 \\quad 6", "11"), ("5 6", "56"),
    ("x=5, y=6", "5"), ("\\{17, 18\\}", "18"), ("(17, 18)", "18"), ("5 \\pm 1", "5"), ("5\\ldots", "5"), ("5...", "5"),
    ("5_{8}", "5"), ("5'", "5"), ("f(5)", "5"), ("5 = 5", "5"), ("\\approx 5", "5"), ("about 5", "5"), ("not 5", "5"),
    ("5 or more", "5"), ("5 is wrong", "5"), ("$5$ or $6$", "5"), ("5 \\text{ or } 6", "5"),
    ("\\boxed{5}\\boxed{6}", "5"),
    ("y = 5", "x = 5"), ("5\\text{ km}", "5\\text{ miles}"), ("125 kilometers", "125\\text{ miles}"), ("2x+3", "2x-3"),
    ("x^2", "x^2+1"), ("x^2+1=0", "x^2+1"), ("(2,1)", "(1,2)"), ("(1,2),(3,4)", "(1,2)"), ("[0,1]", "[0,1)"),
    ("0.333", "\\frac{1}{3}"), ("\\frac13, \\frac23", "\\frac{1}{3}"), ("45^\\circ", "90^\\circ"), ("2.8", "28\\%"),
    ("1 + \\frac{1}{e}", "1 - \\frac{1}{e}"), ("D", "\\text{E}"), ("\\sqrt{6}", "2\\sqrt{3}"),
    ("2\\sqrt{3} \\text{ or } 3", "2\\sqrt{3}"),
]


@pytest.mark.parametrize("predicted, gold", MATH_EQUIVALENTS)
def test_answers_match_reads_math_spellings_of_one_value_as_equal(predicted, gold):
    assert answers.answers_match(predicted, gold)


@pytest.mark.parametrize("predicted, gold", MATH_WRONG)
def test_answers_match_never_pays_a_wrong_answer_that_shares_a_number_with_the_gold(predicted, gold):
    assert not answers.answers_match(predicted, gold)
    assert rewards.correctness_reward([chat(answer_block(predicted))], answer=[gold]) == [0.0]
    assert rewards.boxed_correctness_reward([chat(f"<think>x</think> \\boxed{{{predicted}}}")], answer=[gold]) == [0.0]


def test_plain_numbers_never_reach_the_slow_path():
    before = answers.VERIFY_STATS["slow"]
    assert answers.answers_match("$1,800.00", "1800") and not answers.answers_match("17", "18")
    assert answers.VERIFY_STATS["slow"] == before


def test_math_verify_runs_safely_off_the_main_thread_and_in_an_event_loop():
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        predictions = ["\\frac{54}{3}", "3 * 6", "\\frac{1}{2}"] * 4
        results = list(pool.map(lambda p: answers.answers_match(p, "18"), predictions))
    assert results == [True, True, False] * 4

    async def reward_in_event_loop():  # how TRL runs async reward functions
        return rewards.correctness_reward([chat(answer_block("\\frac{72}{4}"))], answer=["\\frac{36}{2}"])

    assert asyncio.run(reward_in_event_loop()) == [1.0]


def test_a_hanging_parse_is_killed_and_the_worker_recovers():
    import time

    worker = math_verify_process.MathVerifyProcess(timeout=1.0)  # not less: the suite runs two tests at once on 2 cores
    assert worker.equal("2 * 9", "18") is True  # warm: the child is up
    start = time.monotonic()
    assert worker.equal("2^{2^{40}}", "18") is None  # math-verify alone would spend its full 2 s here
    assert time.monotonic() - start < 1.9
    assert worker.equal("\\frac{36}{2}", "18") is True  # a fresh child took over


def test_extract_boxed_answer_handles_nesting_and_refuses_several_boxes():
    assert answers.extract_boxed_answer("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert answers.extract_boxed_answer("\\boxed{1} or \\boxed{2}") is None
    assert answers.extract_boxed_answer("\\boxed{unclosed") is None


# ------------------------------------------------------------------------------- percents, separators, rates, cost
def percent_pairs():
    """(prediction, gold, right?) over golds below and above 1, each percent written at the right and wrong scales."""
    pairs = []
    for gold in ("0.75", "0.05", "-0.4", "0", "1", "18", "250", "12.5", "-3"):
        value = float(gold)
        right = f"{value * 100:g}%" if abs(value) < 1 else f"{value:g}%"
        wrong = {f"{value:g}%", f"{value * 100:g}%", f"{value / 100:g}%", f"{value * 10000:g}%"} - {right}
        pairs += [(right, gold, True), (right.replace("%", "\\%"), gold, True),
                  (right.replace("%", " percent"), gold, True)]
        pairs += [(w, gold, False) for w in sorted(wrong)]
    return pairs


@pytest.mark.parametrize("predicted, gold, right", percent_pairs())
def test_a_percent_has_one_reading_per_gold(predicted, gold, right):
    assert answers.answers_match(predicted, gold) is right


@pytest.mark.parametrize("predicted, gold", [("\\frac{1}{3}\\%", "\\frac{1}{3}"), ("\\frac{\\sqrt{2}}{2}\\%",
                                                                                    "\\frac{\\sqrt{2}}{2}")])
def test_the_slow_path_reads_a_percent_once_too(predicted, gold):
    assert not answers.answers_match(predicted, gold)  # math-verify alone credits both scales
    assert answers.answers_match(predicted.replace("\\frac{1}{3}", "\\frac{100}{3}").replace(
        "\\frac{\\sqrt{2}}{2}", "50\\sqrt{2}"), gold)


@pytest.mark.parametrize("predicted, gold", [
    ("\\boxed{11,\\! 111,\\! 111,\\! 100}", "11111111100"), ("32,\\! 349", "32349"), ("1 000", "1000"),
    ("1 000 000", "1000000"), ("12 345.5", "12345.5"), ("1\\ 000", "1000"), ("1~000", "1000"), ("1\u00a0000", "1000"),
    ("60 km/h", "60"), ("5 m/s", "5"), ("60 miles per hour", "60"), ("3 per day", "3"), ("18 per cent", "18"),
    ("USD 18", "18"), ("USD 18", "\\$18"), ("Rs. 18", "18"), ("Rs 1,800", "1800"), ("1.6e3", "1600"), ("2E-2", "0.02")])
def test_separators_rates_currency_codes_and_scientific_notation_are_read(predicted, gold):
    assert answers.answers_match(predicted, gold)


@pytest.mark.parametrize("predicted, gold", [
    ("1 00", "100"), ("0 111", "111"), ("5 1 000", "51000"), ("1 000", "1"), ("12 34", "1234"), ("1,\\! 11", "111"),
    ("18 x/y", "18"), ("Rs. 18", "\\$18"), ("1.6e3", "16"), ("~18", "18"), ("≈ 18", "18"), ("60 km/h", "60 m/s")])
def test_reading_them_opens_no_wrong_credit(predicted, gold):
    assert not answers.answers_match(predicted, gold)


def test_slow_answers_in_one_batch_are_bounded_and_counted(monkeypatch):
    import time

    answers.answers_match("\\frac{36}{2}", "18")  # the worker up, outside the timed part
    monkeypatch.setattr(answers, "SLOW_PATH_SECONDS_PER_BATCH", 3.0)  # 10 s by default: bench_rewards.py's worst case
    before = dict(answers.VERIFY_STATS)
    binomials = [chat(answer_block(f"\\binom{{{300_000 + i}}}{{{150_000 + i}}}")) for i in range(64)]
    start = time.perf_counter()
    assert rewards.correctness_reward(binomials, answer=["\\frac{1}{2}"] * 64) == [0.0] * 64
    assert time.perf_counter() - start < 3.0 + math_verify_process.PARSE_SECONDS + 1.0  # the budget, the one in flight
    spent = {key: answers.VERIFY_STATS[key] - before.get(key, 0) for key in ("slow", "timeout", "over_budget")}
    assert spent["timeout"] >= 1 and spent["slow"] + spent["over_budget"] == 64, spent
