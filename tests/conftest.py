"""Shared fixtures: the offline kit (toy GSM8K data + tiny Qwen2 model), built once per test session."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# No network here: fail fast instead of waiting on the Hub. One torch thread is fastest for the tiny model.
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", WANDB_SILENT="true")


@pytest.fixture(scope="session")
def kit(tmp_path_factory) -> Path:
    """`python offline.py --out_dir <tmp> --tools --search`: toy data, the tiny model, its two warm starts, configs."""
    import offline

    out = tmp_path_factory.mktemp("offline")
    offline.main(["--out_dir", str(out), "--tools", "--search"])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(kit):
    """`transformers serve <tiny tool-calling model>` on a free localhost port (evaluate.py's tests, the search
    recipe's reader), stopped after the session."""
    model, port = str(kit / "tiny-qwen2-tools"), free_port()
    process = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", model, "--device", "cpu",
                                "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    base_url = f"http://127.0.0.1:{port}/v1"
    client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=5)
    for _ in range(120):
        try:
            client.models.list()
            break
        except Exception:  # noqa: BLE001 - still starting
            assert process.poll() is None, "transformers serve exited"
            time.sleep(0.5)
    yield base_url, model
    process.terminate()
    process.wait(timeout=30)
