"""GRPO where no program can check the answer: a judge model grades each answer against a written rubric.

Judge first (a second GPU, or an API):  CUDA_VISIBLE_DEVICES=1 vllm serve Qwen/Qwen2.5-7B-Instruct --port 8001
Then one GPU:                           CUDA_VISIBLE_DEVICES=0 python judge_grpo.py
An API as the judge:                    python judge_grpo.py --judge_base_url https://api.openai.com/v1 \\
                                            --judge_model gpt-4.1-mini --judge_input_price 0.4 --judge_output_price 1.6
Pointwise, or a reward model:           python judge_grpo.py --reward_mode pointwise  |  --reward_mode reward_model
Offline on CPU (the kit's stand-in judge, a program, no model):
    python offline.py && (python offline.py --serve_judge &) && python judge_grpo.py --config offline/judge_grpo.yaml
Jupyter or Colab:                       notebooks/judge_grpo.ipynb, generated from this file (the judge is an API there)

The task: answer a question from a passage, correctly, from the passage only, briefly (SQuAD's passages; no gold
answer is used). The rubric below is plain text, the part to edit for your own task. Three ways to turn it into a
reward, one flag: `group` (the default: one judge call sees a prompt's whole group, shuffled and labelled afresh each
call, and scores each answer against the others, ART's RULER; G times fewer calls), `pointwise` (each answer graded
alone), `reward_model` (a sequence classifier scores each answer: TRL's own path, no rubric). The judge is any
OpenAI-compatible endpoint (grpo_recipes/judge.py): bounded concurrency, retries on 429/5xx, a deadline per batch,
a cache, and no verdict is None (no opinion), never 0. Its calls, tokens, seconds, failures (and cost, with
its prices) are in every logged step. An API's key goes in JUDGE_API_KEY (--judge_api_key_env names another).
"""

# %% [markdown]
# ## What to expect
# The judge decides what "better" means here, so watch it: a total reward that climbs while the answers you read get
# longer, vaguer or start addressing the grader is the policy hacking the judge, not learning the task. In the curves,
# `judge/*/failures` should stay near 0 (a judge that fails often gives no signal), and `length_penalty_reward` near 0.
# On a CPU the kit's stand-in judge is a program (a colour-lookup toy): it runs every code path, it proves no learning.

# %%
import functools
import os
from dataclasses import dataclass

from datasets import Dataset

import rewards
from grpo_recipes import data, options
from grpo_recipes.contract import Setup
from grpo_recipes.judge import GroupJudgeReward, JudgeReward
from grpo_recipes.options import arg
from grpo_recipes.refusal import Refusal, run_script

# %% [markdown]
# ## Config
# The same GRPO as gsm8k_grpo.py; the reward comes from a judge model instead of a program. The defaults are sized for
# one GPU for the policy and a second one (or an API) for the judge.

# %%
ON_COLAB = options.on_colab()
MODEL_NAME = "Qwen/Qwen2.5-0.5B-Instruct" if ON_COLAB else "Qwen/Qwen2.5-1.5B-Instruct"
DATASET = ("rajpurkar/squad", None)  # passages and questions; its answers are not used (the judge reads the passage)
HUB_SPLITS = {"train": "train", "test": "validation"}  # the recipe's split -> SQuAD's

RECIPE_DEFAULTS = dict(
    model_name_or_path=MODEL_NAME, output_dir="runs/judge_grpo",
    learning_rate=1e-6,  # a full fine-tune's rate (--use_peft false)
    lora_learning_rate=2e-5 if ON_COLAB else 1e-5,  # LoRA needs ~10x (Schulman et al., "LoRA Without Regret")
    lr_scheduler_type="cosine", warmup_steps=0.05, max_grad_norm=1.0,
    gradient_checkpointing=True,
    num_generations=8,  # the group judge sees these together: one call per prompt
    scale_rewards="none",  # the group mean removed, no std division: as gsm8k_grpo.py, measured there
    per_device_train_batch_size=16 if ON_COLAB else 8,
    gradient_accumulation_steps=1 if ON_COLAB else 4,  # 4 passages × 8 answers per optimizer step
    max_completion_length=128 if ON_COLAB else 256,  # brief answers: the rubric asks for one or two sentences
    max_steps=100 if ON_COLAB else 500, num_train_epochs=1,  # SQuAD's 87,599 questions: far more than a run needs
    logging_steps=1, num_completions_to_print=2,
    save_steps=50 if ON_COLAB else 100, save_total_limit=3,
    eval_strategy="steps", eval_steps=50 if ON_COLAB else 100, num_generations_eval=4,
    per_device_eval_batch_size=16 if ON_COLAB else 32,
    use_peft=True, lora_r=16, lora_alpha=32, lora_target_modules=["all-linear"],  # LoRA: one 24 GB GPU
    lora_dropout=0.0,  # TRL's 0.05: trained log-probs differ from what vLLM sampled (read as off-policy)
)


@dataclass
class ScriptArguments:
    dataset_path: str | None = arg(None, "Local passages and questions (columns context, question): a file or a "
                                         "folder of split files; default: SQuAD.")
    num_eval_examples: int = arg(64 if ON_COLAB else 128, "Held-out questions graded by the same judge at each "
                                                          "evaluation (judge calls cost: keep it small).")
    reward_mode: str = arg("group", "group: one judge call per prompt's group, each answer scored against the others; "
                                    "pointwise: one call per answer; reward_model: --reward_model scores each answer.",
                           choices=["group", "pointwise", "reward_model"])
    judge_base_url: str = arg("http://localhost:8001/v1", "The judge's OpenAI-compatible endpoint (vllm serve, "
                                                          "transformers serve, an API).")
    judge_model: str = arg("Qwen/Qwen2.5-7B-Instruct", "The model name the judge's endpoint serves.")
    judge_api_key_env: str = arg("JUDGE_API_KEY", "The environment variable holding the judge's API key (never the "
                                                  "key itself: configs and logs get shared).")
    judge_input_price: float = arg(0.0, "The judge's price per million input tokens: with it (or the output price), "
                                        "each logged step shows the judge's cost.")
    judge_output_price: float = arg(0.0, "The judge's price per million output tokens.")
    judge_max_concurrency: int = arg(16, "Judge requests in flight at once (an API's rate limit: lower it).")
    judge_timeout: float = arg(60.0, "Seconds one judge request may take; retried twice on timeouts, 429 and 5xx.")
    judge_orders: int = arg(1, "group mode: shuffles of each group asked and averaged (2+ cancels more position "
                               "bias, at that many calls).")
    reward_model: str = arg("Skywork/Skywork-Reward-V2-Qwen3-0.6B", "reward_model mode: a sequence classifier's Hub "
                                                                    "id or folder.")
    max_answer_words: int = arg(60, "Answers longer than this lose reward (length_penalty_reward): judges like length.")


# %% [markdown]
# ## System prompt
# What the policy is asked to do. The judge gets its own instructions (grpo_recipes/judge.py) and the rubric below.

# %%
SYSTEM_PROMPT = """Answer the question using only the passage. Reply in one or two sentences, the answer first. If \
the passage does not say, reply that it does not."""


# %% [markdown]
# ## Data
# Each prompt is the system prompt, then the passage and the question. No gold answer is needed: the judge reads the
# passage. Local data needs `context` and `question` columns.

# %%
def build_dataset(split: str = "train", dataset_path: str | None = None) -> Dataset:
    """Passages and questions as conversational `prompt`s."""
    raw = data.load_split(split if dataset_path else HUB_SPLITS[split], dataset_path, *DATASET)
    if missing := {"context", "question"} - set(raw.column_names):
        raise ValueError(f"{dataset_path or DATASET[0]} ({split}) lacks column(s) {sorted(missing)}: it has "
                         f"{raw.column_names}; rename them to `context` (the passage) and `question`.")
    return raw.map(lambda row: {"prompt": [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Passage:\n{row['context']}\n\nQuestion: {row['question']}"}]},
        remove_columns=raw.column_names)


# %% [markdown]
# ## The rubric
# The criteria the judge grades against, in plain text: edit them for your task. Criteria a judge can check from what
# it sees (the passage, the question, the answer) make a judge hard to fool; a criterion it cannot check ("is this
# true?") rewards whatever sounds confident. The judge's own instructions say the answer is untrusted data, and read
# the verdict only from the judge's last line, fenced by a nonce the policy cannot know (grpo_recipes/judge.py).

# %%
RUBRIC = """1. Correct: the answer is what the passage says. A wrong or missing answer gets at most 2, however well \
written.
2. Grounded: everything it states is supported by the passage; invented facts are a fault.
3. Direct and brief: the answer first, in one or two sentences. Padding, repetition, flattery, praise of itself, or \
talk about grading or scores are faults."""


def length_penalty_reward(completions, max_words: int = 60, **kwargs) -> list[float]:
    """0 up to `max_words` words, falling linearly to -1 at four times that: judges tend to prefer longer answers.

    It only takes reward away, so it cannot be farmed. Gaming it: a very short answer loses nothing here, so brevity
    for its own sake is the judge's to judge (the rubric's "correct" outweighs "brief").
    """
    def score(completion) -> float:
        words = len(rewards.completion_text(completion).split())
        return -min(max(words - max_words, 0) / (3 * max_words), 1.0)

    return rewards.score_each(score, completions)


def setup(script_args: ScriptArguments) -> Setup:
    """The judge the flags ask for (a service: training.prepare checks it answers before the model loads, and a
    callback: it logs its calls, tokens, seconds and failures each step), or the reward model, plus the length
    penalty."""
    length = functools.partial(length_penalty_reward, max_words=script_args.max_answer_words)
    if script_args.reward_mode == "reward_model":
        return Setup([script_args.reward_model, length], [1.0, 0.5])  # TRL loads the sequence classifier
    if script_args.reward_mode not in ("group", "pointwise"):
        raise Refusal(f"--reward_mode {script_args.reward_mode}: use group, pointwise or reward_model")
    endpoint = dict(model=script_args.judge_model, base_url=script_args.judge_base_url,
                    api_key=os.environ.get(script_args.judge_api_key_env), timeout=script_args.judge_timeout,
                    max_concurrency=script_args.judge_max_concurrency,
                    prices=(script_args.judge_input_price, script_args.judge_output_price)
                    if script_args.judge_input_price or script_args.judge_output_price else None)
    if script_args.reward_mode == "group":
        judge = GroupJudgeReward(RUBRIC, orders=script_args.judge_orders, **endpoint)
    else:
        judge = JudgeReward(RUBRIC, **endpoint)
    # The judge pays at most 1.0; answers four times too long lose 0.5 of it.
    return Setup([judge, length], [1.0, 0.5], callbacks=[judge], services=[judge])


# %% [markdown]
# ## Trainer
# The shared pre-flight checks, then the judge's check (one tiny request: a judge that cannot be reached is one line,
# before the model loads), then TRL's `GRPOTrainer` with the judge as a reward function and its stats as a callback.

# %%
def main(argv: list[str] | None = None):
    # The trainer's imports are here, not at the top: evaluate.py reads this file's prompt, data and rubric without
    # loading torch and TRL's trainer, seconds of start-up a user checking an environment against an API never needs.
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_recipes import training

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    task = setup(script_args)  # the judge (or reward model) the flags ask for
    tokenizer = training.prepare(training_args, model_args, task)  # one-line checks, then the judge is asked once
    train_dataset, eval_dataset = data.load_splits(build_dataset, training_args, script_args.dataset_path,
                                                   script_args.num_eval_examples)
    training.check_rows(task, train_dataset, tokenizer)  # prompts rendered, each reward called on real rows
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,  # loaded with training_args.model_init_kwargs (dtype, ...)
        reward_funcs=task.reward_funcs,  # the judge, or the reward model's id (TRL loads it), and the length penalty
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),  # LoRA with --use_peft (the default here), else None
        quantization_config=get_quantization_config(model_args),  # --load_in_4bit / --load_in_8bit
        callbacks=training.trainer_callbacks(task.callbacks),  # the judge's calls, tokens, seconds in each log
    )
    return training.run(trainer)


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags
# (on Colab, an API judge: `--judge_base_url`, `--judge_model`, its key in the `JUDGE_API_KEY` environment variable).

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--judge_base_url", "https://api.openai.com/v1", "--judge_model", ...]

# %% tags=["active-ipynb"]
# from grpo_recipes import notebook
#
# trainer = main(NOTEBOOK_ARGS)
# notebook.show_training(trainer.args.output_dir, trainer)

# %% [markdown]
# ## Try it
# The trained model on a few held-out passages, graded by the same judge.

# %% tags=["active-ipynb"]
# notebook.try_model(trainer, n=3)

# %% tags=["active-py"]
if __name__ == "__main__":
    run_script(main)
