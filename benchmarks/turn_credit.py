"""Does turn-level credit speed learning? Two agent_demo.py runs of one task, outcome-only rewards vs turn credit.

    python agent_demo.py --task search --seeds 0 1 2 --out_dir runs/outcome_only
    python agent_demo.py --task search --seeds 0 1 2 --out_dir runs/turn_credit --turn_credit 0.5
    python benchmarks/turn_credit.py runs/outcome_only/search runs/turn_credit/search --plot docs/turn_credit.png

Per seed and arm: held-out greedy accuracy after GRPO (the demo's results.json), and the learning curve of the
training batches' correctness (exact match for search, correctness for tool) at each logging step, read from the
GRPO run's last trainer_state.json. Both arms start from the same SFT model when their seeds match (agent_demo is
seeded end to end; the script checks that the SFT starts scored the same).
"""

import argparse
import json
import statistics
from pathlib import Path

CORRECT = {"search": "rewards/exact_match_reward_after_search/mean", "tool": "rewards/correctness_reward/mean"}
CHECKPOINTS = (10, 25, 50)


def learning_curve(run: Path, key: str) -> dict[int, float]:
    """{step: the training batches' mean of `key`} from the newest checkpoint of a GRPO run."""
    states = sorted(run.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    if not states:
        raise SystemExit(f"{run} holds no checkpoint with trainer_state.json: pass an agent_demo.py task folder")
    return {log["step"]: log[key] for log in json.loads(states[-1].read_text())["log_history"] if key in log}


def arm(folder: Path) -> dict:
    results = json.loads((folder / "results.json").read_text())
    key = CORRECT[results["args"]["task"]]
    seeds = {}
    for r in results["results"]:
        curve = learning_curve(folder / f"seed{r['seed']}" / "grpo", key)
        seeds[r["seed"]] = {"start": r["sft_start"]["accuracy"], "after": r["grpo"]["accuracy"], "curve": curve,
                            "train_mean": statistics.mean(curve.values())}
    return {"task": results["args"]["task"], "seeds": seeds}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outcome_only", type=Path, help="agent_demo.py's <out_dir>/<task> without --turn_credit")
    parser.add_argument("turn_credit", type=Path, help="the same with --turn_credit")
    parser.add_argument("--plot", type=Path, help="write the learning curves here")
    args = parser.parse_args(argv)
    arms = {"outcome only": arm(args.outcome_only), "turn credit": arm(args.turn_credit)}
    if len({a["task"] for a in arms.values()}) != 1:
        raise SystemExit("the two runs are of different tasks")
    seeds = sorted(set.intersection(*(set(a["seeds"]) for a in arms.values())))
    print(f"task {arms['outcome only']['task']}; train: the training batches' correctness at steps "
          f"{', '.join(map(str, CHECKPOINTS))} and its mean over the run; held-out: greedy accuracy")
    print("seed  arm            held-out start -> after   train " + "  ".join(f"@{s:<4}" for s in CHECKPOINTS)
          + "  mean")
    for seed in seeds:
        for name, a in arms.items():
            s = a["seeds"][seed]
            print(f"{seed:>4}  {name:<13}  {s['start']:>13.1%} -> {s['after']:<6.1%}        "
                  + "  ".join(f"{s['curve'].get(step, float('nan')):>5.2f}" for step in CHECKPOINTS)
                  + f"  {s['train_mean']:>4.2f}")
        if arms["outcome only"]["seeds"][seed]["start"] != arms["turn credit"]["seeds"][seed]["start"]:
            print(f"      seed {seed}: the SFT starts differ: the arms are not paired")
    if args.plot:
        from matplotlib.figure import Figure

        figure = Figure(figsize=(4 * len(seeds), 3.2), layout="constrained")
        for axis, seed in zip(figure.subplots(1, len(seeds), squeeze=False)[0], seeds):
            for name, a in arms.items():
                curve = a["seeds"][seed]["curve"]
                axis.plot(list(curve), list(curve.values()), marker="o", label=name)
            axis.set(title=f"seed {seed}", xlabel="GRPO step", ylabel="training batches correct", ylim=(0, 1))
        axis.legend(fontsize=8)
        figure.savefig(args.plot, dpi=90)
        print(f"wrote {args.plot}")
    return arms


if __name__ == "__main__":
    main()
