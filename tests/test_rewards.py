"""rewards.py: each reward pays for what its docstring says, never raises, and cannot be gamed past a real answer."""

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rewards
from gsm8k_grpo import REWARD_FUNCS, REWARD_WEIGHTS

GOOD = "<reasoning>\nShe has 3 packs of 5, so 3 * 5 = 15, plus 3 is 18.\n</reasoning>\n<answer>\n18\n</answer>"


def chat(text):
    return [{"role": "assistant", "content": text}]


def weighted_total(completion, gold="18") -> float:
    return sum(w * f(completions=[completion], answer=[gold])[0] for f, w in zip(REWARD_FUNCS, REWARD_WEIGHTS))


def answer_block(inner: str) -> str:
    return f"<reasoning>\nworking\n</reasoning>\n<answer>\n{inner}\n</answer>"


# ------------------------------------------------------------------------------------------------------ correctness
@pytest.mark.parametrize("answer", ["18", "18.0", "$18", "18 dollars", "\\boxed{18}", " 18 ", "18.", "The answer is 18"])
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
    assert rewards.strict_format_reward([chat(text)]) == [strict]
    assert rewards.soft_format_reward([chat(text)]) == [soft]


def test_format_rewards_take_other_tag_names():
    think = "<think>\nworking\n</think>\n<answer>\n18\n</answer>"
    assert rewards.strict_format_reward([chat(think)], reasoning_tag="think") == [1.0]
    assert rewards.strict_format_reward([chat(think)]) == [0.0]


@pytest.mark.parametrize("text, credit", [
    (GOOD, 1.0),
    ("<reasoning>\nworking\n</reasoning>", 0.5),
    (GOOD + " trailing", 0.75),
    ("<reasoning></reasoning>" * 50 + "<answer></answer>", 0.5),       # repeated tags earn nothing
    ("<answer>\n18\n</answer>" + "x" * 100_000, 0.25),                 # bounded penalty, not -len(text)
    ("", 0.0),
])
def test_xml_tag_count_gives_bounded_partial_credit_that_repetition_cannot_farm(text, credit):
    assert rewards.xml_tag_count_reward([chat(text)]) == [credit]


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
tagged_text = st.lists(st.sampled_from(["<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n", " ", "18", "1,800",
                                        "-", ".", ",", "$", "\\boxed{", "}", "abc", "٣"]), max_size=30).map("".join)
completion = (tagged_text.map(chat) | st.text(max_size=200).map(chat) | json_like
              | st.lists(st.fixed_dictionaries({"role": st.sampled_from(["assistant", "tool", "user"]), "content": tagged_text}), max_size=4))


@settings(max_examples=300, deadline=None)
@given(completions=st.lists(completion, min_size=1, max_size=4), gold=json_like | tagged_text)
def test_no_reward_raises_and_each_returns_one_float_in_range_per_completion(completions, gold):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the safety net in rewards._safely must not be what keeps this passing
        for reward in REWARD_FUNCS:
            scores = reward(completions=completions, answer=[gold] * len(completions), trainer_state=None)
            assert len(scores) == len(completions)
            assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores)


def test_a_scorer_that_fails_costs_one_completion_its_reward_with_a_warning():
    class Unprintable:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.warns(RuntimeWarning, match="correctness_reward"):
        assert rewards.correctness_reward([chat(GOOD), chat(GOOD)], answer=[Unprintable(), "18"]) == [0.0, 1.0]
