"""A CPU-only demo that GRPO with code_grpo.py's test reward fixes a teacher's bug that only the tests see.

    python experiments/code_demo.py --seeds 0 1 2        # about 10 minutes a seed on 2 cores

The task: "Write a function that returns x times 7. Name the function `times_7`; a test calls it like this:
`times_7(3)`" (and `plus`, `minus` problems of the same shape), answered with a function in one code block and
scored by code_grpo.py's rubric (three assert tests a problem, run in the sandbox). The teacher writes every function
with the right name, in the right format, but on `times` problems it writes `x + k` 60% of the time: the format and
syntax rewards cannot see the bug; the tests can.

Stages, each training stage a subprocess through the real entry point, as a user would run it:
  1. data (SFT, RL and held-out problems never shared) and the teacher's answers, scored by the recipe's rubric as an
     evaluate.py JSONL;
  2. a tiny model (offline.build_tiny_model) whose tokenizer learns the teacher's text;
  3. SFT: sft_warmstart.py --source rollouts on every teacher answer;
  4. GRPO with `code_grpo.py` beside the SFT control (more SFT on the teacher, --control_ratio × the GRPO steps),
     then the ablation: GRPO where the tests are useless (each compares the function's answer with itself: every
     function that runs passes);
  5. held-out pass rate (every test passed, through the recipe's rubric) of the SFT start, GRPO, the control and
     the ablation, 4 samples a problem at the GRPO temperature 0.7 and greedy, and how often a `times` function adds.
Writes runs/code_demo/results.json and results.png.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cpu_demo import run, say  # the same stages' runner: a subprocess per stage, one thread, a log each

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent  # the repository: the recipe this experiment runs
TEACHER_ERROR = 0.6  # how often the teacher adds where a `times` problem multiplies
KINDS = {"plus": ("x plus {k}", "x + {k}"), "minus": ("x minus {k}", "x - {k}"), "times": ("x times {k}", "x * {k}")}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one full pipeline per seed")
    parser.add_argument("--out_dir", default="runs/code_demo", help="a folder per seed, results.json and .png")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="replace an earlier demo")
    parser.add_argument("--n_sft", type=int, default=2000, help="teacher answers for SFT")
    parser.add_argument("--n_rl", type=int, default=800, help="RL problems (tests only)")
    parser.add_argument("--n_test", type=int, default=300, help="held-out problems, never seen in SFT or RL")
    parser.add_argument("--sft_steps", type=int, default=300, help="SFT steps, batch 32, lr 1e-3 cosine")
    parser.add_argument("--grpo_steps", type=int, default=100, help="GRPO steps, 8 problems x 8 completions each")
    parser.add_argument("--grpo_lr", type=float, default=5e-5, help="GRPO learning rate, constant")
    parser.add_argument("--temperature", type=float, default=0.7, help="GRPO sampling temperature")
    parser.add_argument("--control_ratio", type=float, default=4.5, help="SFT control steps per GRPO step: a GRPO "
                        "step took 1.3 s and an SFT step 0.27 s on a 2-core CPU")
    return parser.parse_args(argv)


def problem(rng: random.Random, teacher_error: float) -> dict:
    """One MBPP-shaped problem (text, code, test_list), the teacher's answer, and its kind."""
    kind = rng.choice(sorted(KINDS))
    k = rng.randint(2, 19)
    asks, body = (part.format(k=k) for part in KINDS[kind])
    name = f"{kind}_{k}"
    args = rng.sample(range(-50, 51), 3)
    expected = [eval(body, {"x": x}) for x in args]  # noqa: S307 - our own arithmetic
    taught = body.replace("*", "+") if kind == "times" and rng.random() < teacher_error else body
    row = {"text": f"Write a function that returns {asks}.", "code": f"def {name}(x):\n    return {body}",
           "test_list": [f"assert {name}({x}) == {y}" for x, y in zip(args, expected, strict=True)],
           "test_setup_code": ""}
    return {"row": row, "kind": kind, "teacher": f"```python\ndef {name}(x):\n    return {taught}\n```"}


def useless_test(test: str) -> str:
    """The ablation's test: the same call, compared with itself, so every function that runs passes (and the prompt,
    which shows the first test's call, is the same)."""
    call = test.removeprefix("assert ").split(" == ")[0]
    return f"assert {call} == {call}"


def write_data(out: Path, seed: int, args) -> list[dict]:
    """rl/{train,test}.jsonl, useless/{train,test}.jsonl (the ablation's tests), kinds.jsonl (held-out kinds) and
    teacher.jsonl (evaluate.py's format, scored by the recipe's rubric). No problem is in two of SFT, RL, held-out."""
    import code_grpo
    import evaluate

    rng, seen, problems = random.Random(seed), set(), []
    while len(problems) < args.n_test + args.n_rl + args.n_sft:
        p = problem(rng, TEACHER_ERROR)
        key = p["row"]["text"] + p["row"]["test_list"][0]
        if key not in seen:
            seen.add(key)
            problems.append(p)
    test, rl, sft = problems[:args.n_test], problems[args.n_test:args.n_test + args.n_rl], problems[-args.n_sft:]
    for folder, useless in (("rl", False), ("useless", True)):
        (out / folder).mkdir(parents=True, exist_ok=True)
        for name, part in (("test", test), ("train", rl)):
            rows = [{**p["row"], "test_list": [useless_test(t) for t in p["row"]["test_list"]]} if useless
                    else p["row"] for p in part]
            (out / folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "kinds.jsonl").write_text("".join(json.dumps(p["kind"]) + "\n" for p in test))
    examples = [code_grpo.mbpp_problem(p["row"]) for p in sft]
    logs = [{"prompt": e["prompt"], "completion": [{"role": "assistant", "content": p["teacher"]}],
             "usage": {"completion_tokens": 0}, "error": None} for e, p in zip(examples, sft, strict=True)]
    task = code_grpo.setup(code_grpo.ScriptArguments(test_workers=1))  # the recipe's own rubric: its test sandboxes
    evaluate.score(task, logs, examples)  # a wrong function scores 0.1, not 0
    (out / "teacher.jsonl").write_text("".join(json.dumps(row) + "\n" for row in logs))
    return logs


def sft_argv(model: Path, out_dir: Path, out: Path, steps: int, seed: int, learning_rate: float,
             overwrite: bool) -> list[str]:
    return ["--recipe", "code_grpo", "--source", "rollouts", "--rollouts", str(out_dir / "teacher.jsonl"),
            "--min_reward", "0", "--best_of", "1", "--model_name_or_path", str(model), "--output_dir", str(out),
            "--max_steps", str(steps), "--learning_rate", str(learning_rate), "--per_device_train_batch_size", "32",
            "--gradient_accumulation_steps", "1", "--warmup_steps", "0.05", "--use_cpu", "--gradient_checkpointing",
            "false", "--logging_steps", "25", "--seed", str(seed), *(["--overwrite_output_dir"] * overwrite)]


def grpo_argv(args, out: Path, output: Path, seed: int, data: str = "rl") -> list[str]:
    steps = str(args.grpo_steps)
    return ["--dataset_path", str(out / data), "--model_name_or_path", str(out / "sft"), "--output_dir", str(output),
            "--max_steps", steps, "--learning_rate", str(args.grpo_lr), "--lr_scheduler_type", "constant",
            "--warmup_steps", "0", "--max_grad_norm", "1.0", "--beta", "0", "--temperature", str(args.temperature),
            "--num_generations", "8", "--per_device_train_batch_size", "64", "--gradient_accumulation_steps", "1",
            "--max_completion_length", "40", "--eval_strategy", "no", "--save_steps", steps, "--save_only_model",
            "--logging_steps", "5", "--report_to", "none", "--use_cpu", "--use_peft", "false",
            "--gradient_checkpointing", "false", "--test_workers", "1", "--seed", str(seed),
            *(["--overwrite_output_dir"] * args.overwrite_output_dir)]


def held_out(model_dir: Path, out: Path) -> dict:
    """Both held-out figures of a model: greedy, and 4 samples a problem at the GRPO temperature (0.7)."""
    return {"greedy": pass_rates(model_dir, out), "sampled": pass_rates(model_dir, out, samples=4, temperature=0.7)}


def pass_rates(model_dir: Path, out: Path, samples: int = 0, temperature: float = 0.7) -> dict:
    """Held-out pass rate (overall and per kind) through the recipe's rubric (the real tests, in the sandbox), and how
    often a `times` function adds (the teacher's bug): greedy, or with `samples` completions a problem at
    `temperature` (what the policy writes: greedy turns a 55/45 preference into all or nothing)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import code_grpo
    import evaluate

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    each = max(samples, 1)
    examples = [e for e in code_grpo.build_dataset("test", str(out / "rl")) for _ in range(each)]
    kinds = [json.loads(line) for line in (out / "kinds.jsonl").read_text().splitlines() for _ in range(each)]
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0} if samples else {"do_sample": False}
    rows = []
    for start in range(0, len(examples), 100):
        prompts = [example["prompt"] for example in examples[start:start + 100]]
        batch = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, padding=True, return_dict=True,
                                              return_tensors="pt")
        with torch.no_grad():
            output = model.generate(**batch, max_new_tokens=40, **sampling)
        for prompt, ids in zip(prompts, output[:, batch["input_ids"].shape[1]:], strict=True):
            rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": tokenizer.decode(
                ids, skip_special_tokens=True)}], "usage": {"completion_tokens": 0}})
    evaluate.score(code_grpo.setup(code_grpo.ScriptArguments(test_workers=1)), rows, examples)
    times = [row for row, kind in zip(rows, kinds, strict=True) if kind == "times"]
    result = {"all": statistics.mean(row["strict"] for row in rows)}
    for kind in sorted(KINDS):
        result[kind] = statistics.mean(row["strict"] for row, k in zip(rows, kinds, strict=True) if k == kind)
    result["times_adds"] = statistics.mean("x +" in (code_grpo.code_of(row["completion"]) or "") for row in times)
    result["sample"] = rows[0]["completion"][0]["content"]
    return result


def pipeline(seed: int, args) -> dict:
    import offline

    out = Path(args.out_dir).resolve() / f"seed{seed}"
    start, times = time.time(), {}
    say(f"seed {seed}: data, the teacher's answers and the tiny model in {out}")
    teacher = write_data(out, seed, args)
    corpus = [m["content"] for row in teacher[:1000] for m in row["prompt"] + row["completion"]]
    offline.build_tiny_model(out / "tiny", corpus, vocab_size=600, seed=seed, hidden_size=128, num_layers=3,
                             single_digits=True)
    times["sft"] = run("sft_warmstart.py", *sft_argv(out / "tiny", out, out / "sft", args.sft_steps, seed, 1e-3,
                                                     args.overwrite_output_dir), log=out / "sft.log")
    result = {"seed": seed, "teacher_pass_rate": statistics.mean(row["strict"] for row in teacher)}
    say(f"seed {seed}: GRPO ({args.grpo_steps} steps) beside the SFT control, then the useless-tests ablation")
    control = sft_argv(out / "sft", out, out / "control", round(args.control_ratio * args.grpo_steps), seed, 3e-4,
                       args.overwrite_output_dir)
    with ThreadPoolExecutor(2) as pool:  # a core each; the ablation takes the first one free
        grpo = pool.submit(run, "code_grpo.py", *grpo_argv(args, out, out / "grpo", seed), log=out / "grpo.log")
        sft_control = pool.submit(run, "sft_warmstart.py", *control, log=out / "control.log")
        ablation = pool.submit(run, "code_grpo.py", *grpo_argv(args, out, out / "ablation", seed, data="useless"),
                               log=out / "ablation.log")
        result["sft_start"] = held_out(out / "sft", out)
        say(f"seed {seed}: SFT start {json.dumps(result['sft_start']['sampled'])}")
        times.update(grpo=grpo.result(), control=sft_control.result(), ablation=ablation.result())
    for arm in ("grpo", "control", "ablation"):
        result[{"control": "sft_control"}.get(arm, arm)] = held_out(out / arm, out)
    result["gain"] = result["grpo"]["sampled"]["all"] - result["sft_start"]["sampled"]["all"]
    result["seconds"] = {**times, "total": time.time() - start}
    say(f"seed {seed}: {json.dumps(result)}")
    return result


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = ["sft_start", "grpo", "sft_control", "ablation"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(results)
    for i, result in enumerate(results):
        ax.bar([a + i * width for a in range(len(arms))], [100 * result[arm]["sampled"]["all"] for arm in arms], width,
               label=f"seed {result['seed']}")
    ax.set_xticks([a + width * (len(results) - 1) / 2 for a in range(len(arms))],
                  ["SFT start", "GRPO", "SFT control", "GRPO, useless tests"])
    ax.set_ylabel("held-out pass rate (%), T=0.7")
    ax.set_title("code_grpo.py on a CPU: the teacher's bug, fixed by the tests")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # everything is built here
    sys.path.insert(0, str(ROOT))  # the recipe, the kit and evaluate.py, imported by the stages run in this process
    out = Path(args.out_dir)
    if (out / "results.json").exists() and not args.overwrite_output_dir:
        raise Refusal(f"{out}/results.json exists: pass --overwrite_output_dir to replace it, or another --out_dir")
    results = [pipeline(seed, args) for seed in args.seeds]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "results.png")
    for r in results:
        rate = {arm: r[arm]["sampled"] for arm in ("sft_start", "grpo", "sft_control", "ablation")}
        print(f"seed {r['seed']}: SFT start {rate['sft_start']['all']:.1%} -> GRPO {rate['grpo']['all']:.1%} "
              f"({r['gain']:+.1%}); SFT control {rate['sft_control']['all']:.1%}; useless tests "
              f"{rate['ablation']['all']:.1%}; times adds {rate['sft_start']['times_adds']:.0%} -> "
              f"{rate['grpo']['times_adds']:.0%} (useless tests {rate['ablation']['times_adds']:.0%}); "
              f"{r['seconds']['total'] / 60:.1f} min")
    return results


if __name__ == "__main__":
    run_script(main)
