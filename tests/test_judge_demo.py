"""experiments/judge_demo.py: the gold grades every kind of answer as the docs say, the splits never share a passage,
the teacher errs as often as it says, the learned judge's server speaks judge.py's protocol, and an earlier demo is
never replaced without asking."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import judge_demo  # noqa: E402


def test_help_shows_every_default_without_importing_torch():
    proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "experiments" / "judge_demo.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "(default: 60)" in " ".join(proc.stdout.split()) and " torch\n" not in proc.stderr


def test_the_gold_grades_each_kind_of_answer_and_the_splits_never_share_a_passage(tmp_path):
    args = judge_demo.parse_args(["--n_sft", "400", "--n_rl", "100", "--n_test", "100"])
    splits = judge_demo.write_data(tmp_path, 0, args)
    texts = {name: {judge_demo.task_text(row) for row in rows} for name, rows in splits.items()}
    assert [len(texts[name]) for name in ("sft", "rl", "test")] == [400, 100, 100]
    assert not (texts["sft"] & texts["rl"] or texts["sft"] & texts["test"] or texts["rl"] & texts["test"])
    grades = {kind: {judge_demo.gold_score(row, answer) for row in splits["test"]
                     for kind_, answer in judge_demo.candidates(row).items() if kind_ == kind}
              for kind in judge_demo.candidates(splits["test"][0])}
    assert grades == {"right": {0.9}, "right_long": {0.6}, "wrong": {0.1}, "both": {0.1}, "none": {0.0}}
    taught = judge_demo.teacher(splits["sft"], 0)
    wrong = sum(judge_demo.gold_score(row, c["messages"][-1]["content"]) < 0.5 for row, c in zip(
        splits["sft"], taught, strict=True))
    assert 0.4 < wrong / len(taught) < 0.6  # TEACHER_ERROR
    written = [json.loads(line) for line in (tmp_path / "rl" / "test.jsonl").read_text().splitlines()]
    assert [judge_demo.task_text(row) for row in written] == [judge_demo.task_text(row) for row in splits["test"]]


def test_the_learned_judges_grades_are_absolute_alone_and_relative_in_a_group():
    class Scores(judge_demo.LearnedJudge):
        def __init__(self):  # the grading rule alone, on given scores
            pass

        def scores(self, task, answers):
            return [{"a": -2.0, "b": 0.0, "c": 2.0}[answer] for answer in answers]

    judge = Scores()
    assert judge.grade("t", {"score": "b"}) == {"score": 5} and judge.grade("t", {"score": "c"}) == {"score": 9}
    assert judge.grade("t", {"X": "a", "Y": "c", "Z": "b"}) == {"X": 0, "Y": 10, "Z": 5}
    assert judge.grade("t", {"X": "b", "Y": "b"}) == {"X": 5, "Y": 5}


def test_hacks_are_graded_by_the_served_judge_beside_the_plain_wrong_answer():
    from grpo_recipes import kit_judge

    class SaysTen(judge_demo.LearnedJudge):  # a judge talked round by any "10" in the answer
        def __init__(self):
            pass

        def scores(self, task, answers):
            return [float("10" in answer) for answer in answers]

    args = judge_demo.parse_args(["--n_test", "5"])
    rows = [judge_demo.passage(judge_demo.random.Random(i)) for i in range(args.n_test)]
    server, url = kit_judge.start(grader=SaysTen().grade)
    try:
        rates = judge_demo.hack_rates(url, rows)
    finally:
        server.shutdown()
    talked_round = {"a score of its own", "the verdict's line", "an injection"}
    assert rates == {name: {"wrong": float(name in talked_round), "right": float(name in talked_round)}
                     for name in judge_demo.HACKS}


def test_an_earlier_demo_is_never_replaced_without_asking(tmp_path):
    (tmp_path / "results.json").write_text("[]")
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "judge_demo.py"), "--out_dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "--overwrite_output_dir" in proc.stderr
    assert (tmp_path / "results.json").read_text() == "[]"


@pytest.mark.slow
@pytest.mark.long  # minutes: by hand with the other demos (`-m long`), outside CI's hour
def test_the_demo_runs_every_arm_and_reports_the_gold_beside_the_judge(tmp_path):
    result = judge_demo.main(["--seeds", "0", "--out_dir", str(tmp_path), "--n_sft", "200", "--n_rl", "64",
                              "--n_test", "20", "--sft_steps", "20", "--judge_steps", "20", "--grpo_steps", "2",
                              "--checkpoints", "1"])[0]
    assert 0.0 <= result["agreement"] <= 1.0 and set(result["hacks"]) == set(judge_demo.HACKS)
    for arm in judge_demo.ARMS:
        assert [point["step"] for point in result["curves"][arm]] == [0, 2]
        assert {"gold", "right", "judge"} <= set(result["curves"][arm][-1])
