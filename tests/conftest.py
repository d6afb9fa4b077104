"""Shared fixtures: the offline kits (toy data, tiny Qwen2 models, configs), built once per test session."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai import APIStatusError, OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "experiments"))  # the demos, which the tests import as the experiments do

# No network here: fail fast instead of waiting on the Hub. One torch thread is fastest for the tiny model.
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", WANDB_SILENT="true")


def built_once(tmp_path_factory, worker_id: str, name: str, *flags: str) -> Path:
    """`python offline.py --out_dir <session tmp>/<name> <flags>`, built once per test session: under `-n 2` the first
    worker to ask builds it and the other waits for it (a kit's warm starts take minutes of one core; each worker
    building its own cost the suite one of them). With GRPO_RECIPES_TEST_KITS set, a kit built for this source is
    copied from there, and one built here is kept there (CI's tiers share their kits)."""
    import torch
    from filelock import FileLock

    import offline

    session = tmp_path_factory.getbasetemp()
    shared = session if worker_id == "master" else session.parent  # xdist: <session>/popen-gw0, <session>/popen-gw1
    out = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (out / "built").exists():
            kept = kept_kit(name, flags)
            if kept is not None and (kept / "built").exists():
                shutil.copytree(kept, out, dirs_exist_ok=True)  # its paths are relative to its folder
                return out
            threads = torch.get_num_threads()
            torch.set_num_threads(os.cpu_count() or 1)  # the other worker mostly waits for the kit: 103 s, not 170
            try:
                offline.main(["--out_dir", str(out), *flags])
            finally:
                torch.set_num_threads(threads)
            (out / "built").touch()
            if kept is not None:  # as built, before any test writes a run into it
                with FileLock(f"{kept}.lock"):
                    shutil.copytree(out, kept, dirs_exist_ok=True)
    return out


def shared_once(tmp_path_factory, worker_id: str, name: str, compute):
    """compute()'s result (pickled), computed once per test session: under `-n 2` the first worker to ask computes it
    and the other reads it, where a module fixture would run once per worker (pytest-xdist 3.8's `loadgroup`, which
    would keep a module on one worker, is a no-op under pytest 9.2: it renames a node attribute pytest 9 no longer
    reads)."""
    import pickle

    from filelock import FileLock

    session = tmp_path_factory.getbasetemp()
    shared = session if worker_id == "master" else session.parent
    saved = shared / f"{name}.pickle"
    with FileLock(str(shared / f"{name}.lock")):
        if not saved.exists():
            saved.write_bytes(pickle.dumps(compute()))
        return pickle.loads(saved.read_bytes())


def kept_kit(name: str, flags: tuple[str, ...]) -> Path | None:
    """Where GRPO_RECIPES_TEST_KITS keeps this kit, named for the flags and for the source that builds it (a kit
    built by other code is never reused); None without the variable. The kits are data: a tier that copies one still
    runs offline.py's code in its own tests."""
    folder = os.environ.get("GRPO_RECIPES_TEST_KITS")
    if not folder:
        return None
    source = hashlib.sha256(" ".join(flags).encode())
    sources = [ROOT / "offline.py", ROOT / "rewards.py", *ROOT.glob("*_grpo.py"), *ROOT.glob("grpo_recipes/*.py")]
    for path in sorted(sources):
        source.update(path.read_bytes())
    return Path(folder) / f"{name}-{source.hexdigest()[:16]}"


KITS = ("base_kit", "kit", "code_kit", "thinking_kit", "vllm_kit", "game_kit", "mcp_kit")


def pytest_collection_modifyitems(items):
    """The tests that need no kit first, each group in its files' order: under `-n 2` one worker builds a kit (a
    minute or two) while the other still has tests to run, instead of both waiting at the first kit test."""
    items.sort(key=lambda item: any(name in item.fixturenames for name in KITS))


@pytest.fixture(scope="session")
def base_kit(tmp_path_factory, worker_id) -> Path:
    """`python offline.py`: toy data and the tiny model, no warm starts (seconds, where `kit` takes minutes)."""
    return built_once(tmp_path_factory, worker_id, "offline-base")


@pytest.fixture(scope="session")
def kit(tmp_path_factory, worker_id) -> Path:
    """`python offline.py --tools --search`: toy data, the tiny model, its two warm starts, configs."""
    return built_once(tmp_path_factory, worker_id, "offline", "--tools", "--search")


@pytest.fixture(scope="session")
def game_kit(tmp_path_factory, worker_id) -> Path:
    """`python offline.py --games`: the base kit and a tiny model warm-started on games played by halving."""
    return built_once(tmp_path_factory, worker_id, "offline-games", "--games")


@pytest.fixture(scope="session")
def mcp_kit(tmp_path_factory, worker_id) -> Path:
    """`python offline.py --mcp`: the base kit and a tiny model warm-started to call the MCP example server."""
    return built_once(tmp_path_factory, worker_id, "offline-mcp", "--mcp")


@pytest.fixture(scope="session")
def code_kit(tmp_path_factory, worker_id) -> Path:
    """`python offline.py --code`: the base kit and code_grpo's (toy problems, a warm-started model)."""
    return built_once(tmp_path_factory, worker_id, "offline-code", "--code")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: str):
    """`transformers serve <model>` on a free localhost port until the generator is closed: (base_url, model)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", model, "--device",
                                "cpu", "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    base_url = f"http://127.0.0.1:{port}/v1"
    client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=5)
    for _ in range(120):
        try:
            client.models.list()
            break
        except APIStatusError:  # it answers (transformers 5.17 fails /v1/models when there is no Hub cache)
            break
        except Exception:  # noqa: BLE001 - still starting
            assert process.poll() is None, "transformers serve exited"
            time.sleep(0.5)
    yield base_url, model
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="session")
def server(kit):
    """`transformers serve <tiny tool-calling model>`, for evaluate.py's tests."""
    yield from serve(str(kit / "tiny-qwen2-tools"))


@pytest.fixture(scope="session")
def reader_server(base_kit, tmp_path_factory):
    """`transformers serve <tiny reader>`: the kit's model after 40 SFT steps on the search recipe's reader prompts,
    each answered "Nothing relevant." (a tiny model cannot summarise; this one answers in text, where the tool-calling
    warm start would emit a tool call the server cannot parse)."""
    import offline
    import search_agent_grpo

    corpus = (base_kit / "search_toy" / "corpus.jsonl").read_text().splitlines()
    passages = [json.loads(line) for line in corpus][:48]
    conversations = [{"messages": [
        {"role": "system", "content": search_agent_grpo.READER_PROMPT},
        {"role": "user", "content": f"Question: Where was {p['title']} born?\n\nPassage:\n[{p['title']}] {p['text']}"},
        {"role": "assistant", "content": "Nothing relevant."}]} for p in passages]
    model = offline.warm_start(base_kit / "tiny-qwen2", tmp_path_factory.mktemp("reader") / "tiny-reader",
                               conversations, tools=[], steps=40)
    yield from serve(str(model))
