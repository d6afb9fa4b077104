"""Difficulty filtering and a curriculum, measured: held-out accuracy against the completions generated to reach it.

    python experiments/difficulty_demo.py --seeds 0 1 2    # about 40 minutes on 2 cores; runs/difficulty_demo/

Two tasks, each from an SFT start built per seed, each arm trained through its recipe's entry point (a subprocess,
one core), a checkpoint every --eval_every steps scored by greedy held-out accuracy:

gsm8k: cpu_demo.py's toy word problems, whose teacher adds on 60% of compare problems, so the SFT start solves nearly
  every add and subtract problem and nearly no compare problem: most groups teach nothing. GRPO runs on a pool of
  --pool training prompts (each drawn several times), three ways:
    all        every prompt
    pre-filter `evaluate.py --pass_rates` rates each pool prompt over --rating_samples completions of the SFT start
               (served by `transformers serve`), and gsm8k_grpo.py --pass_rates keeps those strictly between 0 and 1;
               the rating's completions are counted as cost
    skip       gsm8k_grpo.py --skip_settled_after 1: a prompt whose group all scored alike is replaced when drawn again
reasoning-gym: reasoning_gym_grpo.py on chain_sum from an SFT start on level-0 gold answers; held-out accuracy at
  --target_level, two ways:
    fixed      --curriculum false --level <target>
    curriculum --curriculum true --level 0: up at a 0.75 pass rate, down at 0.1

Cost is completions generated: each GRPO step generates 64 (8 prompts x 8), whatever the arm. The ratio for an arm is
the completions it needed to first reach the baseline arm's final held-out accuracy (all, fixed), over those the
baseline needed; "not reached" where it never did within the run.
"""

import argparse
import json
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package

import cpu_demo  # noqa: E402 - its data, stages and scoring
from servers import transformers_server  # noqa: E402

from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

ROOT = cpu_demo.ROOT
GENERATIONS = 8  # completions per prompt; 8 prompts a step: 64 completions a step in every arm
GYM_TASK = "chain_sum"
RECIPES = {"gsm8k": "gsm8k_grpo.py", "gym": "reasoning_gym_grpo.py"}
ARMS = {"gsm8k": {"all": [], "pre-filter": ["--pass_rates", "{rates}"], "skip": ["--skip_settled_after", "1"]},
        "gym": {"fixed": ["--curriculum", "false", "--level", "{target}"],
                "curriculum": ["--curriculum", "true", "--level", "0"]}}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one SFT start per seed and task")
    parser.add_argument("--tasks", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out_dir", default="runs/difficulty_demo", help="results.json and a folder per task and seed")
    parser.add_argument("--reuse_starts", action="store_true",
                        help="reuse the data and SFT starts already in --out_dir; rate and train every arm afresh "
                             "(replacing the earlier ratings and arms there)")
    parser.add_argument("--grpo_steps", type=int, default=80, help="GRPO steps per arm, 64 completions each")
    parser.add_argument("--eval_every", type=int, default=5, help="steps between held-out evaluations")
    parser.add_argument("--sft_steps", type=int, default=400, help="SFT steps of each start, batch 64, lr 1e-3")
    parser.add_argument("--pool", type=int, default=160, help="gsm8k: training prompts GRPO draws from")
    parser.add_argument("--rating_samples", type=int, default=4, help="gsm8k: completions per prompt to rate it")
    parser.add_argument("--n_test", type=int, default=300, help="held-out problems per task")
    parser.add_argument("--target_level", type=int, default=1, help="reasoning-gym: the level held-out accuracy is "
                                                                  "measured at, and the fixed arm trains at")
    parser.add_argument("--grpo_lr", type=float, default=2e-5, help="GRPO learning rate, constant")
    parser.add_argument("--temperature", type=float, default=1.0, help="GRPO and rating sampling temperature")
    return parser.parse_args(argv)


def demo_args(args, task_dir: Path):
    """cpu_demo's options with this run's sizes (a folder per seed in `task_dir`): its stages are the stages here."""
    return cpu_demo.parse_args(["--out_dir", str(task_dir), "--n_test", str(args.n_test), "--sft_steps",
                                str(args.sft_steps), "--grpo_steps", str(args.grpo_steps), "--grpo_lr",
                                str(args.grpo_lr), "--temperature", str(args.temperature),
                                *(["--overwrite_output_dir"] if args.reuse_starts else [])])


# ------------------------------------------------------------------------------------------------- the SFT starts
def gsm8k_start(seed: int, args) -> dict:
    """cpu_demo's data, tiny model and SFT (its held-out accuracy); the pool of training prompts GRPO draws from."""
    out = Path(args.out_dir).resolve() / "gsm8k" / f"seed{seed}"
    if args.reuse_starts and (out / "sft" / "config.json").exists():
        before, seconds = cpu_demo.accuracy(out / "sft", out / "rl"), None
    else:
        out, before, seconds = cpu_demo.sft_start(seed, demo_args(args, out.parent))
    pool = out / "pool"  # the first --pool RL problems, and the held-out ones
    pool.mkdir(exist_ok=True)
    (pool / "train.jsonl").write_text("".join(line + "\n" for line in
                                              (out / "rl" / "train.jsonl").read_text().splitlines()[:args.pool]))
    (pool / "test.jsonl").write_text((out / "rl" / "test.jsonl").read_text())
    return {"dir": out, "sft_seconds": seconds, "accuracy": before["all"]}


def gym_rows(tasks, level: int, split: str, n: int) -> list[dict]:
    return [tasks.row(GYM_TASK, level, split, i) for i in range(n)]


def gym_start(seed: int, args) -> dict:
    """reasoning-gym's chain_sum: level-0 gold answers to imitate, a tiny model whose tokenizer learned their text,
    and an SFT start on them."""
    import offline
    import reasoning_gym_grpo
    from grpo_recipes.gym_tasks import TaskSet

    out = Path(args.out_dir).resolve() / "gym" / f"seed{seed}"
    if args.reuse_starts and (out / "sft" / "config.json").exists():
        return {"dir": out, "sft_seconds": None, "accuracy": held_out_accuracy("gym", out / "sft", seed, args)}
    (out / "gold").mkdir(parents=True, exist_ok=True)
    tasks = TaskSet(GYM_TASK, seed, reasoning_gym_grpo.SYSTEM_PROMPT)
    gold = gym_rows(tasks, 0, "train", 4000)
    for split, rows in (("train", gold), ("test", gym_rows(tasks, 0, "test", 64))):
        (out / "gold" / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    corpus = [row["prompt"][-1]["content"] + " " + row["gold_completion"] for row in gold[:2000]]
    harder = [row["prompt"][-1]["content"] for row in gym_rows(tasks, 2, "train", 200)]  # longer numbers, more terms
    corpus += [reasoning_gym_grpo.SYSTEM_PROMPT, *harder]
    offline.build_tiny_model(out / "tiny", corpus, vocab_size=400, seed=seed, hidden_size=128, num_layers=3,
                             single_digits=True, added_tokens=("<answer>", "</answer>"))
    seconds = cpu_demo.run("sft_warmstart.py", *cpu_demo.sft_argv(out / "tiny", out / "gold", out / "sft",
                                                                  args.sft_steps, seed, recipe="reasoning_gym_grpo"),
                           log=out / "sft.log")
    return {"dir": out, "sft_seconds": seconds, "accuracy": held_out_accuracy("gym", out / "sft", seed, args)}


# ------------------------------------------------------------------------------------------------------ held-out
def held_out_accuracy(task: str, model_dir: Path, seed: int, args) -> float:
    """Greedy accuracy on --n_test held-out problems, scored by evaluate.py with the recipe's rubric."""
    if task == "gsm8k":
        return cpu_demo.accuracy(model_dir, Path(args.out_dir).resolve() / "gsm8k" / f"seed{seed}" / "pool")["all"]
    import reasoning_gym_grpo

    script_args = reasoning_gym_grpo.ScriptArguments(tasks=GYM_TASK, task_seed=seed)
    with cpu_demo.EVALUATING:  # datasets is not thread-safe
        setup = reasoning_gym_grpo.setup(script_args)
        examples = list(setup.build_dataset("test", levels={GYM_TASK: args.target_level}, test_size=args.n_test))
    rows = cpu_demo.greedy_scored(model_dir, setup, examples, max_new_tokens=24)
    return sum(row["strict"] for row in rows) / len(rows)


# ----------------------------------------------------------------------------------------------------------- arms
def rate_pool(start: dict, seed: int, args) -> tuple[Path, int]:
    """`evaluate.py --pass_rates` on the pool, against the SFT start served by `transformers serve`: (the file, the
    completions it generated). The server gets a copy of the start whose generation_config.json says do_sample:
    transformers serve decodes greedily without it, whatever the request's temperature (every rate 0 or 1)."""
    out = start["dir"]
    sampling = out / "sft-sampling"
    shutil.copytree(out / "sft", sampling, dirs_exist_ok=True)
    config = json.loads((sampling / "generation_config.json").read_text())
    (sampling / "generation_config.json").write_text(json.dumps({**config, "do_sample": True}, indent=2))
    with transformers_server(sampling, out / "serve.log") as base_url:
        cpu_demo.run("evaluate.py", "gsm8k_grpo", "--base_url", base_url, "--model", str(sampling), "--split",
                     "train", "-n", str(args.pool), "-r", str(args.rating_samples), "--dataset_path", str(out / "pool"),
                     "--temperature", str(args.temperature), "--max_tokens", "32", "--concurrency", "8", "--out",
                     str(out / "rating.jsonl"), "--pass_rates", str(out / "rates.jsonl"),
                     *(["--overwrite_out"] if args.reuse_starts else []), log=out / "rating.log")
    return out / "rates.jsonl", args.pool * args.rating_samples


def arm_argv(task: str, arm: str, start: dict, seed: int, args, rates: Path | None) -> list[str]:
    """The recipe's flags for one arm: cpu_demo's GRPO settings from the seed's SFT start, a checkpoint every
    --eval_every steps, and the arm's own flags."""
    out, demo = start["dir"], demo_args(args, start["dir"].parent)
    folder = out / "arms" / arm
    flags = [flag.format(rates=rates, target=args.target_level) for flag in ARMS[task][arm]]
    flags += ["--save_steps", str(args.eval_every), "--save_total_limit", str(args.grpo_steps)]  # every checkpoint kept
    if task == "gsm8k":
        return cpu_demo.grpo_argv(out, folder, seed, demo, *flags, data="pool")
    return cpu_demo.grpo_argv(out, folder, seed, demo, "--tasks", GYM_TASK, "--task_seed", str(seed),
                              "--max_completion_length", "24", *flags, data=None)


def train_arm(task: str, arm: str, start: dict, seed: int, args, rating: tuple[Path, int] | None) -> dict:
    """One arm's GRPO run from the seed's SFT start, then the held-out accuracy of each of its checkpoints."""
    folder = start["dir"] / "arms" / arm
    folder.parent.mkdir(parents=True, exist_ok=True)
    began = time.time()
    cpu_demo.run(RECIPES[task], *arm_argv(task, arm, start, seed, args, rating[0] if rating else None),
                 log=folder.parent / f"{arm}.log")
    seconds = time.time() - began
    extra = rating[1] if arm == "pre-filter" and rating else 0
    curve = [{"step": 0, "completions": extra, "accuracy": start["accuracy"]}]
    for step in range(args.eval_every, args.grpo_steps + 1, args.eval_every):
        curve.append({"step": step, "completions": extra + step * 8 * GENERATIONS,
                      "accuracy": held_out_accuracy(task, folder / f"checkpoint-{step}", seed, args)})
    state = json.loads((folder / f"checkpoint-{args.grpo_steps}" / "trainer_state.json").read_text())
    logged = [{k: v for k, v in entry.items() if k == "step" or k.startswith(("settled/", "curriculum/", "reward"))
               or k == "frac_reward_zero_std"} for entry in state["log_history"] if "loss" in entry]
    return {"task": task, "arm": arm, "seed": seed, "curve": curve, "grpo_seconds": seconds, "log": logged}


def first_reaching(curve: list[dict], target: float) -> int | None:
    return next((point["completions"] for point in curve if point["accuracy"] >= target - 1e-9), None)


def ratios(results: list[dict]) -> list[dict]:
    """Per task and seed: each arm's completions to reach the baseline arm's final accuracy, over the baseline's."""
    table = []
    for task, arms in ARMS.items():
        baseline = next(iter(arms))
        for seed in sorted({r["seed"] for r in results if r["task"] == task}):
            runs = {r["arm"]: r for r in results if r["task"] == task and r["seed"] == seed}
            target = runs[baseline]["curve"][-1]["accuracy"]
            base_cost = first_reaching(runs[baseline]["curve"], target)
            for arm, run in runs.items():
                cost = first_reaching(run["curve"], target)
                ratio = cost / base_cost if cost is not None and base_cost else None
                table.append({"task": task, "seed": seed, "arm": arm, "target": target, "completions": cost,
                              "start": run["curve"][0]["accuracy"], "final": run["curve"][-1]["accuracy"],
                              "ratio": ratio})
    return table


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.out_dir)
    if out.exists() and any(out.iterdir()) and not args.reuse_starts:
        raise Refusal(f"{out} already holds a run: pass another --out_dir, or --reuse_starts to train new arms from "
                      "its SFT starts")
    cpu_demo.os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # everything is built here
    sys.path.insert(0, str(ROOT))
    # imported once here: transformers' lazy imports fail when two threads first reach them at once
    import evaluate, gsm8k_grpo, offline, reasoning_gym_grpo  # noqa: E401, F401
    from transformers import (AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast,  # noqa: F401
                              Qwen2Config, Qwen2ForCausalLM)
    began = time.time()
    jobs = [(task, seed) for task in args.tasks for seed in args.seeds]
    builders = {"gsm8k": gsm8k_start, "gym": gym_start}
    with ThreadPoolExecutor(2) as pool:  # one core each
        starts = dict(zip(jobs, pool.map(lambda job: builders[job[0]](job[1], args), jobs), strict=True))
        for (task, seed), start in starts.items():
            cpu_demo.say(f"{task} seed {seed}: SFT start {start['accuracy']:.1%} held-out")
        ratings = dict(zip([j for j in jobs if j[0] == "gsm8k"],
                           pool.map(lambda job: rate_pool(starts[job], job[1], args),
                                    [j for j in jobs if j[0] == "gsm8k"]), strict=True))
        runs = [(task, arm, seed) for task, seed in jobs for arm in ARMS[task]]
        results = list(pool.map(lambda r: train_arm(r[0], r[1], starts[(r[0], r[2])], r[2], args,
                                                    ratings.get((r[0], r[2]))), runs))
    for r in results:
        cpu_demo.say(f"{r['task']} seed {r['seed']} {r['arm']}: " +
                     " ".join(f"{p['completions']}:{p['accuracy']:.1%}" for p in r["curve"]))
    table = ratios(results)
    print("| task | seed | arm | SFT start | final | target (baseline's final) | completions to target | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for row in table:
        cost = f"{row['completions']:,}" if row["completions"] is not None else "not reached"
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "—"
        print(f"| {row['task']} | {row['seed']} | {row['arm']} | {row['start']:.1%} | {row['final']:.1%} | "
              f"{row['target']:.1%} | {cost} | {ratio} |")
    for task, arms in ARMS.items():
        for arm in arms:
            finals = [r["final"] for r in table if r["task"] == task and r["arm"] == arm]
            if finals:
                print(f"{task} {arm}: mean final accuracy {statistics.mean(finals):.1%} over {len(finals)} seed(s)")
    out.mkdir(parents=True, exist_ok=True)
    summary = {"args": vars(args), "minutes": (time.time() - began) / 60, "ratios": table, "runs": results,
               "sft_seconds": {f"{t}/{s}": start["sft_seconds"] for (t, s), start in starts.items()}}
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"wrote {out / 'results.json'} ({summary['minutes']:.1f} minutes)")
    return summary


if __name__ == "__main__":
    run_script(main)
