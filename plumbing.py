"""The plumbing every recipe shares, so that a recipe file holds only what a person edits.

A recipe keeps its model, defaults, data, system prompt, tools and rewards, and calls this module in a few lines
(as TRL's own `scripts/grpo.py` imports its plumbing from `trl`):

    script_args, training_args, model_args = plumbing.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    tokenizer = plumbing.prepare(training_args, model_args, REWARD_FUNCS)
    train_dataset, eval_dataset = plumbing.load_splits(build_dataset, script_args, training_args)
    return plumbing.train(model_args, training_args, tokenizer, train_dataset, eval_dataset, REWARD_FUNCS)

What is here: the config classes with hardware-aware defaults (precision, vLLM), the pre-flight checks that fail in one
line before a model loads (options, flags and YAML keys, batch divisibility, model options, chat templates that TRL can
parse tool calls from, the output directory, the model's source, the network), wandb set-up, split loading, the
trainer call with resume/save/plot and Ctrl-C, compact logs, notebook arguments, and the training plots. Every mistake
a user can make here ends in one line naming the fix; a real bug still shows its traceback. Editing this file changes
every recipe; editing a recipe changes only that recipe.
"""

import ast
import difflib
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import datasets
import huggingface_hub
import torch
import yaml
from datasets import Dataset, load_dataset
from transformers import AutoTokenizer, PrinterCallback, ProgressCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer, ModelConfig, SFTConfig, TrlParser, get_peft_config, get_quantization_config
from trl.chat_template_utils import add_response_schema, supports_tool_calling

import rewards

logger = logging.getLogger("grpo-recipes")
PLOT_FILE = "training_curves.png"
# Sized for Colab's free T4 (16 GB, no native bf16): LoRA on the 0.5B model, 100 steps of 16 completions, evaluations
# and checkpoints every 50 steps. A recipe's COLAB_ARGS adds its lengths; a notebook's NOTEBOOK_ARGS override both.
COLAB_T4_ARGS = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--use_peft", "--learning_rate", "2e-5",
                 "--max_steps", "100", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "1",
                 "--eval_steps", "50", "--save_steps", "50", "--num_eval_examples", "64"]


def arg(default, help: str):
    """A dataclass field with its --help text, for a recipe's ScriptArguments."""
    return field(default=default, metadata={"help": help})


# ----------------------------------------------------------------------------------------------------------- config
@dataclass
class RecipeGRPOConfig(GRPOConfig):
    """GRPOConfig whose precision and vLLM switch default to what this machine supports."""

    use_vllm: bool | None = field(default=None, metadata={"nargs": "?", "const": True, "help": "Generate with vLLM. "
                                  "Default: on when vLLM is installed and a CUDA GPU is present, off otherwise."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Start over in an output_dir that already "
                                       "holds checkpoints, deleting them. Default: refuse, and say how to resume."})
    lora_learning_rate: float | None = field(default=None, metadata={"help": "The learning rate with --use_peft when "
                                             "--learning_rate is not given. Default: 10 x the recipe's full fine-tune "
                                             "rate, as LoRA needs (Schulman et al., 'LoRA Without Regret', 2025)."})
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
        elif self.use_vllm and not cuda:
            sys.exit("--use_vllm needs a CUDA GPU; drop --use_vllm to generate with transformers.")
        check_batch_divisibility(self)
        super().__post_init__()  # turns a --chat_template_kwargs JSON string into a dict
        if self.thinking is not None:
            self.chat_template_kwargs = {**(self.chat_template_kwargs or {}), "enable_thinking": self.thinking}


@dataclass
class RecipeSFTConfig(SFTConfig):
    """SFTConfig with the recipes' precision defaults and the same output directory guard as RecipeGRPOConfig."""

    overwrite_output_dir: bool = field(default=False, metadata={"help": "Start over in an output_dir that already "
                                       "holds checkpoints, deleting them. Default: refuse, and say how to resume."})

    def __post_init__(self):
        default_precision(self)
        super().__post_init__()


def default_precision(args) -> bool:
    """Unless the user chose: bf16 where the GPU has it, fp16 otherwise (T4), fp32 on CPU. Returns: training on CUDA?"""
    cuda = torch.cuda.is_available() and not args.use_cpu
    if args.bf16 is None and not args.fp16:
        args.bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)  # a T4 only emulates bf16
        args.fp16 = cuda and not args.bf16
    return cuda


def check_batch_divisibility(args: GRPOConfig) -> None:
    """Say in one line how to fix a batch that TRL would reject, naming the smallest working batch size."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batch, n = args.per_device_train_batch_size, args.num_generations
    steps = args.steps_per_generation or args.gradient_accumulation_steps
    if args.generation_batch_size is None and (batch * world * steps) % n:
        multiple = n // math.gcd(n, world * steps)
        fix = math.ceil(batch / multiple) * multiple
        sys.exit(f"per_device_train_batch_size × processes × steps_per_generation = {batch} × {world} × {steps} is "
                 f"not a multiple of num_generations={n}: pass --per_device_train_batch_size {fix} or a smaller "
                 "--num_generations.")
    eval_batch, n_eval = args.per_device_eval_batch_size, args.num_generations_eval or n
    if args.eval_strategy != "no" and (eval_batch * world) % n_eval:
        sys.exit(f"per_device_eval_batch_size × processes = {eval_batch} × {world} is not a multiple of "
                 f"num_generations_eval={n_eval}: pass --per_device_eval_batch_size {n_eval}.")


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
    apply_dependent_defaults(training_args, model_args, given, defaults)
    return script_args, training_args, model_args


def apply_dependent_defaults(training_args, model_args, given: set[str], defaults: dict) -> None:
    """Defaults that depend on other options, applied only where the user did not choose: LoRA's learning rate,
    bf16 weights where the GPU computes in bf16, and no vLLM beside a 4-bit model."""
    if model_args.use_peft and "learning_rate" not in given and hasattr(training_args, "lora_learning_rate"):
        training_args.learning_rate = training_args.lora_learning_rate or 10 * defaults.get(
            "learning_rate", training_args.learning_rate)
    if training_args.bf16 and "dtype" not in given and model_args.dtype in (None, "float32"):
        model_args.dtype = "bfloat16"  # half the weights' memory; bf16 training computes in bf16 anyway
    if model_args.load_in_4bit and getattr(training_args, "use_vllm", False):
        if not training_args.use_vllm_chosen:
            sys.exit("--use_vllm with --load_in_4bit: TRL would merge the LoRA adapter into the 4-bit base for vLLM "
                     "at every step (a lossy requantisation on the CPU, reported to crash); drop one of them")
        training_args.use_vllm = False  # the same reason: generate with transformers beside a 4-bit model
        logger.warning("--load_in_4bit: generating with transformers, not vLLM (vLLM would need the adapter merged "
                       "into the 4-bit model at every step)")


# ------------------------------------------------------------------------------------------------------- pre-flight
def setup_wandb(training_args: GRPOConfig) -> None:
    """Never block on wandb's interactive login: without credentials, log offline (sync later with `wandb sync`)."""
    if "wandb" not in training_args.report_to:
        return
    if importlib.util.find_spec("wandb") is None:
        sys.exit("--report_to wandb: wandb is not installed; `pip install wandb`.")
    netrc_path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))  # where `wandb login` stores the key
    logged_in = netrc_path.is_file() and "api.wandb.ai" in netrc_path.read_text(errors="ignore")
    if not (os.environ.get("WANDB_API_KEY") or logged_in or os.environ.get("WANDB_MODE")):
        os.environ["WANDB_MODE"] = "offline"
        logger.warning("wandb: no API key (WANDB_API_KEY or `wandb login`): logging offline; upload with `wandb sync`.")


def check_model_options(training_args: GRPOConfig, model_args: ModelConfig, reward_funcs: list) -> None:
    """Fail in one line on options TRL would only reject after loading the model."""
    if len(training_args.reward_weights) != len(reward_funcs):
        sys.exit(f"--reward_weights has {len(training_args.reward_weights)} values for {len(reward_funcs)} reward "
                 f"functions ({', '.join(rewards.reward_name(f) for f in reward_funcs)}).")
    quantized = model_args.load_in_4bit or model_args.load_in_8bit
    if quantized and not model_args.use_peft:
        sys.exit("--load_in_4bit/--load_in_8bit freeze the quantized model: add --use_peft to train LoRA adapters.")
    if quantized and importlib.util.find_spec("bitsandbytes") is None:
        sys.exit("--load_in_4bit/--load_in_8bit need bitsandbytes: `pip install bitsandbytes`.")
    if model_args.load_in_4bit and model_args.dtype == "float32":  # QLoRA computes in half precision, not fp32
        model_args.dtype = "bfloat16" if training_args.bf16 else "float16"


GiB = 1024**3


@lru_cache(maxsize=8)
def _sizes(config_json: str) -> tuple[int, int, int]:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**json.loads(config_json))
    with torch.device("meta"):  # the real architecture, no memory
        model = AutoModelForCausalLM.from_config(config)
    linears = [module for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")]
    return (sum(p.numel() for p in model.parameters()), sum(m.weight.numel() for m in linears),
            sum(m.in_features + m.out_features for m in linears))


def count_parameters(model_config) -> tuple[int, int, int]:
    """(all parameters, those in the decoder's linear layers, LoRA parameters per unit of rank on every linear layer
    but the output head, as PEFT's 'all-linear' places them) of a model config."""
    return _sizes(model_config.to_json_string())


def estimate_memory(model_config, *, bf16: bool, use_peft: bool, load_in_4bit: bool, lora_r: int, batch: int,
                    sequence: int, completion: int, checkpointing: bool, vllm_bytes: float = 0.0) -> dict[str, float]:
    """Peak GPU memory of one training process, in bytes, by part.

    Weights: 2 bytes a parameter in bf16, 4 in fp32; 4-bit (QLoRA) linear layers 0.5 byte plus a 4-byte scale per
    64 weights, the rest in bf16. Trainable: every parameter, or LoRA's (kept in fp32 by PEFT). Gradients: one value
    per trainable parameter; AdamW: two (exp_avg, exp_avg_sq), in the trainable parameters' dtype. Activations: the
    completion tokens' logits (in bf16, plus an fp32 copy for the log-softmax) and the hidden states (with
    checkpointing: one per layer and one layer's working set; without: about 16 hidden-sized and 3
    intermediate-sized tensors per layer). Plus what vLLM reserves beside it, and 1 GiB of CUDA context. An estimate
    to decide before loading, not an allocator: tests check it against hand arithmetic.
    """
    params, linear, lora_per_rank = count_parameters(model_config)
    dtype_bytes = 2 if bf16 else 4
    weights = linear * (0.5 + 4 / 64) + (params - linear) * 2 if load_in_4bit else params * dtype_bytes
    trainable, train_bytes = (lora_r * lora_per_rank, 4) if use_peft else (params, dtype_bytes)
    hidden, layers = model_config.hidden_size, model_config.num_hidden_layers
    tokens = batch * sequence
    logits = batch * completion * model_config.vocab_size * (2 + 4)
    per_layer = tokens * (hidden * 16 + model_config.intermediate_size * 3) * 2
    hidden_states = tokens * hidden * 2 * layers + per_layer if checkpointing else per_layer * layers
    return {"weights": weights, "gradients": trainable * train_bytes, "optimizer": 2 * trainable * train_bytes,
            "activations": logits + hidden_states, "vllm": vllm_bytes, "cuda context": 1 * GiB}


def check_memory(training_args, model_args, prompt_tokens: int = 256, gpu: tuple[int, int] | None = None) -> None:
    """On a GPU, before the model loads: exit in one line, with options that fit, when the estimate exceeds its free
    memory. `gpu` is (free, total) bytes; by default this machine's first GPU, and nothing to check without one."""
    if gpu is None and (not torch.cuda.is_available() or training_args.use_cpu):
        return
    from transformers import AutoConfig

    free, total = gpu or torch.cuda.mem_get_info()
    model_config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    colocated = getattr(training_args, "use_vllm", False) and training_args.vllm_mode == "colocate"
    vllm = training_args.vllm_gpu_memory_utilization * total if colocated else 0.0
    completion = getattr(training_args, "max_completion_length", 512)

    def peak(**changes) -> float:
        options = dict(bf16=bool(training_args.bf16), use_peft=model_args.use_peft,
                       load_in_4bit=model_args.load_in_4bit, lora_r=model_args.lora_r,
                       batch=training_args.per_device_train_batch_size, sequence=prompt_tokens + completion,
                       completion=completion,
                       checkpointing=bool(training_args.activation_checkpointing), vllm_bytes=vllm)
        return sum(estimate_memory(model_config, **{**options, **changes}).values())

    needed = peak()
    logger.info(f"GPU memory: about {needed / GiB:.1f} GiB needed, {free / GiB:.1f} of {total / GiB:.1f} GiB free")
    if needed <= free:
        return
    candidates = {"--use_peft": dict(use_peft=True), "--use_peft --load_in_4bit": dict(use_peft=True,
                  load_in_4bit=True), "--per_device_train_batch_size "
                  f"{max(1, training_args.per_device_train_batch_size // 2)}":
                  dict(batch=max(1, training_args.per_device_train_batch_size // 2)),
                  "--activation_checkpointing true": dict(checkpointing=True),
                  "--vllm_gpu_memory_utilization 0.15": dict(vllm_bytes=0.15 * total if colocated else 0.0)}
    fits = [f"{flags} (~{peak(**change) / GiB:.1f} GiB)" for flags, change in candidates.items()
            if peak(**change) <= free and peak(**change) < needed]
    sys.exit(f"this run needs about {needed / GiB:.1f} GiB of GPU memory and {free / GiB:.1f} GiB are free: "
             + (f"try {'; or '.join(fits)}" if fits else "use a smaller model, or a GPU with more memory"))


def check_tool_template(tokenizer, model_name: str) -> None:
    """TRL must be able to render tool calls with this chat template and parse them back out of completions."""
    try:
        add_response_schema(tokenizer)
        parses = True
    except ValueError:
        parses = False
    if not (parses and supports_tool_calling(tokenizer)):
        raise SystemExit(f"{model_name}: TRL cannot parse tool calls with this chat template. Use a model from a "
                         "family TRL supports for tool calling: Qwen2.5, Qwen3, Qwen3.5, Llama 3.1/3.2, GLM-4-MoE, "
                         "gpt-oss, LFM2, Gemma 4 or DeepSeek-R1-Distill.")


def check_thinking_template(tokenizer, model_name: str, thinking: bool | None) -> None:
    """A template that reads enable_thinking gets TRL's response parser, which moves each turn's <think> block out of
    the message content (into reasoning_content): every rubric then judges only what follows the thinking, in every
    recipe, as it would for a model that does not think."""
    if "enable_thinking" not in str(tokenizer.chat_template):
        if thinking is not None:
            sys.exit(f"--thinking: {model_name}'s chat template has no enable_thinking switch (Qwen3-style templates "
                     "have one); drop --thinking for this model.")
        return
    try:
        add_response_schema(tokenizer)
    except ValueError:
        sys.exit(f"{model_name}: its chat template thinks (enable_thinking) but TRL cannot parse the thinking out of "
                 "its completions; use a Qwen3 or Qwen3.5 model, or a template TRL knows.")


class Reader:
    """A frozen model behind an OpenAI-compatible endpoint that summarises a passage for a question (a sub-agent
    tool: search_agent_grpo.py --reader_base_url). On a timeout, an error or an empty reply: the passage itself."""

    def __init__(self, base_url: str, model: str, timeout: float, max_tokens: int, prompt: str):
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=os.environ.get("READER_API_KEY", "none"), timeout=timeout,
                             max_retries=0)  # a retry would double the wait a timeout bounds
        self.model, self.max_tokens, self.prompt = model, max_tokens, prompt
        self.calls = self.fallbacks = 0

    def summarise(self, passage: str, question: str) -> str:
        self.calls += 1
        try:
            reply = self.client.chat.completions.create(
                model=self.model, max_tokens=self.max_tokens, temperature=0.0,
                messages=[{"role": "system", "content": self.prompt},
                          {"role": "user", "content": f"Question: {question}\n\nPassage:\n{passage}"}])
            summary = (reply.choices[0].message.content or "").strip()
        except Exception as err:  # noqa: BLE001 - whatever the endpoint does, the episode goes on with the passage
            summary, why = "", type(err).__name__
        else:
            why = "an empty reply"
        if not summary:
            self.fallbacks += 1
            logger.warning(f"reader: {why}; `read` returned the passage itself ({self.fallbacks} of {self.calls} "
                           "reads so far)")
            return passage
        return f"{passage.split('] ', 1)[0]}] (summary) {summary}"


@dataclass
class ReaderArguments:
    """The flags of a sub-agent reader: a recipe's ScriptArguments subclasses this to offer one."""
    reader_base_url: str | None = arg(None, "A sub-agent reader: `read` then takes the policy's question too and "
                                      "returns a short summary of the passage for it, written by a frozen model at "
                                      "this OpenAI-compatible endpoint (transformers serve, vLLM, an API; key: "
                                      "READER_API_KEY). Default: none, `read` returns the passage itself.")
    reader_model: str | None = arg(None, "The reader's model name at --reader_base_url.")
    reader_timeout: float = arg(20.0, "Seconds the reader may take; past them, or on any error, `read` returns the "
                                      "passage itself (counted in the log).")
    reader_max_tokens: int = arg(96, "The longest summary the reader may write, in tokens.")


def start_reader(script_args: ReaderArguments, prompt: str) -> Reader | None:
    """A Reader once its endpoint answers, or None without --reader_base_url; each bad option or an endpoint that does
    not answer is one line."""
    base_url, model = script_args.reader_base_url, script_args.reader_model
    timeout, max_tokens = script_args.reader_timeout, script_args.reader_max_tokens
    if base_url is None:
        return None
    if not model:
        sys.exit("--reader_base_url needs --reader_model: the model name the endpoint serves.")
    if timeout <= 0 or max_tokens < 1:
        sys.exit("--reader_timeout must be > 0 seconds and --reader_max_tokens >= 1.")
    reader = Reader(base_url, model, timeout, max_tokens, prompt)
    try:
        reader.client.models.list()
    except Exception as err:  # noqa: BLE001 - unreachable, refused, not OpenAI-compatible: all one line
        sys.exit(f"--reader_base_url {base_url}: no OpenAI-compatible server answers ({type(err).__name__}); start "
                 f"one (e.g. `transformers serve {model}`) or drop --reader_base_url.")
    return reader


def bm25_index(corpus: list[dict], index_dir: str) -> tuple:
    """(bm25s retriever, its corpus, whether it was built now) for passages {'title', 'text'}: built once, saved under
    index_dir/<corpus hash>, reloaded while the corpus is unchanged. Under accelerate launch the main process builds
    and the others load."""
    import bm25s
    from accelerate import PartialState

    digest = hashlib.sha256(json.dumps(corpus, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(index_dir) / digest
    with PartialState().main_process_first():
        if (path / "params.index.json").exists():
            logger.warning(f"reusing the bm25s index in {path}")
            retriever = bm25s.BM25.load(str(path), load_corpus=True, show_progress=False)
            return retriever, list(retriever.corpus), False
        logger.warning(f"building the bm25s index of {len(corpus)} passages in {path}")  # every rank says so
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize([f"{p['title']}\n{p['text']}" for p in corpus], stopwords="en"))
        building = path.with_name(f"{digest}.building-{os.getpid()}")  # complete, then in place at once:
        retriever.save(str(building), corpus=corpus)  # another run never reads half an index
        try:
            building.rename(path)
        except OSError:  # another run put the same index there first
            shutil.rmtree(building, ignore_errors=True)
        return retriever, corpus, True


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


def check_output_dir(training_args) -> None:
    """Never lose work: refuse to start over on checkpoints unless asked, resolve `--resume_from_checkpoint last`,
    and find an unwritable output directory now, not at the first save."""
    output = Path(training_args.output_dir)
    checkpoints = sorted(output.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]) if
                         p.name.split("-")[-1].isdigit() else -1) if output.is_dir() else []
    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("last", "latest", "true"):
        # A run stopped while saving (Ctrl-C, a kill) leaves a checkpoint without trainer_state.json, which the
        # Trainer writes last and cannot resume without: the newest complete one is the one to resume.
        complete = [p for p in checkpoints if (p / "trainer_state.json").is_file()]
        if not complete:
            sys.exit(f"--resume_from_checkpoint {resume}: {output} holds no complete checkpoint "
                     f"({', '.join(p.name for p in checkpoints) or 'none'}); start without it")
        incomplete = checkpoints[checkpoints.index(complete[-1]) + 1:]
        if incomplete:
            logger.warning(f"skipping {', '.join(p.name for p in incomplete)}: no trainer_state.json (the run stopped "
                           "while saving it)")
        training_args.resume_from_checkpoint = resume = str(complete[-1])
        logger.info(f"resuming from {resume}")
    elif resume and not Path(resume).is_dir():
        found = ", ".join(p.name for p in checkpoints) or "none"
        sys.exit(f"--resume_from_checkpoint {resume}: no such folder (checkpoints in {output}: {found}; "
                 "`--resume_from_checkpoint last` takes the newest)")
    if checkpoints and not resume:
        if not training_args.overwrite_output_dir:
            sys.exit(f"{output} already holds {', '.join(p.name for p in checkpoints)}: continue with "
                     "--resume_from_checkpoint last, or start over with --overwrite_output_dir (deletes them), or "
                     "pass another --output_dir")
        for checkpoint in checkpoints:  # asked for: --overwrite_output_dir
            shutil.rmtree(checkpoint)
        logger.warning(f"--overwrite_output_dir: deleted {len(checkpoints)} checkpoint(s) in {output}")
    try:
        output.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=output).close()
    except OSError as err:
        sys.exit(f"--output_dir {output}: cannot write there ({err.strerror}); pass a writable --output_dir")


RECIPES = ("gsm8k_grpo", "tool_use_grpo", "search_agent_grpo")


def load_recipe(name: str):
    """A recipe module by name (gsm8k_grpo) or by the path of its file (my_recipe.py); an unknown one is one line."""
    if name.endswith(".py"):
        if not Path(name).is_file():
            sys.exit(f"recipe {name}: no such file")
        sys.path.insert(0, str(Path(name).resolve().parent))
        name = Path(name).stem
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise  # the recipe exists but imports something missing: that is its own error
        sys.exit(f"unknown recipe {name!r}: use one of {', '.join(RECIPES)}, or the path of a recipe file")


@lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the Hugging Face Hub answers within 5 seconds (its client would retry for about a minute)."""
    try:
        huggingface_hub.utils.get_session().head(huggingface_hub.constants.ENDPOINT, timeout=5)
        return True
    except Exception:  # noqa: BLE001 - any failure to get an answer means: not reachable from here
        return False


OFFLINE_HINT = "run offline with HF_HUB_OFFLINE=1 and a cached or local model (`python offline.py` builds a CPU kit)"


def check_model_source(name: str) -> None:
    """A local folder that does not exist, or a Hub model that cannot be fetched, is one line, not a minute of retries.
    """
    if Path(name).expanduser().exists():
        return
    first = name.split("/")[0]
    if name.startswith(("/", ".", "~")) or name.endswith("/") or name.count("/") > 1 or (
            "/" in name and Path(first).is_dir()):
        sys.exit(f"--model_name_or_path {name}: no such folder")
    cached = isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str)
    if huggingface_hub.constants.HF_HUB_OFFLINE and not cached:
        sys.exit(f"--model_name_or_path {name}: not a local folder, and not in the Hugging Face cache (HF_HUB_OFFLINE "
                 "is set); download it once online or point to a local model folder")
    if not huggingface_hub.constants.HF_HUB_OFFLINE and not hub_reachable():
        fix = "run with HF_HUB_OFFLINE=1 to use the cached copy" if cached else OFFLINE_HINT
        sys.exit(f"cannot reach {huggingface_hub.constants.ENDPOINT} for {name} (no network?): {fix}")


def prepare(training_args: GRPOConfig, model_args: ModelConfig, reward_funcs: list, tools: list | None = None):
    """Logging, the checks TRL would only fail on after loading the model, wandb, and the tokenizer."""
    setup_logging()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # one line per process, so a multi-GPU launch shows every rank came up
        logger.warning(f"process {rank} of {world} ready")
    if "OMP_NUM_THREADS" in os.environ:  # torch read it at import, before a YAML `env:` block could set it
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    check_model_options(training_args, model_args, reward_funcs)
    check_output_dir(training_args)
    check_model_source(model_args.model_name_or_path)
    check_memory(training_args, model_args)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    if tokenizer.chat_template is None:
        sys.exit(f"{model_args.model_name_or_path} has no chat template; use an instruct/chat model or set "
                 "tokenizer.chat_template before training.")
    if tools:
        check_tool_template(tokenizer, model_args.model_name_or_path)
    check_thinking_template(tokenizer, model_args.model_name_or_path, getattr(training_args, "thinking", None))
    setup_wandb(training_args)
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision,
                                       "attn_implementation": model_args.attn_implementation,
                                       **(training_args.model_init_kwargs or {})}
    return tokenizer


# ------------------------------------------------------------------------------------------------------------- data
def load_split(split: str, dataset_path: str | None = None, name="openai/gsm8k", config="main") -> Dataset:
    """One split of a Hub dataset or of local data: a JSON/JSONL/parquet file (train only) or a folder of splits.

    Unreachable Hub data, a missing path and a malformed JSON line end in one line (file and 1-based line number)."""
    if dataset_path is None:
        if not huggingface_hub.constants.HF_HUB_OFFLINE and not hub_reachable():
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
        if Path(dataset_path).is_dir():
            return load_dataset(dataset_path, split=split)
        file_format = "parquet" if dataset_path.endswith(".parquet") else "json"
        return load_dataset(file_format, data_files={"train": dataset_path}, split=split)
    except ValueError as err:
        if not str(err).startswith("Unknown split"):
            raise
        sys.exit(f"{dataset_path}: no {split!r} split there ({err}); name the files {split}.jsonl")
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


def load_splits(build, script_args, training_args: GRPOConfig) -> tuple[Dataset, Dataset | None]:
    """`build("train")`, and `build("test")` cut to num_eval_examples when evaluating; bad data exits in one line."""
    evaluate = training_args.eval_strategy != "no"
    if script_args.dataset_path and not Path(script_args.dataset_path).exists():
        sys.exit(f"--dataset_path {script_args.dataset_path}: no such file or folder")
    if evaluate and script_args.dataset_path and not Path(script_args.dataset_path).is_dir():
        sys.exit(f"{script_args.dataset_path} is one file, so it has no held-out split: pass --eval_strategy no, "
                 "or point --dataset_path at a folder with train.jsonl and test.jsonl.")
    try:
        train_dataset = build("train", script_args.dataset_path)
        eval_dataset = build("test", script_args.dataset_path) if evaluate else None
    except ValueError as err:  # a missing column or split: one line, not a traceback
        sys.exit(str(err))
    if eval_dataset is not None:
        eval_dataset = eval_dataset.select(range(min(script_args.num_eval_examples, len(eval_dataset))))
    return train_dataset, eval_dataset


# ---------------------------------------------------------------------------------------------------------- trainer
def train(model_args: ModelConfig, training_args: GRPOConfig, tokenizer, train_dataset, eval_dataset, reward_funcs,
          **trainer_kwargs) -> GRPOTrainer:
    """TRL's GRPOTrainer (with LoRA/QLoRA when asked), trained (resumed from a checkpoint when asked) and saved."""
    generation = f"vLLM ({training_args.vllm_mode})" if training_args.use_vllm else "transformers" + (
        " (install vLLM for faster generation)" if torch.cuda.is_available() else "")
    precision = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
    logger.info(f"precision {precision}; generation with {generation}")
    logger.info("rubric (rewards.py documents each):\n" + rubric_summary(reward_funcs, training_args.reward_weights))
    reentrant_checkpointing_for_peft_zero3(training_args, model_args.use_peft)
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        **trainer_kwargs,
    )
    run_training(trainer, training_args)
    trainer.save_model(training_args.output_dir)
    if trainer.is_world_process_zero():
        plot_training(trainer.state.log_history, Path(training_args.output_dir) / PLOT_FILE)
    logger.info(f"saved the trained model and {PLOT_FILE} to {training_args.output_dir}")
    return trainer


def reentrant_checkpointing_for_peft_zero3(training_args, use_peft: bool) -> None:
    """LoRA under DeepSpeed ZeRO-3 needs reentrant activation checkpointing. TRL forces it, but into the deprecated
    `gradient_checkpointing_kwargs`, which transformers 5 no longer reads once the config is built: set both."""
    plugin = getattr(training_args, "deepspeed_plugin", None)
    if use_peft and plugin is not None and plugin.zero_stage == 3 and training_args.activation_checkpointing:
        kwargs = {**(training_args.activation_checkpointing_kwargs or {}), "use_reentrant": True}
        training_args.activation_checkpointing_kwargs = training_args.gradient_checkpointing_kwargs = kwargs


def run_training(trainer, training_args) -> None:
    """trainer.train() with compact logs; Ctrl-C saves nothing new and prints the exact command that resumes."""
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


class ToolTimeBudget(TrainerCallback):
    """Seconds of tool time one training step may spend, summed over all its rollouts' calls (TRL runs sync tools
    one after another, so a young policy's infinite loops would stall the step for minutes). Once spent, a tool
    wrapped in `timing()` answers at once with an error; each logging step shows `tool s` (seconds used)."""

    def __init__(self, seconds_per_step: float):
        self.seconds_per_step, self.used = seconds_per_step, 0.0

    def spent(self) -> bool:
        return self.used >= self.seconds_per_step

    @contextmanager
    def timing(self):
        start = time.monotonic()
        try:
            yield
        finally:
            self.used += time.monotonic() - start

    def on_step_begin(self, args, state, control, **kwargs):
        self.used = 0.0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            logs["tools/seconds"] = self.used


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
def notebook_argv(argv: list[str], colab_argv: list[str]) -> list[str]:
    """A notebook's flags; on Colab, the recipe's T4-sized flags go first and the notebook's own override them."""
    if "google.colab" not in sys.modules:
        return argv
    print("Colab: T4-sized defaults " + " ".join(colab_argv) + " (NOTEBOOK_ARGS overrides them)")
    return colab_argv + argv


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
    logs = getattr(trainer, "_logs", None)  # GRPOTrainer keeps the latest generation batch here
    for i in range(min(n, len(logs["completion"]) if logs else 0)):
        scores = ", ".join(f"{name} {values[i]:.2f}" for name, values in logs["rewards"].items())
        completion = logs["completion"][i]
        turns = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
        print(f"--- completion {i + 1} of the last step: {scores}")
        for turn in turns:
            calls = [f"[{c['function']['name']}({c['function']['arguments']})]" for c in turn.get("tool_calls") or []]
            print(f"{turn['role']}: {turn.get('content') or ''}{' '.join(calls)}")
