"""Why does a merge lose a specialist's gain: the other specialist's update, or its own update scaled down?

    python experiments/merge_demo.py --seeds 0 1 2
    python experiments/merge_scaling.py runs/merge_demo --scales 0.75

A linear merge of two specialists from one start is the start plus half of each one's update. For each seed of a
merge_demo.py run this evaluates, on the held-out problems of the demo (agent_demo.held_out):
  - half_<skill>: one specialist averaged with its own start (linear, 0.5 each): half its update and nothing else,
    on its skill. If it loses as much as the linear merge does, halving is the cause, not the other update;
  - task_arithmetic at each --scales value: the start plus that much of both updates (0.5 is the linear merge, 1.0
    the demo's task_arithmetic), on both skills.
Prints each one's share of the specialist's gain over the SFT start kept; writes <demo>/scaling.json (--out).
"""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

from cpu_demo import say  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("demo", type=Path, help="a merge_demo.py --out_dir (results.json, seed<N>/ folders)")
    parser.add_argument("--scales", type=float, nargs="*", default=[0.75], help="task_arithmetic weights to try "
                        "(each for both updates)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: every seed of the demo")
    parser.add_argument("--out", type=Path, help="where to write the figures (default: <demo>/scaling.json)")
    args = parser.parse_args(argv)
    args.out = args.out or args.demo / "scaling.json"
    if not (args.demo / "results.json").exists():
        raise Refusal(f"{args.demo} holds no results.json: pass a merge_demo.py --out_dir, e.g. runs/merge_demo")
    demo = json.loads((args.demo / "results.json").read_text())
    results = {r["seed"]: r for r in demo["results"] if args.seeds is None or r["seed"] in args.seeds}
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    import torch

    import agent_demo
    import merge_demo
    import merge_models
    import tool_use_grpo

    torch.set_num_threads(1)
    demo_args = argparse.Namespace(**demo["args"])
    table = {}
    for seed, result in results.items():
        out = (args.demo / f"seed{seed}").resolve()
        merges = {f"half_{skill}": dict(models=[out / f"specialist_{skill}", out / "sft"], method="linear",
                                        weights=[0.5, 0.5]) for skill in merge_demo.SKILLS}
        merges.update({f"task_arithmetic_{scale:g}": dict(models=[out / f"specialist_{s}" for s in merge_demo.SKILLS],
                                                         method="task_arithmetic", weights=[scale, scale],
                                                         base=str(out / "sft")) for scale in args.scales})
        for name, options in merges.items():
            say(f"seed {seed}: {name}")
            model = merge_models.merge([str(m) for m in options.pop("models")], str(out / f"scaling_{name}"),
                                       seed=seed, overwrite_output_dir=True, **options)
            result[name] = agent_demo.held_out(tool_use_grpo, model, demo_args, out)
        table[seed] = {name: merge_demo.gains_kept(result, name) for name in merges}
        table[seed].update({name: merge_demo.gains_kept(result, name) for name in ("merge_linear", "merge_ties")})
        evaluated = [*merges, "sft_start", *[f"specialist_{skill}" for skill in merge_demo.SKILLS]]
        table[seed]["accuracy"] = {name: {skill: result[name][f"accuracy_{skill}"] for skill in merge_demo.SKILLS}
                                   for name in evaluated}
    args.out.write_text(json.dumps(table, indent=1))
    print("share of each specialist's gain kept (multiply / subtract); half_<skill>: that specialist at half its "
          "update")
    names = [n for n in next(iter(table.values())) if n != "accuracy"]
    print("seed  " + "  ".join(f"{n:>22}" for n in names))
    for seed, row in table.items():
        cells = []
        for name in names:
            kept = [row[name][skill] for skill in merge_demo.SKILLS]
            if name.startswith("half_"):  # only its own skill means anything
                kept = [k if name == f"half_{skill}" else None
                        for k, skill in zip(kept, merge_demo.SKILLS, strict=True)]
            cells.append(" / ".join("   -" if k is None else f"{k:>4.0%}" for k in kept))
        print(f"{seed:>4}  " + "  ".join(f"{c:>22}" for c in cells))
    say(f"wrote {args.out}")
    return table


if __name__ == "__main__":
    run_script(main)
