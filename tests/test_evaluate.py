"""evaluate.py against a real OpenAI-compatible server: `transformers serve` of the tiny local model
(conftest.server)."""

import json
import subprocess
import sys

import pytest

import evaluate
import rewards
from conftest import ROOT, free_port
from grpo_recipes.refusal import Refusal


def run(args, tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    rows = evaluate.main([*args, "--out", str(out)])
    return rows, [json.loads(line) for line in out.read_text().splitlines()], capsys.readouterr().out


def test_a_single_turn_recipe_is_scored_with_its_own_rubric(reader_server, kit, tmp_path, capsys):
    base_url, model = reader_server  # answers in text (the tool model's calls make transformers serve answer 500)
    rows, saved, printed = run(["gsm8k_grpo", "--base_url", base_url, "--model", model, "-n", "3", "-r", "2",
                                "--dataset_path", str(kit / "gsm8k_toy"), "--max_tokens", "24", "--concurrency", "2"],
                               tmp_path, capsys)
    assert len(saved) == 6
    assert [(r["example"], r["rollout"]) for r in saved] == [(i, j) for i in range(3) for j in range(2)]
    assert set(saved[0]["scores"]) == {"correctness_reward", "integer_answer_reward", "strict_format_reward",
                                       "soft_format_reward", "xml_tag_count_reward"}
    assert all(r["error"] is None for r in saved), saved[0]["error"]
    assert all(r["completion"][0]["role"] == "assistant" and r["usage"]["completion_tokens"] > 0 for r in saved)
    for line in ("strict accuracy", "lenient accuracy", "pass@1", "pass@2", "correctness_reward", "weighted total"):
        assert line in printed


def test_ctrl_c_stops_at_once_and_keeps_every_rollout_that_finished(reader_server, kit, tmp_path):
    """Each rollout reaches --out as it finishes; Ctrl-C sends nothing more, and says how many are there."""
    import signal
    import time

    base_url, model = reader_server
    out = tmp_path / "rollouts.jsonl"
    proc = subprocess.Popen([sys.executable, str(ROOT / "evaluate.py"), "gsm8k_grpo", "--base_url", base_url,
                             "--model", model, "-n", "16", "-r", "4", "--dataset_path", str(kit / "gsm8k_toy"),
                             "--max_tokens", "24", "--concurrency", "1", "--out", str(out)], cwd=tmp_path,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    deadline = time.monotonic() + 120
    while (not out.exists() or len(out.read_text().splitlines()) < 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - interrupted < 15, "it went on after Ctrl-C"
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert 2 <= len(kept) < 64 and all(row["completion"] and row["error"] is None for row in kept)
    assert stderr.strip().splitlines()[-1] == (f"interrupted: {len(kept)} of 64 rollouts are in {out}, unscored; no "
                                               "further request was sent")


def test_a_reward_that_fails_in_scoring_is_named_and_the_rollouts_it_would_score_are_kept(reader_server, kit,
                                                                                         tmp_path):
    base_url, model = reader_server
    fork = tmp_path / "my_recipe.py"
    # It breaks on the third problem only: evaluate.py's check on the first two rows, before any request, passes it.
    third = json.loads((kit / "gsm8k_toy" / "test.jsonl").read_text().splitlines()[2])["answer"].split("####")[1]
    fork.write_text((ROOT / "gsm8k_grpo.py").read_text().replace("REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({", (
        f"def my_reward(completions, answer, **kwargs):\n    if {third.strip()!r} in answer:\n"
        "        raise KeyError('score')\n    return [0.0] * len(completions)\n\n\n"
        "REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({\n    my_reward: 1.0,")))
    out = tmp_path / "rollouts.jsonl"
    with pytest.raises(Refusal) as refusal:
        evaluate.main([str(fork), "--base_url", base_url, "--model", model, "-n", "3", "--dataset_path",
                       str(kit / "gsm8k_toy"), "--max_tokens", "16", "--out", str(out)])
    assert str(refusal.value) == (f"my_reward (KeyError: 'score') raised while scoring: its scores are null in {out}, "
                                  "which keeps all 3 rollouts; fix the reward")
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(kept) == 3 and all(row["scores"]["my_reward"] is None for row in kept)
    assert all(row["scores"]["correctness_reward"] is not None for row in kept)  # the other rewards still scored


def test_a_tool_recipe_runs_its_tools_locally_between_turns(server, kit, tmp_path, capsys):
    base_url, model = server
    rows, saved, printed = run(["tool_use_grpo", "--base_url", base_url, "--model", model, "-n", "4",
                                "--dataset_path", str(kit / "gsm8k_toy"), "--max_tokens", "48", "--temperature", "0",
                                "--max_turns", "1"], tmp_path, capsys)
    tool_results = [(m_call, m_result) for r in saved
                    for m_call, m_result in zip(r["completion"], r["completion"][1:], strict=False)
                    if m_result["role"] == "tool"]
    assert tool_results, "the model made no tool call through the OpenAI tools API"
    from grpo_recipes.sandbox import Sandbox

    fresh = Sandbox()
    for call_message, result in tool_results:
        code = call_message["tool_calls"][0]["function"]["arguments"]["code"]
        assert result["content"] == fresh.run(code)
    fresh.close()
    assert saved[0]["tools"][0]["function"]["name"] == "python"  # the schemas, for SFT on these rollouts
    assert "tool calls" in printed


def test_an_unreachable_server_gets_one_clear_message(base_kit, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "gsm8k_grpo", "--base_url",
                           f"http://127.0.0.1:{free_port()}/v1", "--model", "m", "--dataset_path",
                           str(base_kit / "gsm8k_toy"), "--out", str(tmp_path / "x.jsonl")],
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
    summary = evaluate.summarize(gsm8k_grpo.setup(gsm8k_grpo.ScriptArguments()), rows, rollouts=4)
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
    assert all(r["error"] is None for r in saved), saved[0]["error"]  # every request answered, none a 500
    assert all(r["completion"][-1]["role"] == "assistant" and r["completion"][-1]["content"].strip() for r in saved
               if r["completion"][-1]["role"] != "tool"), "a final turn with no text"
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



BAD_ANSWERS = {  # what a broken server answers every chat request: (status, content type, body)
    "HTTP 500 with an error": (500, "application/json", b'{"error": {"message": "worker died: out of memory"}}'),
    "HTTP 500 as HTML": (500, "text/html", b"<html>Internal Server Error</html>"),
    "a cut-off JSON body": (200, "application/json", b'{"id": "x", "choices": ['),
    "a body that is not a completion": (200, "text/plain", b"hello"),
    "a base URL without /v1": (404, "application/json", b'{"detail": "Not Found"}'),
    "a wrong key": (401, "application/json", b'{"error": {"message": "Incorrect API key provided"}}'),
}
ALL_FAILED = "all 2 requests failed, none written to --out; the first: "
SAID = {"HTTP 500 with an error": ALL_FAILED + "HTTP 500 from {url}/chat/completions: worker died: out of memory",
        "HTTP 500 as HTML": ALL_FAILED + "HTTP 500 from {url}/chat/completions: <html>Internal Server Error</html>",
        "a cut-off JSON body": "{url}/chat/completions answered with a body that is not JSON",
        "a body that is not a completion": "{url}/chat/completions answered with a body that is not a chat completion",
        "a base URL without /v1": "HTTP 404 from {url}/chat/completions: Not Found; does --base_url end in /v1",
        "a wrong key": "HTTP 401 from {url}/chat/completions: Incorrect API key provided; check --api_key"}


@pytest.fixture
def broken_server(request):
    """A stdlib HTTP server that answers every POST with BAD_ANSWERS[request.param]."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    status, content_type, body = BAD_ANSWERS[request.param]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1", request.param
    server.shutdown()


@pytest.mark.parametrize("broken_server", list(BAD_ANSWERS), indirect=True)
def test_a_broken_server_is_one_line_with_its_own_error_and_no_out(broken_server, kit, tmp_path):
    url, case = broken_server
    out = tmp_path / "rollouts.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "gsm8k_grpo", "--base_url", url, "--model", "m",
                           "--dataset_path", str(kit / "gsm8k_toy"), "-n", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout
    assert lines[0].startswith(SAID[case].format(url=url)), lines[0]
    assert not out.exists()


def test_every_request_failing_exits_non_zero_and_writes_nothing(kit, tmp_path):
    """The probe passes (a 1-token request), then every rollout fails: nothing is scored or written."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            probe = request.get("max_tokens") == 1
            body = json.dumps({"id": "p", "object": "chat.completion", "created": 0, "model": "m", "choices": [{
                "index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "x"}}]} if probe
                else {"error": {"message": "cannot parse the tool call"}}).encode()
            self.send_response(200 if probe else 500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url, out = f"http://127.0.0.1:{server.server_port}/v1", tmp_path / "rollouts.jsonl"
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "gsm8k_grpo", "--base_url", url, "--model",
                               "m", "--dataset_path", str(kit / "gsm8k_toy"), "-n", "2", "--out", str(out)],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    finally:
        server.shutdown()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == ("all 2 requests failed, none written to --out; the first: HTTP "
                                                    f"500 from {url}/chat/completions: cannot parse the tool call")
    assert not out.exists()
