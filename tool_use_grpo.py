"""Multi-turn GRPO with a tool: the model solves math word problems by calling a sandboxed Python interpreter.

One GPU:                         python tool_use_grpo.py
Harder problems (MATH):          python tool_use_grpo.py --dataset_name DigitalLearningGmbH/MATH-lighteval
Any GRPOConfig field, YAML:      python tool_use_grpo.py --config my.yaml --max_tool_calling_iterations 4
Offline on CPU (tiny model, warm-started to call the tool, ~1 minute):
    python offline.py --tools && python tool_use_grpo.py --config offline/tool_use_grpo.yaml
Jupyter or Colab (free T4):      notebooks/tool_use_grpo.ipynb, generated from this file

TRL's multi-turn loop (`GRPOTrainer(environment_factory=PythonInterpreter)`: one interpreter per rollout) parses
each tool call from the completion, runs the tool, appends its result as a `tool` message and lets the model continue,
up to `max_tool_calling_iterations` times. The tool's output tokens are masked out of the loss (TRL's tool_mask): the
model is trained on what it wrote, never on what the interpreter printed. The interpreter runs in the sandbox
(grpo_recipes/sandbox.py), never in the training process.
"""

# %% [markdown]
# ## What to expect
# On Colab's free T4 the config cell's `if ON_COLAB` values apply: Qwen2.5-0.5B-Instruct with LoRA, 100 steps, up to 2
# rounds of tool calls (not yet timed on a T4). In the curves, `tool_use_reward` shows whether the model keeps calling
# the interpreter; correctness should rise with it.

# %%
import functools
from dataclasses import dataclass

from datasets import Dataset

import rewards
from grpo_recipes import data, options
from grpo_recipes.contract import Setup, StepHooks
from grpo_recipes.options import arg
from grpo_recipes.refusal import StopRun, run_script
from grpo_recipes.sandbox import ENGINES, PRELOAD, SCIENTIFIC, SCIENTIFIC_WARMUP, Sandbox, SandboxUnavailable

# %% [markdown]
# ## Config
# The same GRPO as gsm8k_grpo.py, but each completion is a conversation: the model writes code, TRL runs it in the
# sandbox and feeds the output back, and the model goes on until it answers or runs out of tool rounds.

# %%
# In a notebook on Colab's free T4 (16 GB, no bf16) the `if ON_COLAB` values apply: a 0.5B model, 100 steps, 2 rounds.
ON_COLAB = options.on_colab()
MODEL_NAME = "Qwen/Qwen2.5-0.5B-Instruct" if ON_COLAB else "Qwen/Qwen2.5-1.5B-Instruct"  # TRL parses its tool calls

RECIPE_DEFAULTS = {
    "model_name_or_path": MODEL_NAME, "output_dir": "runs/tool_use_grpo",
    "learning_rate": 1e-6,  # a full fine-tune's rate (--use_peft false)
    "lora_learning_rate": 2e-5 if ON_COLAB else 1e-5,  # LoRA needs ~10x (Schulman et al., "LoRA Without Regret")
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.05,
    "max_grad_norm": 1.0,  # TRL's, not the gist's 0.1: 0.1 lost on all 3 of cpu_demo's seeds (docs/experiments.md)
    "gradient_checkpointing": True,  # off: --gradient_checkpointing false
    "num_generations": 8,
    "scale_rewards": "none",  # the group mean removed, no std division: as gsm8k_grpo.py, measured there
    "per_device_train_batch_size": 16 if ON_COLAB else 8,
    "gradient_accumulation_steps": 1 if ON_COLAB else 4,  # 4 prompts × 8 completions per optimizer step
    "max_completion_length": 512 if ON_COLAB else 1024,  # the whole conversation after the prompt: calls, results
    "max_tool_calling_iterations": 2 if ON_COLAB else 4,  # rounds of tool calls per completion, at most
    "max_steps": 100 if ON_COLAB else -1, "num_train_epochs": 1,  # -1: one epoch
    "logging_steps": 1, "num_completions_to_print": 2,  # --log_completions: 2 printed per logged step
    "save_steps": 50 if ON_COLAB else 100, "save_total_limit": 3,
    "eval_strategy": "steps", "eval_steps": 50 if ON_COLAB else 100,
    "per_device_eval_batch_size": 16 if ON_COLAB else 64,  # 200 problems × 4 generations: 13 calls, not 50
    "num_generations_eval": 4,
    "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["all-linear"],  # LoRA: one 24 GB GPU
    "lora_dropout": 0.0,  # TRL's 0.05: trained log-probs differ from what vLLM sampled (read as off-policy)
}


@dataclass
class ScriptArguments:
    dataset_name: str = arg("openai/gsm8k", "openai/gsm8k, or DigitalLearningGmbH/MATH-lighteval for harder problems.")
    dataset_path: str | None = arg(None, "Local GSM8K-form data (question, answer '… #### n'): a file or a folder "
                                         "with train.* and test.* files. Replaces --dataset_name.")
    num_eval_examples: int = arg(64 if ON_COLAB else 200, "Held-out test problems scored with the same rewards at "
                                                          "each evaluation.")
    tool_timeout: float = arg(2.0, "Seconds one tool call may run before the sandbox kills it (arithmetic takes ms).")
    tool_seconds_per_step: float = arg(60.0, "Seconds of tool time one training step may spend, in equal shares per "
                                             "rollout; a rollout past its share gets an error at once. Logged as "
                                             "`tool s`.")
    tool_sandbox: str = arg("bubblewrap", "The sandbox's engine: bubblewrap (namespaces, a fresh tmpfs per call), or "
                                          "landlock where user namespaces cannot be had (weaker: docs/sandbox.md).",
                            choices=ENGINES)
    unsafe_tool_sandbox: bool = arg(False, "Run the model's code even where this machine cannot isolate it (no "
                                           "namespaces nor Landlock, or no seccomp): resource limits only. Unsafe.")


# %% [markdown]
# ## System prompt
# The prompt asks for the arithmetic to be done in Python and for the final number alone inside `<answer>` tags.

# %%
SYSTEM_PROMPT = """Solve the math problem. Use the python tool to do the arithmetic instead of doing it in your head: \
write code that prints the result. When you know the answer, reply with only the final number inside \
<answer></answer> tags, for example <answer>42</answer>."""


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
    raw = data.load_split(split, dataset_path, name, config)
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
# ## Tools
# A tool is a method of the rollout's environment, with a docstring: TRL turns its signature and `Args:` into the schema
# the model sees.
# The code is hostile until proven otherwise: it runs in the sandbox's confined child processes (namespaces,
# Landlock, seccomp, resource limits); a crash, a hang, a fork bomb or an escape attempt becomes an error string.

# %%
class ToolTimeBudget(StepHooks):
    """Seconds of tool time one training step, or one evaluation batch, may spend, in equal shares per rollout: TRL
    runs sync tools one after another, so a young policy's infinite loops would stall the step for minutes, and one
    rollout's 31 loops in a turn would spend every other rollout's time. A rollout past its share gets an error at
    once. Only the calls' own time counts (not waiting for another caller's call). Logs show `tools/seconds` (the
    step's) and `eval_tools/seconds` (the evaluation's, all batches). Outside a training run there are no steps to
    share (evaluate.py; async_grpo.py's rollout process, where a slow rollout holds up no step): no budget applies
    there, and each call still stops at --tool_timeout."""

    def __init__(self, seconds_per_step: float):
        self.seconds_per_step, self.used, self.rollouts = seconds_per_step, 0.0, 0
        self.step_seconds = self.evaluation_seconds = 0.0
        self.training = False  # set by the trainer that runs this callback

    def __getstate__(self) -> dict:
        """A copy in another process (TRL's async trainer runs the tools in a spawned one) has no steps to share."""
        return {**self.__dict__, "training": False, "used": 0.0, "rollouts": 0}

    def share(self) -> float:
        """Each rollout's part of the budget: the rollouts counted are this batch's (TRL resets them all before any
        tool runs)."""
        return self.seconds_per_step / max(self.rollouts, 1)

    def spent(self, rollout_seconds: float) -> bool:
        return self.training and (rollout_seconds >= self.share() or self.used >= self.seconds_per_step)

    def on_train_begin(self, args, state, control, **kwargs):
        self.training, self.used, self.rollouts = True, 0.0, 0

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False

    def on_step_begin(self, args, state, control, **kwargs):
        self.used = 0.0

    def on_step_end(self, args, state, control, **kwargs):  # an evaluation may follow: it starts with a full budget
        self.step_seconds, self.used, self.evaluation_seconds, self.rollouts = self.used, 0.0, 0.0, 0

    def on_prediction_step(self, args, state, control, **kwargs):  # each evaluation batch gets its own budget
        self.evaluation_seconds, self.used, self.rollouts = self.evaluation_seconds + self.used, 0.0, 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            logs["tools/seconds"] = self.step_seconds
        elif logs is not None and any(key.startswith("eval_") for key in logs):
            logs["eval_tools/seconds"] = self.evaluation_seconds + self.used


class PythonInterpreter:
    """The code tool of one rollout: TRL's environment_factory makes one per rollout and calls reset() before its
    generation, so the rollout's calls are counted against its own share of the step's tool time. Every interpreter
    of a run shares its sandbox and its budget (setup() builds them from the flags)."""

    def __init__(self, sandbox: Sandbox, budget: ToolTimeBudget | None = None):
        self.sandbox, self.budget, self.seconds = sandbox, budget or ToolTimeBudget(float("inf")), 0.0

    def reset(self, **row) -> None:
        self.seconds = 0.0
        self.budget.rollouts += 1

    def python(self, code: str) -> str:
        """Run Python code and return what it printed, or the value of its last expression, or the error.

        Args:
            code: Python source code. Each call starts fresh: variables do not carry over between calls.
        """
        if self.budget.spent(self.seconds):
            return "Error: this rollout's time for running code is used up; answer without the tool"
        try:
            result, seconds = self.sandbox.timed_run(code)
        except SandboxUnavailable as err:  # a zygote that cannot start again: stop, rather than train on errors
            # StopRun, not Refusal: TRL's loop turns a tool's Exception into the model's tool message and goes on
            raise StopRun(f"{err} (the sandbox stopped working during the run)") from None
        self.seconds += seconds
        self.budget.used += seconds
        return result


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
    rewards.used_output_reward: 0.0,  # turn-level credit, logged per turn; docs/experiments.md before paying for it
})


def setup(script_args: ScriptArguments) -> Setup:
    """The rubric above, and one PythonInterpreter per rollout over the sandbox and tool-time budget the flags ask
    for. The sandbox starts in training.prepare (Setup.start): a machine that cannot isolate the code is one line."""
    # numpy and sympy preloaded, with the parts they load lazily (numpy.random, sympy.solve, ...): models like them.
    sandbox = Sandbox(timeout=script_args.tool_timeout, preload=PRELOAD + SCIENTIFIC, warmup=SCIENTIFIC_WARMUP,
                      engine=script_args.tool_sandbox, unsafe_without_isolation=script_args.unsafe_tool_sandbox)
    budget = ToolTimeBudget(script_args.tool_seconds_per_step)  # infinite loops cannot stall a step for minutes
    interpreter = functools.partial(PythonInterpreter, sandbox, budget)  # one a rollout, sharing the two
    return Setup(REWARD_FUNCS, REWARD_WEIGHTS, environment_factory=interpreter, callbacks=[budget], services=[sandbox])


# %% [markdown]
# ## Trainer
# The shared pre-flight checks (plus one that TRL can parse tool calls with the model's chat template), then TRL's
# `GRPOTrainer` with one PythonInterpreter per rollout (`environment_factory`, each with a share of the tool time):
# TRL parses each tool call, runs it, and masks the tool's output out of the loss, so the model is trained on what it
# wrote, never on what the interpreter printed. The budget callback resets each step.

# %%
def main(argv: list[str] | None = None):
    # The trainer's imports are here, not at the top: evaluate.py reads this file's prompt, data and rubric without
    # loading torch and TRL's trainer, seconds of start-up a user checking an environment against an API never needs.
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_recipes import training

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    task = setup(script_args)  # the rubric, and the sandboxed interpreter from the flags
    tokenizer = training.prepare(training_args, model_args, task)  # one-line checks, then the sandbox starts

    def build(split, dataset_path):
        return build_dataset(split, dataset_path, script_args.dataset_name)

    train_dataset, eval_dataset = data.load_splits(build, training_args, script_args.dataset_path,
                                                   script_args.num_eval_examples)
    training.check_rows(task, train_dataset, tokenizer)  # prompts rendered, each reward called on real rows
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,  # loaded with training_args.model_init_kwargs (dtype, ...)
        reward_funcs=task.reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),  # LoRA with --use_peft (the default here), else None
        quantization_config=get_quantization_config(model_args),  # --load_in_4bit / --load_in_8bit
        environment_factory=task.environment_factory,  # one PythonInterpreter (one share of tool time) per rollout
        callbacks=training.trainer_callbacks(task.callbacks),  # the tool-time budget, reset each step
    )
    return training.run(trainer)


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags.
# In the curves, `tool_use_reward` shows whether the model keeps using the tool; correctness should rise with it.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/tool_use_grpo.yaml"]

# %% tags=["active-ipynb"]
# from grpo_recipes import notebook
#
# trainer = main(NOTEBOOK_ARGS)
# notebook.show_training(trainer.args.output_dir, trainer)

# %% [markdown]
# ## Try it
# The trained model on a few held-out problems, calling the sandboxed tool as in training, scored by the same rubric.

# %% tags=["active-ipynb"]
# notebook.try_model(trainer, n=3)

# %% tags=["active-py"]
if __name__ == "__main__":
    run_script(main)
