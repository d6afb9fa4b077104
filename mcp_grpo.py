"""Multi-turn GRPO with the tools of any MCP server: the model solves tasks by calling the tools a Model Context
Protocol server offers, under the server's own names, descriptions and argument schemas.

One GPU (the example server: a calculator and notes):   python mcp_grpo.py
Your server over stdio, or over streamable HTTP:         python mcp_grpo.py --mcp_command "npx my-server"  |
                                                          python mcp_grpo.py --mcp_url http://127.0.0.1:8000/mcp
Check it against an API first:     python evaluate.py mcp_grpo --base_url ... --model ... --mcp_command "..."
Offline on CPU (tiny model, warm-started to call the example server's calculator):
    python offline.py --mcp && python mcp_grpo.py --config offline/mcp_grpo.yaml
Jupyter or Colab (free T4):        notebooks/mcp_grpo.ipynb, generated from this file

The recipe starts the server (`--mcp_command`, a stdio server) or connects to it (`--mcp_url`), lists its tools and
offers each to the model; TRL's multi-turn loop parses each tool call, sends it to the server through the official
`mcp` SDK, appends the result as a `tool` message (masked out of the loss: the model is trained on what it wrote,
never on what the server answered) and lets the model go on, up to `max_tool_calling_iterations` rounds.
grpo_recipes/mcp_tools.py says how a server's schema becomes the one the model sees, and what a failing call does.

Trust: an MCP server's tools run outside the sandbox, with the server's rights (a stdio server runs as you, with your
files and network). Train only against servers you would let an agent use; a command comes from your command line
or your own --config file, never from a data file (docs/recipes.md#mcp_grpopy).
"""

# %% [markdown]
# ## What to expect
# On Colab's free T4 the config cell's `if ON_COLAB` values apply: Qwen2.5-0.5B-Instruct with LoRA, 100 steps, up to 2
# rounds of tool calls (not yet timed on a T4). `tools/call_frequency` shows whether the model keeps calling the
# server, `tools/failure_frequency` how often a call fails; correctness should rise with successful calls.

# %%
from dataclasses import dataclass

from datasets import Dataset

import rewards
from grpo_recipes import data, options
from grpo_recipes import mcp_example_server  # the default server: a notebook carries it beside the recipe
from grpo_recipes.contract import Setup
from grpo_recipes.mcp_tools import SESSIONS, McpCallLog, McpServer, McpTools
from grpo_recipes.options import arg
from grpo_recipes.refusal import run_script

# %% [markdown]
# ## Config
# The same GRPO as tool_use_grpo.py; the tools are the server's.

# %%
ON_COLAB = options.on_colab()
MODEL_NAME = "Qwen/Qwen2.5-0.5B-Instruct" if ON_COLAB else "Qwen/Qwen2.5-1.5B-Instruct"  # TRL parses its tool calls

RECIPE_DEFAULTS = {
    "model_name_or_path": MODEL_NAME, "output_dir": "runs/mcp_grpo",
    "learning_rate": 1e-6,  # a full fine-tune's rate (--use_peft false)
    "lora_learning_rate": 2e-5 if ON_COLAB else 1e-5,  # LoRA needs ~10x (Schulman et al., "LoRA Without Regret")
    "lr_scheduler_type": "cosine", "warmup_steps": 0.05, "max_grad_norm": 1.0,
    "gradient_checkpointing": True,
    "num_generations": 8, "scale_rewards": "none",  # as gsm8k_grpo.py, measured there
    "per_device_train_batch_size": 16 if ON_COLAB else 8,
    "gradient_accumulation_steps": 1 if ON_COLAB else 4,  # 4 prompts × 8 completions per optimizer step
    "max_completion_length": 512 if ON_COLAB else 1024,  # the whole conversation after the prompt: calls, results
    "max_tool_calling_iterations": 2 if ON_COLAB else 4,  # rounds of tool calls per completion, at most
    "max_steps": 100 if ON_COLAB else -1, "num_train_epochs": 1,  # -1: one epoch
    "logging_steps": 1, "num_completions_to_print": 2,
    "save_steps": 50 if ON_COLAB else 100, "save_total_limit": 3,
    "eval_strategy": "steps", "eval_steps": 50 if ON_COLAB else 100, "num_generations_eval": 4,
    "per_device_eval_batch_size": 16 if ON_COLAB else 64,
    "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["all-linear"],  # LoRA: one 24 GB GPU
    "lora_dropout": 0.0,  # TRL's 0.05: trained log-probs differ from what vLLM sampled (read as off-policy)
}


@dataclass
class ScriptArguments:
    mcp_command: str = arg(f"python -m {mcp_example_server.__name__}", "The command that starts a stdio MCP server, "
                           "run from this folder (`python` is this run's interpreter). From the command line or your "
                           "own --config only.")
    mcp_url: str | None = arg(None, "A streamable-HTTP MCP server's URL (http://127.0.0.1:8000/mcp); replaces "
                                    "--mcp_command.")
    mcp_session: str = arg("auto", "auto: shared where every offered tool is read-only (its readOnlyHint), else "
                                    "rollout; shared: one connection for every rollout (a server without state); "
                                    "rollout: a new one per rollout (over stdio a server process each), so rollouts "
                                    "never share state.", choices=SESSIONS)
    mcp_warm_pool: bool = arg(True, "With rollout sessions: start each rollout's server ahead of it (a spare per "
                                     "rollout, closed after 10 idle minutes), so its first call does not wait for a "
                                     "server to start; false for a server too heavy to run twice over.")
    mcp_tools: list[str] | None = arg(None, "Offer only these of the server's tools (default: all).")
    mcp_env: list[str] | None = arg(None, "Names of this run's environment variables the --mcp_command server gets "
                                          "(an API key: --mcp_env GITHUB_TOKEN); else only PATH, HOME and a few.")
    mcp_timeout: float = arg(30.0, "Seconds a call may take; past it the model is told the tool did not answer.")
    mcp_max_result_chars: int = arg(4000, "Characters of a result the model is shown; the rest is cut, and says so.")
    dataset_name: str = arg("openai/gsm8k", "Questions with their answers: openai/gsm8k.")
    dataset_path: str | None = arg(None, "Local GSM8K-form data (question, answer '… #### n'): a file or a folder "
                                         "with train.* and test.* files. Replaces --dataset_name.")
    num_eval_examples: int = arg(64 if ON_COLAB else 200, "Held-out questions scored with the same rewards at each "
                                                          "evaluation.")


# %% [markdown]
# ## System prompt
# What the tools are for, and the answer's format the rubric reads. A server of your own: say what its tools do.

# %%
SYSTEM_PROMPT = """Solve the problem. Use the tools to do the work instead of doing it in your head. When you know the \
answer, reply with only the final answer inside <answer></answer> tags, for example <answer>42</answer>."""


# %% [markdown]
# ## Data
# Questions as chat prompts with their gold answers (GSM8K, or local files in its form). Your task: your questions, with
# the columns your rewards read.

# %%
def build_dataset(split: str = "train", dataset_path: str | None = None) -> Dataset:
    """Questions as conversational `prompt`s and gold `answer`s (the number after '####')."""
    raw = data.load_split(split, dataset_path, "openai/gsm8k", "main")
    if missing := {"question", "answer"} - set(raw.column_names):
        raise ValueError(f"{dataset_path or 'openai/gsm8k'} ({split}) lacks column(s) {sorted(missing)}: it has "
                         f"{raw.column_names}; rename them to `question` and `answer` ('<solution> #### <number>').")
    return raw.map(lambda row: {
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
        "answer": rewards.extract_hash_answer(row["answer"]),
    }, remove_columns=raw.column_names)


# %% [markdown]
# ## Tools
# The server's: one McpToolbox per rollout (TRL's `environment_factory`), whose methods are the server's tools. A
# failed call (an error result, a timeout) is the model's tool message and counts in `tools/failure_frequency`; a
# server that is gone stops the run in one line.

# %%
def mcp_server(script_args: ScriptArguments) -> McpServer:
    """The server the flags name, and how its tools are called."""
    return McpServer(command=None if script_args.mcp_url else script_args.mcp_command, url=script_args.mcp_url,
                     session=script_args.mcp_session, timeout=script_args.mcp_timeout,
                     max_result_chars=script_args.mcp_max_result_chars, tools=tuple(script_args.mcp_tools or ()),
                     env=tuple(script_args.mcp_env or ()), warm_pool=script_args.mcp_warm_pool)


# %% [markdown]
# ## Rewards
# `correctness_reward` pays for the right answer in `<answer>`; `tool_use_reward` pays a little for calls that worked
# and costs a little for failed or repeated ones. Tool use alone can never reach a correct answer's score.

# %%
REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({rewards.correctness_reward: 2.0, rewards.tool_use_reward: 0.5})


def setup(script_args: ScriptArguments) -> Setup:
    """The rubric above and the server's tools; the server is reached in training.prepare (Setup.start), so one that
    does not start is one line before the model loads."""
    tools = McpTools(mcp_server(script_args))
    return Setup(REWARD_FUNCS, REWARD_WEIGHTS, environment_factory=tools, callbacks=[McpCallLog(tools)],
                 services=[tools])


# %% [markdown]
# ## Trainer
# The shared pre-flight checks (and that TRL can parse tool calls with the model's chat template), then TRL's
# `GRPOTrainer` with one toolbox per rollout.

# %%
def main(argv: list[str] | None = None):
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_recipes import training

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    task = setup(script_args)  # the rubric, and the server's tools
    tokenizer = training.prepare(training_args, model_args, task)  # one-line checks, then the server is reached
    train_dataset, eval_dataset = data.load_splits(build_dataset, training_args, script_args.dataset_path,
                                                   script_args.num_eval_examples)
    training.check_rows(task, train_dataset, tokenizer)  # prompts rendered, each reward called on real rows
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=task.reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        environment_factory=task.environment_factory,  # one toolbox per rollout: the server's tools
        callbacks=training.trainer_callbacks(task.callbacks),  # logs the results cut at --mcp_max_result_chars
    )
    return training.run(trainer)


# %% [markdown]
# ## Run
# Watch `tools/call_frequency` and `tools/failure_frequency` beside correctness.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/mcp_grpo.yaml"]

# %% tags=["active-ipynb"]
# from grpo_recipes import notebook
#
# trainer = main(NOTEBOOK_ARGS)
# notebook.show_training(trainer.args.output_dir, trainer)

# %% [markdown]
# ## Try it
# The trained model on a few held-out questions, calling the server's tools as in training, scored by the same rubric.

# %% tags=["active-ipynb"]
# notebook.try_model(trainer, n=3)

# %% tags=["active-py"]
if __name__ == "__main__":
    run_script(main)
