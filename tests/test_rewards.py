"""rewards.py: each reward pays for what its docstring says, never raises, and cannot be gamed past a real answer (each
recipe's whole rubric, probed adversarially, in its own tests)."""

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rewards

QUESTION = "Mia has 18 stickers and gives away 0 of them. How many stickers does she have now?"
GOOD = "<reasoning>\nShe has 3 packs of 5, so 3 * 5 = 15, plus 3 is 18.\n</reasoning>\n<answer>\n18\n</answer>"


def chat(text):
    return [{"role": "assistant", "content": text}]


def answer_block(inner: str) -> str:
    return f"<reasoning>\nworking\n</reasoning>\n<answer>\n{inner}\n</answer>"


# ------------------------------------------------------------------------------------------------------ correctness
@pytest.mark.parametrize("answer", ["18", "18.0", "$18", "18 dollars", "\\boxed{18}", " 18 ", "18.", "x = 18",
                                    "**18**"])
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


def test_a_none_gold_is_no_answer_not_the_word_none():
    assert rewards.exact_match_reward([chat(answer_block("None"))], answer=[None]) == [0.0]
    assert rewards.token_f1_reward([chat(answer_block("None"))], answer=[[None, "Paris"]]) == [0.0]
    assert not rewards.answers_match("None", None)


def test_boxed_correctness_reads_the_box_after_the_thinking():
    good = "<think>\n3 * 6 = 18\n</think>\nThe answer is \\boxed{18}."
    boxed_in_thinking_only = "<think>\nmaybe \\boxed{18}\n</think>\nI am not sure."
    two_boxes = "<think>\nhm\n</think>\n\\boxed{17} \\boxed{18}"
    scores = rewards.boxed_correctness_reward([chat(good), chat(boxed_in_thinking_only), chat(two_boxes)],
                                              answer=["18"] * 3)
    assert scores == [1.0, 0.0, 0.0]


def test_an_unreadable_gold_gives_no_opinion_as_trls_rewards_do():
    completions = [chat(GOOD)] * 3
    golds = ["18", "√2 (not LaTeX)", None]
    assert rewards.correctness_reward(completions, answer=golds) == [1.0, None, None]
    assert rewards.boxed_correctness_reward([chat("\\boxed{18}")] * 3, answer=golds) == [1.0, None, None]
    cosine = rewards.CosineScaledCorrectness(max_len=100)
    assert cosine(completions, completion_ids=[[0] * 10] * 3, answer=golds)[1:] == [None, None]


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
    def own_reward(completions, **kwargs):  # a recipe's own, beside the library's
        return [0.0] * len(completions)

    funcs, weights = rewards.combine({"correctness_reward": 2, own_reward: 0.5})
    assert funcs == [rewards.correctness_reward, own_reward] and weights == [2.0, 0.5]
    with pytest.raises(ValueError, match="unknown reward 'corectness_reward'.*correctness_reward"):
        rewards.combine({"corectness_reward": 1.0})


def test_every_reward_documents_what_it_pays_for_and_how_it_could_be_gamed():
    funcs = [f for name, f in vars(rewards).items() if name.endswith("_reward") and callable(f)]
    funcs += [rewards.CosineScaledCorrectness(10), rewards.soft_overlong_penalty(10, 2), rewards.repetition_penalty()]
    for name, _, pays_for, gaming in rewards.describe(funcs, [1.0] * len(funcs)):  # the recipes': test_contract
        assert pays_for and gaming, f"{name} lacks a first line or a 'Gaming it:' sentence"


@pytest.mark.parametrize("answer, expected", [("18", 1.0), ("-4", 1.0), ("18.5", 0.0), ("18 apples", 0.0), ("", 0.0)])
def test_integer_answer_reward(answer, expected):
    assert rewards.integer_answer_reward([chat(answer_block(answer))]) == [expected]


# ------------------------------------------------------------------------------------------------------- robustness
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["role", "content", "text", "type"]), children, max_size=4),
    max_leaves=12,
)
tagged_text = st.lists(st.sampled_from(["<reasoning>", "</reasoning>", "<answer>", "</answer>", "<think>", "</think>",
                                        "\n", " ", "18", "1,800", "-", ".", ",", "$", "\\boxed{", "\\frac{1}{2}", "}",
                                        "{",
                                        "abc", "٣", "\ud800", "\x00", "2**9", "/", "the"]), max_size=30).map("".join)
completion = (tagged_text.map(chat) | st.text(max_size=200).map(chat) | json_like
              | st.lists(st.fixed_dictionaries({"role": st.sampled_from(["assistant", "tool", "user"]),
                                                "content": tagged_text}), max_size=4)
              | st.lists(st.dictionaries(st.sampled_from(["role", "content"]), tagged_text),  # missing keys
                         max_size=3))
ALL_REWARDS = [rewards.correctness_reward, rewards.boxed_correctness_reward, rewards.integer_answer_reward,
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
                not rewards.readable_gold(rewards.gold_text(gold))  # TRL's convention: None for a gold it cannot read
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
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "python", "content": result}]


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
