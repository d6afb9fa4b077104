"""A run, before and after the recipe builds its trainer: `prepare` (the pre-flight checks, the tokenizer, the run's
services started) and `run` (train with compact logs, Ctrl-C with the command that resumes, save atomically, plot).

    tokenizer = training.prepare(training_args, model_args, task)  # task: the recipe's setup(script_args)
    training.check_rows(task, train_dataset, tokenizer)            # after the recipe loads its data
    trainer = GRPOTrainer(...)                                      # in the recipe
    training.run(trainer)
"""

import errno
import os
import shlex
import shutil
import sys
import traceback
from pathlib import Path

import torch
from transformers import AutoTokenizer, TrainerCallback, TrainerState
from transformers.integrations import get_reporting_integration_callbacks
from trl import GRPOConfig, GRPOTrainer, ModelConfig

import rewards
from grpo_recipes import contract, difficulty, memory, preflight, row_checks
from grpo_recipes.contract import Setup, StepHooks
from grpo_recipes.console import logger, setup_logging
from grpo_recipes.logs import (PLOT_FILE, CompletionsPrinter, KeepCallbacksMetrics, plot_training, rubric_summary,
                               run_summary, use_compact_logs)
from grpo_recipes.output_dir import checkpoints_in, complete, prepare_output_dir, release_output_dir
from grpo_recipes.refusal import Refusal
from grpo_recipes.trl_patches import reentrant_checkpointing_for_peft_zero3, sync_lora_out_of_place


def prepare(training_args: GRPOConfig, model_args: ModelConfig, task: Setup, generation_server: bool = False,
            server_share: float | None = None):
    """Before the model loads: logging, the pre-flight checks (preflight.py, output_dir.py, memory.py), the run's reward
    weights (the recipe's, unless --reward_weights), wandb and the tokenizer; then the task's services start (a
    sandbox, an index: Setup.start), last, so that a mistake in the options costs one line before they do.
    `generation_server`: a vLLM server generates (async_grpo.py), reserving `server_share` of its GPU."""
    setup_logging()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # one line per process, so a multi-GPU launch shows every rank came up
        logger.warning(f"process {rank} of {world} ready")
    if "OMP_NUM_THREADS" in os.environ:  # torch read it at import, before a YAML `env:` block could set it
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    tools = task.environment_factory is not None
    preflight.check_launch(Path(sys.argv[0]).name if sys.argv[0].endswith(".py") else "<recipe>.py",
                           generation_server=generation_server)
    preflight.check_tools_across_processes(training_args, tools)
    preflight.check_model_options(training_args, model_args)
    if training_args.reward_weights is None:
        training_args.reward_weights = list(task.reward_weights)
    preflight.check_rubric(training_args.reward_weights, task.reward_funcs,
                           [rewards.reward_name(f) for f in task.reward_funcs])
    contract.check_tools(task.environment_factory)
    if training_args.skip_settled_after:
        if generation_server or world > 1:
            raise Refusal("--skip_settled_after keeps its record in the one process that trains and scores: "
                          f"{'not under async_grpo.py' if generation_server else f'here are {world}'}; drop it")
        difficulty.skip_settled(task, training_args.skip_settled_after, training_args.seed)
    preflight.check_caches(model_args.model_name_or_path)
    prepare_output_dir(training_args)
    preflight.check_model_source(model_args.model_name_or_path)
    if getattr(training_args, "use_vllm", False) and training_args.vllm_mode == "colocate":
        memory.size_colocated_vllm(training_args, model_args)
    memory.check_memory(training_args, model_args, server_share=server_share, generation_server=generation_server)
    preflight.check_lora_targets(model_args)
    preflight.check_loggers(training_args)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    if tokenizer.chat_template is None:
        raise Refusal(f"{model_args.model_name_or_path} has no chat template; use an instruct/chat model or set "
                      "tokenizer.chat_template before training.")
    if tools:
        preflight.check_tool_template(tokenizer, model_args.model_name_or_path)
    preflight.check_thinking_template(tokenizer, model_args.model_name_or_path,
                                      getattr(training_args, "thinking", None),
                                      getattr(training_args, "max_completion_length", None))
    preflight.setup_wandb(training_args)
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision,
                                       "attn_implementation": model_args.attn_implementation,
                                       **(training_args.model_init_kwargs or {})}
    reentrant_checkpointing_for_peft_zero3(training_args, model_args.use_peft)
    if model_args.use_peft and getattr(training_args, "use_vllm", False):
        sync_lora_out_of_place()  # the frozen base stays as loaded (trl_patches.lora_weights_for_vllm says why)
    task.start()
    return tokenizer


def check_rows(task: Setup, train_dataset, tokenizer) -> None:
    """The first training rows, before the model loads (row_checks.py): their prompts as the chat template renders
    them, and every reward called on them as TRL will call it."""
    row_checks.check_prompts(train_dataset, "train", tokenizer, tokenizer.name_or_path)
    row_checks.check_rubric(task.reward_funcs, train_dataset, "train", task.environment_factory, TrainerState())


def run(trainer: GRPOTrainer, reward_funcs: list | None = None) -> GRPOTrainer:
    """Train the trainer a recipe built (compact logs; Ctrl-C prints the command that resumes; resumes when asked),
    save the model to its output_dir, and plot its curves there. Logs what runs first: the summary and the rubric
    (reward_funcs, where the trainer keeps none: the async trainer)."""
    trainable_in_float32(trainer.model)
    logger.info(run_summary(trainer.args, trainer.model))
    rubric = rubric_summary(reward_funcs or trainer.reward_funcs, trainer.args.reward_weights)
    logger.info(f"rubric (rewards.py documents each):\n{rubric}")
    run_training(trainer)
    output_dir = trainer.args.output_dir
    save_atomically(output_dir, trainer.save_model, trainer.args.should_save, trainer.accelerator.wait_for_everyone)
    if trainer.is_world_process_zero():
        plot_training(trainer.state.log_history, Path(output_dir) / PLOT_FILE)
    logger.info(f"saved the trained model and {PLOT_FILE} to {output_dir}")
    return trainer


def trainer_callbacks(hooks: list[StepHooks]) -> list[TrainerCallback]:
    """A recipe's StepHooks (Setup.callbacks) as the trainer's callbacks."""
    return [_HooksCallback(hook) for hook in hooks]


class _HooksCallback(TrainerCallback):
    """Passes the trainer's events that StepHooks names to one of them."""

    def __init__(self, hooks: StepHooks):
        self.hooks = hooks

    def on_train_begin(self, args, state, control, **kwargs):
        self.hooks.on_train_begin(args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        self.hooks.on_train_end(args, state, control, **kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        self.hooks.on_step_begin(args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        self.hooks.on_step_end(args, state, control, **kwargs)

    def on_prediction_step(self, args, state, control, **kwargs):
        self.hooks.on_prediction_step(args, state, control, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.hooks.on_log(args, state, control, logs=logs, **kwargs)


def trainable_in_float32(model) -> None:
    """Trained weights stay float32, as the recipes' precision rule says (configs.default_precision), before the
    optimizer exists: TRL 1.16's GRPOTrainer casts a quantized (QLoRA) model's adapter to bfloat16, where AdamW's
    steps at the recipes' LoRA rates are mostly below bf16's resolution (one step moved 15-62% of lora_A's entries at
    1e-5..5e-5, 100% in float32). PEFT's quantized layers run a float32 adapter on half-precision inputs as they do by
    default. Other models keep what they were loaded with."""
    if not (getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)):
        return
    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()


def save_atomically(output_dir: str | Path, save, moves: bool = True, wait=lambda: None) -> None:
    """save(folder) into a staging folder inside output_dir, then each file renamed into output_dir: a full disk or a
    kill while writing leaves the model that was there before whole. Every process calls save (it may gather a
    sharded model) and then `wait` (the trainer's barrier, so that every shard is written); the processes that write
    (`moves`) rename. Ends the run's hold on the folder (output_dir.release_output_dir)."""
    output, staging = Path(output_dir), Path(output_dir) / ".saving"
    try:
        if moves:
            shutil.rmtree(staging, ignore_errors=True)  # an earlier save cut short: none of its files are kept
        save(str(staging))
        wait()
        if moves:
            for path in staging.iterdir():
                if path.is_dir() and (output / path.name).is_dir():
                    shutil.rmtree(output / path.name)
                os.replace(path, output / path.name)
            staging.rmdir()
    except Exception as err:
        if not disk_full(err, output):
            raise
        shutil.rmtree(staging, ignore_errors=True)
        raise Refusal(f"no space left on the device of {output} while saving the final model: what was "
                      f"there is unchanged{checkpoint_note(output)}; free some space and run again") from None
    release_output_dir(output)


def disk_full(err: Exception, output: Path) -> bool:
    """Whether err is a write that failed for want of space: an OSError saying so, or one of the errors torch.save
    raises instead ('unexpected pos', 'iostream error'), raised while saving, on a device with almost nothing free."""
    chain = [err, err.__context__, err.__cause__]
    if any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain):
        return True
    if any(words in str(e) for e in chain for words in ("No space left on device", "os error 28", "quota exceeded")):
        return True
    saving = any("save" in frame.name for frame in traceback.extract_tb(err.__traceback__))
    try:
        return saving and shutil.disk_usage(output).free < 16 * 2**20
    except OSError:
        return False


def checkpoint_note(output: Path) -> str:
    """', the newest complete checkpoint is checkpoint-N' (or nothing), for a message after a failed save."""
    saved = [p for p in checkpoints_in(output) if complete(p)]
    return f", and the newest complete checkpoint is {saved[-1].name}" if saved else ""


def run_training(trainer, training_args=None) -> None:
    """trainer.train() with compact logs; Ctrl-C saves nothing new and prints the exact command that resumes; a full
    disk while saving a checkpoint is one line (the checkpoint it cut short is skipped on resume)."""
    training_args = training_args or trainer.args
    use_compact_logs(trainer)
    trainer.add_callback(KeepCallbacksMetrics())
    # The reporters (wandb, TensorBoard, ...) last, so that they see what the other callbacks add to a log.
    reporters = tuple(get_reporting_integration_callbacks(training_args.report_to))
    trainer.callback_handler.callbacks.sort(key=lambda callback: isinstance(callback, reporters))
    if getattr(training_args, "log_completions", False) and hasattr(trainer, "_logs"):
        trainer.num_completions_to_print = 0  # TRL's own rich table: 0 prints none (the parquet files stay)
        trainer.add_callback(CompletionsPrinter(trainer))
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    except KeyboardInterrupt:
        step, checkpoints = trainer.state.global_step, list(Path(training_args.output_dir).glob("checkpoint-*"))
        if not checkpoints:
            raise Refusal(f"\ninterrupted at step {step}, before the first checkpoint "
                          f"(save_steps={training_args.save_steps}): nothing to resume; "
                          "rerun to start over", exit_code=130) from None
        raise Refusal(f"\ninterrupted at step {step}; resume from the newest checkpoint with: {resume_command()}",
                      exit_code=130) from None  # 130: the shell's code for Ctrl-C
    except Exception as err:
        if (line := stopped_elsewhere(err)) is not None:  # async_grpo.py: a tool's service gone in the rollout process
            raise Refusal(line) from None
        output = Path(training_args.output_dir)
        if not disk_full(err, output):
            raise
        note = checkpoint_note(output)
        fix = f"free some space, then resume with: {resume_command()}" if note else "free some space and run again"
        raise Refusal(f"no space left on the device of {output} at step {trainer.state.global_step}, "
                      f"while saving{note.replace(', and the', '; the')}: {fix}") from None


def stopped_elsewhere(err: Exception) -> str | None:
    """The line of a StopRun or Refusal raised in TRL's async rollout process (an MCP server gone, a sandbox that cannot
    start), or None: TRL 1.16 re-raises it here as a RuntimeError caused by one whose text is `<type>: <line>` and the
    child's traceback."""
    name, _, rest = str(err.__cause__ or "").partition(": ")
    return rest.split("\n", 1)[0] if name in ("StopRun", "Refusal") and rest else None


def resume_command() -> str:
    """This run's own command line with `--resume_from_checkpoint last` (a notebook: what to add to NOTEBOOK_ARGS)."""
    if "ipykernel" in sys.modules:
        return "add '--resume_from_checkpoint', 'last' to NOTEBOOK_ARGS and run the cell again"
    argv, kept = sys.argv[1:], []
    while argv:
        flag = argv.pop(0)
        if flag in ("--resume_from_checkpoint", "--overwrite_output_dir"):
            if argv and not argv[0].startswith("--"):
                argv.pop(0)
            continue
        kept.append(flag)
    return shlex.join(["python", sys.argv[0], *kept, "--resume_from_checkpoint", "last"])

