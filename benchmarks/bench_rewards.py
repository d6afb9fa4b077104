"""Throughput of the GSM8K rubric (gsm8k_grpo.REWARD_FUNCS) against a naive gist-style rubric, on 10,000 completions;
then correctness_reward alone on MATH-style LaTeX answers.

    python benchmarks/bench_rewards.py [--n 10000] [--seed 0]

The naive baseline is the original GRPO gist's rubric shape, written here for comparison: regex extraction of the
<answer> block and exact string match for correctness, plus its integer check, two format regexes and tag count.
Both rubrics score the same completions in batches of 64 (as TRL calls them); the script prints completions/second,
the share of answers that took math-verify's slow path, and how often each rubric's correctness agrees with the
label the generator knows to be true. The MATH-style part scores LaTeX golds against equivalent spellings and wrong
answers that share a number with the gold, and prints its slow-path share and cost per answer.
"""

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rewards  # noqa: E402
from grpo_recipes import answers  # noqa: E402
from gsm8k_grpo import REWARD_FUNCS, REWARD_WEIGHTS  # noqa: E402


def naive_rubric(completions, answer):
    texts = [c[0]["content"] for c in completions]
    answers = [t.split("<answer>")[-1].split("</answer>")[0].strip() for t in texts]
    correct = [2.0 if a == g else 0.0 for a, g in zip(answers, answer, strict=True)]
    integer = [0.5 if a.isdigit() else 0.0 for a in answers]
    template = r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$"
    strict = [0.5 if re.match(template, t) else 0.0 for t in texts]
    soft = [0.5 if re.match(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", t) else 0.0 for t in texts]
    tags = ("<reasoning>\n", "\n</reasoning>\n", "\n<answer>\n", "\n</answer>")
    count = [0.125 * sum(t.count(tag) == 1 for tag in tags)
             for t in texts]
    return [sum(parts) for parts in zip(correct, integer, strict, soft, count, strict=True)], [c > 0 for c in correct]


def our_rubric(completions, answer):
    columns = [f(completions=completions, answer=answer) for f in REWARD_FUNCS]
    totals = [sum(w * v for w, v in zip(REWARD_WEIGHTS, row, strict=True)) for row in zip(*columns, strict=True)]
    return totals, [c > 0 for c in columns[0]]


def make_completion(rng: random.Random) -> tuple[str, str, bool]:
    """(completion text, gold, whether the completion truly answers correctly)."""
    gold = rng.randint(2, 5000)
    steps = "\n".join(f"Step {i}: {rng.randint(1, 99)} + {rng.randint(1, 99)}." for i in range(rng.randint(1, 6)))
    wrap = lambda a: f"<reasoning>\n{steps}\n</reasoning>\n<answer>\n{a}\n</answer>"  # noqa: E731
    kind = rng.random()
    if kind < 0.40:
        return wrap(gold), str(gold), True
    if kind < 0.50:
        variant = rng.choice([f"${gold}", f"{gold}.0", f"{gold:,}", f"\\boxed{{{gold}}}", f"{gold} dollars"])
        return wrap(variant), str(gold), True
    if kind < 0.55:  # arithmetic left undone: equal in value, not an answer to a GSM8K question (refused on purpose)
        return wrap(rng.choice([f"\\frac{{{gold * 2}}}{{2}}", f"{gold} \\cdot 1", f"2 \\times {gold / 2:g}",
                                f"\\sqrt{{{gold * gold}}}"])), str(gold), False
    if kind < 0.75:
        return wrap(gold + rng.randint(1, 9)), str(gold), False
    if kind < 0.85:
        return wrap(f"{gold - 1}, {gold}, {gold + 1}"), str(gold), False
    if kind < 0.95:
        several_blocks = wrap(gold + 1) + f"\n<answer>\n{gold}\n</answer>"  # hedging: is the last one the answer?
        return rng.choice([f"The answer is {gold}.", several_blocks]), str(gold), False
    return wrap(gold + 1) + " and so on" * 200, str(gold), False


def make_math_completion(rng: random.Random) -> tuple[str, str, bool]:
    """(completion text, LaTeX gold, truth) for MATH-style answers: fractions, roots, pi, percents, intervals."""
    (a, b), c = rng.sample(range(2, 10), 2), rng.randint(2, 30)  # a != b: a/b and b/a differ, a√b is not √b
    golds = {  # gold: (equivalent spellings, wrong answers that share a number with it)
        f"\\frac{{{a}}}{{{b}}}": ([f"\\frac{a}{b}", f"\\dfrac{{{a}}}{{{b}}}", f"{a}/{b}",
                                 f"\\frac{{{2 * a}}}{{{2 * b}}}"],
                                [f"\\frac{{{b}}}{{{a}}}", f"{a}", f"\\frac{{{a}}}{{{b}}}, \\frac{{{b}}}{{{a}}}"]),
        f"{a}\\sqrt{{{b}}}": ([f"{a}\\sqrt{b}", f"\\sqrt{{{a * a * b}}}"],
                             [f"{a}", f"\\sqrt{{{b}}}", f"{a}\\sqrt{{{b + 1}}}"]),
        f"{a}\\pi": ([f"{a} \\pi", f"\\pi \\cdot {a}"], [f"{a}", f"{a}\\pi^2", f"{a}\\pi \\text{{ or }} {b}"]),
        f"{c}\\%": ([f"{c}", f"{c} percent"], [f"{c + 1}\\%", f"{c} thousand"]),
        f"[{a}, {a + b})": ([f"[{a},{a + b})", f"\\left[{a}, {a + b}\\right)"], [f"[{a}, {a + b}]", f"{a}"]),
        f"x^2+{c}": ([f"{c}+x^2", f"x^{{2}} + {c}"], ["x^2", f"x^2-{c}", f"x^2+{c}=0"]),
    }
    gold = rng.choice(sorted(golds))
    right, wrong = golds[gold]
    correct = rng.random() < 0.5
    answer = rng.choice(right if correct else wrong)
    return f"<reasoning>\nworking\n</reasoning>\n<answer>\n{answer}\n</answer>", gold, correct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    data = [make_completion(rng) for _ in range(args.n)]
    completions = [[{"role": "assistant", "content": text}] for text, _, _ in data]
    golds, truth = [gold for _, gold, _ in data], [ok for _, _, ok in data]

    start = time.perf_counter()
    rewards.answers_match("2 \\cdot 1", "2")  # start the math-verify worker outside the timed runs
    print(f"math-verify worker start: {time.perf_counter() - start:.2f} s (once per process)")
    answers.VERIFY_STATS.clear()
    answers._math_verify_cached.cache_clear()

    slow_seconds = 0.0
    timed_equal = answers.MATH_VERIFY.equal

    def equal_timed(*args, **kwargs):
        nonlocal slow_seconds
        start = time.perf_counter()
        try:
            return timed_equal(*args, **kwargs)
        finally:
            slow_seconds += time.perf_counter() - start

    answers.MATH_VERIFY.equal = equal_timed
    for name, rubric in (("naive gist-style", naive_rubric), ("grpo-recipes", our_rubric)):
        start = time.perf_counter()
        credited = []
        for i in range(0, args.n, 64):
            credited += rubric(completions[i:i + 64], golds[i:i + 64])[1]
        seconds = time.perf_counter() - start
        agree = sum(c == t for c, t in zip(credited, truth, strict=True)) / args.n
        false_credit = sum(c and not t for c, t in zip(credited, truth, strict=True))
        missed = sum(t and not c for c, t in zip(credited, truth, strict=True))
        print(f"{name:>17}: {args.n / seconds:9,.0f} completions/s  correctness agrees with truth on {agree:6.1%}"
              f"  (credited wrongly {false_credit}, missed {missed})")
    decided = sum(answers.VERIFY_STATS.values()) - answers.VERIFY_STATS["timeout"]
    print(f"answer comparisons: {dict(answers.VERIFY_STATS)}; slow path share "
          f"{answers.VERIFY_STATS['slow'] / max(decided, 1):.1%}, {slow_seconds:.2f} s in math-verify "
          f"({1000 * slow_seconds / max(answers.VERIFY_STATS['slow'], 1):.1f} ms an answer); without it the rubric "
          f"would run at {args.n / (seconds - slow_seconds):,.0f} completions/s")

    math_data = [make_math_completion(rng) for _ in range(args.n // 10)]
    answers.VERIFY_STATS.clear()
    slow_seconds = 0.0
    start = time.perf_counter()
    credited = []
    for i in range(0, len(math_data), 64):
        batch = math_data[i:i + 64]
        credited += rewards.correctness_reward([[{"role": "assistant", "content": t}] for t, _, _ in batch],
                                               answer=[gold for _, gold, _ in batch])
    seconds = time.perf_counter() - start
    truth = [ok for _, _, ok in math_data]
    false_credit = sum(bool(c) and not t for c, t in zip(credited, truth, strict=True))
    missed = sum(t and not c for c, t in zip(credited, truth, strict=True))
    print(f"MATH-style answers: {len(math_data) / seconds:9,.0f} completions/s, correctness agrees with truth on "
          f"{sum(bool(c) == t for c, t in zip(credited, truth, strict=True)) / len(math_data):.1%} (credited wrongly "
          f"{false_credit}, missed {missed}); slow path share {answers.VERIFY_STATS['slow'] / len(math_data):.1%}, "
          f"{1000 * slow_seconds / max(answers.VERIFY_STATS['slow'], 1):.1f} ms an answer in math-verify "
          f"({dict(answers.VERIFY_STATS)})")


    worst_cases()


def degenerate_batch(size: int = 64, characters: int = 32_000) -> list:
    """What a collapsing policy writes: the template, truncated and repeated, ~8K tokens per completion."""
    pieces = ["<reasoning>\n", "3 + 4 = 7\n", "</reasoning>\n", "<answer>\n", "7\n", "</answer>\n"]
    generator, batch = random.Random(0), []
    for _ in range(size):
        parts = []
        while sum(map(len, parts)) < characters:
            parts += pieces[:generator.randint(1, len(pieces))]
        batch.append([{"role": "assistant", "content": "".join(parts)}])
    return batch


def worst_cases() -> None:
    """The rubric's worst batches: degenerate completions, and answers that each cost math-verify seconds."""
    batch = degenerate_batch()
    start = time.perf_counter()
    for reward in REWARD_FUNCS:
        reward(completions=batch, answer=["7"] * len(batch))
    print(f"worst case, 64 degenerate completions of ~8K tokens, GSM8K rubric: {time.perf_counter() - start:.3f} s")
    answers.VERIFY_STATS.clear()
    slow = [[{"role": "assistant", "content": f"<answer>\\binom{{{300_000 + i}}}{{{150_000 + i}}}</answer>"}]
            for i in range(64)]
    start = time.perf_counter()
    rewards.correctness_reward(slow, answer=["\\frac{1}{2}"] * len(slow))
    print(f"worst case, 64 answers that each stall math-verify, correctness_reward: {time.perf_counter() - start:.1f} "
          f"s (slow-path budget {answers.SLOW_PATH_SECONDS_PER_BATCH:g} s a batch; {dict(answers.VERIFY_STATS)})")


if __name__ == "__main__":
    main()
