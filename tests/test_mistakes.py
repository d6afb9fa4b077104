"""Mistakes cost one line: each common mistake exits non-zero with at most two lines on stderr, no traceback, and a
message naming the fix; no command loses work (a rerun keeps every checkpoint; Ctrl-C prints the command that
resumes, and that command resumes).

Every case runs the real entry point from the offline kit's folder: in a subprocess, as a user would, where the
process matters (its environment, the network, a signal, the rerun that must keep its checkpoints); in this process
otherwise, with the interpreter's own report of an uncaught exception or SystemExit reproduced, to keep the suite
fast. The network cases rely on this machine having no route to the Hugging Face Hub, as on CI.
"""

import importlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT

ONLINE = {"HF_HUB_OFFLINE": None, "HF_DATASETS_OFFLINE": None}  # as a user who never set them


def workdir_with_checkpoints(kit: Path, folder: Path) -> Path:
    """A run folder holding checkpoints 280, 290, 300 and a final model, as an earlier run would have left it."""
    run = folder / "earlier_run"
    for step in (280, 290, 300):
        shutil.copytree(kit / "tiny-qwen2", run / f"checkpoint-{step}")
    return run


def malformed_data(folder: Path) -> Path:
    data = folder / "bad_data"
    data.mkdir()
    good = json.dumps({"question": "1 + 1?", "answer": "#### 2"})
    (data / "train.jsonl").write_text(f"{good}\n{good}\n{{\"question\": \"2 + 2?\", \"answer\": \"#### 4\"\n{good}\n")
    (data / "test.jsonl").write_text(good + "\n")
    return data


def cases(kit: Path, folder: Path) -> dict:
    """name -> (script, argv, environment changes, words the message must hold)."""
    (folder / "typo.yaml").write_text("learning_rat: 1.0e-5\n")
    (folder / "bad_value.yaml").write_text("learning_rate: fast\n")
    (folder / "broken.yaml").write_text("learning_rate: [1\n")
    config = str(kit / "gsm8k_grpo.yaml")
    return {
        "rerun into checkpoints": ("gsm8k_grpo.py", ["--config", config, "--output_dir",
                                   str(workdir_with_checkpoints(kit, folder))], {},
                                   ["checkpoint-300", "--resume_from_checkpoint last", "--overwrite_output_dir"]),
        "unwritable output dir": ("gsm8k_grpo.py", ["--config", config, "--output_dir", "/proc/grpo-out"], {},
                                  ["cannot write", "--output_dir"]),
        "no network": ("gsm8k_grpo.py", ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--output_dir",
                       str(folder / "a")], ONLINE, ["cannot reach", "HF_HUB_OFFLINE=1", "offline.py"]),
        "no network for the dataset": ("gsm8k_grpo.py", ["--model_name_or_path", str(kit / "tiny-qwen2"),
                                       "--output_dir", str(folder / "b")], ONLINE,
                                       ["cannot reach", "openai/gsm8k", "--dataset_path"]),
        "offline and not cached": ("gsm8k_grpo.py", ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct",
                                   "--output_dir", str(folder / "c")], {}, ["not in the Hugging Face cache"]),
        "mistyped local model path": ("gsm8k_grpo.py", ["--config", config, "--model_name_or_path", "./tiny-qwen",
                                      "--output_dir", str(folder / "d")], ONLINE, ["./tiny-qwen", "no such folder"]),
        "malformed data line": ("gsm8k_grpo.py", ["--config", config, "--dataset_path", str(malformed_data(folder)),
                                "--output_dir", str(folder / "e")], {}, ["train.jsonl line 3", "not valid JSON"]),
        "missing data path": ("gsm8k_grpo.py", ["--config", config, "--dataset_path", "data/nope", "--output_dir",
                              str(folder / "f")], {}, ["data/nope", "no such file or folder"]),
        "misspelled flag": ("gsm8k_grpo.py", ["--config", config, "--max_stepz", "3"], {},
                            ["--max_stepz", "did you mean --max_steps"]),
        "flag prefix": ("gsm8k_grpo.py", ["--config", config, "--learning_rat", "1e-5"], {},
                        ["--learning_rat", "did you mean --learning_rate"]),
        "missing config": ("gsm8k_grpo.py", ["--config", "nope.yaml"], {}, ["nope.yaml", "no such file"]),
        "mistyped YAML key": ("gsm8k_grpo.py", ["--config", str(folder / "typo.yaml")], {},
                              ["learning_rat", "did you mean learning_rate"]),
        "bad YAML value": ("gsm8k_grpo.py", ["--config", str(folder / "bad_value.yaml")], {},
                           ["--learning_rate", "invalid float value: 'fast'"]),
        "broken YAML": ("gsm8k_grpo.py", ["--config", str(folder / "broken.yaml")], {}, ["not valid YAML", "line"]),
        "missing checkpoint": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(folder / "g"),
                               "--resume_from_checkpoint", str(folder / "g" / "checkpoint-9")], {},
                               ["checkpoint-9", "no such folder", "last"]),
        "resume with nothing to resume": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(folder / "h"),
                                          "--resume_from_checkpoint", "last"], {}, ["holds no complete checkpoint"]),
        "unknown recipe (evaluate.py)": ("evaluate.py", ["gsm9k_grpo", "--base_url", "http://localhost:9/v1",
                                         "--model", "m"], {}, ["unknown recipe 'gsm9k_grpo'", "gsm8k_grpo"]),
        "unknown recipe (sft_warmstart.py)": ("sft_warmstart.py", ["--config", str(kit / "sft_warmstart.yaml"),
                                              "--recipe", "tool_grpo", "--output_dir", str(folder / "i")], {},
                                              ["unknown recipe 'tool_grpo'"]),
        "missing rollouts file": ("sft_warmstart.py", ["--config", str(kit / "sft_warmstart.yaml"), "--source",
                                  "rollouts", "--rollouts", "gone.jsonl", "--output_dir", str(folder / "j")], {},
                                  ["gone.jsonl", "no such file"]),
        "missing search corpus": ("search_agent_grpo.py", ["--config", str(kit / "search_agent_grpo.yaml"),
                                  "--corpus_path", "corpus_typo.jsonl", "--output_dir", str(folder / "k")], {},
                                  ["corpus_typo.jsonl", "no such file"]),
    }


def run(script: str, argv: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run([sys.executable, str(ROOT / script), *argv], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=environment, stdin=subprocess.DEVNULL)


def run_here(script: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`script`'s main(argv) in this process; stderr as the interpreter would end it (a traceback or the exit text)."""
    import traceback
    from contextlib import redirect_stderr
    from io import StringIO

    module, stderr, code, here = importlib.import_module(script.removesuffix(".py")), StringIO(), 0, os.getcwd()
    os.chdir(cwd)
    try:
        with redirect_stderr(stderr):
            module.main(argv)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
        stderr.write("" if isinstance(exit.code, int) or exit.code is None else f"{exit.code}\n")
    except Exception:  # noqa: BLE001 - what the interpreter would print
        code = 1
        stderr.write(traceback.format_exc())
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess([script, *argv], code, "", stderr.getvalue())


IN_A_SUBPROCESS = {"rerun into checkpoints", "no network", "no network for the dataset", "offline and not cached",
                   "unknown recipe (evaluate.py)"}


@pytest.fixture(scope="module")
def outcomes(kit, tmp_path_factory):
    folder = tmp_path_factory.mktemp("mistakes")
    table = cases(kit, folder)
    with ThreadPoolExecutor(2) as pool:  # each is mostly the import of torch and TRL
        futures = {name: pool.submit(run, script, argv, env, kit) for name, (script, argv, env, _) in table.items()
                   if name in IN_A_SUBPROCESS}
        results = {name: run_here(script, argv, kit) for name, (script, argv, env, _) in table.items()
                   if name not in IN_A_SUBPROCESS}
        results.update({name: future.result() for name, future in futures.items()})
    return {name: (result, table[name][3]) for name, result in results.items()}, folder


CASES = ["rerun into checkpoints", "unwritable output dir", "no network", "no network for the dataset",
         "offline and not cached", "mistyped local model path", "malformed data line", "missing data path",
         "misspelled flag", "flag prefix", "missing config", "mistyped YAML key", "bad YAML value", "broken YAML",
         "missing checkpoint", "resume with nothing to resume", "unknown recipe (evaluate.py)",
         "unknown recipe (sft_warmstart.py)", "missing rollouts file", "missing search corpus"]


@pytest.mark.parametrize("name", CASES)
def test_each_mistake_is_one_line_naming_the_fix(outcomes, name):
    (proc, words), _ = outcomes[0][name], outcomes[1]
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr and 1 <= len(lines) <= 2, proc.stderr[-3000:]
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)


def test_the_table_checks_every_case_it_runs(outcomes):
    assert sorted(outcomes[0]) == sorted(CASES)


def test_a_rerun_into_checkpoints_keeps_every_one_of_them(outcomes):
    run_dir = outcomes[1] / "earlier_run"
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-280", "checkpoint-290", "checkpoint-300"]
    assert all((run_dir / f"checkpoint-{s}" / "model.safetensors").exists() for s in (280, 290, 300))


def test_ctrl_c_prints_the_command_that_resumes_and_that_command_resumes(kit, tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, str(ROOT / "gsm8k_grpo.py"), "--config", str(kit / "gsm8k_grpo.yaml"), "--output_dir",
            str(out), "--max_steps", "5000", "--save_steps", "3", "--eval_strategy", "no"]
    # As in a terminal: a test run started in the background (`cmd &`) ignores SIGINT, and its children inherit that.
    proc = subprocess.Popen(argv, cwd=kit, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(out.glob("checkpoint-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    message = [line for line in stderr.splitlines() if "resume from the newest checkpoint with: " in line]
    assert len(message) == 1
    command = shlex.split(message[0].split("resume from the newest checkpoint with: ", 1)[1])
    assert command[0] == "python" and command[-2:] == ["--resume_from_checkpoint", "last"]
    # Ctrl-C can land while a checkpoint is being saved: the newest complete one is where the run resumes.
    newest = max(int(p.parent.name.split("-")[1]) for p in out.glob("checkpoint-*/trainer_state.json"))
    resumed = subprocess.run([sys.executable, *command[1:], "--max_steps", str(newest + 1)], cwd=kit,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {out}/checkpoint-{newest}" in resumed.stderr
    assert f"step {newest + 1}/{newest + 1}" in resumed.stdout and f"step {newest}/" not in resumed.stdout


def test_resume_last_skips_a_checkpoint_the_run_stopped_saving(tmp_path, caplog):
    from types import SimpleNamespace

    import preflight

    for step, files in ((3, ["model.safetensors", "trainer_state.json"]), (6, ["model.safetensors"])):
        for name in files:
            (tmp_path / f"checkpoint-{step}").mkdir(exist_ok=True)
            (tmp_path / f"checkpoint-{step}" / name).write_text("{}")
    args = SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint="last", overwrite_output_dir=False)
    preflight.check_output_dir(args)
    assert args.resume_from_checkpoint == str(tmp_path / "checkpoint-3")
    assert "skipping checkpoint-6: no trainer_state.json" in caplog.text
    (tmp_path / "checkpoint-3" / "trainer_state.json").unlink()
    args.resume_from_checkpoint = "last"
    with pytest.raises(SystemExit, match="holds no complete checkpoint .checkpoint-3, checkpoint-6."):
        preflight.check_output_dir(args)
