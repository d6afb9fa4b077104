"""experiments/: the scripts that measure the demos refuse bad input in one line and read their runs right (the demos
themselves: test_cpu_demo.py, test_agent_demo.py, test_merge_demo.py)."""

import subprocess
import sys

from conftest import ROOT


def run_script(name, *argv):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / name), *map(str, argv)], capture_output=True,
                          text=True, timeout=120, check=False)


def test_turn_credit_and_merge_scaling_refuse_bad_input_in_one_line(tmp_path):
    demo = tmp_path / "search"
    demo.mkdir()
    for name, argv, message in [
            ("turn_credit.py", [demo], "holds no results.json: pass an agent_demo.py task folder"),
            ("merge_scaling.py", [demo], "holds no results.json: pass a merge_demo.py --out_dir")]:
        proc = run_script(name, *argv)
        assert proc.returncode != 0 and message in proc.stderr.strip().splitlines()[-1]
    (demo / "results.json").write_text('{"args": {"task": "search", "turn_credit": 0.5}, "results": [{"seed": 0}]}')
    proc = run_script("turn_credit.py", demo)
    assert "was run with --turn_credit 0.5: the outcome-only arm must not" in proc.stderr
    (demo / "results.json").write_text('{"args": {"task": "search"}, "results": [{"seed": 0}]}')
    for argv, message in [(["--turn_credit", "1"], "must be in (0, 1)"), (["--seeds", "3"], "not [3]")]:
        proc = run_script("turn_credit.py", demo, *argv, "--out_dir", tmp_path / "out")
        assert proc.returncode != 0 and message in proc.stderr.strip().splitlines()[-1]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("{}")
    proc = run_script("turn_credit.py", demo, "--out_dir", tmp_path / "out")
    assert "already holds a comparison" in proc.stderr and (tmp_path / "out" / "results.json").read_text() == "{}"


def test_turn_credit_reads_the_learning_curve_of_the_newest_checkpoint(tmp_path):
    import json

    import turn_credit

    for step, value in ((25, 0.1), (50, 0.3)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        history = [{"step": s, "rewards/correctness_reward/mean": value} for s in range(5, step + 1, 5)]
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": history + [{"train_runtime": 1.0}]}))
    curve = turn_credit.learning_curve(tmp_path, turn_credit.CORRECT["tool"])
    assert list(curve) == list(range(5, 51, 5)) and set(curve.values()) == {0.3}
