"""Does turn-level credit speed learning? GRPO from agent_demo.py's SFT starts, outcome-only and with turn credit.

    python experiments/agent_demo.py --task search --seeds 0 1 2  # data, SFT starts (runs/agent_demo/search/seed*/sft)
    python experiments/turn_credit.py runs/agent_demo/search --turn_credit 0.5 --plot docs/turn_credit_search.png

For each seed of the demo, two GRPO runs from its SFT start, each exactly the demo's GRPO run (data, seed, steps and
settings: agent_demo.grpo_argv) but for the weight of the recipe's turn-level credit reward (search:
new_evidence_reward, tool: used_output_reward): 0 (outcome only; the recipes' default) and --turn_credit. Two runs
at a time, a core each. Compared on held-out greedy accuracy after GRPO (agent_demo.held_out) and on the learning
curve: the training batches' correctness (exact match for search, correctness for tool) at each logging step, from
each run's trainer_state.json. The demo's own after-GRPO figure is printed beside the outcome-only rerun: equal when
the runs are deterministic. Writes <out_dir>/results.json.
"""

import argparse
import json
import os
import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

import agent_demo  # noqa: E402
from cpu_demo import run, say  # noqa: E402

CORRECT = {"search": "rewards/exact_match_reward_after_search/mean", "tool": "rewards/correctness_reward/mean"}
STEPS_SHOWN = (10, 25, 50)


def learning_curve(run_dir: Path, key: str) -> dict[int, float]:
    """{step: the training batches' mean of `key`} from the newest checkpoint of a GRPO run."""
    states = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    if not states:
        raise Refusal(f"{run_dir} holds no checkpoint with trainer_state.json: is it an agent_demo.py GRPO run?")
    return {log["step"]: log[key] for log in json.loads(states[-1].read_text())["log_history"] if key in log}


def checked_demo(args) -> dict:
    """The demo's results.json, once --out_dir, the demo and --turn_credit make a comparison (each mistake one line)."""
    if (args.out_dir / "results.json").exists() and not args.overwrite_output_dir:
        raise Refusal(f"{args.out_dir} already holds a comparison (results.json): pass --overwrite_output_dir to "
                      "replace it, or another --out_dir")
    if not (args.demo / "results.json").exists():
        raise Refusal(f"{args.demo} holds no results.json: pass an agent_demo.py task folder, e.g. "
                      "runs/agent_demo/search")
    demo = json.loads((args.demo / "results.json").read_text())
    if demo["args"].get("turn_credit") is not None:
        raise Refusal(f"{args.demo} was run with --turn_credit {demo['args']['turn_credit']}: the outcome-only arm "
                      "must not")
    if not 0 < args.turn_credit < 1:
        raise Refusal(f"--turn_credit {args.turn_credit}: must be in (0, 1) (0 is the outcome-only arm; 1 or more "
                      "could outweigh a correct answer)")
    return demo


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("demo", type=Path, help="an agent_demo.py task folder (<out_dir>/<task>), run without "
                        "--turn_credit")
    parser.add_argument("--turn_credit", type=float, default=0.5, help="the turn-level credit reward's weight")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: every seed of the demo")
    parser.add_argument("--out_dir", type=Path, default=Path("runs/turn_credit"))
    parser.add_argument("--overwrite_output_dir", action="store_true", help="replace an earlier comparison")
    parser.add_argument("--plot", type=Path, help="also draw the learning curves here")
    args = parser.parse_args(argv)
    demo = checked_demo(args)
    # The runs write to --out_dir only; the demo's folder is read (its data, index and SFT starts), never written.
    demo_args = argparse.Namespace(**{**demo["args"], "overwrite_output_dir": True})
    demo_results = {r["seed"]: r for r in demo["results"]}
    seeds = args.seeds or list(demo_results)
    if set(seeds) - set(demo_results):
        raise Refusal(f"{args.demo} holds seeds {sorted(demo_results)}, not {sorted(set(seeds) - set(demo_results))}")
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    import importlib

    import torch

    torch.set_num_threads(1)
    recipe = importlib.import_module(agent_demo.TURN_CREDIT[demo_args.task][0])
    key = CORRECT[demo_args.task]
    held_out_lock = threading.Lock()

    def arm(job: tuple[int, float]) -> dict:
        seed, weight = job
        data = (args.demo / f"seed{seed}").resolve()
        out = (args.out_dir / f"credit{weight:g}" / f"seed{seed}").resolve()
        out.mkdir(parents=True, exist_ok=True)
        arm_args = argparse.Namespace(**{**vars(demo_args), "turn_credit": weight})
        seconds = run(f"{recipe.__name__}.py", *agent_demo.grpo_argv(arm_args, data, data / "sft", out / "grpo", seed),
                      log=out / "grpo.log")
        with held_out_lock:  # held_out loads the seed's index and sets the tool budget: module state, one at a time
            figures = agent_demo.held_out(recipe, out / "grpo", arm_args, data)
        return {"after": figures["accuracy"], "curve": learning_curve(out / "grpo", key), "seconds": seconds,
                **{k: figures[k] for k in ("retrieved", "tool_calls", "teacher_mistake") if k in figures}}

    jobs = [(seed, weight) for seed in seeds for weight in (0.0, args.turn_credit)]
    with ThreadPoolExecutor(2) as pool:  # two GRPO runs at a time, a core each
        arms = dict(zip(jobs, pool.map(arm, jobs), strict=True))
    rows = {seed: {"sft_start": demo_results[seed]["sft_start"]["accuracy"],
                   "demo_after": demo_results[seed]["grpo"]["accuracy"],
                   "outcome_only": arms[seed, 0.0], "turn_credit": arms[seed, args.turn_credit]} for seed in seeds}
    summary = {"task": demo_args.task, "turn_credit": args.turn_credit, "demo": str(args.demo), "seeds": rows}
    (args.out_dir / "results.json").write_text(json.dumps(summary, indent=1))
    print(f"{demo_args.task}: held-out greedy accuracy after {demo_args.grpo_steps} GRPO steps, and the training "
          f"batches' correctness at steps {', '.join(map(str, STEPS_SHOWN))} and over the run (mean)")
    print("seed  arm                 SFT start -> after GRPO   train " + "  ".join(f"@{s:<4}" for s in STEPS_SHOWN)
          + "  mean   (the demo's own run)")
    for seed, row in rows.items():
        for name, label in (("outcome_only", "outcome only"), ("turn_credit", f"turn credit {args.turn_credit:g}")):
            curve = row[name]["curve"]
            print(f"{seed:>4}  {label:<18}  {row['sft_start']:>9.1%} -> {row[name]['after']:<6.1%}           "
                  + "  ".join(f"{curve.get(step, float('nan')):>5.2f}" for step in STEPS_SHOWN)
                  + f"  {statistics.mean(curve.values()):>4.2f}"
                  + (f"   ({row['demo_after']:.1%})" if name == "outcome_only" else ""))
    if args.plot:
        from matplotlib.figure import Figure

        figure = Figure(figsize=(4 * len(rows), 3.2), layout="constrained")
        for axis, (seed, row) in zip(figure.subplots(1, len(rows), squeeze=False)[0], rows.items(), strict=True):
            for name in ("outcome_only", "turn_credit"):
                curve = row[name]["curve"]
                axis.plot(list(curve), list(curve.values()), marker="o", label=name.replace("_", " "))
            axis.set(title=f"seed {seed}", xlabel="GRPO step", ylabel="training batches correct", ylim=(0, 1))
        axis.legend(fontsize=8)
        figure.savefig(args.plot, dpi=90)
    say(f"wrote {args.out_dir / 'results.json'}" + (f" and {args.plot}" if args.plot else ""))
    return summary


if __name__ == "__main__":
    run_script(main)
