"""rewards.py: each reward pays for what its docstring says, never raises, and cannot be gamed past a real answer."""

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rewards
from gsm8k_grpo import REWARD_FUNCS, REWARD_WEIGHTS, soft_format_reward, strict_format_reward, xml_tag_count_reward

QUESTION = "Mia has 18 stickers and gives away 0 of them. How many stickers does she have now?"
GOOD = "<reasoning>\nShe has 3 packs of 5, so 3 * 5 = 15, plus 3 is 18.\n</reasoning>\n<answer>\n18\n</answer>"


def chat(text):
    return [{"role": "assistant", "content": text}]


def weighted_total(completion, gold="18") -> float:
    return sum(w * f(completions=[completion], answer=[gold])[0] for f, w in zip(REWARD_FUNCS, REWARD_WEIGHTS))


def answer_block(inner: str) -> str:
    return f"<reasoning>\nworking\n</reasoning>\n<answer>\n{inner}\n</answer>"


# ------------------------------------------------------------------------------------------------------ correctness
@pytest.mark.parametrize("answer", ["18", "18.0", "$18", "18 dollars", "\\boxed{18}", " 18 ", "18.", "x = 18", "**18**"])
def test_correctness_accepts_numeric_equivalents_of_the_gold(answer):
    assert rewards.correctness_reward([chat(answer_block(answer))], answer=["18"]) == [1.0]


@pytest.mark.parametrize("answer, gold", [("1,800", "1800"), ("1800", "1800"), ("-3", "-3"), ("0.50", "0.5"),
                                          ("1,234,567", "1234567"), ("18", 18)])
def test_correctness_reads_thousands_separators_signs_and_decimals(answer, gold):
    assert rewards.correctness_reward([chat(answer_block(answer))], answer=[gold]) == [1.0]


def test_correctness_takes_a_raw_gsm8k_solution_as_gold():
    assert rewards.correctness_reward([chat(answer_block("1800"))], answer=["3 * 600 = 1800\n#### 1,800"]) == [1.0]


@pytest.mark.parametrize("completion", [
    answer_block("17, 18, 19"),                                        # a list of guesses
    answer_block("17,18,19"),
    answer_block("2 * 9 = 18"),                                        # several numbers
    answer_block("1,80"),                                              # not a valid separator
    answer_block(""),                                                  # empty answer
    answer_block("19"),                                                # wrong
    answer_block("The answer is 18"),                                  # prose around the number: not one answer
    answer_block("not 18"),
    GOOD + "\n<answer>\n17\n</answer>",                                # two answer blocks
    "<reasoning>\n<answer>18</answer>\n</reasoning>",                  # answer only inside the reasoning
    "<reasoning>\nworking\n</reasoning>\n<answer>\n18\n",              # unclosed
    "18",                                                              # no tags
    "",
])
def test_correctness_pays_nothing_for_guesses_ambiguity_or_missing_answers(completion):
    assert rewards.correctness_reward([chat(completion)], answer=["18"]) == [0.0]


def test_answer_tags_inside_the_reasoning_do_not_count():
    text = "<reasoning>\nfirst I wrote <answer>17</answer>, then fixed it\n</reasoning>\n<answer>\n18\n</answer>"
    assert rewards.correctness_reward([chat(text)], answer=["18"]) == [1.0]
    assert rewards.extract_xml_answer(text) == "18"


def test_multi_turn_completions_are_judged_on_the_last_assistant_message():
    right_then_wrong = [{"role": "assistant", "content": GOOD}, {"role": "tool", "content": "42"},
                        {"role": "assistant", "content": answer_block("19")}]
    wrong_then_right = [{"role": "assistant", "content": answer_block("19")}, {"role": "tool", "content": "18"},
                        {"role": "assistant", "content": GOOD}]
    assert rewards.correctness_reward([right_then_wrong, wrong_then_right], answer=["18", "18"]) == [0.0, 1.0]


def test_plain_string_and_multipart_contents_are_read():
    multipart = [{"role": "assistant", "content": [{"type": "text", "text": GOOD}]}]
    assert rewards.correctness_reward([GOOD, multipart], answer=["18", "18"]) == [1.0, 1.0]


def test_extract_hash_answer_removes_thousands_separators():
    assert rewards.extract_hash_answer("so 1,200 + 600 = 1,800\n#### 1,800") == "1800"
    assert rewards.extract_hash_answer("no marker") is None


@pytest.mark.parametrize("predicted, gold", [
    ("\\frac{36}{2}", "18"), ("2 * 9", "18"), ("$\\frac{1}{2}$", "\\frac{1}{2}"), ("0.5", "\\frac{1}{2}"),
    ("1/2", "0.5"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("18", "18"), ("1,800", "1800"), ("\\sqrt{324}", "18"),
    ("2^{4} + 2", "18"), ("**18**", "18"), ("18\\%", "18"),
])
def test_answers_match_mathematically_equal_answers(predicted, gold):
    assert rewards.answers_match(predicted, gold)


@pytest.mark.parametrize("predicted, gold", [
    ("-18", "18"), ("\u221218", "18"), ("١٨", "18"), ("\\sqrt{323}", "323"), ("17 \\\\ 18", "18"), ("17, 18, 19", "18"), ("{17, 18}", "18"), ("17 then 18", "18"), ("18 or 19", "18"),
    ("2+2=4", "18"), ("eighteen", "18"), ("", "18"), (None, "18"), ("18", None), ("1" * 300, "18"),
])
def test_answers_match_refuses_lists_guesses_and_near_misses(predicted, gold):
    assert not rewards.answers_match(predicted, gold)


# MATH-style answers: the spellings of one value that must be equal, and wrong answers that share a number with the
# gold, each of which a policy could learn to write (a reward hack if it paid).
MATH_EQUIVALENTS = [
    ("\\frac13", "\\frac{1}{3}"), ("\\dfrac{1}{3}", "1/3"), ("\\cfrac{1}{3}", "\\frac{1}{3}"), ("\\sqrt3", "\\sqrt{3}"),
    ("\\left(\\frac{1}{3}\\right)", "\\frac{1}{3}"), ("2x-3", "2x-3"), ("-3+2x", "2x-3"), ("x = \\frac{1}{2}", "\\frac{1}{2}"),
    ("125\\text{ miles}", "125"), ("\\pi", "\\pi"), ("e", "e"), ("y+x", "x+y"), (".5", "0.5"), ("32,\\!349", "32349"),
    ("14{,}916", "14916"), ("1\\,000", "1000"), ("90^\\circ", "90"), ("90", "90^{\\circ}"), ("28\\%", "28"),
    ("28", "28\\%"), ("28\\%", "0.28"), ("28 percent", "28\\%"), ("\\$5", "5"), ("5 dollars", "\\$5"),
    ("\\sqrt{12}", "2\\sqrt{3}"), ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"), ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("[0,1)", "[0,1)"), ("(0,1)", "0<x<1"), ("\\{-2, 2\\}", "\\pm 2"), ("Evelyn", "\\text{Evelyn}"), ("\\text{(C)}", "\\text{(C)}"),
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
    ("5 or more", "5"), ("5 is wrong", "5"), ("$5$ or $6$", "5"), ("5 \\text{ or } 6", "5"), ("\\boxed{5}\\boxed{6}", "5"),
    ("y = 5", "x = 5"), ("5\\text{ km}", "5\\text{ miles}"), ("125 kilometers", "125\\text{ miles}"), ("2x+3", "2x-3"),
    ("x^2", "x^2+1"), ("x^2+1=0", "x^2+1"), ("(2,1)", "(1,2)"), ("(1,2),(3,4)", "(1,2)"), ("[0,1]", "[0,1)"),
    ("0.333", "\\frac{1}{3}"), ("\\frac13, \\frac23", "\\frac{1}{3}"), ("45^\\circ", "90^\\circ"), ("2.8", "28\\%"),
    ("1 + \\frac{1}{e}", "1 - \\frac{1}{e}"), ("D", "\\text{E}"), ("\\sqrt{6}", "2\\sqrt{3}"), ("2\\sqrt{3} \\text{ or } 3", "2\\sqrt{3}"),
]


@pytest.mark.parametrize("predicted, gold", MATH_EQUIVALENTS)
def test_answers_match_reads_math_spellings_of_one_value_as_equal(predicted, gold):
    assert rewards.answers_match(predicted, gold)


@pytest.mark.parametrize("predicted, gold", MATH_WRONG)
def test_answers_match_never_pays_a_wrong_answer_that_shares_a_number_with_the_gold(predicted, gold):
    assert not rewards.answers_match(predicted, gold)
    assert rewards.correctness_reward([chat(answer_block(predicted))], answer=[gold]) == [0.0]
    assert rewards.boxed_correctness_reward([chat(f"<think>x</think> \\boxed{{{predicted}}}")], answer=[gold]) == [0.0]


def test_a_none_gold_is_no_answer_not_the_word_none():
    assert rewards.exact_match_reward([chat(answer_block("None"))], answer=[None]) == [0.0]
    assert rewards.token_f1_reward([chat(answer_block("None"))], answer=[[None, "Paris"]]) == [0.0]
    assert not rewards.answers_match("None", None)


def test_plain_numbers_never_reach_the_slow_path():
    before = rewards.VERIFY_STATS["slow"]
    assert rewards.answers_match("$1,800.00", "1800") and not rewards.answers_match("17", "18")
    assert rewards.VERIFY_STATS["slow"] == before


def test_math_verify_runs_safely_off_the_main_thread_and_in_an_event_loop():
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: rewards.answers_match(p, "18"), ["\\frac{54}{3}", "3 * 6", "\\frac{1}{2}"] * 4))
    assert results == [True, True, False] * 4

    async def reward_in_event_loop():  # how TRL runs async reward functions
        return rewards.correctness_reward([chat(answer_block("\\frac{72}{4}"))], answer=["\\frac{36}{2}"])

    assert asyncio.run(reward_in_event_loop()) == [1.0]


def test_a_hanging_parse_is_killed_and_the_worker_recovers():
    import time

    worker = rewards._MathVerifyWorker(timeout=1.0)  # 1 s, not less: the suite runs two tests at a time on 2 cores
    assert worker.equal("2 * 9", "18") is True  # warm: the child is up
    start = time.monotonic()
    assert worker.equal("2^{2^{40}}", "18") is None  # math-verify alone would spend its full 2 s here
    assert time.monotonic() - start < 1.9
    assert worker.equal("\\frac{36}{2}", "18") is True  # a fresh child took over


def test_extract_boxed_answer_handles_nesting_and_refuses_several_boxes():
    assert rewards.extract_boxed_answer("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert rewards.extract_boxed_answer("\\boxed{1} or \\boxed{2}") is None
    assert rewards.extract_boxed_answer("\\boxed{unclosed") is None


def test_boxed_correctness_reads_the_box_after_the_thinking():
    good = "<think>\n3 * 6 = 18\n</think>\nThe answer is \\boxed{18}."
    boxed_in_thinking_only = "<think>\nmaybe \\boxed{18}\n</think>\nI am not sure."
    two_boxes = "<think>\nhm\n</think>\n\\boxed{17} \\boxed{18}"
    scores = rewards.boxed_correctness_reward([chat(good), chat(boxed_in_thinking_only), chat(two_boxes)], answer=["18"] * 3)
    assert scores == [1.0, 0.0, 0.0]


# ------------------------------------------------------------------------------- percents, separators, rates, cost
def percent_pairs():
    """(prediction, gold, right?) over golds below and above 1, each percent written at the right and wrong scales."""
    pairs = []
    for gold in ("0.75", "0.05", "-0.4", "0", "1", "18", "250", "12.5", "-3"):
        value = float(gold)
        right = f"{value * 100:g}%" if abs(value) < 1 else f"{value:g}%"
        wrong = {f"{value:g}%", f"{value * 100:g}%", f"{value / 100:g}%", f"{value * 10000:g}%"} - {right}
        pairs += [(right, gold, True), (right.replace("%", "\\%"), gold, True), (right.replace("%", " percent"), gold, True)]
        pairs += [(w, gold, False) for w in sorted(wrong)]
    return pairs


@pytest.mark.parametrize("predicted, gold, right", percent_pairs())
def test_a_percent_has_one_reading_per_gold_and_a_wrong_one_stays_below_the_ceiling(predicted, gold, right):
    assert rewards.answers_match(predicted, gold) is right
    if not right:  # the GSM8K recipe's stated ceiling for a wrong answer is 2.0 of its 4.0
        assert weighted_total(chat(answer_block(predicted)), gold) <= 2.0


@pytest.mark.parametrize("predicted, gold", [("\\frac{1}{3}\\%", "\\frac{1}{3}"), ("\\frac{\\sqrt{2}}{2}\\%",
                                                                                    "\\frac{\\sqrt{2}}{2}")])
def test_the_slow_path_reads_a_percent_once_too(predicted, gold):
    assert not rewards.answers_match(predicted, gold)  # math-verify alone credits both scales
    assert rewards.answers_match(predicted.replace("\\frac{1}{3}", "\\frac{100}{3}").replace(
        "\\frac{\\sqrt{2}}{2}", "50\\sqrt{2}"), gold)


@pytest.mark.parametrize("predicted, gold", [
    ("\\boxed{11,\\! 111,\\! 111,\\! 100}", "11111111100"), ("32,\\! 349", "32349"), ("1 000", "1000"),
    ("1 000 000", "1000000"), ("12 345.5", "12345.5"), ("1\\ 000", "1000"), ("1~000", "1000"), ("1\u00a0000", "1000"),
    ("60 km/h", "60"), ("5 m/s", "5"), ("60 miles per hour", "60"), ("3 per day", "3"), ("18 per cent", "18"),
    ("USD 18", "18"), ("USD 18", "\\$18"), ("Rs. 18", "18"), ("Rs 1,800", "1800"), ("1.6e3", "1600"), ("2E-2", "0.02")])
def test_separators_rates_currency_codes_and_scientific_notation_are_read(predicted, gold):
    assert rewards.answers_match(predicted, gold)


@pytest.mark.parametrize("predicted, gold", [
    ("1 00", "100"), ("0 111", "111"), ("5 1 000", "51000"), ("1 000", "1"), ("12 34", "1234"), ("1,\\! 11", "111"),
    ("18 x/y", "18"), ("Rs. 18", "\\$18"), ("1.6e3", "16"), ("~18", "18"), ("≈ 18", "18"), ("60 km/h", "60 m/s")])
def test_reading_them_opens_no_wrong_credit(predicted, gold):
    assert not rewards.answers_match(predicted, gold)


def test_an_unreadable_gold_gives_no_opinion_as_trls_rewards_do():
    completions = [chat(GOOD)] * 3
    golds = ["18", "√2 (not LaTeX)", None]
    assert rewards.correctness_reward(completions, answer=golds) == [1.0, None, None]
    assert rewards.boxed_correctness_reward([chat("\\boxed{18}")] * 3, answer=golds) == [1.0, None, None]
    cosine = rewards.CosineScaledCorrectness(max_len=100)
    assert cosine(completions, completion_ids=[[0] * 10] * 3, answer=golds)[1:] == [None, None]


def test_a_batch_of_degenerate_completions_scores_in_under_a_second():
    import time

    from benchmarks.bench_rewards import degenerate_batch

    batch = degenerate_batch()
    start = time.perf_counter()
    for reward in REWARD_FUNCS:
        reward(completions=batch, answer=["7"] * len(batch))
    assert time.perf_counter() - start < 1.0


def test_slow_answers_in_one_batch_are_bounded_and_counted(monkeypatch):
    import time

    rewards.answers_match("\\frac{36}{2}", "18")  # the worker up, outside the timed part
    monkeypatch.setattr(rewards, "SLOW_PATH_SECONDS_PER_BATCH", 3.0)  # 10 s by default: bench_rewards.py's worst case
    before = dict(rewards.VERIFY_STATS)
    answers = [chat(answer_block(f"\\binom{{{300_000 + i}}}{{{150_000 + i}}}")) for i in range(64)]
    start = time.perf_counter()
    assert rewards.correctness_reward(answers, answer=["\\frac{1}{2}"] * 64) == [0.0] * 64
    assert time.perf_counter() - start < 3.0 + rewards.PARSE_SECONDS + 1.0  # the budget, and the answer in flight
    spent = {key: rewards.VERIFY_STATS[key] - before.get(key, 0) for key in ("slow", "timeout", "over_budget")}
    assert spent["timeout"] >= 1 and spent["slow"] + spent["over_budget"] == 64, spent


# --------------------------------------------------------------------------------------- length and repetition
def test_cosine_scaled_correctness_prefers_short_correct_and_long_wrong_answers():
    cosine = rewards.CosineScaledCorrectness(max_len=100)
    completions = [chat(GOOD), chat(GOOD), chat(answer_block("19")), chat(answer_block("19"))]
    ids = [[0] * 10, [0] * 90, [0] * 90, [0] * 10]
    short_right, long_right, long_wrong, short_wrong = cosine(completions, completion_ids=ids, answer=["18"] * 4)
    assert 1.0 >= short_right > long_right > 0 > long_wrong > short_wrong >= -1.0
    assert cosine([chat(GOOD)], completion_ids=[[0] * 500], answer=["18"]) == [pytest.approx(0.5)]  # clamped
    assert rewards.reward_name(cosine) == "cosine_scaled_correctness_reward"


def test_overlong_and_repetition_penalties_come_from_trl():
    overlong = rewards.soft_overlong_penalty(max_completion_length=100, soft_cache=20)
    assert overlong(completion_ids=[[0] * 50, [0] * 90, [0] * 120]) == [0.0, pytest.approx(-0.5), -1.0]
    repetition = rewards.repetition_penalty(ngram_size=2)
    assert repetition(completion_ids=[[1, 2, 3, 4], [5] * 5]) == [0.0, -0.75]
    assert "Gaming it:" in overlong.__doc__ and "Gaming it:" in repetition.__doc__


# ------------------------------------------------------------------------------------------- question answering
@pytest.mark.parametrize("answer, gold, em, f1", [
    ("The Eiffel Tower", "eiffel tower", 1.0, 1.0),
    ("Eiffel Tower!", ["Tour Eiffel", "the Eiffel Tower"], 1.0, 1.0),
    ("Paris", "Eiffel Tower", 0.0, 0.0),
    ("the tower in Paris", "Eiffel Tower", 0.0, pytest.approx(0.4)),
])
def test_exact_match_and_token_f1_use_squad_normalisation(answer, gold, em, f1):
    completion = chat(answer_block(answer))
    assert rewards.exact_match_reward([completion], answer=[gold]) == [em]
    assert rewards.token_f1_reward([completion], answer=[gold]) == [f1]


def test_pasting_a_passage_that_contains_the_answer_scores_low_on_f1():
    passage = "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France, built in 1889."
    genuine, pasted = chat(answer_block("Eiffel Tower")), chat(answer_block(passage))
    em = rewards.exact_match_reward([genuine, pasted], answer=["Eiffel Tower"] * 2)
    f1 = rewards.token_f1_reward([genuine, pasted], answer=["Eiffel Tower"] * 2)
    assert em == [1.0, 0.0] and f1[0] == 1.0 and f1[1] < 0.25


# --------------------------------------------------------------------------------------------- combining rewards
def test_combine_takes_functions_or_names_and_keeps_them_separate_for_trl():
    funcs, weights = rewards.combine({"correctness_reward": 2, strict_format_reward: 0.5})
    assert funcs == [rewards.correctness_reward, strict_format_reward] and weights == [2.0, 0.5]  # a recipe's own too
    with pytest.raises(ValueError, match="unknown reward 'corectness_reward'.*correctness_reward"):
        rewards.combine({"corectness_reward": 1.0})


def test_every_reward_documents_what_it_pays_for_and_how_it_could_be_gamed():
    import importlib

    from harness import RECIPES

    funcs = [f for name, f in vars(rewards).items() if name.endswith("_reward") and callable(f)]
    funcs += [rewards.CosineScaledCorrectness(10), rewards.soft_overlong_penalty(10, 2), rewards.repetition_penalty()]
    funcs += [f for recipe in RECIPES for f in importlib.import_module(recipe).REWARD_FUNCS]  # wherever defined
    for name, weight, pays_for, gaming in rewards.describe(funcs, [1.0] * len(funcs)):
        assert pays_for and gaming, f"{name} lacks a first line or a 'Gaming it:' sentence"


def test_the_readme_rubric_table_is_the_recipe_rubric():
    from conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    assert rewards.rubric_table(REWARD_FUNCS, REWARD_WEIGHTS) in readme


# ------------------------------------------------------------------------------------------------- format rewards
@pytest.mark.parametrize("text, strict, soft", [
    (GOOD, 1.0, 1.0),
    (GOOD + "\n", 1.0, 1.0),                                           # the gist demanded a trailing newline
    ("<reasoning>\nline one\nline two\n</reasoning>\n<answer>\n18\n</answer>", 1.0, 1.0),  # multi-line (DOTALL)
    ("<reasoning>working</reasoning><answer>18</answer>", 0.0, 1.0),   # right order, no newlines
    ("<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>", 0.0, 1.0),  # empty blocks
    ("<answer>\n18\n</answer>\n<reasoning>\nworking\n</reasoning>", 0.0, 0.0),  # wrong order
    (GOOD + "\nP.S. 19", 0.0, 1.0),                                    # trailing text
    (GOOD + GOOD, 0.0, 0.0),                                           # everything twice
    ("<reasoning>\nworking\n</reasoning>", 0.0, 0.0),
])
def test_strict_and_soft_format(text, strict, soft):
    assert strict_format_reward([chat(text)]) == [strict]
    assert soft_format_reward([chat(text)]) == [soft]


def test_format_rewards_take_other_tag_names():
    think = "<think>\nworking\n</think>\n<answer>\n18\n</answer>"
    assert strict_format_reward([chat(think)], reasoning_tag="think") == [1.0]
    assert strict_format_reward([chat(think)]) == [0.0]


@pytest.mark.parametrize("text, credit", [
    (GOOD, 1.0),
    ("<reasoning>\nworking\n</reasoning>", 0.5),
    (GOOD + " trailing", 0.75),
    ("<reasoning></reasoning>" * 50 + "<answer></answer>", 0.5),       # repeated tags earn nothing
    ("<answer>\n18\n</answer>" + "x" * 100_000, 0.25),                 # bounded penalty, not -len(text)
    ("", 0.0),
])
def test_xml_tag_count_gives_bounded_partial_credit_that_repetition_cannot_farm(text, credit):
    assert xml_tag_count_reward([chat(text)]) == [credit]


@pytest.mark.parametrize("answer, expected", [("18", 1.0), ("-4", 1.0), ("18.5", 0.0), ("18 apples", 0.0), ("", 0.0)])
def test_integer_answer_reward(answer, expected):
    assert rewards.integer_answer_reward([chat(answer_block(answer))]) == [expected]


# ------------------------------------------------------------------------------- the design rule, probed adversarially
ADVERSARIAL = {
    "wrong answer, perfect format": answer_block("19"),
    "several answer blocks": GOOD + "\n<answer>\n18\n</answer>",
    "answer list": answer_block("17, 18, 19"),
    "every number from 0 to 100": answer_block(", ".join(map(str, range(101)))),
    "tags in the wrong order": "<answer>\n18\n</answer>\n<reasoning>\nworking\n</reasoning>",
    "answer hidden in the reasoning": "<reasoning>\n<answer>18</answer>\n</reasoning>\n<answer>\n\n</answer>",
    "correct, then trailing garbage": GOOD + "\nActually it might be 19.",
    "correct but no reasoning": "<answer>\n18\n</answer>",
    "bare number": "18",
    "repeated tags to farm partial credit": "<reasoning></reasoning>" * 100 + "<answer></answer>" * 100,
    "giant output": "<reasoning>\n" + "18 " * 200_000 + "\n</reasoning>\n<answer>\n18 18\n</answer>",
    "giant answer": answer_block("1" * 5000),
    "empty string": "",
    "whitespace": " \n\t ",
    "nested tags": "<reasoning>\n<reasoning>\nx\n</reasoning>\n</reasoning>\n<answer>\n18\n</answer>",
    "answer tag injected into the answer": answer_block("18</answer><answer>18"),
    "uppercase tags": GOOD.upper(),
    "correct number, wrong sign": answer_block("-18"),
    "correct number, unicode minus sign": answer_block("\u221218"),
    "several answer blocks, the last one right": answer_block("17") + "\n<answer>\n18\n</answer>",
    "unicode digits": answer_block("١٨"),
    "markdown-wrapped answer": answer_block("**18**"),
    "the question copied as the answer": answer_block(QUESTION),
    "guesses in a set": answer_block("{17, 18, 19}"),
    "guess then correction": answer_block("17, no wait, 18"),
    "deeply nested tags": "<reasoning>" * 500 + "18" + "</reasoning>" * 500 + "<answer>18</answer>",
    "1 MB of trailing text": GOOD + "18 " * 350_000,
}
NON_STRING = {"None content": [{"role": "assistant", "content": None}], "int content": [{"role": "assistant", "content": 18}],
              "no assistant message": [{"role": "user", "content": GOOD}], "garbage list": [None, 3, "x"],
              "None": None, "number": 18, "dict": {"content": GOOD}}


def test_a_genuine_answer_scores_the_maximum():
    assert weighted_total(chat(GOOD)) == pytest.approx(sum(REWARD_WEIGHTS))


@pytest.mark.parametrize("name", sorted(ADVERSARIAL) + sorted(NON_STRING))
def test_no_adversarial_completion_scores_as_high_as_a_genuine_one(name):
    completion = chat(ADVERSARIAL[name]) if name in ADVERSARIAL else NON_STRING[name]
    assert weighted_total(completion) < weighted_total(chat(GOOD))


# ------------------------------------------------------------------------------------------------------- robustness
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(["role", "content", "text", "type"]), children, max_size=4),
    max_leaves=12,
)
tagged_text = st.lists(st.sampled_from(["<reasoning>", "</reasoning>", "<answer>", "</answer>", "<think>", "</think>",
                                        "\n", " ", "18", "1,800", "-", ".", ",", "$", "\\boxed{", "\\frac{1}{2}", "}", "{",
                                        "abc", "٣", "\ud800", "\x00", "2**9", "/", "the"]), max_size=30).map("".join)
completion = (tagged_text.map(chat) | st.text(max_size=200).map(chat) | json_like
              | st.lists(st.fixed_dictionaries({"role": st.sampled_from(["assistant", "tool", "user"]), "content": tagged_text}), max_size=4)
              | st.lists(st.dictionaries(st.sampled_from(["role", "content"]), tagged_text), max_size=3))  # missing keys
ALL_REWARDS = [rewards.correctness_reward, rewards.boxed_correctness_reward, rewards.integer_answer_reward,
               strict_format_reward, soft_format_reward, xml_tag_count_reward,
               rewards.exact_match_reward, rewards.token_f1_reward, rewards.tool_use_reward, rewards.used_output_reward]


@settings(max_examples=300, deadline=None)
@given(completions=st.lists(completion, min_size=1, max_size=4), gold=json_like | tagged_text)
def test_no_reward_raises_and_each_returns_one_float_in_range_per_completion(completions, gold):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the safety net in rewards._safely must not be what keeps this passing
        for reward in ALL_REWARDS:
            scores = reward(completions=completions, answer=[gold] * len(completions), trainer_state=None)
            assert len(scores) == len(completions)
            no_opinion = reward in (rewards.correctness_reward, rewards.boxed_correctness_reward) and \
                not rewards.readable_gold(rewards._gold_text(gold))  # TRL's convention: None for a gold it cannot read
            assert all(s is None if no_opinion else isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores)


tool_call = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["python", "search", "read"]), "arguments": json_like})}) | json_like
episode = st.lists(st.fixed_dictionaries({"role": st.just("assistant"), "content": tagged_text,
                                          "tool_calls": st.lists(tool_call, max_size=3) | json_like})
                   | st.fixed_dictionaries({"role": st.just("tool"),
                                            "content": tagged_text | st.sampled_from(["[T1] x", "[T2] 18", "Error"])}),
                   max_size=6)


@settings(max_examples=300, deadline=None)
@given(completions=st.lists(episode | completion, min_size=1, max_size=4),
       titles=st.lists(st.sampled_from(["T1", "T2", "T3"]), max_size=3) | st.none())
def test_turn_level_credit_never_raises_and_stays_in_range(completions, titles):
    logged = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for reward, columns in ((rewards.used_output_reward, {}),
                                (rewards.new_evidence_reward, {"supporting_titles": [titles] * len(completions)})):
            scores = reward(completions=completions, log_metric=logged.__setitem__, **columns)
            assert len(scores) == len(completions)
            assert all(s is None or (isinstance(s, float) and 0.0 <= s <= 1.0) for s in scores)
    assert all(0.0 <= value <= 1.0 for value in logged.values())


@pytest.mark.parametrize("text", ["x" * 1_000_000, "<reasoning>" * 100_000, "\ud800\udfff" * 1000, "1" * 1_000_000,
                                  "<answer>" + "9" * 100_000 + "</answer>", "\\boxed{" * 10_000])
def test_rewards_stay_fast_and_in_range_on_megabyte_inputs(text):
    import time

    for reward in ALL_REWARDS:
        start = time.monotonic()
        scores = reward(completions=[chat(text), text], answer=["18", ["18"]])
        assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)
        assert time.monotonic() - start < 5, f"{reward.__name__} took {time.monotonic() - start:.1f} s"


def test_a_scorer_that_fails_costs_one_completion_its_reward_with_a_warning():
    class Unprintable:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.warns(RuntimeWarning, match="correctness_reward"):
        assert rewards.correctness_reward([chat(GOOD), chat(GOOD)], answer=[Unprintable(), "18"]) == [0.0, 1.0]


# ---------------------------------------------------------------------------------------------------------- tool use
def tool_turn(code, result):
    call = {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "name": "python", "content": result}]


def final(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize("completion, expected", [
    (final("<answer>18</answer>"), 0.0),                                                       # no calls
    (tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>"), 1.0),
    (tool_turn("print(3 * 6)", "18") * 2 + final("<answer>18</answer>"), 0.5),                # a repeat adds nothing
    (tool_turn("1/0", "Error: ZeroDivisionError: division by zero") + final("x"), -0.5),
    (tool_turn("x", "{'error': 'boom'}") + final("x"), -0.5),                                  # TRL's own error form
    (tool_turn("1/0", "Error: ZeroDivisionError") * 5 + final("x"), -1.0),                     # floored
    (tool_turn("print(1)", "1") + tool_turn("print(2)", "2") + final("x"), 1.0),               # capped at 1
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "python"}}]}], -0.5),  # unanswered
])
def test_tool_use_reward_pays_for_working_distinct_calls_only(completion, expected):
    assert rewards.tool_use_reward([completion]) == [expected]


def test_no_tool_use_pattern_outscores_a_correct_answer():
    import tool_use_grpo

    def total(completion):
        return sum(w * f(completions=[completion], answer=["18"])[0]
                   for f, w in zip(tool_use_grpo.REWARD_FUNCS, tool_use_grpo.REWARD_WEIGHTS))

    genuine = tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>")
    correct_without_tools = final("<answer>18</answer>")
    correct_with_errors = tool_turn("1/0", "Error: ZeroDivisionError") * 3 + final("<answer>18</answer>")
    tool_spam = sum((tool_turn(f"print({i})", str(i)) for i in range(20)), []) + final("<answer>17</answer>")
    answer_only_in_tool_code = tool_turn("print(18)", "18") + final("I computed it above.")
    for gamed in (tool_spam, answer_only_in_tool_code):
        assert total(gamed) < total(correct_with_errors) < total(correct_without_tools) < total(genuine)


@pytest.mark.parametrize("completion, expected", [
    (final("<answer>18</answer>"), 0.0),                                                       # no calls
    (tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>"), 1.0),
    (tool_turn("print(3 * 6)", "18") + final("<answer>17</answer>"), 0.0),                    # result not used
    (tool_turn("print(3 * 6)", "18") + final("18"), 0.0),                                      # no answer block
    (tool_turn("print(3)", "3") + tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>"), 1.0),  # a chain
    (tool_turn("print(2)", "2") + tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>"), 0.5),  # one unused
    (tool_turn("print(3 * 6)", "18") * 2 + final("<answer>18</answer>"), 0.5),                # a repeat earns nothing
    (tool_turn("1/0", "Error: ZeroDivisionError") + final("<answer>18</answer>"), 0.0),
    (tool_turn("print(1800)", "1800") + final("<answer>1,800</answer>"), 1.0),
    (tool_turn("print(*range(30))", " ".join(map(str, range(30)))) + final("<answer>18</answer>"), 0.0),  # spraying
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "python"}}]}], 0.0),  # unanswered
])
def test_used_output_reward_pays_for_calls_whose_result_the_episode_used(completion, expected):
    assert rewards.used_output_reward([completion]) == [expected]


def test_turn_level_credit_is_logged_per_turn():
    metrics, columns = {}, {}
    two_turns = tool_turn("print(2)", "2") + tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>")
    one_turn = tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>")
    scores = rewards.used_output_reward([two_turns, one_turn, final("<answer>18</answer>")],
                                        log_metric=metrics.__setitem__, log_extra=columns.__setitem__)
    assert scores == [0.5, 1.0, 0.0]
    assert metrics == {"used_output/turn_1": 0.5, "used_output/turn_2": 0.5}  # turn 2: only the first episode's
    assert columns == {"used_output_per_turn": ["0.00 0.50", "1.00", ""]}


@pytest.mark.parametrize("credit_weight", [None, 0.5, 0.99])
def test_turn_level_credit_never_lifts_a_wrong_answer_over_a_right_one(credit_weight):
    """For the recipe's weight of used_output_reward and any weight below 1 (agent_demo --turn_credit refuses more)."""
    import tool_use_grpo

    weights = [credit_weight if credit_weight is not None and f is rewards.used_output_reward else w
               for f, w in zip(tool_use_grpo.REWARD_FUNCS, tool_use_grpo.REWARD_WEIGHTS)]

    def total(completion):
        return sum(w * f(completions=[completion], answer=["18"])[0]
                   for f, w in zip(tool_use_grpo.REWARD_FUNCS, weights))

    right = [tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>"), final("<answer>18</answer>"),
             tool_turn("1/0", "Error: ZeroDivisionError") * 3 + final("<answer>18</answer>"),
             tool_turn("print(3 * 6)", "18") * 4 + final("<answer>18</answer>")]
    wrong = [tool_turn("print(3 + 6)", "9") + final("<answer>9</answer>"),                   # the used, wrong result
             tool_turn("print(17)", "17") + final("<answer>17</answer>"),                    # a printed guess
             sum((tool_turn(f"print({i} + 1)", str(i + 1)) for i in range(20)), []) + final("<answer>21</answer>"),
             tool_turn("print(18)", "18") + final("I computed it above."),
             tool_turn("print(3 * 6)", "18") + final("<answer>18</answer><answer>17</answer>")]
    assert max(map(total, wrong)) < min(map(total, right))


@pytest.mark.parametrize("answer", ["150 - 45", "100+5", "(100 + 5)", "2*52.5", "21 * 5", "210/2", "\\frac{210}{2}",
                                    "\\dfrac{210}{2}", "10^2 + 5", "\\sqrt{11025}", "105 \\times 1", "105\\cdot 1",
                                    "105 - 0", "315 \\div 3", "$100 + 5$", "\\boxed{100+5}", "105/1", "10**2+5"])
def test_correctness_pays_nothing_for_arithmetic_left_to_the_rubric(answer):
    """A numeric gold wants the number: '150 - 45' would let a tool-use policy skip its tool (agent_demo's ablation
    learned exactly that while the rubric credited it)."""
    assert rewards.correctness_reward([chat(answer_block(answer))], answer=["105"]) == [0.0]


@pytest.mark.parametrize("answer, gold", [("105", "105"), ("1,050", "1050"), ("-5", "-5"), ("1/2", "0.5"),
                                          ("\\frac{3}{4}", "0.75"), ("$105", "105"), ("105 apples", "105"),
                                          ("\\frac{36}{2}", "\\frac{36}{2}"), ("2\\sqrt{2}", "2\\sqrt{2}")])
def test_final_numbers_and_fractions_in_lowest_terms_still_count(answer, gold):
    assert rewards.correctness_reward([chat(answer_block(answer))], answer=[gold]) == [1.0]
