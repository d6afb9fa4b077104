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
