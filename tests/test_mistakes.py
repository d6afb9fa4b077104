"""Mistakes cost one line: each common mistake exits non-zero with at most two lines on stderr, no traceback, and a
message naming the fix; no command loses work (a rerun keeps every checkpoint; Ctrl-C prints the command that
resumes, and that command resumes).

Every case runs the real entry point from the offline kit's folder: in a subprocess, as a user would, where the
process matters (its environment, the network, a signal, the rerun that must keep its checkpoints); in this process
otherwise, with the interpreter's own report of an uncaught exception or SystemExit reproduced, to keep the suite
fast. The network cases rely on this machine having no route to the Hugging Face Hub, as on CI.
"""

import importlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT, free_port, shared_once
from grpo_recipes.refusal import Refusal, run_script

ONLINE = {"HF_HUB_OFFLINE": None, "HF_DATASETS_OFFLINE": None}  # as a user who never set them


def workdir_with_checkpoints(kit: Path, folder: Path) -> Path:
    """A run folder holding checkpoints 280, 290, 300 and a final model, as an earlier run would have left it."""
    run = folder / "earlier_run"
    for step in (280, 290, 300):
        shutil.copytree(kit / "tiny-qwen2", run / f"checkpoint-{step}")
    return run


def malformed_data(folder: Path) -> Path:
    data = folder / "bad_data"
    data.mkdir()
    good = json.dumps({"question": "1 + 1?", "answer": "#### 2"})
    (data / "train.jsonl").write_text(f"{good}\n{good}\n{{\"question\": \"2 + 2?\", \"answer\": \"#### 4\"\n{good}\n")
    (data / "test.jsonl").write_text(good + "\n")
    return data


def run_folder(kit: Path, folder: Path, name: str, recorded: dict | None, checkpoint: bool = True,
               final: bool = False) -> Path:
    """An earlier run's folder: checkpoint-2 (complete) and/or a final model, and what that run trained."""
    run = folder / name
    if checkpoint:
        shutil.copytree(kit / "tiny-qwen2", run / "checkpoint-2")
        (run / "checkpoint-2" / "trainer_state.json").write_text("{}")
    if final:
        shutil.copytree(kit / "tiny-qwen2", run, dirs_exist_ok=True)
    if recorded:
        (run / "recipe_run.json").write_text(json.dumps(recorded))
    return run


def odd_models(kit: Path, folder: Path) -> dict[str, Path]:
    """Folders that are not a model: empty, a tokenizer alone, a LoRA adapter."""
    empty, tokenizer, adapter = folder / "empty_model", folder / "tokenizer_only", folder / "lora_adapter"
    empty.mkdir()
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(kit / "tiny-qwen2" / name, tokenizer / name)
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",
                                                             "peft_type": "LORA"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    return {"empty": empty, "tokenizer": tokenizer, "adapter": adapter}


def fork(folder: Path, name: str, *edits: tuple[str, str], recipe: str = "gsm8k_grpo.py") -> str:
    """A user's fork of a recipe: its file copied to folder/<name>.py with each (old, new) edit made."""
    source = (ROOT / recipe).read_text()
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    (folder / f"{name}.py").write_text(source)
    return str(folder / f"{name}.py")


def add_reward(name: str, body: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """The edits that add a reward to gsm8k_grpo.py's rubric, weight 0.5: `def <name>(completions, **kwargs)`."""
    return (("# A correct, well-formatted answer scores",
             f"def {name}(completions, answer, **kwargs):\n    {body}\n\n\n# A correct, well-formatted answer scores"),
            ("    xml_tag_count_reward: 0.5,\n", f"    xml_tag_count_reward: 0.5,\n    {name}: 0.5,\n"))


ROLE_LINE = '"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],'


def forks(folder: Path) -> dict[str, str]:
    """The forks a new user writes, each with one mistake the row checks must catch before the model loads."""
    return {
        "no **kwargs": fork(folder, "fork_no_kwargs", (
            'def soft_format_reward(completions, reasoning_tag="reasoning", answer_tag="answer", **kwargs)',
            'def soft_format_reward(completions, reasoning_tag="reasoning", answer_tag="answer")')),
        "one value": fork(folder, "fork_one_value", *add_reward(
            "brevity_reward", "return [sum(len(rewards.completion_text(c)) < 200 for c in completions) / "
                              "len(completions)]")),
        "strings": fork(folder, "fork_strings", *add_reward(
            "label_reward", 'return ["good" if "<answer>" in rewards.completion_text(c) else "bad" '
                            'for c in completions]')),
        "missing column": fork(folder, "fork_missing_column", ('"answer": rewards.extract_hash_answer(row["answer"]),',
                                                               '"gold": rewards.extract_hash_answer(row["answer"]),')),
        "raises": fork(folder, "fork_raises", *add_reward(
            "parsed_reward", 'return [float(rewards.completion_text(c).split("<answer>")[1].split("</answer>")[0]) '
                             '== float(a) for c, a in zip(completions, answer)]')),
        "scorer fails": fork(folder, "fork_scorer_fails", *add_reward(
            "number_reward", "return rewards.score_each(lambda c, a: float(rewards.completion_text(c)) == float(a), "
                             "completions, answer)")),
        "string prompt": fork(folder, "fork_string_prompt", (
            ROLE_LINE, '"prompt": SYSTEM_PROMPT + "\\n\\n" + row["question"],')),
        "capital role": fork(folder, "fork_capital_role", (ROLE_LINE, ROLE_LINE.replace('"system"', '"System"'))),
        "dropped role": fork(folder, "fork_dropped_role", (ROLE_LINE, ROLE_LINE.replace('"system"', '"developer"'))),
        "tool without Args": fork(folder, "fork_tool_no_args", (
            "\n        Args:\n            code: Python source code. Each call starts fresh: variables do not carry "
            "over between calls.\n", "\n"), recipe="tool_use_grpo.py"),
    }


def cases(kit: Path, folder: Path) -> dict:
    """name -> (script, argv, environment changes, words the message must hold)."""
    (folder / "typo.yaml").write_text("learning_rat: 1.0e-5\n")
    (folder / "list.yaml").write_text("- learning_rate: 1.0e-5\n- max_steps: 3\n")
    (folder / "section.yaml").write_text("training:\n  learning_rate: 1.0e-5\n")
    (folder / "no_answers").mkdir()
    (folder / "no_answers" / "train.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
    (folder / "empty_data").mkdir()
    (folder / "empty_data" / "train.jsonl").write_text("")
    (folder / "data.txt").write_text("1 + 1 = 2\n")
    (folder / "not_rollouts.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    odd = odd_models(kit, folder)
    model = str(kit / "tiny-qwen2")
    this_run = {"recipe": "gsm8k_grpo", "model": model, "data": str(kit / "gsm8k_toy"), "use_peft": False}
    (folder / "bad_value.yaml").write_text("learning_rate: fast\n")
    (folder / "broken.yaml").write_text("learning_rate: [1\n")
    config = str(kit / "gsm8k_grpo.yaml")
    (folder / "empty.yaml").write_text("# a template, every line a comment\n")
    cut_run = run_folder(kit, folder, "cut_run", this_run)  # checkpoint-2, then -4 cut while saving its state
    rate_run = run_folder(kit, folder, "rate_run", {**this_run, "learning_rate": 5e-6, "lr_scheduler_type": "cosine"})
    fork_of = forks(folder)
    (folder / "half_step.yaml").write_text(f"max_steps: 4.5\nmodel_name_or_path: {model}\n")
    (folder / "one_string.yaml").write_text("use_peft: true\nlora_target_modules: q_proj, v_proj\n")
    (folder / "evaluated").mkdir()
    shutil.copytree(cut_run / "checkpoint-2", cut_run / "checkpoint-4")
    (cut_run / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4, "log_hist')
    return {
        "rerun into checkpoints": ("gsm8k_grpo.py", ["--config", config, "--output_dir",
                                   str(workdir_with_checkpoints(kit, folder))], {},
                                   ["checkpoint-300", "--resume_from_checkpoint last", "--overwrite_output_dir"]),
        "unwritable output dir": ("gsm8k_grpo.py", ["--config", config, "--output_dir", "/proc/grpo-out"], {},
                                  ["cannot write", "--output_dir"]),
        "no network": ("gsm8k_grpo.py", ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--output_dir",
                       str(folder / "a")], ONLINE, ["cannot reach", "HF_HUB_OFFLINE=1", "offline.py"]),
        "no network for the dataset": ("gsm8k_grpo.py", ["--model_name_or_path", str(kit / "tiny-qwen2"),
                                       "--output_dir", str(folder / "b")], ONLINE,
                                       ["cannot reach", "openai/gsm8k", "--dataset_path"]),
        "offline and not cached": ("gsm8k_grpo.py", ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct",
                                   "--output_dir", str(folder / "c")], {}, ["not in the Hugging Face cache"]),
        "mistyped local model path": ("gsm8k_grpo.py", ["--config", config, "--model_name_or_path", "./tiny-qwen",
                                      "--output_dir", str(folder / "d")], ONLINE, ["./tiny-qwen", "no such folder"]),
        "malformed data line": ("gsm8k_grpo.py", ["--config", config, "--dataset_path", str(malformed_data(folder)),
                                "--output_dir", str(folder / "e")], {}, ["train.jsonl line 3", "not valid JSON"]),
        "missing data path": ("gsm8k_grpo.py", ["--config", config, "--dataset_path", "data/nope", "--output_dir",
                              str(folder / "f")], {}, ["data/nope", "no such file or folder"]),
        "misspelled flag": ("gsm8k_grpo.py", ["--config", config, "--max_stepz", "3"], {},
                            ["--max_stepz", "did you mean --max_steps"]),
        "flag prefix": ("gsm8k_grpo.py", ["--config", config, "--learning_rat", "1e-5"], {},
                        ["--learning_rat", "did you mean --learning_rate"]),
        "missing config": ("gsm8k_grpo.py", ["--config", "nope.yaml"], {}, ["nope.yaml", "no such file"]),
        "mistyped YAML key": ("gsm8k_grpo.py", ["--config", str(folder / "typo.yaml")], {},
                              ["learning_rat", "did you mean learning_rate"]),
        "bad YAML value": ("gsm8k_grpo.py", ["--config", str(folder / "bad_value.yaml")], {},
                           ["--learning_rate", "invalid float value: 'fast'"]),
        "broken YAML": ("gsm8k_grpo.py", ["--config", str(folder / "broken.yaml")], {}, ["not valid YAML", "line"]),
        "missing checkpoint": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(folder / "g"),
                               "--resume_from_checkpoint", str(folder / "g" / "checkpoint-9")], {},
                               ["checkpoint-9", "no such folder", "last"]),
        "resume with nothing to resume": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(folder / "h"),
                                          "--resume_from_checkpoint", "last"], {}, ["holds no complete checkpoint"]),
        "unknown recipe (evaluate.py)": ("evaluate.py", ["gsm9k_grpo", "--base_url", "http://localhost:9/v1",
                                         "--model", "m"], {}, ["unknown recipe 'gsm9k_grpo'", "gsm8k_grpo"]),
        "unknown recipe (sft_warmstart.py)": ("sft_warmstart.py", ["--config", str(kit / "sft_warmstart.yaml"),
                                              "--recipe", "tool_grpo", "--output_dir", str(folder / "i")], {},
                                              ["unknown recipe 'tool_grpo'"]),
        "missing rollouts file": ("sft_warmstart.py", ["--config", str(kit / "sft_warmstart.yaml"), "--source",
                                  "rollouts", "--rollouts", "gone.jsonl", "--output_dir", str(folder / "j")], {},
                                  ["gone.jsonl", "no such file"]),
        "num_generations 0": ("gsm8k_grpo.py", ["--config", config, "--num_generations", "0"], {},
                              ["--num_generations 0", "at least 2"]),
        "batch size 0": ("gsm8k_grpo.py", ["--config", config, "--per_device_train_batch_size", "0"], {},
                         ["--per_device_train_batch_size 0", "positive"]),
        "negative learning rate": ("gsm8k_grpo.py", ["--config", config, "--learning_rate", "-1"], {},
                                   ["--learning_rate -1", "positive"]),
        "max_steps 0": ("gsm8k_grpo.py", ["--config", config, "--max_steps", "0"], {}, ["--max_steps 0", "-1"]),
        "negative recipe option": ("tool_use_grpo.py", ["--config", str(kit / "tool_use_grpo.yaml"), "--tool_timeout",
                                   "-2"], {}, ["--tool_timeout -2", "positive"]),
        "YAML list": ("gsm8k_grpo.py", ["--config", str(folder / "list.yaml")], {}, ["list.yaml", "mapping", "list"]),
        "config is a folder": ("gsm8k_grpo.py", ["--config", str(folder)], {}, ["is a folder", "list.yaml"]),
        "YAML section": ("gsm8k_grpo.py", ["--config", str(folder / "section.yaml")], {},
                         ["training", "top level"]),
        "kit config before the kit": ("gsm8k_grpo.py", ["--config", "offline/code_grpo.yaml"], {},
                                      ["no such file", "python offline.py --code"]),
        "another recipe's flag": ("gsm8k_grpo.py", ["--config", config, "--tool_timeout", "3"], {},
                                  ["--tool_timeout", "an option of tool_use_grpo.py, not of gsm8k_grpo.py"]),
        "a flag of code_grpo.py": ("gsm8k_grpo.py", ["--config", config, "--seconds_per_test", "3"], {},
                                      ["an option of code_grpo.py"]),
        "empty dataset": ("gsm8k_grpo.py", ["--config", config, "--dataset_path", str(folder / "empty_data"),
                          "--eval_strategy", "no", "--output_dir", str(folder / "l")], {}, ["train.jsonl", "empty"]),
        "unknown data file type": ("gsm8k_grpo.py", ["--config", config, "--dataset_path", str(folder / "data.txt"),
                                   "--eval_strategy", "no", "--output_dir", str(folder / "m")], {},
                                   ["data.txt", ".jsonl", ".csv"]),
        "no readable gold answers": ("gsm8k_grpo.py", ["--config", config, "--dataset_path",
                                     str(folder / "no_answers"), "--eval_strategy", "no", "--output_dir",
                                     str(folder / "n")], {}, ["none of the 1 train rows", "#### <number>"]),
        "empty model folder": ("gsm8k_grpo.py", ["--config", config, "--model_name_or_path", str(odd["empty"]),
                               "--output_dir", str(folder / "o")], {}, ["empty folder"]),
        "tokenizer-only folder": ("gsm8k_grpo.py", ["--config", config, "--model_name_or_path",
                                  str(odd["tokenizer"]), "--output_dir", str(folder / "p")], {},
                                  ["a tokenizer but no model"]),
        "LoRA adapter folder": ("gsm8k_grpo.py", ["--config", config, "--model_name_or_path", str(odd["adapter"]),
                                "--output_dir", str(folder / "q")], {},
                                ["is a LoRA adapter (on Qwen/Qwen2.5-0.5B-Instruct)", "merge_models.py", "--use_peft"]),
        "4-bit on a CPU": ("gsm8k_grpo.py", ["--config", config, "--use_peft", "--load_in_4bit", "--output_dir",
                           str(folder / "r")], {}, ["--load_in_4bit", "needs a CUDA GPU"]),
        "rollouts not from evaluate.py": ("sft_warmstart.py", ["--config", str(kit / "sft_warmstart.yaml"), "--source",
                                          "rollouts", "--rollouts", str(folder / "not_rollouts.jsonl"),
                                          "--output_dir", str(folder / "s")], {},
                                          ["line 1: not an evaluate.py rollout", "evaluate.py"]),
        "rerun onto a finished model": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(run_folder(
                                        kit, folder, "finished", this_run, checkpoint=False, final=True))], {},
                                        ["already holds a trained model", "--overwrite_output_dir"]),
        "SFT twice into one folder": ("sft_warmstart.py", ["--config", str(kit / "sft_warmstart.yaml"),
                                      "--output_dir", str(run_folder(kit, folder, "sft_done", None, checkpoint=False,
                                                                     final=True))], {},
                                      ["already holds a trained model"]),
        "resume with another model": ("gsm8k_grpo.py", ["--config", config, "--model_name_or_path",
                                      str(kit / "tiny-qwen2-tools"), "--output_dir",
                                      str(run_folder(kit, folder, "other_model", this_run)),
                                      "--resume_from_checkpoint", "last"], {},
                                      ["continues a run of model", "tiny-qwen2, not",
                                       "without --resume_from_checkpoint"]),
        "resume another recipe's checkpoint": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(folder / "t"),
                                               "--resume_from_checkpoint", str(run_folder(kit, folder, "sft_run", {
                                                   **this_run, "recipe": "sft_warmstart"}) / "checkpoint-2")], {},
                                               ["recipe sft_warmstart.py, not gsm8k_grpo.py"]),
        "new model into another run's checkpoints": ("gsm8k_grpo.py", ["--config", config, "--model_name_or_path",
                                                     str(kit / "tiny-qwen2-tools"), "--output_dir",
                                                     str(run_folder(kit, folder, "their_run", this_run))], {},
                                                     ["of another run", "another --output_dir"]),
        "missing search corpus": ("search_agent_grpo.py", ["--config", str(kit / "search_agent_grpo.yaml"),
                                  "--corpus_path", "corpus_typo.jsonl", "--output_dir", str(folder / "k")], {},
                                  ["corpus_typo.jsonl", "no such file"]),
        "empty config": ("gsm8k_grpo.py", ["--config", str(folder / "empty.yaml"), "--output_dir", str(folder / "l")],
                         {}, ["empty.yaml holds no options", "without --config"]),
        "logger not installed": ("gsm8k_grpo.py", ["--config", config, "--report_to", "dvclive", "--output_dir",
                                 str(folder / "m")], {}, ["--report_to dvclive", "pip install dvclive"]),
        "mistyped logger": ("gsm8k_grpo.py", ["--config", config, "--report_to", "wandbb", "--output_dir",
                            str(folder / "n")], {}, ["--report_to wandbb", "did you mean wandb"]),
        "mistyped LoRA layer": ("gsm8k_grpo.py", ["--config", config, "--use_peft", "--lora_target_modules", "q_proj",
                                "v_prj", "--output_dir", str(folder / "o")], {},
                                ["--lora_target_modules v_prj", "v_proj", "all-linear"]),
        "cut-short checkpoint": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(cut_run),
                                 "--resume_from_checkpoint", str(cut_run / "checkpoint-4")], {},
                                 ["not a complete checkpoint", "checkpoint-2, or pass `last`"]),
        "async without a server": ("async_grpo.py", ["gsm8k_grpo", "--config", config, "--use_peft",
                                   "--vllm_server_base_url", f"http://127.0.0.1:{free_port()}", "--output_dir",
                                   str(folder / "p")], {}, ["no vLLM server at http://127.0.0.1:", "vllm serve"]),
        "async tool recipe without a server": ("async_grpo.py", ["tool_use_grpo", "--config",
                                               str(kit / "tool_use_grpo.yaml"), "--use_peft", "--vllm_server_base_url",
                                               f"http://127.0.0.1:{free_port()}", "--output_dir", str(folder / "r")],
                                               {}, ["no vLLM server at http://127.0.0.1:", "vllm serve"]),
        "async with evaluation": ("async_grpo.py", ["gsm8k_grpo", "--config", config, "--eval_strategy", "steps",
                                  "--output_dir", str(folder / "q")], {}, ["--eval_strategy steps", "evaluate.py"]),
        "reward without **kwargs": (fork_of["no **kwargs"], ["--config", config, "--output_dir", str(folder / "f1")],
                                    {}, ["soft_format_reward takes no **kwargs", "add **kwargs"]),
        "reward with one value": (fork_of["one value"], ["--config", config, "--output_dir", str(folder / "f2")], {},
                                  ["brevity_reward returned 1 value for", "one number (or None) per completion"]),
        "reward of strings": (fork_of["strings"], ["--config", config, "--output_dir", str(folder / "f3")], {},
                              ["label_reward returned str 'bad'", "a number"]),
        "reward on a dropped column": (fork_of["missing column"], ["--config", config, "--output_dir",
                                       str(folder / "f4")], {},
                                       ["correctness_reward reads the column 'answer'", "gold", "build_dataset"]),
        "reward that raises": (fork_of["raises"], ["--config", config, "--output_dir", str(folder / "f5")], {},
                               ["parsed_reward raised IndexError", "first train rows"]),
        "scorer that always fails": (fork_of["scorer fails"], ["--config", config, "--output_dir",
                                     str(folder / "f6")], {}, ["number_reward failed on all", "0 to every answer"]),
        "prompt as text": (fork_of["string prompt"], ["--config", config, "--output_dir", str(folder / "f7")], {},
                           ["prompt is str, not a conversation", "chat template"]),
        "role in capitals": (fork_of["capital role"], ["--config", config, "--output_dir", str(folder / "f8")], {},
                             ["role 'System'", "lower case"]),
        "role the template drops": (fork_of["dropped role"], ["--config", config, "--output_dir", str(folder / "f9")],
                                    {}, ["chat template drops the developer message"]),
        "tool without Args": (fork_of["tool without Args"], ["--config", str(kit / "tool_use_grpo.yaml"),
                              "--output_dir", str(folder / "f10")], {},
                              ["the tool python cannot be described", "Args:"]),
        "evaluate a reward that raises": ("evaluate.py", [fork_of["raises"], "--dataset_path", str(kit / "gsm8k_toy"),
                                          "--base_url", "http://127.0.0.1:9/v1", "--model", "m", "--out",
                                          str(folder / "evaluated" / "e.jsonl")], {},
                                          ["parsed_reward raised IndexError"]),
        "evaluate a prompt as text": ("evaluate.py", [fork_of["string prompt"], "--dataset_path",
                                      str(kit / "gsm8k_toy"), "--base_url", "http://127.0.0.1:9/v1", "--model", "m",
                                      "--out", str(folder / "evaluated" / "e2.jsonl")], {},
                                      ["prompt is str, not a conversation"]),
        "fractional max_steps in YAML": ("gsm8k_grpo.py", ["--config", str(folder / "half_step.yaml")], {},
                                         ["max_steps: 4.5", "not a whole number"]),
        "LoRA layers as one string": ("gsm8k_grpo.py", ["--config", str(folder / "one_string.yaml")], {},
                                      ["is one string", "[q_proj, v_proj]"]),
        "two configs": ("gsm8k_grpo.py", ["--config", config, "--config", config], {},
                        ["--config given 2 times", "one YAML file"]),
        "unwritable HF_HOME": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(folder / "f11")],
                               {"HF_HOME": "/proc/grpo-cache", "HF_DATASETS_CACHE": None, "HF_HUB_CACHE": None},
                               ["/proc/grpo-cache", "HF_HOME=/proc/grpo-cache", "a folder you can write"]),
        "resume at a new learning rate": ("gsm8k_grpo.py", ["--config", config, "--output_dir", str(rate_run),
                                          "--learning_rate", "1e-3", "--resume_from_checkpoint", "last"], {},
                                          ["continues a run at learning rate 5e-06, not 0.001",
                                           "would not apply", "without --resume_from_checkpoint"]),
        "evaluate -n 0": ("evaluate.py", ["gsm8k_grpo", "--base_url", "http://127.0.0.1:9/v1", "--model", "m", "-n",
                          "0", "--out", str(folder / "e0.jsonl")], {}, ["--num_examples 0: must be at least 1"]),
        "base URL without a scheme": ("evaluate.py", ["gsm8k_grpo", "--base_url", "localhost:8000", "--model", "m",
                                      "--out", str(folder / "e1.jsonl")], {},
                                      ["needs its scheme", "http://localhost:8000/v1"]),
    }


def run(script: str, argv: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run([sys.executable, str(ROOT / script), *argv], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=environment, stdin=subprocess.DEVNULL)


def run_here(script: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`script`'s main(argv) in this process, as its `__main__` block runs it (run_script: a Refusal is its line on
    stderr and its exit status); stderr as the interpreter would end it (a traceback or the exit text)."""
    import traceback
    from contextlib import redirect_stderr
    from io import StringIO

    if Path(script).is_absolute():  # a user's fork, imported from its file
        spec = importlib.util.spec_from_file_location(Path(script).stem, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(script.removesuffix(".py"))
    stderr, code, here = StringIO(), 0, os.getcwd()
    os.chdir(cwd)
    try:
        with redirect_stderr(stderr):
            run_script(module.main, argv)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
        stderr.write("" if isinstance(exit.code, int) or exit.code is None else f"{exit.code}\n")
    except Exception:  # noqa: BLE001 - what the interpreter would print
        code = 1
        stderr.write(traceback.format_exc())
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess([script, *argv], code, "", stderr.getvalue())


IN_A_SUBPROCESS = {"rerun into checkpoints", "no network", "no network for the dataset", "offline and not cached",
                   "unknown recipe (evaluate.py)", "unwritable HF_HOME"}  # HF_HOME: read when datasets is imported


@pytest.fixture(scope="module")
def outcomes(kit, tmp_path_factory, worker_id):
    """Every case's outcome, run once a session (conftest.shared_once): half a minute of subprocesses."""
    def run_all():
        folder = tmp_path_factory.mktemp("mistakes")
        table = cases(kit, folder)
        with ThreadPoolExecutor(2) as pool:  # each is mostly the import of torch and TRL
            futures = {name: pool.submit(run, script, argv, env, kit) for name, (script, argv, env, _) in table.items()
                       if name in IN_A_SUBPROCESS}
            results = {name: run_here(script, argv, kit) for name, (script, argv, env, _) in table.items()
                       if name not in IN_A_SUBPROCESS}
            results.update({name: future.result() for name, future in futures.items()})
        return {name: (result, table[name][3]) for name, result in results.items()}, folder

    return shared_once(tmp_path_factory, worker_id, "mistakes-outcomes", run_all)


CASES = ["rerun into checkpoints", "unwritable output dir", "no network", "no network for the dataset",
         "offline and not cached", "mistyped local model path", "malformed data line", "missing data path",
         "misspelled flag", "flag prefix", "missing config", "mistyped YAML key", "bad YAML value", "broken YAML",
         "missing checkpoint", "resume with nothing to resume", "unknown recipe (evaluate.py)",
         "unknown recipe (sft_warmstart.py)", "missing rollouts file", "missing search corpus", "num_generations 0",
         "batch size 0", "negative learning rate", "max_steps 0", "negative recipe option", "YAML list",
         "config is a folder", "YAML section", "kit config before the kit", "another recipe's flag",
         "a flag of code_grpo.py", "empty dataset", "unknown data file type", "no readable gold answers",
         "empty model folder", "tokenizer-only folder", "LoRA adapter folder", "4-bit on a CPU",
         "rollouts not from evaluate.py", "rerun onto a finished model", "SFT twice into one folder",
         "resume with another model", "resume another recipe's checkpoint",
         "new model into another run's checkpoints", "empty config", "logger not installed", "mistyped logger",
         "mistyped LoRA layer", "cut-short checkpoint", "evaluate -n 0", "base URL without a scheme",
         "async without a server", "async tool recipe without a server", "async with evaluation",
         "reward without **kwargs", "reward with one value", "reward of strings", "reward on a dropped column",
         "reward that raises", "scorer that always fails", "prompt as text", "role in capitals",
         "role the template drops", "tool without Args", "evaluate a reward that raises", "evaluate a prompt as text",
         "fractional max_steps in YAML", "LoRA layers as one string", "two configs", "unwritable HF_HOME",
         "resume at a new learning rate"]


@pytest.mark.parametrize("name", CASES)
def test_each_mistake_is_one_line_naming_the_fix(outcomes, name):
    (proc, words), _ = outcomes[0][name], outcomes[1]
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr and 1 <= len(lines) <= 2, proc.stderr[-3000:]
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)


def test_the_table_checks_every_case_it_runs(outcomes):
    assert sorted(outcomes[0]) == sorted(CASES)


def test_a_rerun_into_checkpoints_keeps_every_one_of_them(outcomes):
    run_dir = outcomes[1] / "earlier_run"
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-280", "checkpoint-290", "checkpoint-300"]
    assert all((run_dir / f"checkpoint-{s}" / "model.safetensors").exists() for s in (280, 290, 300))


def test_ctrl_c_prints_the_command_that_resumes_and_that_command_resumes(kit, tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, str(ROOT / "gsm8k_grpo.py"), "--config", str(kit / "gsm8k_grpo.yaml"), "--output_dir",
            str(out), "--max_steps", "5000", "--save_steps", "3", "--eval_strategy", "no"]
    # As in a terminal: a test run started in the background (`cmd &`) ignores SIGINT, and its children inherit that.
    proc = subprocess.Popen(argv, cwd=kit, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(out.glob("checkpoint-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    message = [line for line in stderr.splitlines() if "resume from the newest checkpoint with: " in line]
    assert len(message) == 1
    command = shlex.split(message[0].split("resume from the newest checkpoint with: ", 1)[1])
    assert command[0] == "python" and command[-2:] == ["--resume_from_checkpoint", "last"]
    # Ctrl-C can land while a checkpoint is being saved: the newest complete one is where the run resumes.
    newest = max(int(p.parent.name.split("-")[1]) for p in out.glob("checkpoint-*/trainer_state.json"))
    resumed = subprocess.run([sys.executable, *command[1:], "--max_steps", str(newest + 1)], cwd=kit,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {out}/checkpoint-{newest}" in resumed.stderr
    assert f"step {newest + 1}/{newest + 1}" in resumed.stdout and f"step {newest}/" not in resumed.stdout


def test_resume_last_skips_a_checkpoint_the_run_stopped_saving(tmp_path, caplog):
    from types import SimpleNamespace

    from grpo_recipes import output_dir

    # checkpoint-3 complete; checkpoint-6 cut while writing trainer_state.json (a full disk); checkpoint-9 before it
    for step, state in ((3, '{"global_step": 3}'), (6, '{"global_step": 6, "log_hi'), (9, None)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_text("weights")
        if state:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    args = SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint="last", overwrite_output_dir=False)
    output_dir.prepare_output_dir(args)
    assert args.resume_from_checkpoint == str(tmp_path / "checkpoint-3")
    assert "skipping checkpoint-6, checkpoint-9: its trainer_state.json is missing or cut short" in caplog.text
    output_dir.release_output_dir(tmp_path)
    args.resume_from_checkpoint = str(tmp_path / "checkpoint-6")  # named explicitly: one line, not a traceback
    with pytest.raises(Refusal, match="checkpoint-6: not a complete checkpoint .*the newest complete one is "
                                         "checkpoint-3, or pass `last`"):
        output_dir.prepare_output_dir(args)
    output_dir.release_output_dir(tmp_path)
    (tmp_path / "checkpoint-3" / "trainer_state.json").unlink()
    args.resume_from_checkpoint = "last"
    with pytest.raises(Refusal, match="holds no complete checkpoint .checkpoint-3, checkpoint-6, checkpoint-9."):
        output_dir.prepare_output_dir(args)


def test_a_second_run_into_a_folder_a_run_is_writing_is_refused(kit, tmp_path):
    import fcntl

    out = tmp_path / "busy"
    out.mkdir()
    holder = os.open(out, os.O_RDONLY)  # as a running recipe holds it (output_dir.lock_output_dir)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        proc = run("gsm8k_grpo.py", ["--config", str(kit / "gsm8k_grpo.yaml"), "--output_dir", str(out)], {}, kit)
    finally:
        os.close(holder)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"another run is writing there (pid {os.getpid()}" in proc.stderr.strip().splitlines()[-1]
    assert list(out.iterdir()) == []


def test_a_full_disk_while_saving_is_one_line_and_resume_takes_the_last_whole_checkpoint(kit, tmp_path):
    """A 3.5 MB tmpfs (a user namespace's own mount): checkpoint-2 (2.2 MB) fits, checkpoint-4 does not."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no user namespaces here to mount a small tmpfs in")
    command = shlex.join([sys.executable, str(ROOT / "gsm8k_grpo.py"), "--config", str(kit / "gsm8k_grpo.yaml"),
                          "--output_dir", str(disk / "run"), "--max_steps", "6", "--save_steps", "2",
                          "--eval_strategy", "no"])
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=3500k tmpfs {disk} && {command}; "
                           f"code=$?; ls {disk}/run; exit $code"], capture_output=True, text=True, timeout=300,
                          cwd=kit)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith(f"no space left on the device of {disk / 'run'} at step 4"), lines[-1]
    assert "the newest complete checkpoint is checkpoint-2" in lines[-1]
    assert "--resume_from_checkpoint last" in lines[-1]


def test_a_kit_config_runs_from_any_directory(kit, tmp_path):
    """Its paths are relative to the file: from elsewhere it trains the same model on the same data."""
    proc = run("gsm8k_grpo.py", ["--config", str(kit / "gsm8k_grpo.yaml"), "--max_steps", "1", "--eval_strategy",
                                 "no", "--output_dir", str(tmp_path / "run")], {}, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model {kit / 'tiny-qwen2'} |" in proc.stderr
    assert json.loads((tmp_path / "run" / "recipe_run.json").read_text())["data"] == str(kit / "gsm8k_toy")


def test_offline_keeps_a_config_the_user_edited(tmp_path):
    import offline

    config = tmp_path / "gsm8k_grpo.yaml"
    first = offline.write_config(config, {"model_name_or_path": str(tmp_path / "tiny-qwen2"), "max_steps": 4})
    assert first == config and "model_name_or_path: tiny-qwen2\n" in config.read_text()
    assert offline.write_config(config, {"model_name_or_path": str(tmp_path / "tiny-qwen2"), "max_steps": 5}) == config
    config.write_text(config.read_text().replace("max_steps: 5", "max_steps: 300"))  # the user's edit
    beside = offline.write_config(config, {"model_name_or_path": str(tmp_path / "tiny-qwen2"), "max_steps": 5})
    assert beside == tmp_path / "gsm8k_grpo.new.yaml" and "max_steps: 300" in config.read_text()
    assert "max_steps: 5" in beside.read_text()


def test_help_shows_the_recipes_own_options_first_and_briefly():
    proc = subprocess.run([sys.executable, str(ROOT / "tool_use_grpo.py"), "--help"], capture_output=True, text=True,
                          timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) < 80, len(lines)
    assert lines[2] == "tool_use_grpo.py's own options (default shown):" and lines[3].startswith("  --dataset_name")
    assert "--help_all lists all" in lines[-1]
    full = subprocess.run([sys.executable, str(ROOT / "tool_use_grpo.py"), "--help_all"], capture_output=True,
                          text=True, timeout=120)
    assert full.returncode == 0 and len(full.stdout.splitlines()) > 500


def test_a_finished_run_lets_go_of_its_folder(kit, tmp_path):
    """In a notebook the kernel outlives the run: once saved, another process may use the folder."""
    import fcntl

    import gsm8k_grpo

    out = tmp_path / "done"
    gsm8k_grpo.main(["--config", str(kit / "gsm8k_grpo.yaml"), "--max_steps", "1", "--eval_strategy", "no",
                     "--output_dir", str(out)])
    other = os.open(out, os.O_RDONLY)  # another open file description: conflicts with a held lock, even here
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)
    assert (out / "model.safetensors").is_file() and not (out / ".saving").exists()


def nan_reward(completions, **kwargs):
    return [float("nan")] * len(completions)


def no_opinion_reward(completions, **kwargs):
    return [None] * len(completions)


def test_a_rubric_that_would_train_on_nothing_warns_in_one_line(kit, caplog):
    import gsm8k_grpo
    from grpo_recipes import preflight, row_checks

    rows = gsm8k_grpo.build_dataset("train", str(kit / "gsm8k_toy"))
    final = rows.map(lambda row: {"prompt": [{"role": "system", "content": gsm8k_grpo.SYSTEM_PROMPT.replace(
        "answer>", "final>")}, row["prompt"][1]]})  # the system prompt's tag changed, the rewards' not
    funcs, names = gsm8k_grpo.REWARD_FUNCS, [f.__name__ for f in gsm8k_grpo.REWARD_FUNCS]
    checks = {
        "every reward None or NaN": (lambda: row_checks.check_rubric([nan_reward, no_opinion_reward], rows),
                                     ["every reward gave None or NaN", "train on nothing"]),
        "every weight 0": (lambda: preflight.check_rubric([0.0] * len(funcs), funcs, names),
                           ["every reward weight is 0", "learns nothing"]),
        "a reward twice": (lambda: preflight.check_rubric([1.0] * (len(funcs) + 1), [*funcs, funcs[0]],
                                                          [*names, names[0]]),
                           ["lists correctness_reward more than once", "one column"]),
        "tags that disagree": (lambda: row_checks.check_rubric(funcs, final),
                               ["correctness_reward, integer_answer_reward, strict_format_reward",
                                "system prompt's format (<reasoning><final>", "pay for the row's gold_completion"]),
    }
    for name, (check, words) in checks.items():
        caplog.clear()
        with caplog.at_level("WARNING", logger="grpo-recipes"):
            check()
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and len(warned[0].splitlines()) == 1, (name, warned)
        assert all(word in warned[0] for word in words), (name, warned[0])


@pytest.mark.parametrize("recipe", ["gsm8k_grpo", "tool_use_grpo", "search_agent_grpo", "reasoning_gym_grpo",
                                    "game_grpo"])
def test_every_recipe_passes_its_own_row_checks_without_a_warning(kit, recipe, caplog, monkeypatch):
    import yaml
    from transformers import AutoTokenizer

    from grpo_recipes import contract, row_checks

    monkeypatch.chdir(kit)
    module = contract.load_recipe(recipe)
    config = yaml.safe_load((kit / f"{recipe}.yaml").read_text())
    fields = module.ScriptArguments.__dataclass_fields__
    task = contract.checked_setup(module, module.ScriptArguments(**{k: v for k, v in config.items() if k in fields}))
    task.start()
    rows = task.build_dataset("train", config.get("dataset_path"))
    caplog.clear()  # what the setup logged (search's index reused)
    with caplog.at_level("WARNING", logger="grpo-recipes"):
        row_checks.check_prompts(rows, "train", AutoTokenizer.from_pretrained(config["model_name_or_path"]))
        row_checks.check_rubric(task.reward_funcs, rows, "train", task.environment_factory)
    assert not [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
