"""agent_demo.py: its data keeps SFT, RL and held-out apart, the teacher errs where the rubric can see it, each seed's
world is new, and the held-out figures come from TRL's own multi-turn loop; both agents learn (slow)."""

import json
from pathlib import Path

import pytest

import agent_demo
import rewards
from grpo_recipes.refusal import Refusal


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def data(tmp_path: Path, task: str, seed: int = 0, n_sft: int = 400) -> tuple[Path, list[dict]]:
    args = agent_demo.parse_args(["--task", task, "--n_sft", str(n_sft), "--n_rl", "150", "--n_test", "100"])
    out = tmp_path / f"{task}{seed}"
    _, _, teacher = agent_demo.write_data(out, seed, args)
    return out, teacher


def test_help_shows_every_default_without_importing_torch():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-X", "importtime", str(Path(agent_demo.__file__)), "--help"],
                          capture_output=True, text=True, timeout=60)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "(default: runs/agent_demo)" in text and "(default: 500)" in text
    assert " torch" not in proc.stderr  # -X importtime lists every module imported


@pytest.mark.parametrize("task", ["tool", "search"])
def test_sft_rl_and_held_out_never_share_a_question(tmp_path, task):
    out, teacher = data(tmp_path, task)
    rl, test = read(out / "rl" / "train.jsonl"), read(out / "rl" / "test.jsonl")
    sft = [row["prompt"][-1]["content"] for row in teacher]
    assert (len(sft), len(rl), len(test)) == (400, 150, 100)
    questions = [set(sft), {r["question"] for r in rl}, {r["question"] for r in test}]
    assert sum(map(len, questions)) == len(set.union(*questions)) == 650


def test_the_tool_teacher_adds_where_it_should_multiply_and_the_rubric_sees_it(tmp_path):
    _, teacher = data(tmp_path, "tool", n_sft=1000)
    for row in teacher:
        [call, *_] = rewards.tool_calls_and_results(row["completion"])
        multiply = "How many" in row["prompt"][-1]["content"] and " are in " in row["prompt"][-1]["content"]
        added = " + " in call[0]
        assert multiply or not added  # subtractions are always right
        assert row["strict"] is (not added)  # the interpreter's sum is never the product: the rubric marks it wrong
    multiplies = [row for row in teacher if " are in " in row["prompt"][-1]["content"]]
    share = sum(not row["strict"] for row in multiplies) / len(multiplies)
    assert abs(share - agent_demo.TEACHER_ERROR) < 0.06


def test_the_search_teacher_stops_one_hop_short_and_earns_only_the_format_reward(tmp_path):
    out, teacher = data(tmp_path, "search", n_sft=1000)
    one_hop = [row for row in teacher if len(rewards.tool_calls_and_results(row["completion"])) == 1]
    assert abs(len(one_hop) / len(teacher) - agent_demo.TEACHER_ERROR) < 0.06
    assert not any(row["strict"] for row in one_hop) and all(row["strict"] for row in teacher if row not in one_hop)
    assert all(row["scores"]["new_evidence_reward"] == 0.5 for row in one_hop)  # the painter, never the town


def test_every_seed_searches_a_new_world(tmp_path):
    facts = [{p["text"] for p in read(data(tmp_path, "search", seed)[0] / "corpus.jsonl")} for seed in (0, 1)]
    assert len(facts[0] & facts[1]) < 0.02 * len(facts[0])  # who was born where, and which town is where: made anew
    questions = [{(r["question"], r["answer"]) for r in read(tmp_path / f"search{seed}" / "rl" / "test.jsonl")}
                 for seed in (0, 1)]
    assert not questions[0] & questions[1]


@pytest.mark.parametrize("task, credit", [("search", "new_evidence_reward"), ("tool", "used_output_reward")])
def test_turn_credit_weights_the_recipes_turn_level_reward_and_nothing_else(task, credit):
    module = __import__(agent_demo.TURN_CREDIT[task][0])
    flags = agent_demo.reward_weights(agent_demo.parse_args(["--task", task, "--turn_credit", "0.5"]))
    expected = [0.5 if rewards.reward_name(f) == credit else w
                for f, w in zip(module.REWARD_FUNCS, module.REWARD_WEIGHTS, strict=True)]
    assert flags == ["--reward_weights", *map(str, expected)]
    assert agent_demo.reward_weights(agent_demo.parse_args(["--task", task])) == []  # the recipe's own weights


@pytest.mark.parametrize("weight", ["1", "-0.1", "2.5"])
def test_a_turn_credit_that_could_outweigh_a_correct_answer_is_one_line(weight, capsys):
    with pytest.raises(SystemExit):  # argparse's usage error, in the script's own parse_args
        agent_demo.parse_args(["--task", "search", "--turn_credit", weight])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--turn_credit" in error and "[0, 1)" in error


def test_an_earlier_demo_is_never_replaced_without_asking(tmp_path):
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "results.json").write_text("{}")
    with pytest.raises(Refusal, match="already holds a demo .* --overwrite_output_dir"):
        agent_demo.main(["--task", "tool", "--out_dir", str(tmp_path)])


@pytest.mark.slow
@pytest.mark.long  # 12 (tool) and 19 (search) minutes beside another check: by hand, with `-m long`
@pytest.mark.parametrize("task", ["tool", "search"])
def test_grpo_teaches_the_agent_its_tool_and_a_useless_tool_teaches_nothing(tmp_path, task):
    """Seed 0, reduced (200 held-out problems, 40 GRPO steps, no SFT control): GRPO gains 10 points over the SFT
    start, and GRPO with a tool that is no use gains less than a third of that."""
    [result] = agent_demo.main(["--task", task, "--seeds", "0", "--out_dir", str(tmp_path), "--n_test", "200",
                                "--grpo_steps", "40", "--control_ratio", "0"])
    assert result["gain"] >= 0.10, result
    ablation_gain = result["ablation"]["accuracy"] - result["ablation_start"]["accuracy"]
    assert ablation_gain < result["gain"] / 3, result
    assert result["grpo"]["teacher_mistake"] < result["sft_start"]["teacher_mistake"]  # what GRPO fixed
    assert (tmp_path / task / "results.png").stat().st_size > 0
