"""SFT warm start: teach a small model a recipe's format before RL, from gold solutions or filtered rollouts.

Gold completions, a column of the recipe's dataset (gsm8k_grpo's `gold_completion`: GSM8K's worked solutions in its
<reasoning>/<answer> format); your fork adds such a column, or names its own with --gold_column:
    python sft_warmstart.py --recipe gsm8k_grpo --source gold
Rejection sampling on evaluate.py rollouts (best-of-k per prompt above a reward threshold, tool conversations kept):
    python evaluate.py tool_use_grpo --base_url ... --model ... -r 8 --out tools.jsonl
    python sft_warmstart.py --recipe tool_use_grpo --source rollouts --rollouts tools.jsonl --min_reward 2.0
Then RL from the result (the output directory is a model directory):
    python gsm8k_grpo.py --model_name_or_path runs/sft_warmstart
Jupyter or Colab (free T4): notebooks/sft_warmstart.ipynb, generated from this file

TRL's SFTTrainer with the loss on assistant turns only (tool results and prompts are never trained on); every
SFTConfig and ModelConfig field is a flag or a YAML key; --use_peft trains LoRA, --merge_lora saves a merged model.
"""

# %% [markdown]
# ## What to expect
# On Colab's free T4 the config cell's `if ON_COLAB` values apply: LoRA, 200 steps, merged into the model when saved
# (not yet timed on a T4). The loss should fall fast and flatten; the saved folder is the `--model_name_or_path` of an
# RL notebook.

# %%
import json
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset, Features, Json, List, Value
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer, get_peft_config

from grpo_recipes import configs, console, contract, data, logs, options, output_dir, preflight, ranges, training
from grpo_recipes.console import logger
from grpo_recipes.options import arg
from grpo_recipes.refusal import Refusal, run_script

# %% [markdown]
# ## Config
# Supervised fine-tuning before RL: a small model that never writes the recipe's format, or never calls its tools,
# gives GRPO nothing to reinforce. A few hundred steps on good examples fix that cheaply.

# %%
# In a notebook on Colab's free T4 (16 GB, no bf16) the `if ON_COLAB` values apply: LoRA, 200 steps.
ON_COLAB = options.on_colab()

RECIPE_DEFAULTS = {
    "output_dir": "runs/sft_warmstart",
    "learning_rate": 1e-4 if ON_COLAB else 1e-5,  # LoRA on Colab needs the higher rate
    "use_peft": ON_COLAB,
    "lr_scheduler_type": "cosine", "warmup_steps": 0.03,
    "max_steps": 200 if ON_COLAB else -1,
    "num_train_epochs": 1, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
    "assistant_only_loss": True,  # train on what the model should write, never on prompts or tool results
    "gradient_checkpointing": True, "logging_steps": 10, "save_strategy": "no", "report_to": "none",
    "model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",
}


@dataclass
class RecipeSFTConfig(SFTConfig):
    """SFTConfig with the recipes' precision defaults (configs.default_precision) and their output directory guard."""

    overwrite_output_dir: bool = field(default=False, metadata={"help": "Start over in an output_dir that already "
                                       "holds checkpoints, deleting them. Default: refuse, and say how to resume."})

    def __post_init__(self):
        configs.default_precision(self)
        ranges.check_ranges(self)
        super().__post_init__()


@dataclass
class ScriptArguments:
    recipe: str = arg("gsm8k_grpo", "The recipe to warm up for (a name, or the path of your fork): its prompts, "
                                    "format and tools.")
    source: str = arg("gold", "gold: a column of the recipe's dataset that holds each prompt's ideal completion; "
                              "rollouts: an evaluate.py JSONL.")
    gold_column: str = arg("gold_completion", "For --source gold: the recipe's dataset column of gold completions.")
    rollouts: str | None = arg(None, "evaluate.py --out file, for --source rollouts.")
    min_reward: float | None = arg(None, "Keep rollouts whose weighted total is at least this. Default: every "
                                         "rollout that scored above 0.")
    best_of: int = arg(1, "Keep at most this many of the best rollouts per example (per game seed).")
    dataset_path: str | None = arg(None, "For --source gold: local data, as the recipe's --dataset_path.")
    split: str = arg("train", "For --source gold: the split whose solutions to imitate.")
    merge_lora: bool = arg(ON_COLAB, "With --use_peft: merge the adapter into the model when saving.")


# %% [markdown]
# ## Data
# Either the gold completions the recipe's dataset carries (`--source gold`), or rollouts from any model scored by the
# recipe's own rubric with evaluate.py, keeping the best of each prompt (`--source rollouts`).

# %%
# Tool-call arguments differ between tools ({"code"} vs {"query"}): as Json they are not merged into one struct.
MESSAGES = Features({"messages": List({"role": Value("string"), "content": Value("string"), "name": Value("string"),
                                       "tool_calls": List({"type": Value("string"), "function": {
                                           "name": Value("string"), "arguments": Json()}})}),
                     "tools": Value("string")})


def gold_conversations(recipe, split: str, dataset_path: str | None, column: str = "gold_completion") -> list[dict]:
    """Each row's prompt answered with its gold completion: the text in `column` of the recipe's dataset."""
    dataset = data.build_split(recipe.build_dataset, split, dataset_path)
    if column not in dataset.column_names:
        raise Refusal(f"{recipe.__name__}.build_dataset gives no {column!r} column (it gives "
                      f"{', '.join(dataset.column_names)}): add one holding each prompt's ideal completion in the "
                      "recipe's format, name yours with --gold_column, or use --source rollouts with an evaluate.py "
                      "JSONL")
    return [{"messages": prompt + [{"role": "assistant", "content": gold}], "tools": None}
            for prompt, gold in zip(dataset["prompt"], dataset[column], strict=True) if gold]


ROLLOUT_KEYS = ("prompt", "completion", "total")  # what every evaluate.py --out row holds


def rollout_conversations(path: str, min_reward: float | None, best_of: int) -> list[dict]:
    """Rejection sampling: per example (evaluate.py numbers them; per prompt in a file without), the best `best_of`
    distinct rollouts whose total is at least min_reward (None: above 0). Refuses, naming the best total, when none is
    kept."""
    rows = rollout_rows(path)
    # A rollout the rubric's first reward (the correctness check, or the judge) had no opinion on is not vouched for:
    # its total counts that None as 0, so a judge that failed would otherwise pass it at --min_reward 0.
    scored = [row for row in rows if row.get("error") is None and _first_score(row) is not None]
    by_prompt = {}
    for row in scored:
        if row["total"] > 0 if min_reward is None else row["total"] >= min_reward:
            # evaluate.py numbers its examples: games share one prompt, and each seed is an example of its own
            by_prompt.setdefault(json.dumps([row["prompt"], row.get("example")]), []).append(row)
    if not by_prompt:
        raise Refusal(_nothing_kept(path, min_reward, rows, max((row["total"] for row in scored), default=None)))
    conversations = []
    for group in by_prompt.values():
        seen = set()
        for row in sorted(group, key=lambda r: -r["total"]):
            key = json.dumps(row["completion"], sort_keys=True)
            if key in seen or len(seen) == best_of:
                continue
            seen.add(key)
            messages = [_message(m) for m in row["prompt"] + row["completion"]]
            tools = json.dumps(row["tools"]) if row.get("tools") else None
            conversations.append({"messages": messages, "tools": tools})
    return conversations


def rollout_rows(path: str) -> list[dict]:
    """The rows of an evaluate.py --out file; anything else is one line."""
    if not Path(path).is_file():
        raise Refusal(f"--rollouts {path}: no such file (write one with evaluate.py --out)")
    if bad := data.first_bad_json_line(path):
        raise Refusal(bad)
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        rows.append(json.loads(line))
        if missing := [key for key in ROLLOUT_KEYS if key not in rows[-1]]:
            raise Refusal(f"{path} line {number}: not an evaluate.py rollout (no {', '.join(missing)}); --rollouts "
                          "takes the file `python evaluate.py <recipe> ... --out rollouts.jsonl` writes")
    return rows


def _first_score(row: dict) -> float | None:
    """The rollout's score from the rubric's first reward: evaluate.py writes `scores` in the rubric's order."""
    return next(iter(row.get("scores", {}).values()), 0.0)  # a file without scores: its total alone decides


def _nothing_kept(path: str, min_reward: float | None, rows: list[dict], best: float | None) -> str:
    if best is None:
        failed = sum(row.get("error") is not None for row in rows)
        return (f"{path}: of its {len(rows)} rollouts {failed} failed (see their `error`) and "
                f"{len(rows) - failed} got no opinion from the rubric's first reward (a judge that failed, or no "
                "gold to check): nothing to keep" if rows else
                f"{path} holds no rollouts: write them with evaluate.py --out")
    kept = "scored above 0" if min_reward is None else f"reached --min_reward {min_reward:g}"
    return (f"{path}: no rollout {kept}; the best total is {best:g}. Pass --min_reward {best:g} to keep the best "
            "anyway, or evaluate more rollouts (-r) or a stronger model")


def _message(message: dict) -> dict:
    """A chat message with exactly the fields of MESSAGES (evaluate.py's tool calls also carry OpenAI ids)."""
    calls = [{"type": "function", "function": c["function"]} for c in message.get("tool_calls") or []]
    return {"role": message["role"], "content": message.get("content"), "name": message.get("name"),
            "tool_calls": calls or None}


# %% [markdown]
# ## Trainer
# TRL's SFTTrainer with the loss on assistant turns only: prompts and tool results are context, never targets.

# %%
def main(argv: list[str] | None = None) -> Path:
    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv,
                                                                config_class=RecipeSFTConfig)
    console.setup_logging()
    recipe = contract.load_recipe(script_args.recipe)
    output_dir.prepare_output_dir(training_args)
    preflight.check_model_source(model_args.model_name_or_path)
    if script_args.source == "gold":
        conversations = gold_conversations(recipe, script_args.split, script_args.dataset_path,
                                           script_args.gold_column)
    elif script_args.source == "rollouts" and script_args.rollouts:
        conversations = rollout_conversations(script_args.rollouts, script_args.min_reward, script_args.best_of)
    else:
        raise Refusal("--source is gold, or rollouts with --rollouts results.jsonl (from evaluate.py).")
    if not conversations:
        raise Refusal(f"{recipe.__name__}'s {script_args.split} split has no gold completions (its "
                      f"{script_args.gold_column!r} column is empty)")
    logger.info(f"SFT on {len(conversations)} conversations from {script_args.source}")
    dataset = Dataset.from_list(conversations, features=MESSAGES)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, dtype=model_args.dtype)
    trainer = SFTTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=get_peft_config(model_args))
    training.run_training(trainer, training_args)
    output = Path(training_args.output_dir)

    def save(folder: str) -> None:
        if model_args.use_peft and script_args.merge_lora:
            trainer.model.merge_and_unload().save_pretrained(folder)
        else:
            trainer.save_model(folder)
        tokenizer.save_pretrained(folder)  # with its chat template: the directory is a --model_name_or_path

    training.save_atomically(output, save, trainer.args.should_save, trainer.accelerator.wait_for_everyone)
    logs.plot_training(trainer.state.log_history, output / logs.PLOT_FILE)
    logger.info(f"saved the warm-started model to {output}")
    return output


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags.
# The loss curve should fall fast and flatten; the saved directory is the `--model_name_or_path` of an RL recipe.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "100"] or ["--config", "offline/sft_warmstart.yaml"]

# %% tags=["active-ipynb"]
# from grpo_recipes import notebook
#
# saved = main(NOTEBOOK_ARGS)
# notebook.show_training(saved)

# %% tags=["active-py"]
if __name__ == "__main__":
    run_script(main)
