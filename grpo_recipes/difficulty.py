"""Difficulty filtering. Before training: each prompt's pass rate over k samples of a model (`evaluate.py
--pass_rates`), and the training prompts a run keeps by it (`--pass_rates`, `--keep_pass_rate_between`). During
training: prompts whose last groups all scored alike are replaced when drawn again (`--skip_settled_after`).

A prompt here is a training row, its prompt with its other columns: game_grpo's games share one prompt and differ in
their `seed`.

A prompt that every sample of a group solves, or that every sample fails, teaches GRPO nothing: its completions all
score the same, so their advantages are 0, yet it costs a full generation. The rate is of correctness (the recipe's
first reward at full marks), never of the shaped total: a group can differ in format rewards and still teach nothing
about the task.
"""

import json
import logging
import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import rewards
from grpo_recipes.contract import Setup, StepHooks
from grpo_recipes.refusal import Refusal

logger = logging.getLogger("grpo-recipes")


@dataclass
class DifficultyOptions:
    """The options every recipe's trainer config (and async_grpo.py's) adds."""

    pass_rates: str | None = field(default=None, metadata={"help": "A file `evaluate.py --pass_rates` wrote for this "
                                   "recipe's training prompts: train only on the prompts whose pass rate lies strictly "
                                   "between --keep_pass_rate_between. Prompts it does not rate are kept."})
    keep_pass_rate_between: list[float] = field(default_factory=lambda: [0.0, 1.0], metadata={
        "help": "With --pass_rates, keep a prompt when LOW < its pass rate < HIGH. Default 0 1: drop the prompts no "
                "sample solved and those every sample solved."})
    skip_settled_after: int = field(default=0, metadata={"help": "Replace a training prompt, when drawn again, by "
                                    "another once its last this many groups each scored alike on the recipe's first "
                                    "reward (all right or all wrong: no advantage, nothing learned). 0: off. One "
                                    "training process; not under async_grpo.py."})


def row_key(row: dict) -> str:
    """A training row (its prompt and every other column) as the one string files and datasets are matched on: rows
    may share a prompt and differ in another column (game_grpo's games share one and differ in `seed`)."""
    return json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)


def pass_rates(rows: list[dict], examples: list[dict]) -> list[dict]:
    """Each example's line: its prompt and other columns, the samples that got an answer (a failed request is no
    sample), how many the recipe's first reward paid in full (evaluate.py's `strict`), and the share (None without a
    sample)."""
    counts = {i: [0, 0] for i in range(len(examples))}
    for row in rows:
        if row["error"] is None:
            counts[row["example"]][0] += 1
            counts[row["example"]][1] += bool(row["strict"])
    return [{"prompt": examples[i]["prompt"], "columns": {k: v for k, v in examples[i].items() if k != "prompt"},
             "samples": samples, "passed": passed, "pass_rate": passed / samples if samples else None}
            for i, (samples, passed) in counts.items()]


def unsampled(rows: list[dict]) -> str | None:
    """What is wrong when every prompt with two or more answered samples got one and the same completion each time:
    a server that decodes greedily whatever the request's temperature (transformers serve samples only where the
    model's generation_config.json says "do_sample": true), so every pass rate is 0 or 1. None otherwise."""
    texts: dict[int, list[str]] = {}
    for row in rows:
        if row["error"] is None:
            texts.setdefault(row["example"], []).append(json.dumps(row["completion"], sort_keys=True, default=str))
    sampled = [completions for completions in texts.values() if len(completions) > 1]
    if len(sampled) < 2 or any(len(set(completions)) > 1 for completions in sampled):
        return None
    return (f"each of the {len(sampled)} prompts got the same completion in every sample: the server may not be "
            "sampling (transformers serve samples only when the model's generation_config.json has \"do_sample\": "
            "true; vLLM samples at the request's temperature), and then every pass rate is 0 or 1 and pass@k is "
            "pass@1")


def describe(rates: list[dict]) -> str:
    """How many prompts no sample solved, every sample solved, and the rest (the ones GRPO learns from)."""
    rated = [r["pass_rate"] for r in rates if r["pass_rate"] is not None]
    never, always, unrated = rated.count(0.0), rated.count(1.0), len(rates) - len(rated)
    return (f"{never} solved by no sample, {always} by every sample, {len(rated) - never - always} in between"
            + (f", {unrated} without a sample (their requests failed)" if unrated else ""))


def read(path: str) -> dict[str, float | None]:
    """A --pass_rates file as {row_key: pass rate}; one that is missing or not evaluate.py's is one line."""
    if not Path(path).is_file():
        raise Refusal(f"--pass_rates {path}: no such file; write one with evaluate.py <recipe> --split train "
                      "--rollouts 8 --pass_rates <file>")
    rates = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            rates[row_key({**entry["columns"], "prompt": entry["prompt"]})] = entry["pass_rate"]
        except (ValueError, KeyError, TypeError):
            raise Refusal(f"--pass_rates {path}: line {number} is not a line evaluate.py --pass_rates writes (a JSON "
                          "object with prompt, columns and pass_rate)") from None
    return rates


def keep_by_pass_rate(dataset, path: str, between: list[float]):
    """The training rows whose pass rate lies strictly between `between`, logged in one line: how many were kept,
    dropped as never solved (at or below LOW), dropped as always solved (at or above HIGH), and not rated."""
    if len(between) != 2 or not 0.0 <= between[0] < between[1] <= 1.0:
        raise Refusal(f"--keep_pass_rate_between {' '.join(map(str, between))}: give LOW HIGH with 0 <= LOW < HIGH "
                      "<= 1 (default 0 1: drop the prompts solved by no sample or by every sample)")
    low, high = between
    rates = read(path)
    kept, never, always, unrated = [], 0, 0, 0
    for i, row in enumerate(dataset):
        rate = rates.get(row_key(row))
        if rate is None:
            unrated += 1
        elif rate <= low:
            never += 1
            continue
        elif rate >= high:
            always += 1
            continue
        kept.append(i)
    if not kept:
        raise Refusal(f"--pass_rates {path}: no training prompt has a pass rate between {low:g} and {high:g} ({never} "
                      f"at or below, {always} at or above): widen --keep_pass_rate_between, or rate the prompts "
                      "with a model closer to the one you train")
    logger.info(f"pass rates from {path}: kept {len(kept)} of {len(dataset)} training prompts; dropped {never} with "
                f"a pass rate <= {low:g} and {always} >= {high:g}; {unrated} not rated (kept)")
    return dataset.select(kept)


class SettledPrompts(StepHooks):
    """`--skip_settled_after K`: a training prompt whose last K groups each scored alike on the recipe's first reward
    (the correctness reward: every completion right, or none; never the shaped total) is settled, and when the trainer
    draws it again it gets another prompt in its place (one not settled, the same for every completion of the group).
    Logged each step: `settled/prompts` (settled so far), `settled/zero_variance_groups` (the share of the groups
    since the last log that scored alike), `settled/generations_saved` (so far: completions that went to another
    prompt instead of a settled one).

    The record lives in the training process, so it needs one (several would each keep their own and could give the
    same group different replacements); the prompts are swapped as the trainer's data loader reads them
    (Dataset.set_transform on its dataset, at the start of training)."""

    def __init__(self, after: int, seed: int = 0):
        self.after, self.seed = after, seed
        self.history: dict[str, deque] = {}
        self.settled: set[str] = set()
        self.drawn: dict[str, dict] = {}  # rows handed to the trainer, not yet scored: only these are recorded
        self.replacements: set[str] = set()  # handed in a settled prompt's place and not yet scored
        self.raw = None
        self.columns: list[str] = []  # the training dataset's, which TRL passes to rewards beside the prompts
        self.groups = self.alike = self.saved = 0

    def record(self, prompts: list, scores: list, columns: dict) -> None:
        """Each group's outcome, from the first reward's scores of a batch's completions and the rows' columns (the
        reward's keyword arguments)."""
        groups: dict[str, list] = {}
        for i, (prompt, score) in enumerate(zip(prompts, scores, strict=True)):
            others = {name: columns[name][i] for name in self.columns if name != "prompt"}
            if (key := self.drawn_key(prompt, others)) is not None:
                groups.setdefault(key, []).append(score)
        for key, group in groups.items():
            self.drawn.pop(key)
            if key in self.replacements:  # counted here, once scored: the trainer reads some batches it never uses
                self.replacements.discard(key)
                self.saved += len(group)
            alike = len(set(group)) == 1 and None not in group  # a group the reward had no opinion on is not settled
            self.groups, self.alike = self.groups + 1, self.alike + alike
            seen = self.history.setdefault(key, deque(maxlen=self.after))
            seen.append(alike)
            if len(seen) == self.after and all(seen):
                self.settled.add(key)

    def drawn_key(self, prompt, others: dict) -> str | None:
        """The drawn row a scored completion came from: the same other columns, and the same prompt, or the prompt
        with an environment's first observation that TRL appended to its last message (game_grpo's)."""
        if (key := row_key({**others, "prompt": prompt})) in self.drawn:
            return key
        if not isinstance(prompt, list) or not isinstance(prompt[-1].get("content"), str):
            return None
        wanted = row_key(others)
        for key, row in self.drawn.items():
            original = row["prompt"]
            if (isinstance(original, list) and original[:-1] == prompt[:-1]
                    and prompt[-1]["content"].startswith(original[-1]["content"])
                    and row_key({name: row[name] for name in others}) == wanted):
                return key
        return None

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        dataset = train_dataloader.dataset
        if dataset.format["type"] is not None:
            raise Refusal(f"--skip_settled_after: the training dataset is formatted as it is read "
                          f"({dataset.format['type']}), and swapping its prompts would replace that; drop it")
        self.raw = dataset.with_format(None)  # the rows as stored, for replacements
        self.columns = self.raw.column_names
        dataset.set_transform(self.swap)

    def swap(self, batch: dict) -> dict:
        """A batch the data loader read, with each settled prompt's row replaced."""
        rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        for i, row in enumerate(rows):
            if row_key(row) in self.settled and (other := self.replacement(row_key(row))):
                rows[i] = other
                self.replacements.add(row_key(other))
            self.drawn[row_key(rows[i])] = rows[i]
        return {column: [row[column] for row in rows] for column in batch}

    def replacement(self, key: str) -> dict | None:
        """A row whose prompt is not settled, drawn by the settled prompt and the record so far: every completion of
        its group (read in the same batch) gets the same one. None when 64 draws find only settled prompts."""
        draw = random.Random(f"{self.seed}/{key}/{self.groups}")
        for _ in range(64):
            row = self.raw[draw.randrange(len(self.raw))]
            if row_key(row) not in self.settled:
                return row
        return None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:  # a training step's log (not an evaluation's, nor the run's summary)
            logs["settled/prompts"] = len(self.settled)
            logs["settled/zero_variance_groups"] = round(self.alike / self.groups, 3) if self.groups else 0.0
            logs["settled/generations_saved"] = self.saved
            self.groups = self.alike = 0


class RecordingReward:
    """The recipe's first reward, unchanged, whose scores also go to SettledPrompts.record (named as the reward it
    wraps, so the logs are unchanged)."""

    def __init__(self, reward, settled: SettledPrompts):
        self.reward, self.settled, self.__name__ = reward, settled, rewards.reward_name(reward)

    def __call__(self, completions, prompts, **kwargs):
        scores = self.reward(completions=completions, prompts=prompts, **kwargs)
        self.settled.record(prompts, scores, kwargs)
        return scores


def skip_settled(task: Setup, after: int, seed: int) -> None:
    """Record the task's first reward and swap settled prompts (--skip_settled_after): its first reward wrapped, the
    swapper added to its callbacks."""
    if isinstance(task.reward_funcs[0], str):
        raise Refusal("--skip_settled_after: the first reward is a reward model the trainer loads, whose scores this "
                      "process never sees; drop it, or reward with a function")
    settled = SettledPrompts(after, seed)
    task.reward_funcs = [RecordingReward(task.reward_funcs[0], settled), *task.reward_funcs[1:]]
    task.callbacks = [*task.callbacks, settled]
