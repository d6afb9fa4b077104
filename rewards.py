"""The rubric library every recipe imports: parsers and reward functions in TRL's reward signature.

A reward function is `f(completions, **kwargs) -> list[float | None]`, one value per completion. `completions` are
chat message lists (or plain strings for non-chat datasets); dataset columns such as `answer` arrive as keyword
lists of the same length; TRL also passes `prompts` and `completion_ids`. In a multi-turn completion the final answer
is the LAST assistant message. `None` means "no opinion" and TRL leaves it out of the total.

Rules every function here keeps, tested in tests/test_rewards.py:
- it never raises and returns exactly one float (or None) per completion, whatever the model wrote;
- it pays for one thing, named in its `__name__` (TRL logs `rewards/<name>/mean`), in the range its docstring says,
  and its docstring says how a model could game it ("Gaming it: ...");
- with a recipe's weights, no adversarial completion (several answers, answer lists, tags in the wrong place, answer
  hidden in the reasoning, trailing garbage, giant or empty outputs) scores as high as a genuine correct,
  well-formatted one: doing the task must be easier than gaming the score.

Your own reward, in the same shape: score one completion, and let `score_each` keep the never-raise rule (a scorer
that raises costs only that completion its reward). Then give it a weight in the recipe's `rewards.combine({...})`.

    def short_answer_reward(completions, **kwargs) -> list[float]:
        '''1.0 when the final answer is at most five words. Gaming it: a short wrong answer earns it too.'''
        return rewards.score_each(lambda c: float(len(rewards.completion_text(c).split()) <= 5), completions)

Sections: correctness · question answering · tool use · turn-level credit · games · length and repetition ·
LLM judge · combining rewards · your own reward (`score_each`). The parsers and answer matching they read answers with
(`completion_text`, `extract_xml_answer`, `answers_match`, ...) live in grpo_recipes/answers.py and are imported here
under the same names. The GSM8K format rewards live in gsm8k_grpo.py.
"""

import functools
import json
import math
import re
import string
import warnings
from collections import Counter

# The answer parsers and answer matching, here so that a rubric (and your own reward) reads them as rewards.<name>.
from grpo_recipes import games
from grpo_recipes.answers import (PLAIN_NUMBER, after_thinking, answers_match, arithmetic_left_undone,  # noqa: F401
                                  completion_text, content_text, extract_boxed_answer, extract_hash_answer,
                                  extract_xml_answer, gold_text, number_tokens, parse_number, plain_value,
                                  read_answer, readable_gold, slow_path_budget)


# ------------------------------------------------------------------------------------------------------ correctness


def correctness_reward(completions, answer, answer_tag="answer", reasoning_tag="reasoning", **kwargs) -> list[float]:
    r"""1.0 when the single answer block, as a whole, equals the gold answer (answers_match), else 0.0.

    '18', '18.0', '$18', '18 dollars' and '\boxed{18}' all match gold 18; '1,800' matches 1800; LaTeX golds (MATH)
    are read as LaTeX: '\frac13' matches '\frac{1}{3}'.
    Gaming it: listing several numbers, writing several answer blocks, hiding the answer in the reasoning, prose
    around the number, or the gold's number inside a different value ('18!', '18 thousand', 'x < 18') all earn 0.0,
    so guessing does not pay. When the gold is a plain number, arithmetic left undone ('150 - 45', '2 * 9',
    '\frac{36}{2}') earns 0.0 too: otherwise the rubric does the arithmetic the model should do. A tool-use policy
    trained while it did learned to skip the interpreter and write the expression (docs/experiments.md).
    """
    def score(completion, gold) -> float | None:
        gold = gold_text(gold)
        if not readable_gold(gold):
            return None  # TRL's convention: a gold that cannot be read has no opinion, not a wrong answer
        predicted = extract_xml_answer(completion_text(completion), answer_tag, reasoning_tag)
        if predicted is not None and PLAIN_NUMBER.fullmatch(gold.strip().replace(",", "")) \
                and arithmetic_left_undone(predicted):
            return 0.0
        return 1.0 if answers_match(predicted, gold) else 0.0

    with slow_path_budget():
        return score_each(score, completions, answer)


def boxed_correctness_reward(completions, answer, think_tag="think", **kwargs) -> list[float]:
    r"""1.0 when the single \boxed{} after the reasoning (`</think>`) equals the gold answer, else 0.0.

    For R1-style `<think>…</think> … \boxed{answer}` outputs. Gaming it: several boxes, or a box only inside the
    thinking, earn 0.0.
    """
    def score(completion, gold) -> float | None:
        gold = gold_text(gold)
        if not readable_gold(gold):
            return None
        predicted = extract_boxed_answer(after_thinking(completion_text(completion), think_tag))
        return 1.0 if answers_match(predicted, gold) else 0.0

    with slow_path_budget():
        return score_each(score, completions, answer)


_INTEGER = re.compile(r"-?\d+", re.ASCII)


def integer_answer_reward(completions, answer_tag="answer", reasoning_tag="reasoning", **kwargs) -> list[float]:
    """1.0 when the single answer block is a bare integer ('18', '-3'), else 0.0.

    Teaches the answer format GSM8K grades. Gaming it: any integer earns it, right or wrong, so its weight must stay
    well below correctness.
    """
    def score(completion) -> float:
        answer = extract_xml_answer(completion_text(completion), answer_tag, reasoning_tag)
        return 1.0 if answer is not None and _INTEGER.fullmatch(answer) else 0.0

    return score_each(score, completions)


class CosineScaledCorrectness:
    r"""Correctness scaled by length on a cosine schedule: short correct answers earn most, short wrong ones lose most.

    Range [wrong_short, correct_short] (defaults -1.0 to 1.0); a correct answer always beats any wrong one; None where
    correctness has no opinion (a gold it cannot read), as TRL's. Length is the completion's token count
    (`completion_ids`) relative to `max_len`. Same idea as TRL's
    get_cosine_scaled_reward, but judged by this module's correctness (answer tags, last assistant message) instead
    of a \boxed answer in the first message. Gaming it: truncating reasoning to look short costs correctness.
    """

    __name__ = "cosine_scaled_correctness_reward"

    def __init__(self, max_len: int, correct_short=1.0, correct_long=0.5, wrong_long=-0.5, wrong_short=-1.0,
                 correctness=correctness_reward):
        self.max_len, self.correctness = max_len, correctness
        self.correct, self.wrong = (correct_long, correct_short), (wrong_long, wrong_short)

    def __call__(self, completions, completion_ids, **kwargs) -> list[float | None]:
        correct = self.correctness(completions, **kwargs)
        scores = []
        for ok, ids in zip(correct, completion_ids, strict=True):
            if ok is None:
                scores.append(None)
                continue
            at_long, at_short = self.correct if ok == 1.0 else self.wrong
            progress = min(len(ids) / self.max_len, 1.0)  # clamped: cos would climb back past max_len
            scores.append(at_long + 0.5 * (at_short - at_long) * (1.0 + math.cos(progress * math.pi)))
        return scores


# -------------------------------------------------------------------------------------------------- question answering


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles (a/an/the), single spaces."""
    text = "".join(ch for ch in str(text).lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _golds(gold) -> list[str]:
    """A gold answer may be one string or a list of accepted aliases; None is no answer at all (not the word 'None')."""
    aliases = gold if isinstance(gold, (list, tuple)) else [gold]
    return [str(g) for g in aliases if g is not None]


def answer_anywhere(text: str, gold) -> bool:
    """Lenient correctness for evaluation: the gold answer appears anywhere in text, as one of its numbers or as
    normalised words. Not a reward (listing guesses would pass); it tells format problems from skill problems."""
    if gold is None or not isinstance(text, str):
        return False
    golds = _golds(gold)
    numbers = [parse_number(token) for token in number_tokens(text)]
    gold_values = [plain_value(read.expression) for read in map(read_answer, golds) if read is not None]
    return any(numbers_value is not None and gold_value is not None and math.isclose(numbers_value, gold_value)
               for gold_value in gold_values for numbers_value in numbers) or any(
        normalize_answer(g) and f" {normalize_answer(g)} " in f" {normalize_answer(text)} " for g in golds)


def answer_format_reward(completions, answer_tag="answer", reasoning_tag="reasoning", **kwargs) -> list[float]:
    """1.0 when the final message holds exactly one non-empty answer block, else 0.0.

    Teaches the answer format. Gaming it: any answer in tags earns it, so its weight must stay well below the answer
    rewards.
    """
    def score(completion) -> float:
        return float(bool(extract_xml_answer(completion_text(completion), answer_tag, reasoning_tag)))

    return score_each(score, completions)


def exact_match_reward(completions, answer, answer_tag="answer", reasoning_tag="reasoning", **kwargs) -> list[float]:
    """1.0 when the normalised answer block equals a normalised gold answer (or alias), else 0.0.

    Gaming it: long answers that contain the gold earn 0.0; it cannot be farmed, only missed by a paraphrase.
    """
    def score(completion, gold) -> float:
        predicted = extract_xml_answer(completion_text(completion), answer_tag, reasoning_tag)
        accepted = {normalize_answer(g) for g in _golds(gold)}
        return float(predicted is not None and normalize_answer(predicted) in accepted)

    return score_each(score, completions, answer)


def token_f1_reward(completions, answer, answer_tag="answer", reasoning_tag="reasoning", **kwargs) -> list[float]:
    """Token-overlap F1 in [0, 1] between the normalised answer block and the best-matching gold alias.

    Partial credit for near misses. Gaming it: pasting a long passage that contains the answer has high recall but low
    precision, so it scores low; the answer must be short and right.
    """
    def f1(predicted: str, gold: str) -> float:
        pred_tokens, gold_tokens = normalize_answer(predicted).split(), normalize_answer(gold).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            return 0.0
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        return 2 * precision * recall / (precision + recall)

    def score(completion, gold) -> float:
        predicted = extract_xml_answer(completion_text(completion), answer_tag, reasoning_tag)
        return 0.0 if predicted is None else max((f1(predicted, g) for g in _golds(gold)), default=0.0)

    return score_each(score, completions, answer)


# ------------------------------------------------------------------------------------------------------------ tool use


def tool_calls_and_results(completion) -> list[tuple[str, str]]:
    """The (call, result) pairs of a multi-turn completion, in order: each call as 'name(arguments as JSON)', each
    result as the text of the tool message that answered it ('' when none did)."""
    calls, results = [], []
    for message in completion if isinstance(completion, list) else []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            for call in _tool_call_list(message):
                function = call.get("function", call) if isinstance(call, dict) else {}
                arguments = function.get("arguments") if isinstance(function, dict) else None
                name = function.get("name") if isinstance(function, dict) else None
                calls.append(f"{name}({json.dumps(arguments, sort_keys=True, default=str)})")
        elif message.get("role") == "tool":
            results.append(content_text(message.get("content")))
    return [(call, results[i] if i < len(results) else "") for i, call in enumerate(calls)]


def _tool_call_list(message: dict) -> list:
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []  # a malformed message made no call


def tool_failed(result: str) -> bool:
    """True when a tool's answer is an error: the sandbox's and the search tools' "Error: ...", TRL's "{'error': ...}"
    for a tool that raised, or no answer at all."""
    return not result or result.startswith("Error") or result.startswith("{'error'")


def tool_use_reward(completions, **kwargs) -> list[float]:
    """1.0 when at least one distinct tool call succeeded, minus 0.5 for each failed or repeated call; range [-1, 1].

    Pays for using a tool that works, not for calling it: an identical repeated call adds nothing and costs like a
    failure, and an error costs. No calls: 0.0. Gaming it: one trivial call that succeeds (print(1)) earns the full
    credit, so its weight must stay far below correctness.
    """
    def score(completion) -> float:
        seen, credit, cost = set(), 0.0, 0.0
        for call, result in tool_calls_and_results(completion):
            if call in seen or tool_failed(result):
                cost += 0.5
            else:
                credit = 1.0
            seen.add(call)
        return max(credit - cost, -1.0)

    return score_each(score, completions)


def _called(completion, tool: str) -> bool:
    return any(call.split("(", 1)[0] == tool and not tool_failed(result)
               for call, result in tool_calls_and_results(completion))


class RequiresToolCall:
    """Wraps a reward so that it pays only in completions that called `tool` successfully at least once.

    For agents that must use their tools: a search agent's answer reward should not pay for answering from memory.
    """

    def __init__(self, reward, tool: str):
        self.reward, self.tool = reward, tool
        self.__name__ = f"{reward_name(reward)}_after_{tool}"
        pays_for, gaming = describe([reward], [1.0])[0][2:]
        self.__doc__ = (f"{pays_for}, and only after a successful `{tool}` call (0.0 without one). "
                        f"Gaming it: answering without calling {tool} earns nothing; otherwise {gaming}")

    def __call__(self, completions, **kwargs) -> list[float]:
        scores = self.reward(completions=completions, **kwargs)
        return [score if _called(c, self.tool) else 0.0 for c, score in zip(completions, scores, strict=True)]


def retrieval_recall_reward(completions, supporting_titles, **kwargs) -> list[float | None]:
    """Share in [0, 1] of the gold supporting passages whose [title] appeared in the tool results; None without gold.

    A diagnostic for search agents, best logged with weight 0: it shows whether the model finds the evidence.
    Gaming it: searching for everything raises it without answering anything, so it should not be paid for.
    """
    return new_evidence_reward(completions, supporting_titles)  # the sum of its per-turn credits


# -------------------------------------------------------------------------------------------------- turn-level credit
# GRPO in TRL 1.16 gives an episode one advantage, spread over all its tokens: a turn's credit reaches the loss only
# through the episode's reward. These rewards are each a sum of per-turn credits, and log every turn's mean credit
# (`<name>/turn_<k>` beside TRL's metrics), so that a run shows which moves of an episode earned what.


def tool_turns(completion) -> list[list[tuple[str, str]]]:
    """tool_calls_and_results grouped by the assistant turn that made the calls; turns without a call are left out."""
    pairs, sizes = tool_calls_and_results(completion), []
    for message in completion if isinstance(completion, list) else []:
        if isinstance(message, dict) and message.get("role") == "assistant" and _tool_call_list(message):
            sizes.append(len(_tool_call_list(message)))
    turns, start = [], 0
    for size in sizes:
        turns.append(pairs[start:start + size])
        start += size
    return turns


def _log_turn_credits(name: str, credits: list[list[float]], log_metric=None, log_extra=None) -> None:
    """Metric `<name>/turn_<k>`: the mean credit of the k-th tool turn, over the episodes that made one; and each
    episode's per-turn credits as a column of TRL's completions table."""
    for turn in range(max(map(len, credits), default=0)):
        reached = [episode[turn] for episode in credits if len(episode) > turn]
        if log_metric is not None:
            log_metric(f"{name}/turn_{turn + 1}", sum(reached) / len(reached))
    if log_extra is not None:
        log_extra(f"{name}_per_turn", [" ".join(f"{credit:.2f}" for credit in episode) for episode in credits])


def new_evidence_reward(completions, supporting_titles, log_metric=None, log_extra=None, **kwargs) -> list:
    """Turn-level credit for search agents: each tool turn earns the share of the gold supporting passages whose [title]
    its results show for the first time in the episode; the episode scores the sum, in [0, 1]; None without gold.

    A second search that finds the passage the first one missed earns what the first one did; repeating a search, or
    reading a passage a search already showed, earns nothing. Summed over the episode it equals retrieval recall.
    Gaming it: searching for everything finds evidence without answering, so its weight must stay below what a
    correct answer adds (tests/test_search_agent_grpo.py probes the recipe's weights).
    """
    credits = []
    for completion, titles in zip(completions, supporting_titles, strict=True):
        seen, episode = set(), []
        for turn in tool_turns(completion) if titles else []:
            shown = " ".join(result for _, result in turn)
            found = {title for title in titles if f"[{title}]" in shown} - seen
            seen |= found
            episode.append(len(found) / len(titles))
        credits.append(episode)
    _log_turn_credits("new_evidence", credits, log_metric, log_extra)
    return [float(min(sum(episode), 1.0)) if titles else None  # min: float rounding of the shares
            for episode, titles in zip(credits, supporting_titles, strict=True)]


def _numbers(text: str) -> set[float]:
    return {value for value in map(parse_number, number_tokens(text)) if value is not None}


def used_output_reward(completions, answer_tag="answer", reasoning_tag="reasoning", log_metric=None, log_extra=None,
                       **kwargs) -> list[float]:
    """Turn-level credit for tool use: the share of an episode's calls that ran, were not a repeat, and whose result
    was used: the last number the call printed is the final answer's number, or appears in a later call.

    Each tool turn earns its calls' share and the episode scores the sum, in [0, 1]; 0 without calls. A chain of
    calls where each feeds the next earns all of it; a call whose result is ignored, fails or repeats dilutes it.
    Gaming it: print a guess and answer it (print(42), then 42) earns the full credit without computing anything, so
    its weight must stay below what a correct answer adds (tests/test_rewards.py probes the recipe's weights).
    """
    credits = []
    for completion in completions:
        turns = tool_turns(completion)
        calls = [pair for turn in turns for pair in turn]
        answer = extract_xml_answer(completion_text(completion), answer_tag, reasoning_tag)
        answered = parse_number(answer)
        seen, episode, index = set(), [], 0
        for turn in turns:
            used = 0
            for call, result in turn:
                index += 1
                printed = number_tokens(result)
                value = parse_number(printed[-1]) if printed else None
                later = {number for later_call, _ in calls[index:] for number in _numbers(later_call)}
                if (call not in seen and not tool_failed(result) and value is not None
                        and (value == answered or value in later)):
                    used += 1
                seen.add(call)
            episode.append(used / len(calls))
        credits.append(episode)
    _log_turn_credits("used_output", credits, log_metric, log_extra)
    return [float(min(sum(episode), 1.0)) for episode in credits]  # min: float rounding of the shares


# ------------------------------------------------------------------------------------------------------------- games
# A game's rewards read the record the game keeps (grpo_recipes/games.py says what it holds), after replaying the
# moves the completion shows answered in a fresh game from the row's `seed`: bind the game's factory with
# functools.partial(reward, new_game=factory). Each is a function of the row and the completion, so TRL's trainer,
# its async trainer (which passes no environments to rewards) and evaluate.py score alike.


def _replayed(new_game, completions, seed) -> list:
    return [games.replay(new_game, s, c) for c, s in zip(completions, seed, strict=True)]


def game_won_reward(completions, seed, new_game, log_metric=None, **kwargs) -> list[float | None]:
    """1.0 when the game ended the episode with a win; 0.0 when it ended otherwise (lost, out of turns) or the player
    stopped moving first; None when the budget cut the episode before the game ended it (its last call unanswered).

    Logs game/unfinished (the share cut: raise --max_completion_length or --max_tool_calling_iterations when it is
    high), game/turns and game/invalid_moves (per episode). TRL adds None as 0 to the total, so a cut episode earns
    its turn-level credit alone; one cut mid-turn is left out of the loss (mask_truncated_completions).
    Gaming it: the game decides from its own state, so claiming a win in text, stalling, repeating a move, invalid
    moves and stopping early never win.
    """
    played = _replayed(new_game, completions, seed)
    cut = [not game.done and games.unanswered_call(c) for game, c in zip(played, completions, strict=True)]
    if log_metric is not None and played:
        log_metric("game/unfinished", sum(cut) / len(played))
        log_metric("game/turns", sum(game.turns for game in played) / len(played))
        log_metric("game/invalid_moves", sum(game.invalid_moves for game in played) / len(played))
    if log_metric is not None and sum(cut) > len(played) / 4:
        warnings.warn("over a quarter of a batch's episodes were cut before the game ended them (game/unfinished): "
                      "raise --max_completion_length or --max_tool_calling_iterations, or lower --turn_limit",
                      RuntimeWarning, stacklevel=2)
    return [None if unfinished else float(game.done and game.won) for game, unfinished in zip(played, cut,
                                                                                                strict=True)]


def game_efficiency_reward(completions, seed, new_game, **kwargs) -> list[float]:
    """For a win, the share of the turn limit left unused, counting the winning move: (max_turns - turns + 1) /
    max_turns, in (0, 1]; 0.0 for anything else.

    Invalid moves count as turns. Calls the game never took (a tool it lacks: TRL answers them) count too, so the
    replay can count more turns than the limit before a win the live game took: such a win earns the slowest win's
    1 / max_turns. Gaming it: only a win earns it, so ending early, stalling or a cut episode earn nothing; it pays a
    fast win over a slow one, never a fast loss.
    """
    def score(game) -> float:
        won = game.done and game.won
        return max(game.max_turns - game.turns + 1, 1) / game.max_turns if won else 0.0

    return score_each(score, _replayed(new_game, completions, seed))


def game_progress_reward(completions, seed, new_game, log_metric=None, log_extra=None, **kwargs) -> list:
    """Turn-level credit where the game gives one: the mean of the episode's per-turn credits, in [0, 1] (the default
    game's: how close a guess comes to halving the numbers the hints still allow), over the turns the game allowed
    where the episode stopped before the game ended it (turns not played earn 0.0); 0.0 without a move; None where
    the game gives none (textarena's).

    Logged per turn (game_progress/turn_<k>). Invalid and repeated moves earn 0.0 for their turn.
    Gaming it: good moves that never finish the game earn it, so its weight must stay below a win's
    (tests/test_game_grpo.py probes the recipe's weights); stopping after one good move earns that move's share of
    all the turns, never more than playing on, and stopping loses the win.
    """
    played = _replayed(new_game, completions, seed)
    credits = [list(game.credits) for game in played if game.credits is not None]
    _log_turn_credits("game_progress", credits, log_metric, log_extra if len(credits) == len(played) else None)
    return [None if game.credits is None else sum(game.credits) / _turns_counted(game) if game.credits else 0.0
            for game in played]


def _turns_counted(game) -> int:
    """The turns a game's credit is averaged over: those played where the game ended the episode, else every turn it
    allowed (an episode the player stopped early is not averaged over its good first moves alone)."""
    return len(game.credits) if game.done else max(len(game.credits), getattr(game, "max_turns", 0))


# --------------------------------------------------------------------------------------------- length and repetition


def soft_overlong_penalty(max_completion_length: int, soft_cache: int):
    """TRL's DAPO soft overlong punishment: 0 up to max_completion_length - soft_cache tokens, then linearly down to -1.

    Pass the same max_completion_length as the GRPOConfig. Gaming it: it never pays for being short, only stops
    paying the cost of rambling into the limit.
    """
    from trl.rewards import get_soft_overlong_punishment

    penalty = get_soft_overlong_punishment(max_completion_len=max_completion_length, soft_punish_cache=soft_cache)
    penalty.__doc__ = soft_overlong_penalty.__doc__
    return penalty


def repetition_penalty(ngram_size: int = 3, max_penalty: float = -1.0):
    """TRL's n-gram repetition penalty on completion tokens: 0 with no repeated n-gram, down to max_penalty.

    Counters degenerate loops, a common way to farm length- or format-shaped rewards. Gaming it: varied filler is not
    repetitive, so it does not replace a length penalty.
    """
    from trl.rewards import get_repetition_penalty_reward

    penalty = get_repetition_penalty_reward(ngram_size=ngram_size, max_penalty=max_penalty)
    penalty.__doc__ = repetition_penalty.__doc__
    return penalty


# --------------------------------------------------------------------------------------------------------- LLM judge

# The LLM judges (JudgeReward, GroupJudgeReward) are a module of their own: grpo_recipes/judge.py, the client, its
# pool, cache and deadline, and the verdicts it reads.


# -------------------------------------------------------------------------------------------------- combining rewards


def combine(weights: dict) -> tuple[list, list[float]]:
    """{reward function, or its name in this module: weight} -> (reward_funcs, reward_weights) for GRPOTrainer.

    The functions stay separate, so TRL still logs `rewards/<name>/mean` for each one.
    """
    funcs = []
    for key in weights:
        func = globals().get(key) if isinstance(key, str) else key
        if not callable(func) or (isinstance(key, str) and not key.endswith("_reward")):
            known = sorted(n for n, f in globals().items() if n.endswith("_reward") and callable(f))
            raise ValueError(f"unknown reward {key!r}; rewards.py has {known}")
        funcs.append(func)
    return funcs, [float(w) for w in weights.values()]


def reward_name(func) -> str:
    """The name TRL logs a reward under, as trl.trainer.utils.get_callable_name gives it (functools.partial unwrapped,
    a callable object by its class's name, a reward model's id by its last part), without importing TRL into the
    rubric library."""
    model_id = func if isinstance(func, str) else getattr(getattr(func, "config", None), "_name_or_path", None)
    if model_id:
        return model_id.rstrip("/").split("/")[-1]
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


REWARD_MODEL_DOC = ("A reward model's score for the whole answer (a sequence classifier that TRL loads). Gaming it: "
                    "whatever the classifier over-rates (length, confidence, its training data's quirks); read the "
                    "answers it pays most.")


def describe(funcs: list, weights: list[float]) -> list[tuple[str, float, str, str]]:
    """(name, weight, what it pays for, how it could be gamed) per reward, read from each docstring."""
    rows = []
    for func, weight in zip(funcs, weights, strict=True):
        base = func
        while isinstance(base, functools.partial):
            base = base.func
        reward_model = isinstance(func, str) or hasattr(func, "config")  # an id, or the model TRL loaded from it
        doc = " ".join((REWARD_MODEL_DOC if reward_model else getattr(base, "__doc__", None) or "").split())
        pays_for = doc.split(". ")[0].rstrip(".") if doc else ""
        gaming = doc.split("Gaming it: ", 1)[1] if "Gaming it: " in doc else ""
        rows.append((reward_name(func), weight, pays_for, gaming))
    return rows


def rubric_table(funcs: list, weights: list[float]) -> str:
    """A markdown table of the rubric for READMEs and logs."""
    lines = ["| reward | weight | pays for | gaming it |", "|---|---|---|---|"]
    lines += [f"| `{name}` | {weight:g} | {pays.replace('|', '/')} | {gaming.replace('|', '/')} |"
              for name, weight, pays, gaming in describe(funcs, weights)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- your own reward
def score_each(score, *columns) -> list[float | None]:
    """`[score(*row) for row in zip(*columns)]` as floats (None stays None: no opinion), never raising: if the scorer
    raises, every row is rescored alone so only the completion that broke it loses its reward (0.0, with a warning).
    Every reward here uses it."""
    rows = list(zip(*columns, strict=True))
    try:
        return [None if (value := score(*row)) is None else float(value) for row in rows]
    except Exception:  # noqa: BLE001 - find the completion that broke it, below
        return [_safely(score, *row) for row in rows]


class ScorerFailed(RuntimeWarning):
    """A scorer raised on one completion, which score_each then scored 0.0 (grpo_recipes/row_checks.py counts them)."""


def _safely(score, *args) -> float | None:
    """Run one scorer; a bug in it costs that completion its reward (with a warning), never the training run."""
    try:
        value = score(*args)
        return None if value is None else float(value)
    except Exception as err:  # noqa: BLE001 - the training run must survive any completion
        warnings.warn(f"{score.__qualname__} failed on one completion and gave it 0.0: {err!r}", ScorerFailed,
                      stacklevel=3)
        return 0.0
