"""Option values in range, before anything loads: counts, rates and probabilities where TRL would divide by zero or
train nothing, and batches TRL would reject, each as one line naming the option, its value and the fix."""

import dataclasses
import math
import os
import re

from grpo_recipes.refusal import Refusal


def check_batch_divisibility(args) -> None:
    """Say in one line how to fix a batch that TRL would reject, naming the smallest working batch size."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batch, n = args.per_device_train_batch_size, args.num_generations
    steps = args.steps_per_generation or args.gradient_accumulation_steps
    if args.generation_batch_size is None and (batch * world * steps) % n:
        multiple = n // math.gcd(n, world * steps)
        fix = math.ceil(batch / multiple) * multiple
        raise Refusal(f"per_device_train_batch_size × processes × steps_per_generation = {batch} × {world} × {steps} "
                      f"is not a multiple of num_generations={n}: pass --per_device_train_batch_size {fix} or a "
                      "smaller --num_generations.")
    eval_batch, n_eval = args.per_device_eval_batch_size, args.num_generations_eval or n
    if args.eval_strategy != "no" and (eval_batch * world) % n_eval:
        raise Refusal(f"per_device_eval_batch_size × processes = {eval_batch} × {world} is not a multiple of "
                      f"num_generations_eval={n_eval}: pass --per_device_eval_batch_size {n_eval}.")


def _positive(value) -> bool:
    return value > 0


def _fraction(value) -> bool:
    return 0 < value <= 1


def _probability(value) -> bool:
    return 0 <= value < 1


# option -> (whether a value is in range, the range in words). None always passes: "not set".
RANGES = {
    "num_generations": (lambda v: v >= 2, "at least 2 (GRPO compares the completions of one prompt with each other)"),
    "max_steps": (lambda v: v > 0 or v == -1, "a positive number of steps, or -1 to train --num_train_epochs"),
    "num_train_epochs": (_positive, "positive"), "learning_rate": (_positive, "positive"),
    "lora_learning_rate": (_positive, "positive"), "temperature": (_positive, "positive (1.0 samples the model as is)"),
    "top_p": (_fraction, "in (0, 1]"), "min_p": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "top_k": (lambda v: v >= -1, "0 or -1 (off), or a positive number of tokens"),
    "vllm_gpu_memory_utilization": (_fraction, "in (0, 1], the share of the GPU's memory vLLM may take"),
    "top_entropy_quantile": (lambda v: 0 <= v <= 1, "in [0, 1]"), "lora_dropout": (_probability, "in [0, 1)"),
    "adam_beta1": (_probability, "in [0, 1)"), "adam_beta2": (_probability, "in [0, 1)"),
    "repetition_penalty": (_positive, "positive (1.0: none)"), "adam_epsilon": (_positive, "positive"),
    "lora_alpha": (_positive, "positive"),
    "max_inflight_tasks": (lambda v: v > 0 or v == -1, "positive, or -1 (TRL sizes it)"),  # async_grpo.py
}
NOT_NEGATIVE = ("warmup_steps", "weight_decay", "max_grad_norm", "beta", "epsilon", "epsilon_high", "delta",
                "dataloader_num_workers", "eval_delay", "label_smoothing_factor", "entropy_coef",
                "max_staleness")  # async_grpo.py: 0 is TRL's strict policy (rollouts of the current version only)
# Counts, sizes, lengths and times: a recipe's own options named so as well as TRL's.
POSITIVE_NAME = re.compile(r"^num_|^max_|_size$|_steps$|_length$|_iterations$|_limit$|^lora_r$|_workers$|seconds|"
                           r"_timeout$|_chars$|_tokens$|_top_k$|^best_of$|_per_step$")
MAY_BE_ZERO = {"dataloader_num_workers", "warmup_steps", "max_grad_norm", "num_completions_to_print"}


def check_ranges(options) -> None:
    """Every numeric option of a parsed config (a dataclass) in its range, before anything loads: one line naming the
    option, its value and the range (`--num_generations 0` would divide by zero in TRL's batch check)."""
    for item in dataclasses.fields(options):
        name, value = item.name, getattr(options, item.name, None)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isnan(value):
            raise Refusal(f"--{name} nan: a number is needed")
        if name in RANGES:
            check, allowed = RANGES[name]
        elif name in NOT_NEGATIVE:
            check, allowed = (lambda v: v >= 0), "0 or more"
        elif POSITIVE_NAME.search(name) and name not in MAY_BE_ZERO:
            check, allowed = _positive, "positive"
        else:
            continue
        if not check(value):
            raise Refusal(f"--{name} {value:g}: must be {allowed}")

