"""cpu_demo.py: its data keeps the three sets apart and the teacher's mistakes where they belong; it learns (slow)."""

import json
from pathlib import Path

import pytest

import cpu_demo
import offline
import rewards
from grpo_recipes.refusal import Refusal


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_help_shows_every_default_without_importing_torch():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(Path(cpu_demo.__file__)), "--help"], capture_output=True, text=True,
                          timeout=60)
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert proc.returncode == 0 and "(default: 150)" in text and "(default: runs/cpu_demo)" in text


def test_a_run_shorter_than_the_logging_interval_still_plots(tmp_path):
    result = {"seed": 0, "grpo_log": [], **{arm: {"all": 0.5, **{k: 0.5 for k in cpu_demo.KINDS}}
                                             for arm in ("sft_start", "grpo", "sft_control")}}
    cpu_demo.plot([result], tmp_path / "results.png")
    assert (tmp_path / "results.png").stat().st_size > 10_000


def test_an_earlier_demo_is_never_replaced_without_asking(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(Refusal, match="already holds a demo .* --overwrite_output_dir"):
        cpu_demo.main(["--out_dir", str(tmp_path)])


def test_sft_rl_and_held_out_problems_never_share_a_question(tmp_path):
    args = cpu_demo.parse_args(["--n_sft", "900", "--n_rl", "300", "--n_test", "200"])
    cpu_demo.write_data(tmp_path, seed=0, args=args)
    sft, rl = read(tmp_path / "teacher" / "train.jsonl"), read(tmp_path / "rl" / "train.jsonl")
    test = read(tmp_path / "rl" / "test.jsonl")
    assert (len(sft), len(rl), len(test)) == (900, 300, 200)
    questions = [{row["question"] for row in rows} for rows in (sft, rl, test)]
    assert sum(map(len, questions)) == len(set.union(*questions)) == 1400


def test_only_the_teachers_compare_solutions_are_wrong_and_rl_answers_are_true(tmp_path):
    args = cpu_demo.parse_args(["--n_sft", "3000", "--n_rl", "300", "--n_test", "300"])
    cpu_demo.write_data(tmp_path, seed=1, args=args)
    sft = read(tmp_path / "teacher" / "train.jsonl")
    wrong = {kind: [rewards.extract_hash_answer(r["answer"]) != str(r["true_answer"]) for r in sft if r["kind"] == kind]
             for kind in cpu_demo.KINDS}
    assert not any(wrong["add"]) and not any(wrong["subtract"])
    assert abs(sum(wrong["compare"]) / len(wrong["compare"]) - cpu_demo.TEACHER_ERROR) < 0.05
    for split in ("train", "test"):
        rows = read(tmp_path / "rl" / f"{split}.jsonl")
        assert all(rewards.extract_hash_answer(r["answer"]) == str(r["true_answer"]) for r in rows)


def test_the_demo_tokenizer_spells_numbers_digit_by_digit_and_keeps_the_tags_whole(tmp_path):
    from transformers import AutoTokenizer

    corpus = ["Ava has 12 shells. <reasoning>\n12 - 3 = 9\n</reasoning>\n<answer>\n9\n</answer>"] * 20
    model_dir = offline.build_tiny_model(tmp_path / "m", corpus, vocab_size=300, hidden_size=32, num_layers=1,
                                         single_digits=True, added_tokens=("<reasoning>", "</answer>"))
    tokens = AutoTokenizer.from_pretrained(model_dir).tokenize("<reasoning>\n123 - 45\n</answer>")
    assert tokens[0] == "<reasoning>" and tokens[-1] == "</answer>"
    assert [t for t in tokens if any(c.isdigit() for c in t)] == list("12345")


@pytest.mark.slow
def test_grpo_raises_held_out_accuracy_at_least_five_points_over_its_sft_start(tmp_path):
    # Seed 0 of the README's demo with half its GRPO steps (docs/cpu_demo.json: each seed's sampled correctness rose
    # from 0.68-0.77 at step 5 to 0.78-0.96 by step 75) and a token SFT control: about 7 minutes on 2 cores.
    [result] = cpu_demo.main(["--seeds", "0", "--out_dir", str(tmp_path), "--control_ratio", "0.1", "--grpo_steps",
                              "75"])
    assert result["gain_over_sft_start"] >= 0.05, {key: result[key] for key in ("sft_start", "grpo", "seconds")}
    assert (tmp_path / "results.png").stat().st_size > 10_000
