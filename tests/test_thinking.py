"""Thinking models (--thinking): a tiny model with Qwen3's chat template, which reads enable_thinking and drops earlier
turns' thinking when it re-renders a conversation. GRPO must train on exactly the tokens the policy sampled; the
rubrics must judge only what follows the thinking; a model without the switch is refused in one line."""

import shutil

import pytest
from trl import GRPOTrainer

import gsm8k_grpo
import rewards
import tool_use_grpo
from conftest import built_once
from grpo_recipes.refusal import Refusal


@pytest.fixture(scope="session")
def thinking_kit(tmp_path_factory, worker_id):
    """`python offline.py --thinking --tools --search`: tiny-qwen3 and warm starts that think, then call the python
    tool or search."""
    return built_once(tmp_path_factory, worker_id, "thinking-kit", "--thinking", "--tools", "--search")


def runs(ids: list[int], mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s in mask."""
    spans, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    return spans


@pytest.mark.slow  # needs the thinking kit (minutes to build): with the thinking checks
def test_multi_turn_grpo_trains_on_exactly_the_tokens_the_thinking_policy_sampled(thinking_kit, tmp_path,
                                                                                   monkeypatch):
    """Every model-written span of every trained episode is one generation's output, sampled after exactly the tokens
    that precede it in the training sequence: TRL 1.16 extends the token ids turn by turn and never re-renders the
    conversation (which, with Qwen3's template, would rewrite the earlier turns' thinking)."""
    generations, batches = [], []
    generate, compute_loss = GRPOTrainer._generate_single_turn, GRPOTrainer.compute_loss

    def recording_generate(self, prompt_ids, *args, **kwargs):  # what the policy was given and what it sampled
        completion_ids, logprobs = generate(self, prompt_ids, *args, **kwargs)
        generations.extend((list(p), list(c)) for p, c in zip(prompt_ids, completion_ids, strict=True))
        return completion_ids, logprobs

    def recording_loss(self, model, inputs, *args, **kwargs):  # what the loss was computed on
        batches.append({key: inputs[key].tolist() for key in ("prompt_ids", "prompt_mask", "completion_ids",
                                                               "completion_mask", "tool_mask")})
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", recording_generate)
    monkeypatch.setattr(GRPOTrainer, "compute_loss", recording_loss)
    trainer = tool_use_grpo.main(["--config", str(thinking_kit / "tool_use_grpo.yaml"), "--output_dir",
                                  str(tmp_path), "--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no",
                                  "--max_completion_length", "128", "--temperature", "0.3"])  # 0.3: it calls
    assert trainer.args.chat_template_kwargs == {"enable_thinking": True}
    think = trainer.processing_class.convert_tokens_to_ids("<think>")
    sampled = {tuple(prompt + completion) for prompt, completion in generations}
    checked = multi_turn = thought_twice = 0
    for batch in batches:
        for row in range(len(batch["prompt_ids"])):
            prompt = [t for t, m in zip(batch["prompt_ids"][row], batch["prompt_mask"][row], strict=True) if m]
            completion, tool_mask = batch["completion_ids"][row], batch["tool_mask"][row]
            trained = [c and t for c, t in zip(batch["completion_mask"][row], tool_mask, strict=True)]
            spans = runs(completion, trained)
            for start, end in spans:  # each span the loss sees: a sampled output, after the tokens before it
                assert tuple(prompt + completion[:end]) in sampled, (start, end)
                checked += 1
            multi_turn += len(spans) > 1
            thought_twice += sum(think in completion[start:end] for start, end in spans) > 1
    assert checked and multi_turn and thought_twice  # the check covered episodes that thought in two turns


def test_rubrics_read_the_answer_after_the_thinking():
    def chat(text):
        return [{"role": "assistant", "content": text}]

    final = "<think>\nmaybe <answer>17</answer>\n</think>\n\n<answer>18</answer>"
    only_in_thinking = "<think>\n<answer>18</answer>\n</think>\n\nI am not sure."
    cut_off = "<think>\n6 * 3 = 18, so <answer>18</answer>"  # the token budget ended the thinking
    completions = [chat(final), chat(only_in_thinking), chat(cut_off)]
    for reward in (rewards.correctness_reward, rewards.exact_match_reward, rewards.answer_format_reward):
        assert reward(completions, answer=["18"] * 3) == [1.0, 0.0, 0.0], reward.__name__


@pytest.mark.slow  # needs the thinking kit (minutes to build): with the thinking checks
def test_gsm8k_recipe_runs_a_thinking_model_and_its_rubric_never_sees_the_thinking(thinking_kit, tmp_path):
    """gsm8k_grpo.py has no tools: the thinking model's completions still reach the rubric with the <think> block
    parsed out (TRL's response parser, set up for every template that reads enable_thinking). The warm start that
    thinks stands in for a thinking model here: the untrained base rarely writes <think>."""
    calls = []

    def spy(completions, **kwargs):
        calls.append(completions)
        return [0.0] * len(completions)

    gsm8k_grpo.REWARD_FUNCS.append(spy)
    try:
        trainer = gsm8k_grpo.main(["--config", str(thinking_kit / "gsm8k_grpo.yaml"), "--output_dir", str(tmp_path),
                                   "--model_name_or_path", str(thinking_kit / "tiny-qwen3-tools"),
                                   "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
                                   "--reward_weights", *map(str, [*gsm8k_grpo.REWARD_WEIGHTS, 0.0])])
    finally:
        gsm8k_grpo.REWARD_FUNCS.remove(spy)
    seen = [c for call in calls[1:] for c in call]  # the first call: training.check_rows' test completions
    assert trainer.state.global_step == 1 and seen
    assert any(c[-1].get("reasoning_content") for c in seen)  # it thought
    assert all("<think>" not in rewards.completion_text(c) for c in seen)


def test_thinking_on_a_model_without_the_switch_is_one_line(kit, tmp_path):
    with pytest.raises(Refusal, match=r"^--thinking: .*tiny-qwen2's chat template has no enable_thinking switch"):
        gsm8k_grpo.main(["--config", str(kit / "gsm8k_grpo.yaml"), "--output_dir", str(tmp_path), "--thinking"])


@pytest.mark.slow  # needs the thinking kit (minutes to build): with the thinking checks
def test_a_thinking_template_trl_cannot_parse_is_one_line(thinking_kit, tmp_path):
    model = shutil.copytree(thinking_kit / "tiny-qwen3", tmp_path / "odd-template")
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").write_text(template.replace("<|im_start|>assistant\\n", "<|im_start|>bot\\n"))
    with pytest.raises(Refusal, match="TRL cannot parse the thinking out of its completions"):
        gsm8k_grpo.main(["--config", str(thinking_kit / "gsm8k_grpo.yaml"), "--model_name_or_path", str(model),
                         "--output_dir", str(tmp_path / "out")])


@pytest.mark.slow
def test_every_recipe_runs_a_thinking_model_offline_end_to_end(thinking_kit, tmp_path):
    """As a user would: `python offline.py --thinking --tools --search` (the session's kit), then each recipe on its
    config, in a subprocess; the agent recipes' thinking warm starts call their tools through TRL's multi-turn loop."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from grpo_recipes import kit_judge
    from grpo_recipes.contract import RECIPES

    root = Path(__file__).resolve().parent.parent

    judge_server, judge_url = kit_judge.start()  # judge_grpo's: the kit's stand-in judge
    for recipe in [r for r in RECIPES if r != "code_grpo"]:  # offline.py's code model does not think (Qwen2.5's)
        out = tmp_path / recipe
        judge = ["--judge_base_url", judge_url] if recipe == "judge_grpo" else []
        proc = subprocess.run([sys.executable, f"{recipe}.py", "--config", str(thinking_kit / f"{recipe}.yaml"),
                               "--output_dir", str(out), "--max_steps", "2", "--eval_strategy", "no",
                               "--max_completion_length", "160", "--temperature", "0.3", *judge],
                              cwd=root, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
        assert state["global_step"] == 2
        if recipe in ("tool_use_grpo", "search_agent_grpo"):
            calls = [log["tools/call_frequency"] for log in state["log_history"] if "tools/call_frequency" in log]
            assert len(calls) == 2 and all(calls), (recipe, calls)
    judge_server.shutdown()


@pytest.mark.slow  # needs the thinking kit (minutes to build): with the thinking checks
def test_a_thinking_model_given_completions_too_short_to_think_gets_the_flag_that_fixes_it(thinking_kit, caplog):
    import logging

    from transformers import AutoTokenizer

    from grpo_recipes import preflight

    tokenizer = AutoTokenizer.from_pretrained(thinking_kit / "tiny-qwen3")
    with caplog.at_level(logging.WARNING, logger="grpo-recipes"):
        preflight.check_thinking_template(tokenizer, "tiny-qwen3", None, 512)  # the template thinks by default
        assert "cut inside <think>" in caplog.text and "--max_completion_length 2048 or more" in caplog.text
        caplog.clear()
        preflight.check_thinking_template(tokenizer, "tiny-qwen3", False, 512)  # answers at once
        preflight.check_thinking_template(tokenizer, "tiny-qwen3", True, 4096)
        assert "cut inside <think>" not in caplog.text
