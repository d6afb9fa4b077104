"""A CPU-only test of merging skill specialists: GRPO on each skill from one SFT start, then merge_models.py.

    python experiments/merge_demo.py --seeds 0 1 2      # 20-27 minutes a seed on 2 cores

The task is agent_demo.py's tool task with a teacher that gets both kinds of problem wrong: it writes `a + b` in 60%
of the multiplications ("How many apples are in 86 crates?") and in 60% of the subtractions ("...sold 86. How many
are left?"), so the SFT start answers neither kind. From that start, through tool_use_grpo.py's own entry point:
  - specialist multiply: GRPO on multiplications only, --grpo_steps steps;
  - specialist subtract: GRPO on subtractions only, --grpo_steps steps;
  - joint: GRPO on both kinds, twice the steps (the two specialists' compute together);
  - merges of the two specialists (merge_models.py, base = the SFT start): linear (0.5 each), task_arithmetic
    (1 each: both updates whole) and ties (1 each, density 0.5).
Every model is evaluated greedy on --n_test held-out problems of both kinds, through TRL's multi-turn loop with the
recipe's tools and rubric (agent_demo.held_out). A merge keeps a skill when its accuracy on that kind reaches 90% of
the specialist's gain over the SFT start. Writes runs/merge_demo/results.json and results.png.
"""

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent_demo import TASK_DEFAULTS, grpo_argv, held_out, sft_start
from cpu_demo import run, say

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent  # the repository: the recipes these experiments run
SKILLS = ("multiply", "subtract")
MERGES = {"linear": {"weights": [0.5, 0.5]}, "task_arithmetic": {"weights": [1.0, 1.0]},
          "ties": {"weights": [1.0, 1.0], "density": 0.5}}
# An SFT start whose loss ends above this has not learned to copy the tool's result into its answer: every seed that
# stalled there (0.26-0.35) gave GRPO nothing to sharpen; the starts that copied ended at 0.02-0.10.
SFT_LOSS_COPIES = 0.15


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one full experiment per seed")
    parser.add_argument("--out_dir", default="runs/merge_demo", help="a folder per seed, results.json/png")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="replace an earlier demo")
    parser.add_argument("--n_sft", type=int, default=2000, help="teacher conversations for SFT")
    parser.add_argument("--n_rl", type=int, default=800, help="RL problems, both kinds (true answers only)")
    parser.add_argument("--n_test", type=int, default=500, help="held-out problems, both kinds")
    parser.add_argument("--copy_steps", type=int, default=1600, help="steps of copying.teach_copying (at 800, seed 1's "
                        "SFT stalled at loss 0.35 and its start could not copy a result; at 1600, 0.06 by step 125)")
    parser.add_argument("--sft_steps", type=int, default=250, help="SFT steps, batch 32, lr 1e-3 cosine")
    parser.add_argument("--grpo_steps", type=int, default=50, help="each specialist's GRPO steps (joint: twice)")
    parser.add_argument("--joint_steps", type=int, default=None, help="the joint run's GRPO steps (default: "
                        "2 x --grpo_steps, the specialists' compute together; 0: no joint run)")
    parser.add_argument("--grpo_lr", type=float, default=5e-5, help="GRPO learning rate, constant")
    parser.add_argument("--temperature", type=float, default=0.7, help="GRPO sampling temperature")
    args = parser.parse_args(argv)
    args.task = "tool"  # what agent_demo's stages read
    for name in ("sft_batch", "grpo_prompts", "solo_threads"):
        setattr(args, name, TASK_DEFAULTS["tool"][name])
    args.joint_steps = 2 * args.grpo_steps if args.joint_steps is None else args.joint_steps
    return args


def write_skill_data(out: Path, rl: list[dict]) -> None:
    """rl_<skill>/train.jsonl: each specialist's RL problems (the joint run's, out/rl, hold both kinds)."""
    for skill in SKILLS:
        folder = out / f"rl_{skill}"
        folder.mkdir(exist_ok=True)
        rows = [{"question": r["question"], "answer": r["answer"]} for r in rl if r["kind"] == skill]
        (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        (folder / "test.jsonl").write_text((out / "rl" / "test.jsonl").read_text())


def gains_kept(result: dict, model: str) -> dict:
    """Per skill: the share of its specialist's gain over the SFT start that `model` keeps."""
    kept = {}
    for skill in SKILLS:
        start = result["sft_start"][f"accuracy_{skill}"]
        gain = result[f"specialist_{skill}"][f"accuracy_{skill}"] - start
        kept[skill] = (result[model][f"accuracy_{skill}"] - start) / gain if gain > 0 else None
    return kept


def experiment(seed: int, args) -> dict:
    import merge_models

    out = Path(args.out_dir).resolve() / f"seed{seed}"
    start = time.time()
    recipe, rl, times = sft_start(out, seed, args, mistaken=SKILLS)
    sft_loss = float(re.findall(r"\| loss ([0-9.e-]+)", (out / "sft.log").read_text())[-1])  # its last logged step
    if sft_loss > SFT_LOSS_COPIES:
        say(f"seed {seed}: SFT ended at loss {sft_loss:.3f} (> {SFT_LOSS_COPIES}): the start has not learned to copy "
            "the tool's result, so its specialists will have little to gain; more --copy_steps or --sft_steps help")
    write_skill_data(out, rl)
    name = f"{recipe.__name__}.py"
    grpo = lambda model_dir, data, steps: grpo_argv(args, out, out / "sft", out / model_dir, seed,  # noqa: E731
                                                    data=data, steps=steps)
    with ThreadPoolExecutor(2) as pool:  # a core each: the two specialists, then the joint run beside the merges
        specialists = {skill: pool.submit(run, name, *grpo(f"specialist_{skill}", f"rl_{skill}", args.grpo_steps),
                                          log=out / f"specialist_{skill}.log") for skill in SKILLS}
        times.update({f"specialist_{skill}": future.result() for skill, future in specialists.items()})
        joint = args.joint_steps and pool.submit(run, name, *grpo("joint", "rl", args.joint_steps),
                                                 log=out / "joint.log")
        merge_start = time.time()
        for method, options in MERGES.items():
            merge_models.merge([str(out / f"specialist_{skill}") for skill in SKILLS], str(out / f"merge_{method}"),
                               method=method, base=None if method == "linear" else str(out / "sft"), seed=seed,
                               overwrite_output_dir=True, **options)
        times["merges"] = time.time() - merge_start
        models = ["sft", *[f"specialist_{skill}" for skill in SKILLS], *[f"merge_{method}" for method in MERGES]]
        say(f"seed {seed}: held-out figures of {', '.join(models)}")
        result = {"seed": seed, **{("sft_start" if m == "sft" else m): held_out(recipe, out / m, args, out)
                                   for m in models}}
        if joint:
            times["joint"] = joint.result()
            result["joint"] = held_out(recipe, out / "joint", args, out)
    result["kept"] = {model: gains_kept(result, model) for model in [*[f"merge_{m}" for m in MERGES], "joint"]
                      if model in result}
    result["sft_loss"] = sft_loss
    result["seconds"] = {**times, "total": time.time() - start}
    say(f"seed {seed}: {json.dumps({k: v for k, v in result.items() if k in ('kept', 'seconds')})}")
    return result


def plot(results: list[dict], path: Path) -> None:
    """Per skill and seed: SFT start, the specialist, each merge and the joint run."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 3.8), layout="constrained")
    arms = {"sft_start": "SFT start", "specialist": "its specialist", **{f"merge_{m}": m for m in MERGES},
            "joint": "joint GRPO (same compute)"}
    arms = {key: label for key, label in arms.items() if key == "specialist" or key in results[0]}
    width = 0.8 / len(arms)
    for axis, skill in zip(figure.subplots(1, len(SKILLS)), SKILLS, strict=True):
        for i, (key, label) in enumerate(arms.items()):
            key = f"specialist_{skill}" if key == "specialist" else key
            seeds = [r["seed"] + (i - (len(arms) - 1) / 2) * width for r in results]
            axis.bar(seeds, [100 * r[key][f"accuracy_{skill}"] for r in results], width, label=label)
        axis.set(title=f"held-out {skill} problems: greedy accuracy", xlabel="seed", ylabel="%",
                 xticks=[r["seed"] for r in results])
    figure.legend(*axis.get_legend_handles_labels(), loc="outside right center", fontsize=8)  # clear of the bars
    figure.savefig(path, dpi=90)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    out = Path(args.out_dir)
    if (out / "results.json").exists() and not args.overwrite_output_dir:
        raise Refusal(f"{out} already holds a demo (results.json): pass --overwrite_output_dir to replace it, or "
                      "another --out_dir")
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # everything is built here
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)
    results = [experiment(seed, args) for seed in args.seeds]
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    plot(results, out / "results.png")
    print("seed  skill     SFT start  specialist  linear  task_arith  ties    joint   best merge keeps  minutes"
          "  SFT loss")
    for r in results:
        for skill in SKILLS:
            cells = [r[m][f"accuracy_{skill}"] if m in r else float("nan")
                     for m in ("sft_start", f"specialist_{skill}", *[f"merge_{m}" for m in MERGES], "joint")]
            best = max((r["kept"][f"merge_{m}"][skill] for m in MERGES if r["kept"][f"merge_{m}"][skill] is not None),
                       default=None)
            print(f"{r['seed']:>4}  {skill:<8}  " + "  ".join(f"{c:>8.1%}" for c in cells)
                  + f"  {'no gain' if best is None else f'{best:.0%}':>16}  {r['seconds']['total'] / 60:>7.1f}"
                  + f"  {r['sft_loss']:>8.3f}")
    print(f"wrote {out / 'results.json'} and {out / 'results.png'}")
    return results


if __name__ == "__main__":
    run_script(main)
