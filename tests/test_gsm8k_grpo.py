"""gsm8k_grpo.py: its data, its config and pre-flight checks, and real GRPO runs through its own entry point."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gsm8k_grpo
import rewards
from conftest import ROOT
from gsm8k_grpo import REWARD_FUNCS, REWARD_WEIGHTS, soft_format_reward, strict_format_reward, xml_tag_count_reward
from test_answers import percent_pairs
from test_rewards import completion
from grpo_recipes import options
from grpo_recipes.refusal import Refusal


def run_recipe(kit: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python gsm8k_grpo.py --config <kit>/gsm8k_grpo.yaml ...` in a subprocess, as a user would run it."""
    cmd = [sys.executable, str(ROOT / "gsm8k_grpo.py"), "--config", str(kit / "gsm8k_grpo.yaml"), *extra]
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}  # None: unset
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=kit, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def train_logs(stdout: str) -> list[dict]:
    """The compact per-step training lines the recipe printed (not eval, not the final summary), as step and lr."""
    lines = [re.match(r"step (\d+)/\d+ \| reward .*\| lr ([-+.e\d]+)$", line) for line in stdout.splitlines()]
    return [{"step": int(m.group(1)), "learning_rate": float(m.group(2))} for m in lines if m]


# -------------------------------------------------------------------------------------------------------------- data
def test_build_dataset_makes_conversational_prompts_and_numeric_answers(kit):
    dataset = gsm8k_grpo.build_dataset("train", str(kit / "gsm8k_toy"))
    assert sorted(dataset.column_names) == ["answer", "gold_completion", "prompt"] and len(dataset) == 48
    row = dataset[0]
    assert row["prompt"][0] == {"role": "system", "content": gsm8k_grpo.SYSTEM_PROMPT}
    assert row["prompt"][1]["role"] == "user" and row["prompt"][1]["content"].endswith("?")
    assert all(re.fullmatch(r"-?\d+", answer) for answer in dataset["answer"])
    raw = [json.loads(line) for line in (kit / "gsm8k_toy" / "train.jsonl").read_text().splitlines()]
    with_separator = [i for i, r in enumerate(raw) if "," in r["answer"].split("####")[1]]
    assert with_separator, "the toy data should exercise thousands separators"
    assert "," not in dataset[with_separator[0]]["answer"]


def test_build_dataset_reads_a_single_jsonl_or_parquet_file(kit, tmp_path):
    jsonl = kit / "gsm8k_toy" / "test.jsonl"
    from_jsonl = gsm8k_grpo.build_dataset("train", str(jsonl))
    parquet = tmp_path / "test.parquet"
    from datasets import load_dataset

    load_dataset("json", data_files=str(jsonl), split="train").to_parquet(str(parquet))
    from_parquet = gsm8k_grpo.build_dataset("train", str(parquet))
    assert len(from_jsonl) == len(from_parquet) == 16
    assert from_jsonl["answer"] == from_parquet["answer"]


def test_a_dataset_without_gsm8k_columns_gets_a_one_line_error(tmp_path, kit):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1 + 1?", "solution": "2"}) + "\n")
    with pytest.raises(Refusal, match=r"lacks column\(s\) \['answer', 'question'\].*rename them"):
        gsm8k_grpo.main(["--model_name_or_path", str(kit / "tiny-qwen2"), "--dataset_path", str(bad),
                         "--eval_strategy", "no", "--output_dir", str(tmp_path / "out")])


def test_a_single_file_without_a_test_split_says_how_to_train_without_eval(tmp_path, kit):
    with pytest.raises(Refusal, match="--eval_strategy no"):
        gsm8k_grpo.main(["--model_name_or_path", str(kit / "tiny-qwen2"), "--output_dir", str(tmp_path / "out"),
                         "--dataset_path", str(kit / "gsm8k_toy" / "train.jsonl")])


# ------------------------------------------------------------------------------------------ config and pre-flight
def parse_args(argv: list[str]):
    """The recipe's own options, parsed as its main() parses them."""
    return options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv)


def test_the_defaults_are_a_valid_one_gpu_config_with_the_recipe_rewards():
    script_args, args, model_args = parse_args([])
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert args.generation_batch_size % args.num_generations == 0
    assert args.reward_weights is None  # the rubric's own, set by training.prepare unless --reward_weights is given
    task = gsm8k_grpo.setup(script_args)
    assert task.reward_funcs == gsm8k_grpo.REWARD_FUNCS and task.reward_weights == [2.0, 0.5, 0.5, 0.5, 0.5]
    assert args.eval_strategy == "steps"


def test_a_model_without_a_chat_template_is_refused_before_training(kit, tmp_path):
    model = shutil.copytree(kit / "tiny-qwen2", tmp_path / "no-template")
    (model / "chat_template.jinja").unlink()
    with pytest.raises(Refusal, match="has no chat template"):
        gsm8k_grpo.main(["--model_name_or_path", str(model), "--dataset_path", str(kit / "gsm8k_toy")])


def test_reward_weights_of_the_wrong_length_are_refused_before_training(kit):
    with pytest.raises(Refusal, match=r"--reward_weights has 2 values for 5 reward functions"):
        gsm8k_grpo.main(["--model_name_or_path", str(kit / "tiny-qwen2"), "--reward_weights", "1.0", "2.0"])


def test_quantization_without_lora_is_refused_before_loading_the_model(kit):
    with pytest.raises(Refusal, match="add --use_peft"):
        gsm8k_grpo.main(["--model_name_or_path", str(kit / "tiny-qwen2"), "--use_peft", "false", "--load_in_4bit"])


def test_a_folder_without_a_test_file_names_the_missing_split(kit, tmp_path):
    folder = tmp_path / "train_only"
    folder.mkdir()
    shutil.copy(kit / "gsm8k_toy" / "train.jsonl", folder / "train.jsonl")
    with pytest.raises(Refusal) as refusal:
        gsm8k_grpo.main(["--model_name_or_path", str(kit / "tiny-qwen2"), "--dataset_path", str(folder),
                         "--output_dir", str(tmp_path / "out")])
    assert str(refusal.value) == f"{folder}: no 'test' split there (it has train); name the files test.jsonl"


def test_the_command_line_prints_one_line_not_a_traceback(kit):
    cmd = [sys.executable, str(ROOT / "gsm8k_grpo.py"), "--num_generations", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=kit)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("per_device_train_batch_size × processes")


# ----------------------------------------------------------------------------------------------------- real training
def test_offline_run_trains_evaluates_checkpoints_and_resumes(kit):
    out = kit / "runs" / "resume"
    first = run_recipe(kit, "--output_dir", str(out), "--log_completions")
    assert ("full fine-tune | learning_rate 5e-06 | max_completion_length 32 | max_steps 4 | precision fp32 | "
            "generation with transformers") in first.stderr  # the run summary: what runs, in one line
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert (out / "checkpoint-2" / "model.safetensors").exists() and (out / "model.safetensors").exists()
    assert (out / "training_curves.png").stat().st_size > 10_000  # the plot of rewards and lengths over steps
    logged = set().union(*state["log_history"])
    for reward in gsm8k_grpo.REWARD_FUNCS:  # every reward of the rubric, logged by name
        assert f"rewards/{reward.__name__}/mean" in logged
        assert f"eval_rewards/{reward.__name__}/mean" in logged  # held-out curve next to the training reward
    assert sorted((out / "completions").glob("completions_*.parquet")), "--log_completions wrote no completions"
    # --log_completions prints plain blocks (TRL's rich table cut every column to '…' at a file's 80 columns)
    shown = re.findall(r"^--- completion (\d) at step (\d): correctness \d\.\d\d, integer_answer .*; advantage "
                       r"[-+]\d\.\d\d\nuser: (.+)\nassistant: ", first.stdout, flags=re.MULTILINE)
    assert [(number, step) for number, step, _ in shown] == [(n, s) for s in "1234" for n in "12"]
    questions = {json.loads(line)["question"] for line in (kit / "gsm8k_toy" / "train.jsonl").read_text().splitlines()}
    assert {question for _, _, question in shown} <= questions, "each block shows its question whole"
    assert "━" not in first.stdout and "…" not in first.stdout
    lr_by_step = {log["step"]: log["learning_rate"] for log in state["log_history"] if "learning_rate" in log}

    resumed = run_recipe(kit, "--output_dir", str(out), "--resume_from_checkpoint", str(out / "checkpoint-2"))
    steps = train_logs(resumed.stdout)
    assert [log["step"] for log in steps] == [3, 4], "a resumed run must train only the two steps after the checkpoint"
    # the logged rates carry 3 digits
    assert [log["learning_rate"] for log in steps] == pytest.approx([lr_by_step[3], lr_by_step[4]], rel=1e-2)


def test_use_peft_trains_and_saves_a_lora_adapter(kit, tmp_path):
    run_recipe(kit, "--output_dir", str(tmp_path), "--use_peft", "--max_steps", "2", "--eval_strategy", "no")
    adapter = json.loads((tmp_path / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["r"] == gsm8k_grpo.RECIPE_DEFAULTS["lora_r"]
    targets = {name.rsplit(".", 1)[-1] for name in adapter["target_modules"]}
    assert targets >= {"q_proj", "v_proj", "down_proj"}  # all-linear
    assert (tmp_path / "adapter_model.safetensors").exists() and not (tmp_path / "model.safetensors").exists()


def test_report_to_wandb_without_credentials_logs_offline_instead_of_prompting(kit, tmp_path):
    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb is not installed")
    env = {"HOME": str(tmp_path), "WANDB_DIR": str(tmp_path), "WANDB_API_KEY": None, "WANDB_MODE": None}
    proc = run_recipe(kit, "--output_dir", str(tmp_path / "out"), "--report_to", "wandb", "--max_steps", "1",
                      "--eval_strategy", "no", env=env)
    assert "logging offline" in proc.stderr
    assert list((tmp_path / "wandb").glob("offline-run-*")), "no offline wandb run was written"


def test_two_cpu_processes_under_accelerate_launch_train_together(kit, tmp_path):
    """DDP on CPU (gloo): `accelerate launch --multi_gpu` starts the processes; `use_cpu` (in the offline config)
    keeps them on the CPU. The batch check counts both processes: 2 per process × 2 = 4 = num_generations."""
    out = tmp_path / "ddp"
    for old in ("checkpoint-1", "checkpoint-7"):  # an earlier run's, started over with --overwrite_output_dir
        for i in range(200):  # files enough that two processes deleting them would collide
            (out / old / f"shard-{i}").parent.mkdir(parents=True, exist_ok=True)
            (out / old / f"shard-{i}").write_text("x")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "gsm8k_grpo.py"),
           "--config", str(kit / "gsm8k_grpo.yaml"), "--output_dir", str(out), "--max_steps", "2", "--save_steps", "2",
           "--per_device_train_batch_size", "2", "--eval_strategy", "no", "--overwrite_output_dir"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=kit, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "process 0 of 2 ready" in proc.stderr and "process 1 of 2 ready" in proc.stderr
    assert proc.stderr.count("deleted checkpoint-1, checkpoint-7") == 1  # by the main process only
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert proc.stderr.count("saved the trained model") == 1  # logged by rank 0 only


def test_the_accelerate_configs_load_with_the_engine_they_name():
    from accelerate.commands.config.config_args import load_config_from_file

    engines = {name: load_config_from_file(str(ROOT / "accelerate" / f"{name}.yaml"))
               for name in ("multi_gpu", "zero2", "zero3", "fsdp")}
    assert {name: str(c.distributed_type).split(".")[-1] for name, c in engines.items()} == {
        "multi_gpu": "MULTI_GPU", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp": "FSDP"}
    assert engines["zero2"].deepspeed_config["zero_stage"] == 2 and engines["zero3"].deepspeed_config["zero_stage"] == 3
    assert all(c.num_processes == -1 for c in engines.values())  # none fixes the count: the command line gives it


# ------------------------------------------------------------------------------------------------------- the rubric
QUESTION = "Mia has 18 stickers and gives away 0 of them. How many stickers does she have now?"
GOOD = "<reasoning>\nShe has 3 packs of 5, so 3 * 5 = 15, plus 3 is 18.\n</reasoning>\n<answer>\n18\n</answer>"


def chat(text):
    return [{"role": "assistant", "content": text}]


def weighted_total(completion, gold="18") -> float:
    return sum(w * f(completions=[completion], answer=[gold])[0] for f, w in zip(REWARD_FUNCS, REWARD_WEIGHTS,
                                                                                  strict=True))


def answer_block(inner: str) -> str:
    return f"<reasoning>\nworking\n</reasoning>\n<answer>\n{inner}\n</answer>"


@pytest.mark.parametrize("predicted, gold, right", percent_pairs())
def test_a_percent_at_the_wrong_scale_stays_below_the_ceiling_of_a_wrong_answer(predicted, gold, right):
    if not right:  # the recipe's stated ceiling for a wrong answer is 2.0 of its 4.0
        assert weighted_total(chat(answer_block(predicted)), gold) <= 2.0




def test_a_batch_of_degenerate_completions_scores_in_under_a_second():
    import time

    from benchmarks.bench_rewards import degenerate_batch

    batch = degenerate_batch()
    start = time.perf_counter()
    for reward in REWARD_FUNCS:
        reward(completions=batch, answer=["7"] * len(batch))
    assert time.perf_counter() - start < 1.0




def test_the_readme_rubric_table_is_the_recipe_rubric():
    from conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    assert rewards.rubric_table(REWARD_FUNCS, REWARD_WEIGHTS) in readme




# ------------------------------------------------------------------------------------------------- format rewards
@pytest.mark.parametrize("text, strict, soft", [
    (GOOD, 1.0, 1.0),
    (GOOD + "\n", 1.0, 1.0),                                           # the gist demanded a trailing newline
    ("<reasoning>\nline one\nline two\n</reasoning>\n<answer>\n18\n</answer>", 1.0, 1.0),  # multi-line (DOTALL)
    ("<reasoning>working</reasoning><answer>18</answer>", 0.0, 1.0),   # right order, no newlines
    ("<reasoning>\n\n</reasoning>\n<answer>\n\n</answer>", 0.0, 1.0),  # empty blocks
    ("<answer>\n18\n</answer>\n<reasoning>\nworking\n</reasoning>", 0.0, 0.0),  # wrong order
    (GOOD + "\nP.S. 19", 0.0, 1.0),                                    # trailing text
    (GOOD + GOOD, 0.0, 0.0),                                           # everything twice
    ("<reasoning>\nworking\n</reasoning>", 0.0, 0.0),
])
def test_strict_and_soft_format(text, strict, soft):
    assert strict_format_reward([chat(text)]) == [strict]
    assert soft_format_reward([chat(text)]) == [soft]


def test_format_rewards_take_other_tag_names():
    think = "<think>\nworking\n</think>\n<answer>\n18\n</answer>"
    assert strict_format_reward([chat(think)], reasoning_tag="think") == [1.0]
    assert strict_format_reward([chat(think)]) == [0.0]


@pytest.mark.parametrize("text, credit", [
    (GOOD, 1.0),
    ("<reasoning>\nworking\n</reasoning>", 0.5),
    (GOOD + " trailing", 0.75),
    ("<reasoning></reasoning>" * 50 + "<answer></answer>", 0.5),       # repeated tags earn nothing
    ("<answer>\n18\n</answer>" + "x" * 100_000, 0.25),                 # bounded penalty, not -len(text)
    ("", 0.0),
])
def test_xml_tag_count_gives_bounded_partial_credit_that_repetition_cannot_farm(text, credit):
    assert xml_tag_count_reward([chat(text)]) == [credit]




# ------------------------------------------------------------------------------- the design rule, probed adversarially
ADVERSARIAL = {
    "wrong answer, perfect format": answer_block("19"),
    "several answer blocks": GOOD + "\n<answer>\n18\n</answer>",
    "answer list": answer_block("17, 18, 19"),
    "every number from 0 to 100": answer_block(", ".join(map(str, range(101)))),
    "tags in the wrong order": "<answer>\n18\n</answer>\n<reasoning>\nworking\n</reasoning>",
    "answer hidden in the reasoning": "<reasoning>\n<answer>18</answer>\n</reasoning>\n<answer>\n\n</answer>",
    "correct, then trailing garbage": GOOD + "\nActually it might be 19.",
    "correct but no reasoning": "<answer>\n18\n</answer>",
    "bare number": "18",
    "repeated tags to farm partial credit": "<reasoning></reasoning>" * 100 + "<answer></answer>" * 100,
    "giant output": "<reasoning>\n" + "18 " * 200_000 + "\n</reasoning>\n<answer>\n18 18\n</answer>",
    "giant answer": answer_block("1" * 5000),
    "empty string": "",
    "whitespace": " \n\t ",
    "nested tags": "<reasoning>\n<reasoning>\nx\n</reasoning>\n</reasoning>\n<answer>\n18\n</answer>",
    "answer tag injected into the answer": answer_block("18</answer><answer>18"),
    "uppercase tags": GOOD.upper(),
    "correct number, wrong sign": answer_block("-18"),
    "correct number, unicode minus sign": answer_block("\u221218"),
    "several answer blocks, the last one right": answer_block("17") + "\n<answer>\n18\n</answer>",
    "unicode digits": answer_block("١٨"),
    "markdown-wrapped answer": answer_block("**18**"),
    "the question copied as the answer": answer_block(QUESTION),
    "guesses in a set": answer_block("{17, 18, 19}"),
    "guess then correction": answer_block("17, no wait, 18"),
    "deeply nested tags": "<reasoning>" * 500 + "18" + "</reasoning>" * 500 + "<answer>18</answer>",
    "1 MB of trailing text": GOOD + "18 " * 350_000,
}
NON_STRING = {"None content": [{"role": "assistant", "content": None}],
              "int content": [{"role": "assistant", "content": 18}],
              "no assistant message": [{"role": "user", "content": GOOD}], "garbage list": [None, 3, "x"],
              "None": None, "number": 18, "dict": {"content": GOOD}}


def test_a_genuine_answer_scores_the_maximum():
    assert weighted_total(chat(GOOD)) == pytest.approx(sum(REWARD_WEIGHTS))


@pytest.mark.parametrize("name", sorted(ADVERSARIAL) + sorted(NON_STRING))
def test_no_adversarial_completion_scores_as_high_as_a_genuine_one(name):
    completion = chat(ADVERSARIAL[name]) if name in ADVERSARIAL else NON_STRING[name]
    assert weighted_total(completion) < weighted_total(chat(GOOD))


@settings(max_examples=300, deadline=None)
@given(completions=st.lists(completion, min_size=1, max_size=4))
def test_the_format_rewards_never_raise_and_each_returns_one_float_in_range(completions):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the safety net in rewards.score_each must not be what keeps this passing
        for reward in (strict_format_reward, soft_format_reward, xml_tag_count_reward):
            scores = reward(completions=completions)
            assert len(scores) == len(completions) and all(0.0 <= s <= 1.0 for s in scores)
