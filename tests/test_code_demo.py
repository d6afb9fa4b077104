"""experiments/code_demo.py: the teacher's bug is one only the tests see, the splits never share a problem, and (long)
GRPO fixes it where the SFT control and the useless-tests ablation do not."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import code_demo  # noqa: E402


def test_help_shows_every_default_without_importing_torch():
    proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "experiments" / "code_demo.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "(default: 100)" in " ".join(proc.stdout.split()) and " torch\n" not in proc.stderr


def test_the_teachers_bug_is_seen_by_the_tests_and_by_nothing_else(tmp_path):
    args = code_demo.parse_args(["--n_sft", "300", "--n_rl", "50", "--n_test", "50"])
    teacher = code_demo.write_data(tmp_path, 0, args)
    kinds = [row["prompt"][1]["content"].split("returns x ")[1].split()[0] for row in teacher]
    adds = [row for row, kind in zip(teacher, kinds, strict=True) if kind == "times" and "x +" in
            row["completion"][0]["content"]]
    assert 0.4 < len(adds) / kinds.count("times") < 0.8  # TEACHER_ERROR of the times problems
    for row in teacher:
        wrong = row in adds
        assert row["scores"]["one_code_block_reward"] == row["scores"]["python_function_reward"] == 1.0
        assert row["scores"]["all_tests_passed_reward"] == (0.0 if wrong else 1.0)  # the tests, and only they, see it
    useless = [json.loads(line) for line in (tmp_path / "useless" / "train.jsonl").read_text().splitlines()]
    real = [json.loads(line) for line in (tmp_path / "rl" / "train.jsonl").read_text().splitlines()]
    assert [u["text"] for u in useless] == [r["text"] for r in real]
    for u, r in zip(useless, real, strict=True):  # the same calls, each compared with itself
        calls = [t.removeprefix("assert ").split(" == ")[0] for t in r["test_list"]]
        assert u["test_list"] == [f"assert {call} == {call}" for call in calls]


def test_sft_rl_and_held_out_never_share_a_problem(tmp_path):
    args = code_demo.parse_args(["--n_sft", "300", "--n_rl", "100", "--n_test", "100"])
    teacher = code_demo.write_data(tmp_path, 0, args)
    sft = {row["prompt"][1]["content"] for row in teacher}
    splits = {name: {json.loads(line)["text"] + json.loads(line)["test_list"][0]
                     for line in (tmp_path / "rl" / f"{name}.jsonl").read_text().splitlines()}
              for name in ("train", "test")}
    assert not splits["train"] & splits["test"] and len(sft) == 300
    shown = {row["text"] + row["test_list"][0] for row in map(json.loads, (tmp_path / "rl" / "test.jsonl").open())}
    assert len(shown) == 100


def test_an_earlier_demo_is_never_replaced_without_asking(tmp_path):
    (tmp_path / "results.json").write_text("[]")
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "code_demo.py"), "--out_dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "--overwrite_output_dir" in proc.stderr
    assert (tmp_path / "results.json").read_text() == "[]"


@pytest.mark.slow
@pytest.mark.long  # about 9 minutes: by hand with the other demos (`-m long`), outside CI's hour
def test_grpo_fixes_the_teachers_bug_where_sft_and_useless_tests_do_not(tmp_path):
    result = code_demo.main(["--seeds", "0", "--out_dir", str(tmp_path)])[0]
    rate = {arm: result[arm]["sampled"] for arm in ("sft_start", "grpo", "sft_control", "ablation")}
    assert result["gain"] >= 0.10
    assert rate["grpo"]["times_adds"] < rate["sft_start"]["times_adds"] / 4  # the bug is gone
    assert rate["sft_control"]["all"] < rate["sft_start"]["all"] + 0.05
    assert rate["ablation"]["all"] - rate["sft_start"]["all"] < result["gain"] / 2  # the gain is the tests'
