"""What an LLM judge costs a GRPO step: pointwise (one call a completion) beside group-relative (one call a group).

    python offline.py && python benchmarks/bench_judge.py [--rounds 3] [--prompts 8] [--group 8]
    python benchmarks/bench_judge.py --base_url http://localhost:8001/v1 --model Qwen/Qwen2.5-7B-Instruct

One step's batch: --prompts of the offline kit's word problems, each with --group completions (its worked solution,
and the same with the final number changed), scored by grpo_recipes/judge.py's JudgeReward and GroupJudgeReward
against one rubric, each with a fresh cache, the two interleaved round by round. Prints each round's judge calls,
prompt and completion tokens, wall seconds and verdicts read, then the median ratios. Without --base_url,
`transformers serve` serves the kit's tiny model as a stand-in judge: its calls, tokens and seconds are real, its
verdicts mostly unreadable (None), so this measures what judging costs, not how well it judges.
"""

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_evaluate import serve_kit_model  # noqa: E402

from grpo_recipes.judge import GroupJudgeReward, JudgeReward  # noqa: E402
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

RUBRIC = """1. The final number answers the question correctly.
2. The working shows each step, and each step follows from the question.
3. No more words than the working needs."""


def step_batch(kit: Path, prompts: int, group: int, seed: int = 0) -> tuple[list, list]:
    """(prompts, completions) for one step: each problem `group` times, its solution right or with the number off."""
    rows = [json.loads(line) for line in (kit / "gsm8k_toy" / "train.jsonl").read_text().splitlines()][:prompts]
    if len(rows) < prompts:
        raise Refusal(f"the kit has {len(rows)} problems, fewer than --prompts {prompts}")
    rng = random.Random(seed)
    batch_prompts, completions = [], []
    for row in rows:
        working, _, number = row["answer"].rpartition("####")
        for _ in range(group):
            answer = number.strip() if rng.random() < 0.5 else str(int(number.replace(",", "")) + rng.randint(1, 9))
            batch_prompts.append([{"role": "user", "content": row["question"]}])
            completions.append([{"role": "assistant", "content": f"{working.strip()}\nThe answer is {answer}."}])
    return batch_prompts, completions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base_url", default=None, help="a running judge; default: serve the kit's model here")
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max_tokens", type=int, default=256, help="the judge's reasoning and verdict")
    parser.add_argument("--kit", type=Path, default=ROOT / "offline", help="the offline kit (`python offline.py`)")
    args = parser.parse_args()
    server = None
    if args.base_url is None:
        server, args.base_url, args.model = serve_kit_model(args.kit / "tiny-qwen2")
    try:
        prompts, completions = step_batch(args.kit, args.prompts, args.group)
        print(f"one step: {args.prompts} prompts x {args.group} completions, judge {args.model} at {args.base_url}, "
              f"max_tokens {args.max_tokens}, {args.rounds} rounds")
        kinds = {"pointwise JudgeReward": JudgeReward, "group GroupJudgeReward": GroupJudgeReward}
        found = {name: [] for name in kinds}
        for round_ in range(args.rounds):
            for name in list(kinds) if round_ % 2 == 0 else list(kinds)[::-1]:
                judge = kinds[name](RUBRIC, model=args.model, base_url=args.base_url, api_key="none",
                                    max_tokens=args.max_tokens, timeout=300)
                start = time.monotonic()
                scores = judge(completions, prompts=prompts)
                seconds = time.monotonic() - start
                stats = dict(judge.stats, wall=seconds, read=sum(score is not None for score in scores))
                found[name].append(stats)
                print(f"  round {round_ + 1} {name:>23}: {stats['calls']:4d} calls, {stats['prompt_tokens']:7d} "
                      f"prompt + {stats['completion_tokens']:6d} completion tokens, {seconds:6.2f} s, "
                      f"{stats['read']} of {len(scores)} verdicts read")
        point, group = ({key: statistics.median(run[key] for run in runs) for key in runs[0]}
                        for runs in found.values())
        print("group / pointwise: " + ", ".join(f"{label} {group[key] / point[key]:.2f}x" for key, label in (
            ("calls", "calls"), ("prompt_tokens", "prompt tokens"), ("completion_tokens", "completion tokens"),
            ("wall", "seconds")) if point[key]))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    run_script(main)
