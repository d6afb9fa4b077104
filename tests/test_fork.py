"""A fork of a recipe, made as the README's "Make your own recipe" says, through every path the README promises: a task
the code has never seen (countdown: reach a target from given numbers with one arithmetic expression), with its own
name, data columns, system prompt and reward. One fork of gsm8k_grpo.py (single-turn) and one of tool_use_grpo.py
(the sandboxed interpreter kept). Each path runs through its entry point: the offline kit's config, training,
evaluate.py against a served model, sft_warmstart.py from the fork's gold column and from evaluate.py's rollouts,
merge_models.py, and the notebook build; what a fork lacks is refused in one line. async_grpo.py with a fork (of
gsm8k_grpo.py, from its file) runs in the vLLM tier: tests/test_vllm.py's short_fork."""

import ast
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent

SYSTEM_PROMPT = '''SYSTEM_PROMPT = """Reach the target with the given numbers, each used at most once, and + - * /.
Reply with the expression inside <answer></answer> tags, for example <answer>3 * 4 + 2</answer>."""'''

BUILD_DATASET = '''def build_dataset(split: str = "train", dataset_path: str | None = None,
                  dataset_name: str | None = None) -> Dataset:
    """Countdown rows (`numbers`, `target`, `solution`) as conversational prompts, with their gold completions."""
    raw = data.load_split(split, dataset_path, "my-org/countdown", None)  # --dataset_path: local files instead
    if missing := {"numbers", "target", "solution"} - set(raw.column_names):
        raise ValueError(f"{dataset_path} ({split}) lacks column(s) {sorted(missing)}")
    return raw.map(lambda row: {
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                   {"role": "user", "content": f"Numbers: {row['numbers']}. Target: {row['target']}."}],
        "numbers": row["numbers"], "target": row["target"],
        "gold_completion": f"<answer>{row['solution']}</answer>",
    }, remove_columns=raw.column_names)'''

REWARDS = '''def expression_reward(completions, numbers, target, **kwargs) -> list[float]:
    """1.0 when the expression in <answer> uses only the given numbers (each at most once) and equals the target.

    Gaming it: nothing but arithmetic is evaluated (names, calls and powers score 0), so it pays a right answer only.
    """
    def score(completion, allowed, goal) -> float:
        text = rewards.completion_text(completion)
        expression = text.split("<answer>")[-1].split("</answer>")[0] if "</answer>" in text else ""
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError:
            return 0.0
        nodes = list(ast.walk(tree.body))
        if not all(isinstance(n, (ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)) for n in nodes):
            return 0.0
        used = sorted(n.value for n in nodes if isinstance(n, ast.Constant))
        left = list(allowed)
        if any(value not in left or left.remove(value) for value in used):
            return 0.0
        try:
            return 1.0 if abs(eval(compile(tree, "<answer>", "eval")) - goal) < 1e-9 else 0.0
        except ZeroDivisionError:
            return 0.0

    return rewards.score_each(score, completions, numbers, target)


REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({expression_reward: 1.0})'''


def replaced(source: str, name: str, text: str) -> str:
    """`source` with its top-level definition or assignment of `name` replaced by `text`, as a user edits a fork."""
    for node in ast.parse(source).body:
        targets = [t for t in getattr(node, "targets", []) if isinstance(t, (ast.Name, ast.Tuple))]
        names = {getattr(node, "name", None)} | {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if name in names:
            lines = source.splitlines(keepends=True)
            start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
            return "".join(lines[:start]) + text + "\n" + "".join(lines[node.end_lineno:])
    raise AssertionError(f"no top-level {name} to replace")


def make_fork(original: str, name: str, folder: Path) -> Path:
    """The README's steps 1-5 on a copy of `original`: its config's folder, prompt, data and rubric are countdown's."""
    source = (ROOT / f"{original}.py").read_text().replace(f"runs/{original}", f"runs/{name}")
    source = replaced(source, "SYSTEM_PROMPT", SYSTEM_PROMPT)
    source = replaced(source, "build_dataset", BUILD_DATASET)
    source = replaced(source, "REWARD_FUNCS", REWARDS)
    source = "import ast\n" + source if "\nimport ast\n" not in source else source
    path = folder / f"{name}.py"
    path.write_text(source)
    return path


def countdown_data(folder: Path) -> Path:
    """train.jsonl and test.jsonl in the fork's own columns: numbers, target, and a solution."""
    rng = random.Random(0)
    folder.mkdir(parents=True)
    for split, count in (("train", 16), ("test", 8)):
        rows = []
        for _ in range(count):
            a, b, c = (rng.randint(1, 9) for _ in range(3))
            rows.append({"numbers": [a, b, c], "target": a * b + c, "solution": f"{a} * {b} + {c}"})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def run(script, *argv, cwd=ROOT, timeout=600):
    """An entry point as a user runs it, from the repository (the fork lives elsewhere, so the path finds the
    library)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), *map(str, argv)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def one_line_refusal(proc) -> str:
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1]


@pytest.fixture(scope="module")
def forks(kit, tmp_path_factory):
    """The two forks, their data, and the kit (a copy, with each fork's config written by offline.py --recipe)."""
    folder = tmp_path_factory.mktemp("fork")
    shutil.copytree(kit, folder / "offline", ignore=shutil.ignore_patterns("runs", "bm25_index"))
    data = countdown_data(folder / "countdown")
    single = make_fork("gsm8k_grpo", "countdown_grpo", folder)
    tools = make_fork("tool_use_grpo", "countdown_tools_grpo", folder)
    for fork in (single, tools):
        proc = run(ROOT / "offline.py", "--out_dir", folder / "offline", "--recipe", fork, "--dataset_path", data)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return {"folder": folder, "data": data, "single": single, "tools": tools, "kit": folder / "offline"}


def test_a_fork_trains_offline_and_its_lora_run_merges(forks):
    """As the README runs it, from the fork's folder with relative paths (the adapter then names its base
    `offline/tiny-qwen2`, which mergekit took for a Hub id)."""
    config = forks["kit"] / "countdown_grpo.yaml"
    assert "output_dir: runs/countdown_grpo" in config.read_text() and "dataset_path: ../countdown" in \
        config.read_text()
    proc = run("countdown_grpo.py", "--config", "offline/countdown_grpo.yaml", "--max_steps", "2", "--eval_steps", "1",
               "--use_peft", "true", cwd=forks["folder"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = forks["kit"] / "runs" / "countdown_grpo"
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert any("rewards/expression_reward/mean" in log for log in state["log_history"])  # the fork's own rubric
    assert any("eval_rewards/expression_reward/mean" in log for log in state["log_history"])  # on its test split
    assert (out / "training_curves.png").is_file()
    merged = run(ROOT / "merge_models.py", "offline/runs/countdown_grpo", "--output_dir", "merged",
                 cwd=forks["folder"])
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert (forks["folder"] / "merged" / "model.safetensors").is_file()


def test_a_tool_fork_trains_offline_with_the_sandboxed_interpreter(forks, tmp_path):
    proc = run(forks["tools"], "--config", forks["kit"] / "countdown_tools_grpo.yaml", "--max_steps", "1",
               "--eval_strategy", "no", "--output_dir", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads((tmp_path / "run" / "checkpoint-1" / "trainer_state.json").read_text())
    assert "rewards/expression_reward/mean" in state["log_history"][0]
    assert "tools/call_frequency" in state["log_history"][0]


def test_sft_warmstart_imitates_a_forks_gold_column(forks, tmp_path):
    proc = run(ROOT / "sft_warmstart.py", "--recipe", forks["single"], "--source", "gold", "--dataset_path",
               forks["data"], "--model_name_or_path", forks["kit"] / "tiny-qwen2", "--output_dir", tmp_path / "sft",
               "--max_steps", "2", "--use_cpu", "--gradient_checkpointing", "false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SFT on 16 conversations from gold" in proc.stderr
    assert (tmp_path / "sft" / "model.safetensors").is_file()
    renamed = run(ROOT / "sft_warmstart.py", "--recipe", forks["single"], "--source", "gold", "--gold_column",
                  "solution", "--dataset_path", forks["data"], "--model_name_or_path", forks["kit"] / "tiny-qwen2",
                  "--output_dir", tmp_path / "sft2", "--use_cpu")
    assert "gives no 'solution' column (it gives numbers, target, prompt, gold_completion): add one" in \
        one_line_refusal(renamed)


@pytest.fixture(scope="module")
def base_server(forks):
    """`transformers serve` of the kit's base model, the README's check of a fork before training."""
    from conftest import serve

    yield from serve(str(forks["kit"] / "tiny-qwen2"))


def test_evaluate_scores_a_fork_and_its_rollouts_feed_sft(forks, base_server, tmp_path):
    base_url, model = base_server
    for fork, turns in ((forks["single"], 0), (forks["tools"], 1)):
        out = tmp_path / f"{fork.stem}.jsonl"
        proc = run(ROOT / "evaluate.py", fork, "--base_url", base_url, "--model", model, "-n", "4", "-r", "2",
                   "--dataset_path", forks["data"], "--split", "test", "--max_tokens", "48", "--out", out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 8 and all(row["error"] is None for row in rows)
        assert all("expression_reward" in row["scores"] for row in rows)
        assert bool(turns) == any(row.get("tools") for row in rows)  # the tool fork's rollouts carry its schema
    # the kit's untrained model earns nothing here: the filter says so, and the value that keeps the best
    refused = one_line_refusal(run(ROOT / "sft_warmstart.py", "--recipe", forks["single"], "--source", "rollouts",
                                   "--rollouts", tmp_path / "countdown_grpo.jsonl", "--model_name_or_path", model,
                                   "--output_dir", tmp_path / "no"))
    assert "no rollout scored above 0; the best total is 0. Pass --min_reward 0 to keep the best" in refused
    kept = run(ROOT / "sft_warmstart.py", "--recipe", forks["single"], "--source", "rollouts", "--rollouts",
               tmp_path / "countdown_grpo.jsonl", "--min_reward", "0", "--model_name_or_path", model,
               "--output_dir", tmp_path / "sft", "--max_steps", "1", "--use_cpu", "--gradient_checkpointing", "false")
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "SFT on 4 conversations from rollouts" in kept.stderr  # the best of each of the 4 prompts


def test_a_forks_notebook_builds_with_its_own_cells_and_carried_files(forks, tmp_path):
    proc = run(ROOT / "notebooks" / "build.py", forks["single"], "--out_dir", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notebook = nbformat.read(tmp_path / "countdown_grpo.ipynb", as_version=4)
    sources = [cell.source for cell in notebook.cells]
    assert sources[0].startswith("# countdown_grpo.py: ")
    assert any(source.startswith("def expression_reward") or "def expression_reward" in source for source in sources)
    assert any(source.startswith("%%writefile rewards.py") for source in sources)
    assert not any("gsm8k" in source for source in sources if source.startswith("SYSTEM_PROMPT"))


def test_a_fork_without_a_part_of_the_contract_is_one_line(forks, tmp_path):
    broken = tmp_path / "broken_grpo.py"
    broken.write_text(replaced(forks["single"].read_text(), "setup", "").replace("run_script(main)", "pass"))
    proc = run(ROOT / "evaluate.py", broken, "--base_url", "http://127.0.0.1:9/v1", "--model", "m", "--out",
               tmp_path / "rollouts.jsonl")
    assert "recipe broken_grpo does not offer setup: grpo_recipes/contract.py lists" in one_line_refusal(proc)
