"""merge_demo.py: its teacher errs on both skills, each specialist trains on its skill only, the gain kept is computed
as the README states it; merging keeps both specialists' skills (slow)."""

import json
import random

import pytest

import agent_demo
import merge_demo
import rewards


def test_the_teacher_gets_both_skills_wrong_and_agent_demos_only_multiplications():
    rng = random.Random(0)
    both = [agent_demo.tool_problem(rng, merge_demo.SKILLS) for _ in range(2000)]
    only = [agent_demo.tool_problem(rng) for _ in range(2000)]
    for problems, wrong_kinds in ((both, {"multiply", "subtract"}), (only, {"multiply"})):
        for kind in ("multiply", "subtract"):
            of_kind = [p for p in problems if p["kind"] == kind]
            share = sum(" + " in p["teacher"] for p in of_kind) / len(of_kind)
            assert abs(share - agent_demo.TEACHER_ERROR) < 0.05 if kind in wrong_kinds else share == 0, (kind, share)


def test_each_specialist_trains_on_its_skill_only(tmp_path):
    args = merge_demo.parse_args(["--n_sft", "200", "--n_rl", "300", "--n_test", "100"])
    recipe, rl, teacher = agent_demo.write_data(tmp_path, 0, args, merge_demo.SKILLS)
    merge_demo.write_skill_data(tmp_path, rl)
    kinds = {p["question"]: p["kind"] for p in rl}
    sizes = {}
    for skill in merge_demo.SKILLS:
        rows = [json.loads(line) for line in (tmp_path / f"rl_{skill}" / "train.jsonl").read_text().splitlines()]
        assert rows and all(kinds[r["question"]] == skill for r in rows)
        sizes[skill] = len(rows)
        assert recipe.build_dataset("train", str(tmp_path / f"rl_{skill}")).num_rows == len(rows)  # the recipe reads it
    assert sum(sizes.values()) == 300  # together, the joint run's problems
    wrong = [row for row in teacher if " + " in rewards.tool_calls_and_results(row["completion"])[0][0]]
    assert {"How many apples are left?" in row["prompt"][-1]["content"] for row in wrong} == {True, False}


def test_the_gain_kept_is_the_share_of_the_specialists_gain():
    def figures(multiply, subtract):
        return {"accuracy_multiply": multiply, "accuracy_subtract": subtract}

    result = {"sft_start": figures(0.0, 0.2), "specialist_multiply": figures(0.8, 0.2),
              "specialist_subtract": figures(0.0, 0.2), "merge_linear": figures(0.6, 0.3)}
    assert merge_demo.gains_kept(result, "merge_linear") == {"multiply": pytest.approx(0.75), "subtract": None}


@pytest.mark.slow
@pytest.mark.long  # 17 minutes beside another check: run by hand, with `-m long` (docs/development.md)
def test_a_merge_of_the_two_specialists_keeps_most_of_both_gains(tmp_path):
    """Seed 0, reduced (200 held-out problems, 40 GRPO steps per specialist, no joint run, 800 copying steps): the SFT
    start copies, each specialist gains 10 points on its skill, and the best merge keeps at least half of each gain."""
    [result] = merge_demo.main(["--seeds", "0", "--out_dir", str(tmp_path), "--n_test", "200", "--grpo_steps", "40",
                                "--joint_steps", "0", "--copy_steps", "800"])  # seed 0 copies after 800 (README)
    assert result["sft_loss"] < merge_demo.SFT_LOSS_COPIES
    for skill in merge_demo.SKILLS:
        gain = result[f"specialist_{skill}"][f"accuracy_{skill}"] - result["sft_start"][f"accuracy_{skill}"]
        assert gain >= 0.10, (skill, result["kept"])
        best = max(result["kept"][f"merge_{method}"][skill] for method in merge_demo.MERGES)
        assert best >= 0.5, (skill, result["kept"])
    assert (tmp_path / "results.png").stat().st_size > 0
