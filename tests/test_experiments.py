"""experiments/: the scripts that measure the demos refuse bad input in one line and read their runs right (the demos
themselves: test_cpu_demo.py, test_agent_demo.py, test_merge_demo.py)."""

import subprocess
import sys

from conftest import ROOT


def run_script(name, *argv):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / name), *map(str, argv)], capture_output=True,
                          text=True, timeout=120, check=False)


def test_turn_credit_and_merge_scaling_refuse_bad_input_in_one_line(tmp_path):
    demo = tmp_path / "search"
    demo.mkdir()
    for name, argv, message in [
            ("turn_credit.py", [demo], "holds no results.json: pass an agent_demo.py task folder"),
            ("merge_scaling.py", [demo], "holds no results.json: pass a merge_demo.py --out_dir")]:
        proc = run_script(name, *argv)
        assert proc.returncode != 0 and message in proc.stderr.strip().splitlines()[-1]
    (demo / "results.json").write_text('{"args": {"task": "search", "turn_credit": 0.5}, "results": [{"seed": 0}]}')
    proc = run_script("turn_credit.py", demo)
    assert "was run with --turn_credit 0.5: the outcome-only arm must not" in proc.stderr
    (demo / "results.json").write_text('{"args": {"task": "search"}, "results": [{"seed": 0}]}')
    for argv, message in [(["--turn_credit", "1"], "must be in (0, 1)"), (["--seeds", "3"], "not [3]")]:
        proc = run_script("turn_credit.py", demo, *argv, "--out_dir", tmp_path / "out")
        assert proc.returncode != 0 and message in proc.stderr.strip().splitlines()[-1]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("{}")
    proc = run_script("turn_credit.py", demo, "--out_dir", tmp_path / "out")
    assert "already holds a comparison" in proc.stderr and (tmp_path / "out" / "results.json").read_text() == "{}"


def test_turn_credit_reads_the_learning_curve_of_the_newest_checkpoint(tmp_path):
    import json

    import turn_credit

    for step, value in ((25, 0.1), (50, 0.3)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        history = [{"step": s, "rewards/correctness_reward/mean": value} for s in range(5, step + 1, 5)]
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": history + [{"train_runtime": 1.0}]}))
    curve = turn_credit.learning_curve(tmp_path, turn_credit.CORRECT["tool"])
    assert list(curve) == list(range(5, 51, 5)) and set(curve.values()) == {0.3}


def test_async_demo_gives_both_arms_the_same_grpo_settings_and_each_script_takes_its_flags(tmp_path):
    """async_demo.py's arms differ only in the trainer: the same steps, batch, LoRA rate and advantage scaling, and
    each arm's flags parse with its own script (a flag the async trainer lacks would stop the demo mid-seed)."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import async_demo
    import async_grpo
    import cpu_demo
    import gsm8k_grpo
    from grpo_recipes import options

    args = cpu_demo.parse_args(["--grpo_steps", "12"])
    args.lora_lr = 2e-4
    flags = async_demo.arm_argv(tmp_path, tmp_path / "sync", 0, args, None)
    assert flags[-3:] == ["--use_vllm", "--vllm_mode", "colocate"]  # (parsed without: vLLM is the vLLM tier's)
    sync = options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, flags[:-3])[1]
    defaults, _ = async_grpo.recipe_defaults(gsm8k_grpo)
    for staleness in (0, 2):
        flags = async_demo.arm_argv(tmp_path, tmp_path / "async", 0, args, staleness)
        late = options.parse_args(gsm8k_grpo.ScriptArguments, defaults, flags,
                                   config_class=async_grpo.AsyncRecipeConfig)[1]
        assert late.max_staleness == staleness
        for name in ("max_steps", "learning_rate", "per_device_train_batch_size", "num_generations", "temperature",
                     "max_completion_length", "seed"):
            assert getattr(late, name) == getattr(sync, name), name
    assert sync.scale_rewards == "group" and sync.beta == 0  # the async trainer's advantage scaling; it has no KL


def test_difficulty_demo_arms_parse_with_their_recipes_and_cost_counts_every_completion(tmp_path):
    """difficulty_demo.py: each arm's flags parse with its recipe and differ from the baseline only in the arm's
    option; an arm's cost to reach the baseline's final accuracy counts its rating's completions, and an arm that never
    reaches it has no ratio."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import difficulty_demo
    import gsm8k_grpo
    import reasoning_gym_grpo
    from grpo_recipes import options

    args = difficulty_demo.parse_args(["--out_dir", str(tmp_path)])
    parsed = {}
    for task, recipe in (("gsm8k", gsm8k_grpo), ("gym", reasoning_gym_grpo)):
        start = {"dir": tmp_path / task / "seed0"}
        for arm in difficulty_demo.ARMS[task]:
            argv = difficulty_demo.arm_argv(task, arm, start, 0, args, tmp_path / "rates.jsonl")
            script_args, training_args, _ = options.parse_args(recipe.ScriptArguments, recipe.RECIPE_DEFAULTS, argv)
            assert (training_args.max_steps, training_args.save_steps, training_args.num_generations) == (80, 5, 8)
            assert training_args.per_device_train_batch_size == 64 and training_args.output_dir.endswith(arm)
            assert training_args.save_total_limit >= 80 / 5  # each checkpoint is evaluated after the run
            parsed[arm] = script_args, training_args
    assert parsed["all"][1].pass_rates is None and parsed["all"][1].skip_settled_after == 0
    assert parsed["pre-filter"][1].pass_rates == str(tmp_path / "rates.jsonl")
    assert parsed["skip"][1].skip_settled_after == 1
    assert (parsed["fixed"][0].curriculum, parsed["fixed"][0].level) == (False, 1)
    assert (parsed["curriculum"][0].curriculum, parsed["curriculum"][0].level) == (True, 0)

    def run(arm, *points):
        return {"task": "gsm8k", "seed": 0, "arm": arm, "curve": [{"completions": c, "accuracy": a} for c, a in points]}

    table = difficulty_demo.ratios([run("all", (0, 0.5), (1280, 0.8), (2560, 0.8)),
                                    run("pre-filter", (640, 0.5), (1920, 0.9), (3200, 0.9)),
                                    run("skip", (0, 0.5), (1280, 0.6), (2560, 0.7))])
    by_arm = {row["arm"]: row for row in table}
    assert by_arm["all"]["completions"] == 1280 and by_arm["all"]["ratio"] == 1.0
    assert by_arm["pre-filter"]["completions"] == 1920 and by_arm["pre-filter"]["ratio"] == 1.5
    assert by_arm["skip"]["completions"] is None and by_arm["skip"]["ratio"] is None
