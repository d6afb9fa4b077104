"""evaluate.py against a real OpenAI-compatible server: `transformers serve` of the tiny local model (conftest.server)."""

import json
import subprocess
import sys

import pytest

import evaluate
import rewards
from conftest import ROOT, free_port


def run(args, tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    rows = evaluate.main([*args, "--out", str(out)])
    return rows, [json.loads(line) for line in out.read_text().splitlines()], capsys.readouterr().out


def test_a_single_turn_recipe_is_scored_with_its_own_rubric(server, kit, tmp_path, capsys):
    base_url, model = server
    rows, saved, printed = run(["gsm8k_grpo", "--base_url", base_url, "--model", model, "-n", "3", "-r", "2",
                                "--dataset_path", str(kit / "gsm8k_toy"), "--max_tokens", "24", "--concurrency", "2"],
                               tmp_path, capsys)
    assert len(saved) == 6 and [(r["example"], r["rollout"]) for r in saved] == [(i, j) for i in range(3) for j in range(2)]
    assert set(saved[0]["scores"]) == {"correctness_reward", "integer_answer_reward", "strict_format_reward",
                                       "soft_format_reward", "xml_tag_count_reward"}
    assert all(r["completion"][0]["role"] == "assistant" and r["usage"]["completion_tokens"] > 0 for r in saved
               if r["error"] is None)
    for line in ("strict accuracy", "lenient accuracy", "pass@1", "pass@2", "correctness_reward", "weighted total"):
        assert line in printed


def test_a_tool_recipe_runs_its_tools_locally_between_turns(server, kit, tmp_path, capsys):
    base_url, model = server
    rows, saved, printed = run(["tool_use_grpo", "--base_url", base_url, "--model", model, "-n", "4",
                                "--dataset_path", str(kit / "gsm8k_toy"), "--max_tokens", "48", "--temperature", "0",
                                "--max_turns", "1"], tmp_path, capsys)
    tool_results = [(m_call, m_result) for r in saved for m_call, m_result in zip(r["completion"], r["completion"][1:])
                    if m_result["role"] == "tool"]
    assert tool_results, "the model made no tool call through the OpenAI tools API"
    from sandbox import Sandbox

    fresh = Sandbox()
    for call_message, result in tool_results:
        code = call_message["tool_calls"][0]["function"]["arguments"]["code"]
        assert result["content"] == fresh.run(code)
    fresh.close()
    assert saved[0]["tools"][0]["function"]["name"] == "python"  # the schemas, for SFT on these rollouts
    assert "tool calls" in printed


def test_an_unreachable_server_gets_one_clear_message(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "gsm8k_grpo", "--base_url",
                           f"http://127.0.0.1:{free_port()}/v1", "--model", "m", "--out", str(tmp_path / "x.jsonl")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("cannot reach http://127.0.0.1:")


def test_pass_at_k_is_the_unbiased_estimate():
    assert evaluate.pass_at_k(4, 0, 1) == 0.0 and evaluate.pass_at_k(4, 4, 1) == 1.0
    assert evaluate.pass_at_k(4, 1, 1) == pytest.approx(0.25) and evaluate.pass_at_k(4, 1, 4) == 1.0
    assert evaluate.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6) and evaluate.pass_at_k(4, 0, 4) == 0.0
    with pytest.raises(ValueError, match="pass@4 needs at least 4 attempts"):
        evaluate.pass_at_k(2, 0, 4)  # was 1.0: two failed requests made a wrong example look solved


def test_failed_requests_count_as_attempts_that_got_nothing_right():
    import gsm8k_grpo

    def row(example, strict, error=None):
        scores = {rewards.reward_name(f): float(strict) for f in gsm8k_grpo.REWARD_FUNCS}
        return {"example": example, "strict": strict, "lenient": strict, "error": error, "scores": scores,
                "total": 2.0 * strict, "completion": [], "usage": {"completion_tokens": 0}}

    rows = [row(0, False, "APIError"), row(0, False, "APIError"), row(0, False), row(0, False),
            row(1, True), row(1, False), row(1, False), row(1, False, "APIError")]
    summary = evaluate.summarize(gsm8k_grpo, rows, rollouts=4)
    assert "8 rollouts, 3 failed on API errors (counted as wrong below)" in summary
    assert "strict accuracy 12.5%" in summary  # 1 of 8 attempted, not 1 of 5 answered
    assert "pass@4 50.0%" in summary  # example 0: 0 of 4 right -> 0; example 1: 1 of 4 -> 1


def test_evaluate_then_rejection_sampling_then_sft_then_grpo(server, kit, tmp_path, capsys):
    """The workflow: score rollouts with an API model, keep the good ones, SFT on them, start RL from the result."""
    import sft_warmstart
    import tool_use_grpo

    base_url, model = server
    _, saved, _ = run(["tool_use_grpo", "--base_url", base_url, "--model", model, "-n", "6", "-r", "2",
                       "--dataset_path", str(kit / "gsm8k_toy"), "--max_tokens", "48", "--max_turns", "1"],
                      tmp_path, capsys)
    kept = sft_warmstart.rollout_conversations(str(tmp_path / "rollouts.jsonl"), min_reward=0.5, best_of=1)
    assert kept and all(any(m.get("tool_calls") for m in c["messages"]) for c in kept)  # tool use paid 0.5
    sft = sft_warmstart.main(["--recipe", "tool_use_grpo", "--source", "rollouts", "--rollouts",
                              str(tmp_path / "rollouts.jsonl"), "--min_reward", "0.5", "--model_name_or_path", model,
                              "--output_dir", str(tmp_path / "sft"), "--max_steps", "2", "--use_cpu",
                              "--gradient_checkpointing", "false"])
    trainer = tool_use_grpo.main(["--config", str(kit / "tool_use_grpo.yaml"), "--model_name_or_path", str(sft),
                                  "--max_steps", "1", "--eval_strategy", "no", "--output_dir", str(tmp_path / "grpo")])
    assert trainer.state.global_step == 1


def test_an_earlier_out_is_never_replaced_without_asking(tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_text('{"paid": "for"}\n{"paid": "too"}\n')
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "gsm8k_grpo", "--base_url",
                           f"http://127.0.0.1:{free_port()}/v1", "--model", "m", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (f"--out {out} already holds 2 rollouts: pass another --out (e.g. "
                                                     f"{tmp_path / 'results-2.jsonl'}) to keep both, or --overwrite_out "
                                                     "to replace it")
    assert out.read_text() == '{"paid": "for"}\n{"paid": "too"}\n'

