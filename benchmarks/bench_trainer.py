"""What a recipe costs per step beside a bare TRL GRPOTrainer with the same model, data, rubric and config.

    python offline.py && python benchmarks/bench_trainer.py [--rounds 4] [--steps 8]

The recipe runs through its own entry point (`gsm8k_grpo.main`: the pre-flight checks, the compact logs, the run
summary, the saved model and curves); the bare trainer is what a user would write instead: `GRPOTrainer(model,
reward_funcs, args, train_dataset)` and `train()`, with the GRPOConfig the recipe's options resolve to, the recipe's
own dataset and reward functions, and the config's thread count (its `env:` block). Each runs in a process of its own
on the offline kit's tiny model, the two interleaved round by round. Prints each run's seconds per step (TRL's
train_runtime over its steps), its time from the process's start to the end of its first step, and the process's CPU
seconds, then the median ratios.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo_recipes.refusal import Refusal, run_script  # noqa: E402
STARTED = time.monotonic()


def run_one(kind: str, kit: Path, steps: int, out: Path) -> None:
    """The child process: train `steps` steps one way; print seconds per step, seconds to the first step's end."""
    import gsm8k_grpo
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo_recipes import options, training

    first_step = []

    class FirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if not first_step:
                first_step.append(time.monotonic() - STARTED)

    argv = ["--config", str(kit / "gsm8k_grpo.yaml"), "--output_dir", str(out), "--max_steps", str(steps),
            "--save_strategy", "no", "--eval_strategy", "no"]
    if kind == "recipe":
        original = training.run_training

        def run_training(trainer, training_args=None):  # the recipe's own, with the first step timed
            trainer.add_callback(FirstStep())
            return original(trainer, training_args)

        training.run_training = run_training
        trainer = gsm8k_grpo.main(argv)
    else:
        script_args, training_args, model_args = options.parse_args(gsm8k_grpo.ScriptArguments,
                                                                    gsm8k_grpo.RECIPE_DEFAULTS, argv)
        if "OMP_NUM_THREADS" in os.environ:  # the config's `env:` threads, as the recipe applies them (torch read
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # the variable at import, before the config)
        trainer = GRPOTrainer(model=model_args.model_name_or_path, reward_funcs=gsm8k_grpo.REWARD_FUNCS,
                              args=training_args, callbacks=[FirstStep()],
                              train_dataset=gsm8k_grpo.build_dataset("train", script_args.dataset_path))
        trainer.train()
    runtime = next(log["train_runtime"] for log in trainer.state.log_history if "train_runtime" in log)
    print(json.dumps({"per_step": runtime / trainer.state.global_step, "first_step": first_step[0]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kit", type=Path, default=ROOT / "offline", help="the offline kit (`python offline.py`)")
    parser.add_argument("--one", nargs=2, metavar=("KIND", "OUT"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.one:
        return run_one(args.one[0], args.kit, args.steps, Path(args.one[1]))
    if not (args.kit / "gsm8k_grpo.yaml").is_file():
        raise Refusal(f"no {args.kit / 'gsm8k_grpo.yaml'}: run `python offline.py` first")
    found = {"gsm8k_grpo.main": [], "bare TRL GRPOTrainer": []}
    print(f"{args.steps} GRPO steps of the offline kit's tiny model on CPU, {args.rounds} rounds")
    for round_ in range(args.rounds):
        for name in list(found) if round_ % 2 == 0 else list(found)[::-1]:
            with tempfile.TemporaryDirectory() as out:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                kind = "recipe" if name.startswith("gsm8k") else "bare"
                proc = subprocess.run([sys.executable, __file__, "--kit", str(args.kit), "--steps", str(args.steps),
                                       "--one", kind, out], cwd=ROOT, capture_output=True, text=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode:
                raise Refusal(f"{name} failed:\n{proc.stderr[-3000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            found[name].append(result)
            print(f"  round {round_ + 1} {name:>21}: {result['per_step']:6.3f} s a step, first step done at "
                  f"{result['first_step']:5.1f} s, process CPU {result['cpu']:5.1f} s")
    medians = {name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
               for name, runs in found.items()}
    recipe, bare = medians.values()
    print("recipe / bare TRL: " + ", ".join(f"{label} {recipe[key] / bare[key]:.2f}x" for key, label in
                                            (("per_step", "per step"), ("first_step", "to the first step's end"),
                                             ("cpu", "process CPU"))))


if __name__ == "__main__":
    run_script(main)
