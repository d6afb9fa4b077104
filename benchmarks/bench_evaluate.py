"""evaluate.py's whole process against what a user would write instead: a plain asyncio AsyncOpenAI loop.

    python offline.py && python benchmarks/bench_evaluate.py [--rounds 3] [--requests 128] [--max_tokens 128]
    python benchmarks/bench_evaluate.py --base_url http://localhost:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct

Both send the same chat requests, the same number at a time (32, evaluate.py's default): gsm8k_grpo's held-out
prompts (the offline kit's 16, each 8 times: 128 requests) with max_tokens and temperature 1.0. The baseline is its
own Python process that reads the prompts from a JSON file and awaits them with asyncio.gather under a semaphore;
evaluate.py runs as a user runs it (its imports, the recipe's data and rubric, the requests, the scoring, the rollouts
file). Without --base_url, `transformers serve` serves the kit's tiny model on this machine. The two are interleaved
round by round; prints each round's wall seconds and the client process's CPU seconds (its own and its waited-for
children's), the median ratios, and each one's `--help` time.
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

PLAIN_CLIENT = """
import asyncio, json, sys
from openai import AsyncOpenAI

async def main(base_url, model, prompts_file, max_tokens, concurrency):
    prompts = json.load(open(prompts_file))
    client = AsyncOpenAI(base_url=base_url, api_key="none", timeout=120, max_retries=3)
    gate = asyncio.Semaphore(concurrency)

    async def one(messages):
        async with gate:
            return await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                        temperature=1.0)

    answers = await asyncio.gather(*(one(messages) for messages in prompts))
    print(sum(a.usage.completion_tokens for a in answers if a.usage))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
"""


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and the children it waited for) of one command."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return time.monotonic() - start, cpu


def serve_kit_model(model: Path) -> tuple[subprocess.Popen, str, str]:
    """`transformers serve` of the offline kit's tiny model on a free local port, once it answers."""
    from openai import APIStatusError, OpenAI

    if not model.is_dir():
        raise Refusal(f"no {model}: run `python offline.py` first, or pass --base_url and --model")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(model),
                               "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=5)
    for _ in range(240):
        try:
            client.models.list()
            break
        except APIStatusError:  # it answers
            break
        except Exception:  # noqa: BLE001 - still starting
            if server.poll() is not None:
                raise Refusal("transformers serve exited") from None
            time.sleep(0.5)
    return server, base_url, str(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base_url", default=None, help="a running server; default: serve the kit's model here")
    parser.add_argument("--model", default=None)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max_tokens", type=int, default=128, help="a short GSM8K answer's length")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kit", type=Path, default=ROOT / "offline", help="the offline kit (`python offline.py`)")
    args = parser.parse_args()
    import gsm8k_grpo

    held_out = gsm8k_grpo.build_dataset("test", str(args.kit / "gsm8k_toy"))
    repeats = -(-args.requests // len(held_out))  # evaluate.py's -r: each example this many times
    prompts = [row["prompt"] for row in held_out for _ in range(repeats)][: len(held_out) * repeats]
    server = None
    if args.base_url is None:
        server, args.base_url, args.model = serve_kit_model(args.kit / "tiny-qwen2")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            prompts_file = Path(scratch) / "prompts.json"
            prompts_file.write_text(json.dumps(prompts))
            plain = [sys.executable, "-c", PLAIN_CLIENT, args.base_url, args.model, str(prompts_file),
                     str(args.max_tokens), str(args.concurrency)]
            out = Path(scratch) / "rollouts.jsonl"
            ours = [sys.executable, "evaluate.py", "gsm8k_grpo", "--base_url", args.base_url, "--model", args.model,
                    "--dataset_path", str(args.kit / "gsm8k_toy"), "-n", str(len(held_out)), "-r", str(repeats),
                    "--max_tokens", str(args.max_tokens), "--concurrency", str(args.concurrency), "--show", "0",
                    "--out", str(out), "--overwrite_out"]
            print(f"{len(prompts)} requests, {args.concurrency} at a time, max_tokens {args.max_tokens}, "
                  f"{args.base_url} ({args.model})")
            timed(plain)  # the server's first requests (its warm-up) are no one's
            found = {"plain asyncio AsyncOpenAI": [], "evaluate.py": []}
            for round_ in range(args.rounds):
                order = list(found) if round_ % 2 == 0 else list(found)[::-1]
                for name in order:
                    seconds, cpu = timed(plain if name.startswith("plain") else ours)
                    found[name].append((seconds, cpu))
                    print(f"  round {round_ + 1} {name:>26}: {seconds:6.2f} s, client CPU {cpu:5.2f} s")
            (plain_s, plain_cpu), (ours_s, ours_cpu) = ((statistics.median(s for s, _ in runs),
                                                         statistics.median(c for _, c in runs))
                                                        for runs in found.values())
            print(f"evaluate.py / plain asyncio client: wall {ours_s / plain_s:.2f}x ({ours_s:.2f} s vs "
                  f"{plain_s:.2f} s), client CPU {ours_cpu / plain_cpu:.2f}x ({ours_cpu:.2f} s vs {plain_cpu:.2f} s)")
        help_seconds = statistics.median(timed([sys.executable, "evaluate.py", "--help"])[0] for _ in range(3))
        print(f"evaluate.py --help: {help_seconds:.2f} s")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the server's torch, on a machine the clients share
    run_script(main)
