"""Which advantage scaling and loss the recipes should default to, measured: cpu_demo.py's pipeline, one GRPO
variant after another from the same SFT start, on several seeds.

    python experiments/ablate_grpo.py --seeds 0 1 2          # about 45 minutes on 2 cores; runs/ablation/results.json

Each seed builds cpu_demo's data, tiny model and SFT start once; then every variant trains GRPO from that start with
cpu_demo's settings plus the variant's flags (two at a time, one core each) and is scored by greedy held-out accuracy.
Every seed of every variant is reported, with the mean gain over the SFT start.
"""

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cpu_demo  # noqa: E402

# name -> gsm8k_grpo.py flags on top of cpu_demo's (TRL 1.16's defaults: scale_rewards "group", loss_type "dapo").
VARIANTS = {
    "group": ["--scale_rewards", "group"],  # TRL's default: each group's rewards over their own std
    "batch": ["--scale_rewards", "batch"],  # Lite PPO: over the whole batch's std
    "none": ["--scale_rewards", "none"],  # Dr. GRPO: no scaling, only the group mean removed
    "none+dr_grpo": ["--scale_rewards", "none", "--loss_type", "dr_grpo"],  # Dr. GRPO's scaling and loss
    "batch+clip_higher+mask": ["--scale_rewards", "batch", "--epsilon_high", "0.28",  # DAPO's clip-higher and
                               "--mask_truncated_completions", "true"],  # truncated completions left out
    # the original gist's gradient clip 0.1 (the recipes' before 2026-12-04) against cpu_demo's TRL default 1.0
    "none+max_grad_norm_0.1": ["--scale_rewards", "none", "--max_grad_norm", "0.1"],
}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out_dir", default="runs/ablation")
    known, rest = parser.parse_known_args(argv)
    args = cpu_demo.parse_args(["--out_dir", known.out_dir, "--overwrite_output_dir", *rest])
    cpu_demo.os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    results = {name: [] for name in known.variants}
    for seed in known.seeds:
        out, before, _ = cpu_demo.sft_start(seed, args)

        def variant(name: str, out=out, seed=seed, before=before) -> dict:  # this seed's, bound now
            folder = out / "ablation" / name
            folder.parent.mkdir(parents=True, exist_ok=True)
            start = time.time()
            cpu_demo.run("gsm8k_grpo.py", *cpu_demo.grpo_argv(out, folder, seed, args, *VARIANTS[name]),
                         log=folder.parent / f"{name}.log")  # not with_suffix: a name may hold a dot (0.1)
            after = cpu_demo.accuracy(folder, out / "rl")
            return {"seed": seed, "sft_start": before["all"], "after": after["all"], "compare": after["compare"],
                    "add": after["add"], "gain": after["all"] - before["all"], "minutes": (time.time() - start) / 60}

        with ThreadPoolExecutor(2) as pool:  # one core each
            for name, row in zip(known.variants, pool.map(variant, known.variants), strict=True):
                results[name].append(row)
                cpu_demo.say(f"seed {seed} {name}: {row['sft_start']:.1%} -> {row['after']:.1%} ({row['gain']:+.1%})")
    print("| variant | " + " | ".join(f"seed {s}" for s in known.seeds) + " | mean gain |")
    print("|---|" + "---|" * (len(known.seeds) + 1))
    for name, rows in results.items():
        cells = [f"{r['sft_start']:.1%} → {r['after']:.1%} ({r['gain']:+.1%})" for r in rows]
        print(f"| {name} | " + " | ".join(cells) + f" | **{statistics.mean(r['gain'] for r in rows):+.1%}** |")
    path = Path(known.out_dir) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"variants": VARIANTS, "results": results}, indent=1))
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
