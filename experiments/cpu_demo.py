"""A CPU-only demo that GRPO learns: a tiny model, an imperfect teacher, and the recipes' own entry points.

    python experiments/cpu_demo.py                  # one seed, about 8 minutes on 2 cores
    python experiments/cpu_demo.py --seeds 0 1 2    # the README's table (runs/cpu_demo/results.json, results.png)

The task is one-step word problems of three kinds: "Ava has 9 shells. Ava finds 4 more. How many ...now?" (add),
"...gives 4 to Ben. How many ...left?" (subtract) and "Ava has 9 shells. Ben has 4 shells. How many more shells does
Ava have than Ben?" (compare: subtract). The teacher whose worked solutions the model imitates has a misconception:
on compare problems it adds instead of subtracting TEACHER_ERROR of the time. SFT copies that, faithfully. GRPO's
correctness reward checks the true answer, so RL can fix what imitation copied, and an SFT control given the same
wall-clock time as GRPO shows that more imitation does not.

Each step is the project's own entry point, in a subprocess as a user would run it:
  1. data: SFT problems with the teacher's solutions, disjoint RL problems with true answers, and held-out test
     problems seen by neither (all in GSM8K form)
  2. offline.build_tiny_model: a random Qwen2 (hidden 128, 3 layers, 0.50M parameters), single-digit tokens
  3. sft_warmstart.py --source gold on the teacher's solutions
  4. greedy held-out accuracy, scored by evaluate.py's scoring with the recipe's rubric
  5. gsm8k_grpo.py from the SFT model on the RL problems; beside it, the SFT control (more SFT, same wall time)
  6. greedy held-out accuracy of both
"""

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent  # the repository: the recipes these experiments run
NAMES = ["Ava", "Ben", "Chidi", "Dana", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luca"]
ITEMS = ["marbles", "stickers", "apples", "pencils", "stamps", "shells"]
KINDS = ["add", "subtract", "compare"]
TEACHER_ERROR = 0.6  # share of compare problems the teacher solves by adding
# One held-out evaluation at a time in this process: loading a model and a dataset is not thread-safe (two threads at
# once got models that answered 0 of 300 held-out problems where one alone answered 205, and a tqdm AttributeError
# from datasets); the demos that train two arms at once evaluate them in threads.
EVALUATING = threading.RLock()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one full pipeline per seed")
    parser.add_argument("--out_dir", default="runs/cpu_demo", help="results.json, results.png, and a folder per seed")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="replace an earlier demo in --out_dir")
    parser.add_argument("--max_number", type=int, default=9, help="operands are 1..max_number")
    parser.add_argument("--n_sft", type=int, default=6000, help="SFT problems (teacher's solutions)")
    parser.add_argument("--n_rl", type=int, default=3000, help="RL problems (true answers only)")
    parser.add_argument("--n_test", type=int, default=600, help="held-out problems, never seen in SFT or RL")
    parser.add_argument("--sft_steps", type=int, default=400, help="SFT steps, batch 64, lr 1e-3 cosine")
    parser.add_argument("--grpo_steps", type=int, default=150, help="GRPO steps, 8 prompts x 8 completions each")
    parser.add_argument("--grpo_lr", type=float, default=2e-5, help="GRPO learning rate, constant")
    parser.add_argument("--temperature", type=float, default=0.7, help="GRPO sampling temperature")
    parser.add_argument("--control_ratio", type=float, default=1.4,
                        help="SFT control steps per GRPO step: the ratio of their step times on a 2-core CPU")
    return parser.parse_args(argv)


# -------------------------------------------------------------------------------------------------------------- data
def problem(rng: random.Random, max_number: int, teacher_error: float) -> dict:
    """One word problem in GSM8K form; with teacher_error > 0 the worked solution is the teacher's, mistakes and all."""
    a, b = rng.sample(NAMES, 2)
    item, kind = rng.choice(ITEMS), rng.choice(KINDS)
    x = rng.randint(2, max_number)
    y = rng.randint(1, max_number) if kind == "add" else rng.randint(1, x - 1)
    question = {
        "add": f"{a} has {x} {item}. {a} finds {y} more. How many {item} does {a} have now?",
        "subtract": f"{a} has {x} {item}. {a} gives {y} to {b}. How many {item} does {a} have left?",
        "compare": f"{a} has {x} {item}. {b} has {y} {item}. How many more {item} does {a} have than {b}?",
    }[kind]
    adds = kind == "add" or (kind == "compare" and rng.random() < teacher_error)  # the teacher's misconception
    result = x + y if adds else x - y
    return {"question": question, "answer": f"{x} {'+' if adds else '-'} {y} = {result}\n#### {result}", "kind": kind,
            "true_answer": x + y if kind == "add" else x - y}


def write_data(out: Path, seed: int, args) -> None:
    """teacher/train.jsonl (SFT), rl/train.jsonl (true answers), rl/test.jsonl (held out); no question in two sets."""
    rng, seen = random.Random(seed), set()

    def unique(n: int, teacher_error: float) -> list[dict]:
        rows = []
        while len(rows) < n:
            row = problem(rng, args.max_number, teacher_error)
            if row["question"] not in seen:
                seen.add(row["question"])
                rows.append(row)
        return rows

    test, rl, sft = unique(args.n_test, 0.0), unique(args.n_rl, 0.0), unique(args.n_sft, TEACHER_ERROR)
    for path, rows in ((out / "rl" / "test.jsonl", test), (out / "rl" / "train.jsonl", rl),
                       (out / "teacher" / "train.jsonl", sft)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


# ------------------------------------------------------------------------------------------------------- the pipeline
def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def run(script: str, *argv: str, log: Path, threads: int = 1) -> float:
    """`python <script> <argv>` from the repository root, one torch thread unless told; returns its wall time in
    seconds."""
    start = time.time()
    say(f"{script} ... (its log: {log})")
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, str(ROOT / script), *argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if proc.returncode:
        raise Refusal(f"{script} failed (exit {proc.returncode}); its log: {log}")
    return time.time() - start


def sft_argv(model: Path, data: Path, out: Path, steps: int, seed: int, learning_rate: float = 1e-3,
             recipe: str = "gsm8k_grpo") -> list[str]:
    return ["--recipe", recipe, "--source", "gold", "--dataset_path", str(data), "--model_name_or_path",
            str(model), "--output_dir", str(out), "--max_steps", str(steps), "--learning_rate", str(learning_rate),
            "--per_device_train_batch_size", "64", "--gradient_accumulation_steps", "1", "--warmup_steps", "0.05",
            "--use_cpu", "--gradient_checkpointing", "false", "--logging_steps", "25", "--seed", str(seed)]


def greedy_scored(model_dir: Path, task, examples: list[dict], max_new_tokens: int = 32) -> list[dict]:
    """Each example's greedy completion from the model in `model_dir`, as evaluate.py's rollout rows, scored by
    evaluate.py with the recipe's rubric (`task`, its Setup): `row["strict"]` is a right answer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import evaluate

    torch.set_num_threads(1)
    with EVALUATING:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        rows = []
        for start in range(0, len(examples), 100):
            prompts = [example["prompt"] for example in examples[start:start + 100]]
            batch = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, padding=True, return_dict=True,
                                                  return_tensors="pt")
            with torch.no_grad():
                output = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
            for prompt, ids in zip(prompts, output[:, batch["input_ids"].shape[1]:], strict=True):
                text = tokenizer.decode(ids, skip_special_tokens=True)
                rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": text}],
                             "usage": {"completion_tokens": 0}})
        evaluate.score(task, rows, examples)
    return rows


def accuracy(model_dir: Path, data_dir: Path) -> dict:
    """Greedy held-out accuracy (overall, per kind), each completion scored by evaluate.py with the recipe's rubric."""
    import gsm8k_grpo

    with EVALUATING:  # datasets' loading is not thread-safe either
        examples = list(gsm8k_grpo.build_dataset("test", str(data_dir)))
    kinds = [json.loads(line)["kind"] for line in (data_dir / "test.jsonl").read_text().splitlines()]
    rows = greedy_scored(model_dir, gsm8k_grpo.setup(gsm8k_grpo.ScriptArguments(dataset_path=str(data_dir))), examples)
    result = {"all": sum(row["strict"] for row in rows) / len(rows)}
    for kind in KINDS:
        result[kind] = sum(row["strict"] for row, k in zip(rows, kinds, strict=True) if k == kind) / kinds.count(kind)
    result["sample"] = rows[0]["completion"][0]["content"]
    return result


def sft_start(seed: int, args) -> tuple[Path, dict, float]:
    """One seed's data, tiny model and SFT: (its folder, held-out accuracy of the SFT model, SFT seconds)."""
    import gsm8k_grpo  # here, not at the top: they import torch, and `--help` should not wait for it
    import offline

    out = Path(args.out_dir).resolve() / f"seed{seed}"
    say(f"seed {seed}: data and the tiny model in {out}")
    write_data(out, seed, args)
    corpus = (out / "teacher" / "train.jsonl").read_text().splitlines()[:2000] + [gsm8k_grpo.SYSTEM_PROMPT]
    offline.build_tiny_model(out / "tiny", corpus, vocab_size=400, seed=seed, hidden_size=128, num_layers=3,
                             single_digits=True, added_tokens=("<reasoning>", "</reasoning>", "<answer>", "</answer>"))
    seconds = run("sft_warmstart.py", *sft_argv(out / "tiny", out / "teacher", out / "sft", args.sft_steps, seed),
                  log=out / "sft.log")
    say(f"seed {seed}: greedy held-out accuracy of the SFT start")
    before = accuracy(out / "sft", out / "rl")
    print(f"seed {seed}: SFT start {before['all']:.1%} held-out ({', '.join(f'{k} {before[k]:.0%}' for k in KINDS)})")
    return out, before, seconds


def grpo_argv(out: Path, output_dir: Path, seed: int, args, *extra: str, data: str | None = "rl") -> list[str]:
    """gsm8k_grpo.py's flags for the demo's GRPO stage, from the SFT model in `out`, on the data in `out / data` (None:
    the recipe's own); `extra` flags go last (win)."""
    steps = str(args.grpo_steps)
    return [*(["--dataset_path", str(out / data)] if data else []), "--model_name_or_path", str(out / "sft"),
            "--output_dir", str(output_dir), "--max_steps", steps, "--learning_rate", str(args.grpo_lr),
            "--lr_scheduler_type", "constant", "--warmup_steps", "0", "--max_grad_norm", "1.0", "--beta", "0",
            "--temperature", str(args.temperature),
            "--num_generations", "8", "--per_device_train_batch_size", "64", "--gradient_accumulation_steps", "1",
            "--max_completion_length", "32", "--eval_strategy", "no", "--save_steps", steps, "--save_only_model",
            "--logging_steps", str(min(5, args.grpo_steps)), "--report_to", "none", "--use_cpu", "--use_peft", "false",
            "--gradient_checkpointing", "false", "--seed", str(seed),
            *(["--overwrite_output_dir"] if args.overwrite_output_dir else []), *extra]


def grpo_log(output_dir: Path, steps: int) -> list[dict]:
    history = json.loads((output_dir / f"checkpoint-{steps}" / "trainer_state.json").read_text())["log_history"]
    keep = ("step", "reward", "completions/mean_length")
    return [{k: e[k] for k in e if k in keep or k.startswith("rewards/")} for e in history if "reward" in e]


def pipeline(seed: int, args) -> dict:
    """Data, tiny model, SFT, evaluate, GRPO beside the SFT control, evaluate: one seed's figures."""
    start = time.time()
    out, before, sft_seconds = sft_start(seed, args)
    times = {"sft": sft_seconds}
    say(f"seed {seed}: GRPO ({args.grpo_steps} steps) beside the SFT control, one core each")
    control = sft_argv(out / "sft", out / "teacher", out / "control", round(args.control_ratio * args.grpo_steps), seed,
                       learning_rate=3e-4) + (["--overwrite_output_dir"] if args.overwrite_output_dir else [])
    with ThreadPoolExecutor(2) as pool:  # one core each
        grpo_time = pool.submit(run, "gsm8k_grpo.py", *grpo_argv(out, out / "grpo", seed, args), log=out / "grpo.log")
        control_time = pool.submit(run, "sft_warmstart.py", *control, log=out / "control.log")
        times.update(grpo=grpo_time.result(), control=control_time.result())
    say(f"seed {seed}: greedy held-out accuracy after GRPO and of the SFT control")
    after, controlled = accuracy(out / "grpo", out / "rl"), accuracy(out / "control", out / "rl")
    result = {"seed": seed, "sft_start": before, "grpo": after, "sft_control": controlled,
              "gain_over_sft_start": after["all"] - before["all"], "seconds": {**times, "total": time.time() - start},
              "grpo_log": grpo_log(out / "grpo", args.grpo_steps)}
    print(f"seed {seed}: after GRPO {after['all']:.1%} ({result['gain_over_sft_start']:+.1%} over the SFT start), "
          f"SFT control {controlled['all']:.1%}; {result['seconds']['total'] / 60:.1f} min")
    return result


def plot(results: list[dict], path: Path) -> None:
    """Held-out accuracy before/after (per seed, per kind), and the reward components and length over GRPO steps."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(18, 3.6), layout="constrained")
    by_seed, by_kind, curves, lengths = figure.subplots(1, 4)
    arms = {"sft_start": "SFT start", "grpo": "after GRPO", "sft_control": "SFT control"}
    width = 0.8 / len(arms)
    for i, (key, name) in enumerate(arms.items()):
        offset = (i - 1) * width
        by_seed.bar([r["seed"] + offset for r in results], [100 * r[key]["all"] for r in results], width, label=name)
        means = [100 * sum(r[key][kind] for r in results) / len(results) for kind in KINDS]
        by_kind.bar([k + offset for k in range(len(KINDS))], means, width, label=name)
    by_seed.set(title="held-out greedy accuracy", xlabel="seed", ylabel="%", xticks=[r["seed"] for r in results])
    by_kind.set(title="by kind of problem (mean over seeds)", ylabel="%", xticks=range(len(KINDS)), xticklabels=KINDS)
    by_kind.legend(loc="center left")
    for i, r in enumerate(results):  # one colour per seed: correctness solid, the format rewards dotted
        if not r["grpo_log"]:
            continue
        steps = [e["step"] for e in r["grpo_log"]]
        components = [k for k in r["grpo_log"][0] if k.startswith("rewards/") and k.endswith("/mean")]
        for key in components:
            correctness = key == "rewards/correctness_reward/mean"
            curves.plot(steps, [e[key] for e in r["grpo_log"]], "-" if correctness else ":", color=f"C{i}",
                        label=f"seed {r['seed']}: correctness" if correctness else None)
        lengths.plot(steps, [e["completions/mean_length"] for e in r["grpo_log"]], label=f"seed {r['seed']}")
    curves.plot([], [], ":", color="gray", label="format rewards (4)")
    curves.set(title="reward components over GRPO steps (sampled)", xlabel="step")
    curves.legend(fontsize=7)
    lengths.set(title="mean completion length (tokens)", xlabel="step")
    if any(r["grpo_log"] for r in results):
        lengths.legend()
    figure.savefig(path, dpi=90)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if (Path(args.out_dir) / "results.json").exists() and not args.overwrite_output_dir:
        raise Refusal(f"{args.out_dir} already holds a demo (results.json): pass --overwrite_output_dir to replace it, "
                      "or another --out_dir")
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # everything is built here
    sys.path.insert(0, str(ROOT))
    results = [pipeline(seed, args) for seed in args.seeds]
    out = Path(args.out_dir)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    plot(results, out / "results.png")
    print("seed  SFT start  after GRPO  gain    SFT control  minutes")
    for r in results:
        print(f"{r['seed']:>4}  {r['sft_start']['all']:>9.1%}  {r['grpo']['all']:>10.1%}  "
              f"{r['gain_over_sft_start']:+6.1%}  {r['sft_control']['all']:>11.1%}  {r['seconds']['total'] / 60:>7.1f}")
    print(f"wrote {out / 'results.json'} and {out / 'results.png'}")
    return results


if __name__ == "__main__":
    run_script(main)
