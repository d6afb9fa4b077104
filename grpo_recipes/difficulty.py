"""Difficulty filtering before training: each prompt's pass rate over k samples of a model (`evaluate.py
--pass_rates`), and the training prompts a run keeps by it (`--pass_rates`, `--keep_pass_rate_between`).

A prompt that every sample of a group solves, or that every sample fails, teaches GRPO nothing: its completions all
score the same, so their advantages are 0, yet it costs a full generation. The rate is of correctness (the recipe's
first reward at full marks), never of the shaped total: a group can differ in format rewards and still teach nothing
about the task.
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from grpo_recipes.refusal import Refusal

logger = logging.getLogger("grpo-recipes")


@dataclass
class PassRateOptions:
    """The two options every recipe's trainer config (and async_grpo.py's) adds."""

    pass_rates: str | None = field(default=None, metadata={"help": "A file `evaluate.py --pass_rates` wrote for this "
                                   "recipe's training prompts: train only on the prompts whose pass rate lies strictly "
                                   "between --keep_pass_rate_between. Prompts it does not rate are kept."})
    keep_pass_rate_between: list[float] = field(default_factory=lambda: [0.0, 1.0], metadata={
        "help": "With --pass_rates, keep a prompt when LOW < its pass rate < HIGH. Default 0 1: drop the prompts no "
                "sample solved and those every sample solved."})


def prompt_key(prompt) -> str:
    """A prompt (its messages) as the one string both files and datasets are matched on."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def pass_rates(rows: list[dict], prompts: list) -> list[dict]:
    """Each prompt's line: the samples that got an answer (a failed request is no sample), how many the recipe's first
    reward paid in full (evaluate.py's `strict`), and the share (None without a sample)."""
    counts = {i: [0, 0] for i in range(len(prompts))}
    for row in rows:
        if row["error"] is None:
            counts[row["example"]][0] += 1
            counts[row["example"]][1] += bool(row["strict"])
    return [{"prompt": prompts[i], "samples": samples, "passed": passed,
             "pass_rate": passed / samples if samples else None} for i, (samples, passed) in counts.items()]


def describe(rates: list[dict]) -> str:
    """How many prompts no sample solved, every sample solved, and the rest (the ones GRPO learns from)."""
    rated = [r["pass_rate"] for r in rates if r["pass_rate"] is not None]
    never, always, unrated = rated.count(0.0), rated.count(1.0), len(rates) - len(rated)
    return (f"{never} solved by no sample, {always} by every sample, {len(rated) - never - always} in between"
            + (f", {unrated} without a sample (their requests failed)" if unrated else ""))


def read(path: str) -> dict[str, float | None]:
    """A --pass_rates file as {prompt_key: pass rate}; one that is missing or not evaluate.py's is one line."""
    if not Path(path).is_file():
        raise Refusal(f"--pass_rates {path}: no such file; write one with evaluate.py <recipe> --split train "
                      "--rollouts 8 --pass_rates <file>")
    rates = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            rates[prompt_key(entry["prompt"])] = entry["pass_rate"]
        except (ValueError, KeyError, TypeError):
            raise Refusal(f"--pass_rates {path}: line {number} is not a line evaluate.py --pass_rates writes (a JSON "
                          "object with prompt and pass_rate)") from None
    return rates


def keep_by_pass_rate(dataset, path: str, between: list[float]):
    """The training rows whose prompt's pass rate lies strictly between `between`, logged in one line: how many were
    kept, dropped as never solved (at or below LOW), dropped as always solved (at or above HIGH), and not rated."""
    if len(between) != 2 or not 0.0 <= between[0] < between[1] <= 1.0:
        raise Refusal(f"--keep_pass_rate_between {' '.join(map(str, between))}: give LOW HIGH with 0 <= LOW < HIGH "
                      "<= 1 (default 0 1: drop the prompts solved by no sample or by every sample)")
    low, high = between
    rates = read(path)
    kept, never, always, unrated = [], 0, 0, 0
    for i, prompt in enumerate(dataset["prompt"]):
        rate = rates.get(prompt_key(prompt))
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
