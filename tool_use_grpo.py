"""Multi-turn GRPO with a tool: the model solves math word problems by calling a sandboxed Python interpreter.

One GPU:                         python tool_use_grpo.py
Harder problems (MATH):          python tool_use_grpo.py --dataset_name DigitalLearningGmbH/MATH-lighteval
Any GRPOConfig field, YAML:      python tool_use_grpo.py --config my.yaml --max_tool_calling_iterations 4
Offline on CPU (tiny model, warm-started to call the tool, ~1 minute):
    python offline.py --tools && python tool_use_grpo.py --config offline/tool_use_grpo.yaml
Jupyter or Colab (free T4):      notebooks/tool_use_grpo.ipynb, generated from this file

TRL's multi-turn loop (`GRPOTrainer(tools=TOOLS)`) parses each tool call from the completion, runs the tool, appends
its result as a `tool` message and lets the model continue, up to `max_tool_calling_iterations` times. The tool's
output tokens are masked out of the loss (TRL's tool_mask): the model is trained on what it wrote, never on what the
interpreter printed. The interpreter runs in `sandbox.py`, never in the training process.
"""

# %%
import sys
from dataclasses import dataclass

from datasets import Dataset
from trl import GRPOTrainer

import plumbing
import rewards
from plumbing import arg, logger
from sandbox import PRELOAD, SCIENTIFIC, SCIENTIFIC_WARMUP, Sandbox, SandboxUnavailable

# %% [markdown]
# ## Config
# The same GRPO as gsm8k_grpo.py, but each completion is a conversation: the model writes code, TRL runs it in the
# sandbox and feeds the output back, and the model goes on until it answers or runs out of tool rounds.

# %%
MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"  # a tool-calling instruct model whose chat template TRL can parse
# A notebook on Colab's free T4 puts these first: 0.5B with LoRA, fewer steps, room for two tool rounds.
COLAB_ARGS = plumbing.COLAB_T4_ARGS + ["--max_completion_length", "512", "--max_tool_calling_iterations", "2"]

RECIPE_DEFAULTS = {
    "model_name_or_path": MODEL_NAME, "output_dir": "runs/tool_use_grpo",
    "learning_rate": 1e-6,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.05,
    "max_grad_norm": 0.1,
    "gradient_checkpointing": True,  # off: --gradient_checkpointing false (or --activation_checkpointing false)
    "num_generations": 8,
    "scale_rewards": "none",  # the group mean removed, no std division: as gsm8k_grpo.py, measured there (README)
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,  # 4 prompts × 8 completions per optimizer step
    "max_completion_length": 1024,  # the whole conversation after the prompt: calls, tool results, answer
    "max_tool_calling_iterations": 4,  # at most 4 rounds of tool calls per completion
    "num_train_epochs": 1,
    "logging_steps": 1,
    "save_steps": 100, "save_total_limit": 3,
    "eval_strategy": "steps", "eval_steps": 100, "per_device_eval_batch_size": 16, "num_generations_eval": 4,
    "vllm_gpu_memory_utilization": 0.3,
    "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["all-linear"],  # LoRA: one 24 GB GPU
}


@dataclass
class ScriptArguments:
    dataset_name: str = arg("openai/gsm8k", "openai/gsm8k, or DigitalLearningGmbH/MATH-lighteval for harder problems.")
    dataset_path: str | None = arg(None, "Local GSM8K-form data (question, answer '… #### n'): a file or a folder "
                                         "with train.* and test.* files. Replaces --dataset_name.")
    num_eval_examples: int = arg(200, "Held-out test problems scored with the same rewards at each evaluation.")
    tool_timeout: float = arg(2.0, "Seconds one tool call may run before the sandbox kills it (arithmetic takes ms).")
    tool_seconds_per_step: float = arg(60.0, "Seconds of tool time one training step may spend in all; then calls "
                                             "answer with an error at once. Logged as `tool s`.")
    unsafe_tool_sandbox: bool = arg(False, "Run the model's code even where this machine cannot isolate it (no "
                                           "namespaces nor Landlock, or no seccomp): resource limits only. Unsafe.")


# %% [markdown]
# ## Data
# GSM8K (or MATH) problems as chat prompts with their gold answers; local files in GSM8K form work too.

# %%
# dataset name -> (config, question column, solution column, how to read the gold answer from the solution)
SOURCES = {
    "openai/gsm8k": ("main", "question", "answer", rewards.extract_hash_answer),
    "DigitalLearningGmbH/MATH-lighteval": ("default", "problem", "solution", rewards.extract_boxed_answer),
}


def build_dataset(split: str = "train", dataset_path: str | None = None, dataset_name: str = "openai/gsm8k") -> Dataset:
    """Math problems as conversational `prompt`s and gold `answer`s; local data (--dataset_path) is in GSM8K form."""
    name = "openai/gsm8k" if dataset_path else dataset_name
    if name not in SOURCES:
        raise ValueError(f"unknown --dataset_name {name!r}: use one of {sorted(SOURCES)} or --dataset_path")
    config, question, solution, gold = SOURCES[name]
    raw = plumbing.load_split(split, dataset_path, name, config)
    missing = {question, solution} - set(raw.column_names)
    if missing:
        raise ValueError(f"{dataset_path or dataset_name} ({split}) lacks column(s) {sorted(missing)}: it has "
                         f"{raw.column_names}.")
    return raw.map(
        lambda row: {
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row[question]}],
            "answer": gold(row[solution]),
        },
        remove_columns=raw.column_names,
    )


# %% [markdown]
# ## System prompt
# The prompt asks for the arithmetic to be done in Python and for the final number alone inside `<answer>` tags.

# %%
SYSTEM_PROMPT = """Solve the math problem. Use the python tool to do the arithmetic instead of doing it in your head: \
write code that prints the result. When you know the answer, reply with only the final number inside \
<answer></answer> tags, for example <answer>42</answer>."""

# %% [markdown]
# ## Tools
# A tool is a plain function with a docstring: TRL turns its signature and `Args:` into the schema the model sees.
# The code is hostile until proven otherwise: it runs in `sandbox.py`'s confined child processes (namespaces,
# Landlock, seccomp, resource limits); a crash, a hang, a fork bomb or an escape attempt becomes an error string.

# %%
# numpy and sympy preloaded, with the parts they load lazily (numpy.random, sympy.solve, ...): models like them.
SANDBOX = Sandbox(timeout=2.0, preload=PRELOAD + SCIENTIFIC, warmup=SCIENTIFIC_WARMUP)
TOOL_BUDGET = plumbing.ToolTimeBudget(seconds_per_step=60.0)  # so that infinite loops cannot stall a step for minutes


def python(code: str) -> str:
    """Run Python code and return what it printed, or the value of its last expression, or the error.

    Args:
        code: Python source code. Each call starts fresh: variables do not carry over between calls.
    """
    if TOOL_BUDGET.spent():
        return "Error: this training step's time for running code is used up; answer without the tool"
    with TOOL_BUDGET.timing():
        return SANDBOX.run(code)


TOOLS = [python]

# %% [markdown]
# ## Rewards
# `correctness_reward` pays for the right number in `<answer>`; `tool_use_reward` pays a little for calls that ran
# without error and costs a little for failed or repeated ones. A model that only calls the tool, or only answers from
# memory, scores less than one that does both right.

# %%
# A correct answer scores 2.0 plus at most 0.5 for tool use; tool use alone can never reach a correct answer's score,
# and failed or repeated calls cost at most 0.5 (tests/test_rewards.py probes both).
REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({
    rewards.correctness_reward: 2.0,
    rewards.tool_use_reward: 0.5,
    rewards.used_output_reward: 0.0,  # turn-level credit, logged per turn; see the README before paying for it
})


# %% [markdown]
# ## Trainer
# The shared pre-flight checks (plus one that TRL can parse tool calls with the model's chat template) and trainer,
# with `tools=TOOLS`: TRL parses each tool call, runs it, and masks
# the tool's output out of the loss, so the model is trained on what it wrote, never on what the interpreter printed.

# %%
def main(argv: list[str] | None = None) -> GRPOTrainer:
    script_args, training_args, model_args = plumbing.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv,
                                                                 reward_weights=REWARD_WEIGHTS)
    SANDBOX.limits["timeout"] = script_args.tool_timeout
    TOOL_BUDGET.seconds_per_step = script_args.tool_seconds_per_step
    SANDBOX.unsafe_without_isolation = script_args.unsafe_tool_sandbox
    tokenizer = plumbing.prepare(training_args, model_args, REWARD_FUNCS, tools=TOOLS)
    try:  # before training: TRL would turn a refusal into an error string on every call
        logger.info(f"sandbox protections here: {SANDBOX.start()}")
    except SandboxUnavailable as err:
        sys.exit(f"{err} (tool_use_grpo.py: --unsafe_tool_sandbox)")

    def build(split, dataset_path):
        return build_dataset(split, dataset_path, script_args.dataset_name)

    train_dataset, eval_dataset = plumbing.load_splits(build, script_args, training_args)
    return plumbing.train(model_args, training_args, tokenizer, train_dataset, eval_dataset, REWARD_FUNCS, tools=TOOLS,
                          callbacks=[TOOL_BUDGET])


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags.
# In the curves, `tool_use_reward` shows whether the model keeps using the tool; correctness should rise with it.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/tool_use_grpo.yaml"]

# %% tags=["active-ipynb"]
# trainer = main(plumbing.notebook_argv(NOTEBOOK_ARGS, COLAB_ARGS))
# plumbing.show_training(trainer.args.output_dir, trainer)

# %% tags=["active-py"]
if __name__ == "__main__":
    main()
