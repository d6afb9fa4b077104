"""sft_warmstart.py: gold solutions in the recipe's format, rejection-sampled rollouts, and a model RL can start
from."""

import json

import pytest
from transformers import AutoModelForCausalLM

import gsm8k_grpo
import sft_warmstart
import tool_use_grpo
from grpo_recipes.refusal import Refusal

FAST = ["--use_cpu", "--gradient_checkpointing", "false", "--learning_rate", "1e-3", "--logging_steps", "1"]


def test_gold_solutions_are_rewritten_in_the_recipe_format_and_earn_full_marks(kit):
    conversations = sft_warmstart.gold_conversations(gsm8k_grpo, "train", str(kit / "gsm8k_toy"))
    assert len(conversations) == 48
    completions = [c["messages"][-1:] for c in conversations]
    answers = gsm8k_grpo.build_dataset("train", str(kit / "gsm8k_toy"))["answer"]
    for func, _ in zip(gsm8k_grpo.REWARD_FUNCS, gsm8k_grpo.REWARD_WEIGHTS, strict=True):
        assert func(completions=completions, answer=answers) == [1.0] * 48, func.__name__
    assert all("<<" not in c["messages"][-1]["content"] for c in conversations)  # calculator notes removed
    assert conversations[0]["messages"][0]["content"] == gsm8k_grpo.SYSTEM_PROMPT


def test_gold_needs_a_gold_column_and_says_how_to_add_one(kit):
    with pytest.raises(Refusal, match="gives no 'gold_completion' column .*answer, prompt.*--gold_column.*--source "
                                      "rollouts") as refused:
        sft_warmstart.gold_conversations(tool_use_grpo, "train", str(kit / "gsm8k_toy"))
    assert "\n" not in str(refused.value)
    renamed = sft_warmstart.gold_conversations(tool_use_grpo, "train", str(kit / "gsm8k_toy"), column="answer")
    answers = tool_use_grpo.build_dataset("train", str(kit / "gsm8k_toy"))["answer"]
    assert [c["messages"][-1]["content"] for c in renamed] == answers  # any column the fork names


def test_rejection_sampling_keeps_the_best_distinct_rollouts_per_prompt(tmp_path):
    def row(prompt, text, total, error=None):
        return {"prompt": [{"role": "user", "content": prompt}], "completion": [{"role": "assistant", "content": text}],
                "total": total, "error": error, "tools": []}

    rows = [row("a", "best", 3.0), row("a", "best", 3.0), row("a", "second", 2.5), row("a", "third", 2.2),
            row("a", "too low", 0.5), row("b", "failed", 3.0, error="APIError"), row("c", "zero", 0.0)]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = sft_warmstart.rollout_conversations(str(path), min_reward=2.0, best_of=2)
    assert [c["messages"][-1]["content"] for c in kept] == ["best", "second"]
    by_default = sft_warmstart.rollout_conversations(str(path), min_reward=None, best_of=10)
    assert [c["messages"][-1]["content"] for c in by_default][-1] == "too low"  # above 0: no zero, no failed rollout
    at_zero = sft_warmstart.rollout_conversations(str(path), min_reward=0.0, best_of=10)
    assert at_zero[-1]["messages"][-1]["content"] == "zero"  # at or above the threshold: 0.0 keeps 0.0


def test_best_of_counts_per_example_where_examples_share_a_prompt(tmp_path):
    """Games: every seed's prompt is the same text, and evaluate.py numbers each seed as an example of its own."""
    rows = [{"prompt": [{"role": "user", "content": "A new game."}], "example": seed // 2, "rollout": seed % 2,
             "completion": [{"role": "assistant", "content": f"episode {seed}"}], "total": 1.0 + seed, "error": None}
            for seed in range(6)]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = sft_warmstart.rollout_conversations(str(path), min_reward=0.0, best_of=1)
    assert [c["messages"][-1]["content"] for c in kept] == ["episode 1", "episode 3", "episode 5"]


def test_a_rollout_the_first_reward_had_no_opinion_on_is_never_kept(tmp_path):
    def row(text, judge, error=None):  # a failed judge is None, which evaluate.py's total counts as 0
        return {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": text}],
                "scores": {"judge": judge, "length": 0.0}, "total": judge or 0.0, "error": error}

    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [row("judged", 0.0), row("unjudged", None)]))
    assert [c["messages"][-1]["content"] for c in sft_warmstart.rollout_conversations(
        str(path), min_reward=0.0, best_of=4)] == ["judged"]
    path.write_text(json.dumps(row("unjudged", None)) + "\n" + json.dumps(row("failed", 1.0, error="APIError")) + "\n")
    with pytest.raises(Refusal, match="of its 2 rollouts 1 failed .* and 1 got no opinion from the rubric's first"):
        sft_warmstart.rollout_conversations(str(path), min_reward=0.0, best_of=4)


@pytest.mark.parametrize("min_reward, totals, advice", [
    (None, [0.0, 0.0], "no rollout scored above 0; the best total is 0. Pass --min_reward 0 "),
    (2.0, [0.5, 1.5], "no rollout reached --min_reward 2; the best total is 1.5. Pass --min_reward 1.5 "),
    (None, [-1.0, -0.5], "the best total is -0.5. Pass --min_reward -0.5 "),
])
def test_a_filter_that_keeps_nothing_names_the_value_that_keeps_the_best(tmp_path, min_reward, totals, advice):
    path = tmp_path / "rollouts.jsonl"
    rows = [{"prompt": [{"role": "user", "content": str(i)}], "completion": [{"role": "assistant", "content": "x"}],
             "total": total, "error": None} for i, total in enumerate(totals)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(Refusal, match=advice.replace(".", r"\.").replace("-", r"\-")):
        sft_warmstart.rollout_conversations(str(path), min_reward=min_reward, best_of=1)
    best = float(advice.split("Pass --min_reward ")[1])
    assert sft_warmstart.rollout_conversations(str(path), min_reward=best, best_of=1)  # the advice keeps the best


def test_gold_sft_output_is_a_model_a_grpo_recipe_starts_from(kit, tmp_path):
    out = sft_warmstart.main(["--config", str(kit / "sft_warmstart.yaml"), "--output_dir", str(tmp_path / "sft"),
                              "--max_steps", "3"])
    trainer = gsm8k_grpo.main(["--config", str(kit / "gsm8k_grpo.yaml"), "--model_name_or_path", str(out),
                               "--max_steps", "1", "--eval_strategy", "no", "--output_dir", str(tmp_path / "grpo")])
    assert trainer.state.global_step == 1 and (tmp_path / "grpo" / "model.safetensors").exists()


def test_lora_is_merged_on_save_when_asked(kit, tmp_path):
    out = sft_warmstart.main(["--recipe", "gsm8k_grpo", "--source", "gold", "--dataset_path", str(kit / "gsm8k_toy"),
                              "--model_name_or_path", str(kit / "tiny-qwen2"), "--output_dir", str(tmp_path / "lora"),
                              "--max_steps", "2", "--use_peft", "--merge_lora", *FAST])
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").exists()
    assert AutoModelForCausalLM.from_pretrained(out).config.model_type == "qwen2"
