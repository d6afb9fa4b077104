"""Shared fixtures: the offline kit (toy GSM8K data + tiny Qwen2 model), built once per test session."""

import os
import sys
from pathlib import Path

import pytest

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
