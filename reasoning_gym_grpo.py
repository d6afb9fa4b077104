"""GRPO on reasoning-gym's generated tasks: endless data, each task's own checker, a curriculum that follows the model.

One GPU:                          python reasoning_gym_grpo.py
Other tasks, mixed by weight:     python reasoning_gym_grpo.py --tasks countdown:2,basic_arithmetic,word_sorting
A fixed difficulty:               python reasoning_gym_grpo.py --curriculum false --level 2
Offline on CPU, tiny model:       python offline.py
                                  python reasoning_gym_grpo.py --config offline/reasoning_gym_grpo.yaml
Jupyter or Colab (free T4):       notebooks/reasoning_gym_grpo.ipynb, generated from this file

reasoning-gym (PyPI) generates about 100 kinds of verifiable task offline (arithmetic, countdown, sudoku, mazes,
ciphers, logic puzzles, ...), each with difficulty levels and its own scorer. Training prompts are generated as the run
reads them, at the curriculum's current level; held-out prompts come from other seeds and never appear in training.
Correctness is the task's scorer, paid only in full: the partial credit some scorers give wrong answers (0.05 for a
wrong countdown expression, 0.01 for an empty one) earns nothing. A scorer is code this project did not write, and
some run the answer as Python: each answer is scored in a confined child of the sandbox, under a time limit, and
expression answers must first fit their task's grammar (grpo_recipes/gym_scorer.py). Tasks whose scorer rejects their
own gold answer, or pays wrong ones, are refused in one line (grpo_recipes/gym_tasks.py's REFUSED says why for each;
and each run checks its tasks' golds before the model loads).
"""

# %% [markdown]
# ## What to expect
# The curves to watch are `rewards/correctness_reward/mean` and `curriculum/<task>/level`: with the curriculum on, the
# pass rate should hover between --demote_at and --promote_at while the level climbs. A level stuck at 0 with a pass
# rate near 0 means the task is too hard for the model even at its easiest: choose another, or a stronger model.

# %%
from collections import deque
from dataclasses import dataclass
from functools import partial

from datasets import Dataset

import rewards
from grpo_recipes import data, options
from grpo_recipes.contract import Setup, StepHooks
from grpo_recipes.gym_scorer import GymScorer
from grpo_recipes.gym_tasks import TaskSet, render
from grpo_recipes.options import arg
from grpo_recipes.refusal import Refusal, run_script
from grpo_recipes.sandbox import ENGINES

# %% [markdown]
# ## Config
# The same GRPO as gsm8k_grpo.py. The data never runs out, so `max_steps` sets the run's length.

# %%
ON_COLAB = options.on_colab()
MODEL_NAME = "Qwen/Qwen2.5-0.5B-Instruct" if ON_COLAB else "Qwen/Qwen2.5-1.5B-Instruct"

RECIPE_DEFAULTS = dict(
    model_name_or_path=MODEL_NAME, output_dir="runs/reasoning_gym_grpo",
    learning_rate=5e-6,  # a full fine-tune's rate (--use_peft false)
    lora_learning_rate=2e-5 if ON_COLAB else 5e-5,  # LoRA needs ~10x (Schulman et al., "LoRA Without Regret")
    adam_beta2=0.99, weight_decay=0.1, warmup_steps=0.05, lr_scheduler_type="cosine", max_grad_norm=1.0,
    gradient_checkpointing=True,
    num_generations=8, scale_rewards="none",  # as gsm8k_grpo.py, measured there
    per_device_train_batch_size=16 if ON_COLAB else 8,
    gradient_accumulation_steps=1 if ON_COLAB else 4,  # 4 prompts × 8 completions per optimizer step
    max_completion_length=512 if ON_COLAB else 1024,
    max_steps=100 if ON_COLAB else 500,  # generated data: the steps, not an epoch, end the run
    logging_steps=1, save_steps=50 if ON_COLAB else 100, save_total_limit=3,
    eval_strategy="steps", eval_steps=50 if ON_COLAB else 100, num_generations_eval=4,
    per_device_eval_batch_size=16 if ON_COLAB else 64, num_completions_to_print=2,
    use_peft=True, lora_r=16, lora_alpha=32, lora_target_modules=["all-linear"],  # LoRA: one 24 GB GPU
    lora_dropout=0.0,  # TRL's 0.05: trained log-probs differ from what vLLM sampled (read as off-policy)
)


@dataclass
class ScriptArguments:
    tasks: str = arg("countdown", "reasoning-gym tasks, comma-separated, each with an optional weight (countdown:2,"
                                  "basic_arithmetic): the share of prompts each gets.")
    level: int = arg(0, "The difficulty level every task starts at (reasoning-gym's curriculum levels, 0 = easiest).")
    curriculum: bool = arg(True, "Move each task's level with its pass rate on training prompts; false: stay at "
                                 "--level.")
    curriculum_window: int = arg(64, "A task's pass rate is measured over its last this many training completions.")
    promote_at: float = arg(0.75, "A pass rate at or above this raises the task's level (the groups stop teaching).")
    demote_at: float = arg(0.1, "A pass rate at or below this lowers it (the groups are all failures).")
    task_seed: int = arg(0, "Seeds the generated prompts; held-out prompts use other seeds and never repeat one.")
    train_size: int = arg(100_000, "Training prompts per epoch, each generated when the run first reads it.")
    dataset_path: str | None = arg(None, "Prompts written earlier (this recipe's columns: task, level, split, index): "
                                         "a file or a folder of split files; default: generated. No curriculum.")
    num_eval_examples: int = arg(64 if ON_COLAB else 200, "Held-out prompts at --level, scored with the same "
                                                          "rewards at each evaluation.")
    scorer_timeout: float = arg(2.0, "Seconds a task's scorer may spend on one answer; past it the answer scores 0.")
    scorer_sandbox: str = arg("bubblewrap", "The scorers' sandbox engine: bubblewrap (namespaces), or landlock where "
                                            "user namespaces cannot be had (weaker: docs/sandbox.md).", choices=ENGINES)
    unsafe_scorer_sandbox: bool = arg(False, "Score where this machine cannot confine the scorers (a child process "
                                             "with resource limits only).")


# %% [markdown]
# ## System prompt
# reasoning-gym's own convention: think first, then the answer alone in `<answer>` tags, in the form the task's
# question asks for. Each task's question says what that form is.

# %%
SYSTEM_PROMPT = """Think about the problem step by step, then give the answer in this format:
<answer>answer here</answer>
Put only the final answer inside the tags, in the form the question asks for."""


# %% [markdown]
# ## Data
# Each prompt is one generated item: row `index` of the task's dataset at a level, for a split. The row keeps only that
# address (task, level, split, index); the item itself, and its gold answer, are generated again from it wherever they
# are needed (reasoning-gym items are a function of their seed), so any process can score a completion
# (grpo_recipes/gym_tasks.py: TaskSet). The curriculum decides each task's level as a batch is read.

# %%
class Curriculum(StepHooks):
    """Each task's level, moved by its pass rate on its last `window` training completions: up at `promote_at` or
    above, down at `demote_at` or below (the window then starts afresh); logged as `curriculum/<task>/level` and
    `.../pass_rate`. The training data reads the levels as it generates each batch; correctness_reward records the
    outcomes (training rows only: held-out prompts never move it)."""

    def __init__(self, tasks: TaskSet, level: int, window: int, promote_at: float, demote_at: float, enabled: bool):
        self.tasks, self.window, self.enabled = tasks, window, enabled
        self.moves_rollouts = "--curriculum false (a fixed --level)" if enabled else ""  # the levels rollouts read
        self.promote_at, self.demote_at = promote_at, demote_at
        self.levels = {task: level for task in tasks.weights}
        self.outcomes = {task: deque(maxlen=window) for task in tasks.weights}

    def record(self, task: str, correct: bool) -> None:
        self.outcomes[task].append(correct)

    def pass_rate(self, task: str) -> float | None:
        seen = self.outcomes[task]
        return sum(seen) / len(seen) if seen else None

    def on_step_end(self, args, state, control, **kwargs):
        if not self.enabled:
            return
        for task, seen in self.outcomes.items():
            if len(seen) < self.window:
                continue
            rate, level = self.pass_rate(task), self.levels[task]
            if rate >= self.promote_at:
                self.levels[task] = self.tasks.next_level(task, level, 1)
            elif rate <= self.demote_at:
                self.levels[task] = self.tasks.next_level(task, level, -1)
            if self.levels[task] != level:
                seen.clear()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and not any(key.startswith("eval_") for key in logs):
            for task, level in self.levels.items():
                logs[f"curriculum/{task}/level"] = level
                if (rate := self.pass_rate(task)) is not None:
                    logs[f"curriculum/{task}/pass_rate"] = round(rate, 3)


def build_dataset(split: str = "train", dataset_path: str | None = None, tasks: TaskSet | None = None,
                  levels: dict[str, int] | None = None, train_size: int = 1000, test_size: int = 200) -> Dataset:
    """The rows in dataset_path, or generated prompts with `task`, `level`, `split`, `index` (the item's address,
    which correctness_reward scores against), `answer` and `gold_completion`: held-out ones at once, training ones
    as the trainer reads each batch (Dataset.with_transform), at the tasks' `levels` (default 0) at that moment."""
    if dataset_path:
        raw = data.load_split(split, dataset_path, None, None)
        if missing := {"task", "level", "split", "index"} - set(raw.column_names):
            raise ValueError(f"{dataset_path} ({split}) lacks column(s) {sorted(missing)}: it has {raw.column_names}; "
                             "the rows address generated items, as build_dataset's do")
        return raw
    tasks = tasks or TaskSet("countdown", 0, SYSTEM_PROMPT)
    levels = levels if levels is not None else dict.fromkeys(tasks.weights, 0)
    if split == "train":
        return Dataset.from_dict({"index": range(train_size)}).with_transform(partial(render, tasks, levels))
    return Dataset.from_list([tasks.row(task := tasks.pick(i), levels[task], split, i) for i in range(test_size)])


# %% [markdown]
# ## Rewards
# `correctness_reward` is the task's own scorer, paid in full or not at all; `answer_format_reward` pays a little for
# one non-empty `<answer>` block, a signal before the answers come right. A right answer in the format
# scores 1.0 + 0.2; the best a wrong answer can earn is 0.2.

# %%
class TaskScorer:
    """1.0 when the task's own scorer gives full marks to the answer in the last `<answer>` block (reasoning-gym's
    extraction), else 0.0; scored in the sandbox, each answer in a child of its own (grpo_recipes/gym_scorer.py).

    Gaming it: partial credit is where scorers leak (a wrong countdown expression earns 0.05, any number 0.01), so only
    full marks pay; an answer that is code (`exec(...)`), makes the scorer do the task (`expand(<the question>)`),
    names nan or inf, hangs the scorer (`9**9**9`), or carries the gold with junk before or after it earns 0; tasks
    whose scorer pays a wrong answer in full (a prefix of the gold, any expression equal to 24) are refused; every task
    offered is tested with each of these, guesses and other items' golds, at its easiest and hardest level.
    """

    __name__ = "correctness_reward"

    def __init__(self, tasks: TaskSet, curriculum: Curriculum):
        self.tasks, self.curriculum = tasks, curriculum

    def __call__(self, completions, task, level, split, index, **kwargs) -> list[float]:
        from reasoning_gym.utils import extract_answer

        def score(completion, task, level, split, index) -> float:
            answer = extract_answer(rewards.completion_text(completion))
            correct = self.tasks.score(answer, task, level, split, index) >= 1.0
            if split == "train":
                self.curriculum.record(task, correct)
            return float(correct)

        timed_out = self.tasks.scorer.stats["timed_out"]
        scores = rewards.score_each(score, completions, task, level, split, index)
        if kwargs.get("log_metric") is not None:  # answers whose scoring ran out of time: each scored 0
            kwargs["log_metric"]("reasoning_gym/scorer_timeouts", self.tasks.scorer.stats["timed_out"] - timed_out)
        return scores


def check_golds(tasks: TaskSet, level: int, n: int = 8) -> None:
    """Refuse, in one line, a task whose scorer does not give its own gold answers full marks at `level`: a
    reasoning-gym version whose scorer broke since gym_tasks.REFUSED was measured."""
    for task in tasks.weights:
        rows = [tasks.row(task, level, "train", i) for i in range(n)]
        scores = [tasks.score(row["answer"], task, level, "train", row["index"]) for row in rows]
        if min(scores) < 1.0:
            raise Refusal(f"--tasks {task}: its scorer gives its own gold answers {scores} at level {level}; "
                          "leave it out, or try another --level")


def setup(script_args: ScriptArguments) -> Setup:
    """The run's tasks (their golds checked), its curriculum, and the rubric that scores against both."""
    scorer = GymScorer(timeout=script_args.scorer_timeout, engine=script_args.scorer_sandbox,
                       unsafe_without_isolation=script_args.unsafe_scorer_sandbox)
    tasks = TaskSet(script_args.tasks, script_args.task_seed, SYSTEM_PROMPT, scorer)
    for name in tasks.weights:
        top = tasks.top_level(name)
        if not 0 <= script_args.level <= top:
            raise Refusal(f"--level {script_args.level}: {name}'s levels are 0 (easiest) to {top}")
    check_golds(tasks, script_args.level)
    curriculum = Curriculum(tasks, script_args.level, script_args.curriculum_window, script_args.promote_at,
                            script_args.demote_at, enabled=script_args.curriculum and not script_args.dataset_path)
    funcs, weights = rewards.combine({TaskScorer(tasks, curriculum): 1.0, rewards.answer_format_reward: 0.2})
    prompts = partial(build_dataset, tasks=tasks, levels=curriculum.levels, train_size=script_args.train_size,
                      test_size=script_args.num_eval_examples)  # the run's tasks, for evaluate.py and async_grpo.py
    return Setup(funcs, weights, callbacks=[curriculum], build_dataset=prompts, services=[scorer])


def datasets(script_args: ScriptArguments, task: Setup, training_args) -> tuple[Dataset, Dataset | None]:
    """Training prompts generated as the trainer reads them (at the curriculum's levels), and the held-out prompts,
    which training then never asks; or both from --dataset_path."""
    if training_args.world_size > 1 and task.callbacks[0].enabled:
        # each process would move its levels by its own completions, and render one group's copies at two levels
        raise Refusal(f"--curriculum: its levels follow the completions one process scores, and here are "
                      f"{training_args.world_size}: pass --curriculum false (a fixed --level), or train in one process")
    for flag in ("pass_rates", "skip_settled_after"):
        if getattr(training_args, flag) and not script_args.dataset_path:
            raise Refusal(f"--{flag}: this recipe generates its prompts as it trains (its curriculum keeps each task "
                          "where the model solves some): filter prompts written to --dataset_path instead")
    train, held_out = data.load_splits(task.build_dataset, training_args, script_args.dataset_path,
                                       script_args.num_eval_examples)
    if held_out is not None and not script_args.dataset_path:
        task.callbacks[0].tasks.held_out = {turn["content"] for prompt in held_out["prompt"] for turn in prompt[1:]}
    return train, held_out


# %% [markdown]
# ## Trainer
# Pre-flight checks that fail in one line before any model is loaded, then TRL's `GRPOTrainer`.

# %%
def main(argv: list[str] | None = None):
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_recipes import training

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    task = setup(script_args)  # the tasks, the curriculum and the rubric this run trains with
    tokenizer = training.prepare(training_args, model_args, task)
    train_dataset, eval_dataset = datasets(script_args, task, training_args)
    training.check_rows(task, train_dataset, tokenizer)  # prompts rendered, each reward called on real rows
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=task.reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        callbacks=training.trainer_callbacks(task.callbacks),  # the curriculum: levels moved and logged
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
    )
    return training.run(trainer)


# %% [markdown]
# ## Run
# Watch correctness and each task's level together: a level that climbs while correctness holds is the model keeping up
# with harder prompts.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--tasks", "chain_sum", "--max_steps", "50"]

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
