"""GRPO on GSM8K with the <reasoning>/<answer> format: the classic one-file recipe, on TRL 1.16.

One GPU (vLLM colocate when installed):   python gsm8k_grpo.py
QLoRA (12 GB), or a full fine-tune (80 GB): python gsm8k_grpo.py --load_in_4bit  |  --use_peft false
Any GRPOConfig field, CLI or YAML:        python gsm8k_grpo.py --config my.yaml --learning_rate 1e-6
Offline on CPU, tiny model (< 1 min):     python offline.py && python gsm8k_grpo.py --config offline/gsm8k_grpo.yaml
Jupyter or Colab (free T4):              notebooks/gsm8k_grpo.ipynb, generated from this file
"""

# %% [markdown]
# ## What to expect
# On Colab's free T4 the config cell's `if ON_COLAB` values apply: Qwen2.5-0.5B-Instruct with LoRA, 100 steps of 16
# completions of at most 256 tokens, an evaluation every 50 steps (not yet timed on a T4). In the curves, the format
# rewards should rise within the first few dozen steps and correctness more slowly; a total reward that climbs while
# correctness stays flat means the model is farming the format rewards.

# %%
import re
from dataclasses import dataclass
from functools import lru_cache

from datasets import Dataset

import rewards
from grpo_recipes import data, options
from grpo_recipes.contract import Setup
from grpo_recipes.options import arg
from grpo_recipes.refusal import run_script

# %% [markdown]
# ## Config
# GRPO samples a group of completions for each prompt, scores each one with the rubric, and raises the probability of
# those that beat their group's mean: no value model, no reference answers beyond the final number. The defaults are
# sized for one GPU; any field can be changed here, from the command line, a `--config` YAML, or `NOTEBOOK_ARGS`.

# %%
# In a notebook on Colab's free T4 (16 GB, no bf16) the `if ON_COLAB` values apply: a 0.5B model, 100 shorter steps.
ON_COLAB = options.on_colab()
MODEL_NAME = "Qwen/Qwen2.5-0.5B-Instruct" if ON_COLAB else "Qwen/Qwen2.5-1.5B-Instruct"
DATASET = ("openai/gsm8k", "main")  # the Hub dataset and its config; --dataset_path reads local files instead

# Valid on ONE GPU: per_device_train_batch_size × GPUs × steps_per_generation must be a multiple of num_generations.
RECIPE_DEFAULTS = dict(
    model_name_or_path=MODEL_NAME, output_dir="runs/gsm8k_grpo",
    learning_rate=5e-6,  # a full fine-tune's rate (--use_peft false)
    # LoRA needs about 10x a full fine-tune's rate (Schulman et al., "LoRA Without Regret", 2025).
    lora_learning_rate=2e-5 if ON_COLAB else 5e-5,
    adam_beta2=0.99, weight_decay=0.1, warmup_steps=0.1, lr_scheduler_type="cosine", max_grad_norm=1.0,
    # max_grad_norm 1.0 (TRL's), not the gist's 0.1: 0.1 lost on all 3 of cpu_demo's seeds (docs/experiments.md)
    gradient_checkpointing=True,  # trades ~20% speed for memory; off: --gradient_checkpointing false
    num_generations=8,  # completions per prompt; GRPO's advantage is each one's reward relative to its group
    # Rewards minus the group mean, not divided by the group std (Dr. GRPO): an all-correct group's formatting noise
    # then stays small. Best mean held-out gain of group/batch/none on cpu_demo's 3 seeds (docs/experiments.md).
    scale_rewards="none",
    per_device_train_batch_size=16 if ON_COLAB else 8,
    gradient_accumulation_steps=1 if ON_COLAB else 4,  # 32 completions (4 prompts × 8) per optimizer step
    max_completion_length=256 if ON_COLAB else 512,
    max_steps=100 if ON_COLAB else -1, num_train_epochs=1,  # -1: one epoch
    logging_steps=1, save_steps=50 if ON_COLAB else 100, save_total_limit=3,
    eval_strategy="steps", eval_steps=50 if ON_COLAB else 100, num_generations_eval=4,
    per_device_eval_batch_size=16 if ON_COLAB else 64,  # 200 problems × 4 generations: 13 generation calls, not 50
    num_completions_to_print=2,  # --log_completions prints this many per logged step, one per prompt
    use_peft=True, lora_r=16, lora_alpha=32, lora_target_modules=["all-linear"],  # LoRA: one 24 GB GPU (README)
    lora_dropout=0.0,  # TRL's 0.05: trained log-probs differ from what vLLM sampled (read as off-policy)
)


@dataclass
class ScriptArguments:
    dataset_path: str | None = arg(None, "Local GSM8K-form data: a JSON/JSONL/parquet file or a folder of split files.")
    num_eval_examples: int = arg(64 if ON_COLAB else 200, "Held-out test problems scored with the same rewards at "
                                                          "each evaluation.")


# %% [markdown]
# ## System prompt
# The model must think inside `<reasoning>` and answer inside `<answer>`, so the answer can be read without guessing.

# %%
SYSTEM_PROMPT = """Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""


# %% [markdown]
# ## Data
# GSM8K's grade-school word problems. The prompt is the system prompt plus the question; the gold answer is the number
# after `####` in the worked solution, which the correctness reward compares against. `gold_completion` is that
# solution in the system prompt's format (calculator notes removed): what `sft_warmstart.py --source gold` imitates.

# %%
def build_dataset(split: str = "train", dataset_path: str | None = None) -> Dataset:
    """GSM8K as conversational `prompt`s (system + question), numeric `answer`s (the text after '####') and each
    worked solution as a `gold_completion` in the <reasoning>/<answer> format."""
    raw = data.load_split(split, dataset_path, *DATASET)
    if missing := {"question", "answer"} - set(raw.column_names):
        raise ValueError(f"{dataset_path or DATASET[0]} ({split}) lacks column(s) {sorted(missing)}: it has "
                         f"{raw.column_names}; rename them to `question` and `answer` ('<solution> #### <number>').")
    return raw.map(lambda row: {
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
        "answer": rewards.extract_hash_answer(row["answer"]),
        "gold_completion": f"<reasoning>\n{re.sub(r'<<[^>]*>>', '', row['answer'].split('####')[0]).strip()}\n"
                           f"</reasoning>\n<answer>\n{rewards.extract_hash_answer(row['answer'])}\n</answer>",
    }, remove_columns=raw.column_names)


# %% [markdown]
# ## Rewards
# `correctness_reward` pays 1 when the number in `<answer>` equals the gold answer; `integer_answer_reward` pays for a
# plain number there; the three format rewards below pay for the tags. Format alone is cheap to farm, so its weights
# are small: a model cannot out-earn a correct answer with tags. Each docstring says how it could be gamed.

# %%
def strict_format_reward(completions, reasoning_tag="reasoning", answer_tag="answer", **kwargs) -> list[float]:
    r"""1.0 when the completion is exactly the system prompt's template, else 0.0.

    Template: `<reasoning>\n…\n</reasoning>\n<answer>\n…\n</answer>`, each tag once, both blocks non-empty,
    nothing before or after (surrounding whitespace is fine: the gist's version demanded a trailing newline and its
    regexes without DOTALL never matched multi-line reasoning). Gaming it: a well-formed but empty-minded completion
    earns it, so it is worth little next to correctness.
    """
    r, a = reasoning_tag, answer_tag
    pattern = _format_pattern(r"<{r}>\n(?P<reasoning>.+?)\n</{r}>\n<{a}>\n(?P<answer>.+?)\n</{a}>", r, a)

    def score(completion) -> float:
        text = rewards.completion_text(completion).strip()
        if not _each_tag_once(text, r, a):  # counts first: the regex backtracks for seconds on repeated templates
            return 0.0
        match = pattern.fullmatch(text)
        if not match:
            return 0.0
        return 1.0 if match["reasoning"].strip() and match["answer"].strip() else 0.0

    return rewards.score_each(score, completions)


def soft_format_reward(completions, reasoning_tag="reasoning", answer_tag="answer", **kwargs) -> list[float]:
    """1.0 when one reasoning block is followed by one answer block, with any whitespace, else 0.0.

    Looser than strict_format_reward (no newline rules; text before or after is allowed) so a model gets a signal
    before it masters the exact template. Gaming it: like strict_format_reward, it pays for form only.
    """
    r, a = reasoning_tag, answer_tag
    pattern = _format_pattern(r"<{r}>.*?</{r}>\s*<{a}>.*?</{a}>", r, a)

    def score(completion) -> float:
        text = rewards.completion_text(completion)
        return 1.0 if _each_tag_once(text, r, a) and pattern.search(text) else 0.0

    return rewards.score_each(score, completions)


def xml_tag_count_reward(completions, reasoning_tag="reasoning", answer_tag="answer", **kwargs) -> list[float]:
    """Partial credit in [0, 1]: 0.25 for each of the four tags that appears exactly once, -0.25 for text after the
    closing answer tag (floored at 0).

    A dense signal for a model still learning the tags. Gaming it: repeating a tag earns nothing for that tag (the
    gist's version could be farmed that way), and the trailing-text penalty is bounded, unlike the gist's, which could
    subtract a whole completion's length.
    """
    tags = [f"<{reasoning_tag}>", f"</{reasoning_tag}>", f"<{answer_tag}>", f"</{answer_tag}>"]

    def score(completion) -> float:
        text = rewards.completion_text(completion)
        credit = 0.25 * sum(text.count(tag) == 1 for tag in tags)
        closing = f"</{answer_tag}>"
        if closing in text and text.rsplit(closing, 1)[1].strip():
            credit -= 0.25
        return max(credit, 0.0)

    return rewards.score_each(score, completions)


@lru_cache(maxsize=64)
def _format_pattern(template: str, reasoning_tag: str, answer_tag: str) -> re.Pattern:
    return re.compile(template.format(r=re.escape(reasoning_tag), a=re.escape(answer_tag)), re.DOTALL)


def _each_tag_once(text: str, *tag_names: str) -> bool:
    return all(text.count(f"<{t}>") == 1 and text.count(f"</{t}>") == 1 for t in tag_names)


# A correct, well-formatted answer scores 2 + 0.5 × 4 = 4.0; the best any wrong or malformed completion can reach is
# 2.0 (tests/test_rewards.py probes this with adversarial completions).
REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({
    rewards.correctness_reward: 2.0,
    rewards.integer_answer_reward: 0.5,
    strict_format_reward: 0.5,
    soft_format_reward: 0.5,
    xml_tag_count_reward: 0.5,
})


def setup(script_args: ScriptArguments) -> Setup:
    """What this run is scored with: the rubric above (plain functions, nothing to start), no tools."""
    return Setup(REWARD_FUNCS, REWARD_WEIGHTS)


# %% [markdown]
# ## Trainer
# Pre-flight checks that fail in one line before any model is loaded, then TRL's `GRPOTrainer`: generation (vLLM on a
# GPU when installed), the rubric, the GRPO loss, logging and checkpoints. `training.run` trains it with compact logs
# (Ctrl-C prints the command that resumes), saves the model and plots the rewards.

# %%
def main(argv: list[str] | None = None):
    # The trainer's imports are here, not at the top: evaluate.py reads this file's prompt, data and rubric without
    # loading torch and TRL's trainer, seconds of start-up a user checking an environment against an API never needs.
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_recipes import training

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    task = setup(script_args)  # the rubric this run trains with
    tokenizer = training.prepare(training_args, model_args, task)  # one-line checks before anything loads
    train_dataset, eval_dataset = data.load_splits(build_dataset, training_args, script_args.dataset_path,
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
        callbacks=training.trainer_callbacks(task.callbacks),  # --skip_settled_after's record, when on
    )
    return training.run(trainer)


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags.
# Then look at the curves: correctness should rise while the format rewards saturate early. A total reward that climbs
# while correctness stays flat means the model found a way to farm the cheap rewards.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/gsm8k_grpo.yaml"]

# %% tags=["active-ipynb"]
# from grpo_recipes import notebook
#
# trainer = main(NOTEBOOK_ARGS)
# notebook.show_training(trainer.args.output_dir, trainer)

# %% [markdown]
# ## Try it
# The trained model on a few held-out problems, through the same generation and rubric as training.

# %% tags=["active-ipynb"]
# notebook.try_model(trainer, n=3)

# %% tags=["active-py"]
if __name__ == "__main__":
    run_script(main)
