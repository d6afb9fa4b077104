"""What a run reports (its console lines: console.py): one
compact line per logging step, the rubric and the run in one line each, completions as plain text, and the curves it
saves (training_curves.png)."""

import json
import math
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

import rewards

PLOT_FILE = "training_curves.png"


def run_summary(training_args, model) -> str:
    """What runs, in one line, read off the trainer's own args and model: the model, LoRA or full, the effective
    learning rate and the option it came from, the completion length, steps, precision and generation."""
    peft = getattr(model, "peft_config", None)
    tuning = f"LoRA r={next(iter(peft.values())).r}" if peft else "full fine-tune"
    tuning += ", 4-bit base" if getattr(model, "is_loaded_in_4bit", False) else ""
    rate_from = getattr(training_args, "learning_rate_from", "learning_rate")
    why = " (lora_learning_rate: --use_peft without --learning_rate)" if rate_from == "lora_learning_rate" else ""
    if not hasattr(training_args, "use_vllm"):  # async_grpo.py: generation on a server, beside training
        generation = (f"the vLLM server at {training_args.vllm_server_base_url}, asynchronous (TRL's experimental "
                      f"AsyncGRPOTrainer, max_staleness {training_args.max_staleness})")
    elif training_args.use_vllm and training_args.vllm_mode == "colocate":  # its share and context, as sized
        generation = (f"vLLM (colocate, {training_args.vllm_gpu_memory_utilization:.2f} of the GPU, context "
                      f"{training_args.vllm_max_model_length or 'the model default'})")
    elif training_args.use_vllm:
        generation = f"vLLM ({training_args.vllm_mode})"
    else:
        generation = "transformers" + (" (install vLLM for faster generation)" if torch.cuda.is_available() else "")
    precision = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
    return (f"model {model.config._name_or_path} | {tuning} | learning_rate {training_args.learning_rate:g}{why} | "
            f"max_completion_length {training_args.max_completion_length} | max_steps {training_args.max_steps} | "
            f"precision {precision} | generation with {generation}")


def compact_line(state, logs: dict) -> str:
    """One log line: step, total reward and each reward component, length, tool calls, seconds per step, loss, lr."""
    if "train_runtime" in logs:
        return f"done: {state.global_step} steps in {logs['train_runtime']:.0f} s"
    prefix = "eval_" if any(key.startswith("eval_") for key in logs) else ""
    parts = [f"{'eval at ' if prefix else ''}step {state.global_step}/{state.max_steps}"]
    if f"{prefix}reward" in logs:
        components = " ".join(f"{key[len(prefix) + 8:].removesuffix('/mean').removesuffix('_reward')} "
                              f"{number(value, '.2f')}" for key, value in logs.items()
                              if key.startswith(f"{prefix}rewards/") and (key.endswith("/mean") or key.count("/") == 1))
        # (the async trainer logs rewards/<name>, each times its weight; GRPOTrainer rewards/<name>/mean, unweighted)
        parts.append(f"reward {number(logs[prefix + 'reward'], '.3f')} ({components})")
    shown = (("completions/mean_length", "length", ".0f"), ("tools/call_frequency", "tool calls", ".2f"),
             ("tools/seconds", "tool s", ".1f"), ("step_time", "s/step", ".2f"), ("perf/step_s", "s/step", ".2f"),
             # async_grpo.py: policy versions behind, seconds waiting for rollouts, rollouts dropped as too old,
             # the share of the time the server generated, the adapter version it generates with
             ("sample/staleness_mean", "staleness", ".2f"), ("perf/rollout_wait_s", "waited s", ".2f"),
             ("sample/dropped_stale_total", "dropped stale", ".0f"), ("server/busy_frac", "server busy", ".0%"),
             ("sync/adapter_version", "adapter v", ".0f"), ("loss", "loss", ".4g"),
             ("mean_token_accuracy", "token accuracy", ".3f"), ("learning_rate", "lr", ".3g"))
    for key, label, form in shown:
        if prefix + key in logs:
            parts.append(f"{label} {number(logs[prefix + key], form)}")
    return " | ".join(parts)


def number(value, form: str) -> str:
    """A logged number in `form`; n/a where TRL logs None (a reward that scored no completion of the batch)."""
    return "n/a" if value is None else f"{value:{form}}"


class CompactProgress(ProgressCallback):
    """TRL's progress bar, with one compact line per logging step instead of a dict of every metric."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.write(compact_line(state, logs))


class CompactPrinter(PrinterCallback):
    """With --disable_tqdm: the same compact line, printed."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero:
            print(compact_line(state, logs), flush=True)


def use_compact_logs(trainer) -> None:
    """The trainer's progress bar and printed logs replaced by their compact forms (one line per logging step)."""
    for verbose, compact in ((ProgressCallback, CompactProgress), (PrinterCallback, CompactPrinter)):
        if trainer.pop_callback(verbose) is not None:
            trainer.add_callback(compact)


class KeepCallbacksMetrics(TrainerCallback):
    """What other callbacks add to a log (tool_use_grpo's `tools/seconds`) kept in the logged history, so it reaches
    trainer_state.json: the Trainer records a log before its callbacks see it. Added last, it sees every addition."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.log_history:  # the entry the Trainer has just recorded for this log
            state.log_history[-1].update({key: value for key, value in logs.items()
                                          if key not in state.log_history[-1]})


def rubric_summary(reward_funcs: list, weights: list[float], width: int = 110) -> str:
    """The rubric in readable width: weight, name and what each reward pays for."""
    rows = []
    for name, weight, pays_for, _ in rewards.describe(reward_funcs, weights):
        line = f"  {weight:>5g} × {name}: {pays_for}"
        rows.append(line if len(line) <= width else line[:width - 1] + "…")
    return "\n".join(rows)


def plot_training(log_history: list[dict], path: Path) -> Path:
    """Save each reward component, the total reward and the mean completion length (SFT: loss) over steps as a PNG."""
    from matplotlib.figure import Figure  # not pyplot: no display backend needed, in a script or a notebook

    keys = list(dict.fromkeys(k for e in log_history for k in e if k.startswith("rewards/") and k.endswith("/mean")))
    keys += ["reward", "completions/mean_length"] if keys else ["loss", "mean_token_accuracy"]
    keys = [k for k in keys if any(k in e or f"eval_{k}" in e for e in log_history)]
    columns, rows = min(len(keys), 3) or 1, math.ceil(len(keys) / 3) or 1
    figure = Figure(figsize=(4 * columns, 3 * rows), layout="constrained")
    for i, key in enumerate(keys):
        axes = figure.add_subplot(rows, columns, i + 1)
        for prefix, style in (("", "-"), ("eval_", "o--")):  # training steps, then evaluations when there were any
            points = [(e["step"], e[prefix + key]) for e in log_history if e.get(prefix + key) is not None]
            if points:
                axes.plot(*zip(*points, strict=True), style, label="eval" if prefix else "train")
        axes.set_title("total reward" if key == "reward" else key.removeprefix("rewards/").removesuffix("/mean"))
        axes.set_xlabel("step")
        axes.legend()
    figure.savefig(path, dpi=90)
    return Path(path)


def completions_text(logs: dict, n: int | None, where: str, stride: int = 1) -> str:
    """Completions as plain text, one block each: its rewards and advantage on the first line, then the question
    (the prompt's last message; the system prompt is the recipe's, the same every time) and every turn of the
    completion with its tool calls. Readable at any width, in a file, a terminal or a notebook."""
    count = len(logs["completion"])
    order = sorted(range(count), key=lambda i: (i % stride, i))  # the first of each group, then the second, ...
    blocks = []
    for shown, i in enumerate(order[:count if n is None else n], start=1):
        scores = ", ".join(f"{name.removesuffix('_reward')} {number(values[i], '.2f')}"
                           for name, values in logs["rewards"].items())
        advantages = logs.get("advantages") or []
        advantage = f"; advantage {number(advantages[i], '+.2f')}" if i < len(advantages) else ""
        prompt, completion = logs["prompt"][i], logs["completion"][i]
        question = prompt[-1] if isinstance(prompt, list) else {"role": "prompt", "content": prompt}
        turns = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
        lines = [f"--- completion {shown} {where}: {scores}{advantage}"]
        for turn in [question, *turns]:
            calls = [f"[{c['function']['name']}({arguments_text(c['function']['arguments'])})]"
                     for c in turn.get("tool_calls") or []]
            lines.append(f"{turn['role']}: {turn.get('content') or ''}{' '.join(calls)}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def arguments_text(arguments) -> str:
    """A tool call's arguments as JSON (TRL keeps them parsed, a dict; other sources keep the JSON string)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


class CompletionsPrinter(TrainerCallback):
    """--log_completions: num_completions_to_print completions of each logged step (one per prompt), as plain text.
    TRL prints them as a rich table of 8+ columns at the console's width (80 in a file or a notebook): cut to '…'."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and "train_runtime" not in (logs or {}) and self.trainer._logs["completion"]:
            where = "at eval" if any(key.startswith("eval_") for key in logs or {}) else "at step"
            group = (args.num_generations_eval or args.num_generations) if where == "at eval" else args.num_generations
            tqdm.write(completions_text(self.trainer._logs, args.num_completions_to_print,
                                        f"{where} {state.global_step}", stride=group))
