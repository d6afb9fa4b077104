"""The checks every recipe runs before a model loads, so that a mistake costs one line, not a traceback minutes later.

`plumbing.parse_args` runs `check_batch_divisibility`; `plumbing.prepare` runs the rest, in this order: the model
options TRL would reject after loading (`check_model_options`), the output directory (`check_output_dir`: never lose
work, resolve `--resume_from_checkpoint last`), the model's source (`check_model_source`: a missing folder, no
network), GPU memory (`check_memory`), the chat template (`check_tool_template`, `check_thinking_template`) and wandb
(`setup_wandb`). Each ends in one line that names the fix; a real bug still shows its traceback.
"""

import dataclasses
import difflib
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
from functools import lru_cache
from pathlib import Path

import huggingface_hub
import torch
from trl import GRPOConfig, ModelConfig
from trl.chat_template_utils import add_response_schema, supports_tool_calling

import rewards

logger = logging.getLogger("grpo-recipes")


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
            sys.exit(f"--{name} nan: a number is needed")
        if name in RANGES:
            check, allowed = RANGES[name]
        elif name in NOT_NEGATIVE:
            check, allowed = (lambda v: v >= 0), "0 or more"
        elif POSITIVE_NAME.search(name) and name not in MAY_BE_ZERO:
            check, allowed = _positive, "positive"
        else:
            continue
        if not check(value):
            sys.exit(f"--{name} {value:g}: must be {allowed}")


def check_launch(script: str, gpus: int | None = None) -> None:
    """A plain `python` run sees several GPUs: transformers would split one model across them (device_map="auto", a
    pipeline that runs one GPU at a time) while vLLM and the memory check use the first. Name the launch that uses
    them all, or the one-GPU run."""
    gpus = torch.cuda.device_count() if gpus is None else gpus
    if gpus > 1 and "WORLD_SIZE" not in os.environ:
        command = " ".join([script, *map(shlex.quote, sys.argv[1:])])
        sys.exit(f"{gpus} GPUs are visible to one process: train on all of them with `accelerate launch --config_file "
                 f"accelerate/multi_gpu.yaml --num_processes {gpus} {command}`, or on one with "
                 f"`CUDA_VISIBLE_DEVICES=0 python {command}`")


def multi_process_collectives(training_args) -> list[str]:
    """What makes each generation call a collective across processes (every process must take part in it)."""
    plugin = getattr(training_args, "deepspeed_plugin", None)
    stage = plugin.zero_stage if plugin is not None else int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0"))
    reasons = []
    if stage == 3:
        reasons.append("DeepSpeed ZeRO-3 (each forward gathers the sharded weights)")
    if training_args.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        reasons.append("FSDP (each forward gathers the sharded weights)")
    if getattr(training_args, "use_vllm", False) and training_args.vllm_mode == "server":
        reasons.append("vLLM server mode (the processes' prompts are gathered for every request)")
    if getattr(training_args, "use_vllm", False) and training_args.vllm_tensor_parallel_size > 1:
        reasons.append(f"vLLM tensor parallel {training_args.vllm_tensor_parallel_size} (each request spans the "
                       "group)")
    return reasons


def check_tools_across_processes(training_args, tools: list | None) -> None:
    """TRL's tool loop runs as many turns on each process as its own rollouts need. Where every turn's generation is
    a collective, a process that finishes its turns early waits in the next one forever: refuse before loading."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    reasons = multi_process_collectives(training_args)
    if tools and processes > 1 and reasons:
        sys.exit(f"tools across {processes} processes with {'; '.join(reasons)} can hang: TRL's tool loop runs a "
                 "different number of turns on each process, and each turn's generation waits for all of them. "
                 "Use DDP (accelerate/multi_gpu.yaml) with vLLM colocate at tensor parallel 1, or one process.")


PIP_NAMES = {"azure_ml": "azureml-core", "flyte": "flytekit", "neptune": "neptune", "comet_ml": "comet_ml"}


def check_loggers(training_args) -> None:
    """Each --report_to logger is one transformers knows and is installed: the Trainer would raise either only when
    it is built, after the model has loaded."""
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    for name in training_args.report_to or []:
        if name not in INTEGRATION_TO_CALLBACK:
            close = difflib.get_close_matches(name, INTEGRATION_TO_CALLBACK, n=1)
            sys.exit(f"--report_to {name}: not a logger transformers knows ("
                     + (f"did you mean {close[0]}? " if close else "") + f"one of: {', '.join(INTEGRATION_TO_CALLBACK)}"
                     ", or none)")
        if name not in get_available_reporting_integrations():
            sys.exit(f"--report_to {name}: it is not installed; `pip install {PIP_NAMES.get(name, name)}`, or pass "
                     "--report_to none")


def check_lora_targets(model_args: ModelConfig) -> None:
    """With --use_peft, each --lora_target_modules name matches a layer of the model (read from its config, on the
    meta device: nothing is allocated). PEFT raises only when none matches, after the model has loaded; a typo among
    good names would train without that layer."""
    targets = model_args.lora_target_modules
    if not model_args.use_peft or not isinstance(targets, list) or targets in (["all-linear"], ["all"]):
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = [name for name, _ in model.named_modules()]
    unmatched = [t for t in targets if t != "all-linear" and not any(n == t or n.endswith("." + t) for n in names)]
    if unmatched:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        sys.exit(f"--lora_target_modules {' '.join(unmatched)}: no layer of {model_args.model_name_or_path} is called "
                 f"so (its linear layers: {', '.join(linear)}; all-linear takes every one but the output head)")


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
    if quantized and (training_args.use_cpu or not torch.cuda.is_available()):
        sys.exit("--load_in_4bit/--load_in_8bit quantize with bitsandbytes, which needs a CUDA GPU: drop it to train "
                 "on this machine, or run on a GPU")
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

    def numel(tensor) -> int:  # under ZeRO-3 a parameter is a 0-element shard that knows its full size
        return getattr(tensor, "ds_numel", None) or tensor.numel()

    return (sum(numel(p) for p in model.parameters()), sum(numel(m.weight) for m in linears),
            sum(m.in_features + m.out_features for m in linears))


def count_parameters(model_config) -> tuple[int, int, int]:
    """(all parameters, those in the decoder's linear layers, LoRA parameters per unit of rank on every linear layer
    but the output head, as PEFT's 'all-linear' places them) of a model config."""
    return _sizes(model_config.to_json_string())


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CPU_PARAMETERS = 0.6e9  # more than Qwen2.5-0.5B: on a CPU only with --use_cpu


LM_HEAD_TILE = (4096, 32768)  # TRL 1.16's fused log-prob head: tokens × vocabulary entries per projection tile
CPU_TILE_COPIES = 8  # float32 tiles its torch fallback (no Triton: CPU) keeps live in the backward, measured


def estimate_memory(model_config, *, weight_dtype: str, half: bool, use_peft: bool, load_in_4bit: bool, lora_r: int,
                    batch: int, generation_batch: int, prompt: int, completion: int, checkpointing: bool,
                    use_vllm: bool, reference_model: bool = False, sharded: tuple[str, ...] = (), processes: int = 1,
                    vllm_bytes: float = 0.0, device: str = "cuda") -> dict[str, float]:
    """Peak GPU memory of one training process, in bytes, by part: what TRL 1.16's GRPO step allocates.

    weights: the model in `weight_dtype` (float32 master weights for a full fine-tune; a frozen LoRA base in bf16/fp16;
    4-bit linear layers at 0.5 byte plus a 4-byte scale per 64), LoRA's adapter in float32, and the reference model
    when beta > 0 on a full fine-tune. gradients and optimizer: one and two (AdamW) values per trainable parameter,
    and on a full fine-tune the float32 output-head gradient TRL's fused head accumulates before adding it to .grad.
    activations, the larger of two phases. Training a micro-batch of `batch` sequences: with checkpointing, the
    residual stream kept at each layer plus one layer recomputed (about 16 hidden-sized and 3 intermediate-sized values
    a token); without, that working set at every layer; and TRL's fused log-prob head, which never materialises the
    (batch, completion, vocab) logits but works in tiles (LM_HEAD_TILE) over the scored tokens (the completions on a
    GPU; every position in the torch fallback on a CPU) with a float32 gradient for the hidden states. Generation
    without vLLM: the KV cache of the whole generation batch and one step's logits. `sharded` lists the parts ZeRO or
    FSDP divide by `processes`. Plus what vLLM reserves beside it (colocate) and 1 GiB of CUDA context.
    benchmarks/bench_memory.py measures the torch-allocated parts against torch's profiler (tests/test_preflight.py).
    """
    params, linear, lora_per_rank = count_parameters(model_config)
    weight_bytes = DTYPE_BYTES.get(weight_dtype, 4)
    compute_bytes = 2 if half else weight_bytes
    lora = lora_r * lora_per_rank if use_peft else 0
    base = linear * (0.5 + 4 / 64) + (params - linear) * 2 if load_in_4bit else params * weight_bytes
    trainable, train_bytes = (lora, 4) if use_peft else (params, weight_bytes)
    hidden, layers, vocab = model_config.hidden_size, model_config.num_hidden_layers, model_config.vocab_size
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or hidden // heads
    kv_width = (getattr(model_config, "num_key_value_heads", None) or heads) * head_dim
    act_bytes = 4 if weight_bytes == 4 and not use_peft else compute_bytes  # float32 weights keep a float32 stream
    tokens = batch * (prompt + completion)
    working_set = tokens * (hidden * 16 + model_config.intermediate_size * 3) * act_bytes
    backbone = tokens * hidden * act_bytes * layers + working_set if checkpointing else working_set * layers
    scored = batch * completion if device == "cuda" else tokens
    tile = min(scored, LM_HEAD_TILE[0]) * min(vocab, LM_HEAD_TILE[1])
    head = tile * (compute_bytes + (4 * CPU_TILE_COPIES if device != "cuda" else 0)) + scored * hidden * 4
    generation = 0 if use_vllm else generation_batch * ((prompt + completion) * layers * 2 * kv_width * weight_bytes
                                                        + vocab * 4)
    head_gradient = 0 if use_peft else vocab * hidden * 4  # the fused head's float32 buffer beside the weight's .grad
    parts = {"weights": base * (2 if reference_model else 1) + lora * 4,
             "gradients": trainable * train_bytes + head_gradient,
             "optimizer": 2 * trainable * train_bytes, "activations": max(backbone + head, generation)}
    for part in sharded:
        parts[part] /= processes
    return {**parts, "vllm": vllm_bytes, "cuda context": 1 * GiB}


def checkpointing_on(training_args) -> bool:
    """Whether activation checkpointing is on. transformers 5.23 renamed `gradient_checkpointing` to
    `activation_checkpointing` (the old name stays, a mirrored alias); 5.17, the version vLLM 0.31 pins, has only the
    old one. Read the new name where it exists: it is the one the Trainer acts on."""
    return bool(getattr(training_args, "activation_checkpointing", training_args.gradient_checkpointing))


def sharding(training_args) -> tuple[tuple[str, ...], int]:
    """(the parts ZeRO or FSDP divide, across how many processes) for this launch."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    plugin = getattr(training_args, "deepspeed_plugin", None)
    stage = plugin.zero_stage if plugin is not None else 0
    if training_args.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        stage = 3  # FSDP's default, FULL_SHARD
    return (("optimizer",), ("optimizer", "gradients"), ("optimizer", "gradients", "weights"))[stage - 1] \
        if stage else (), processes


def memory_options(training_args, model_args, prompt_tokens: int = 256, total: int = 0) -> dict:
    """The keyword arguments of estimate_memory for this run."""
    colocated = getattr(training_args, "use_vllm", False) and training_args.vllm_mode == "colocate"
    batch = training_args.per_device_train_batch_size
    steps = training_args.steps_per_generation or training_args.gradient_accumulation_steps
    sharded, processes = sharding(training_args)
    return dict(weight_dtype=str(model_args.dtype or "float32"), half=bool(training_args.bf16 or training_args.fp16),
                use_peft=model_args.use_peft, load_in_4bit=model_args.load_in_4bit, lora_r=model_args.lora_r,
                batch=batch, generation_batch=training_args.generation_batch_size or batch * steps,
                prompt=prompt_tokens, completion=getattr(training_args, "max_completion_length", 512),
                checkpointing=checkpointing_on(training_args), use_vllm=bool(getattr(training_args, "use_vllm", False)),
                reference_model=getattr(training_args, "beta", 0.0) != 0 and not model_args.use_peft,
                sharded=sharded, processes=processes,
                vllm_bytes=training_args.vllm_gpu_memory_utilization * total if colocated else 0.0)


def check_memory(training_args, model_args, prompt_tokens: int = 256, gpu: tuple[int, int] | None = None) -> None:
    """On a GPU, before the model loads: exit in one line, with options that fit, when the estimate exceeds its free
    memory. `gpu` is (free, total) bytes; by default this machine's first GPU, and nothing to check without one.
    --skip_memory_check skips it (an estimate, not an allocator)."""
    if getattr(training_args, "skip_memory_check", False):
        return
    from transformers import AutoConfig

    if gpu is None and not torch.cuda.is_available() and not training_args.use_cpu:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
        params = count_parameters(config)[0]
        if params > CPU_PARAMETERS:  # a CPU-only torch build, or a machine without a working driver
            sys.exit(f"no CUDA GPU here (torch {torch.__version__} sees none): training {params / 1e9:.1f}B "
                     "parameters on the CPU takes days; use a GPU (a CPU-only torch needs the CUDA build), or pass "
                     "--use_cpu true to train on the CPU anyway")
    if gpu is None and (not torch.cuda.is_available() or training_args.use_cpu):
        return

    free, total = gpu or torch.cuda.mem_get_info()
    model_config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    options = memory_options(training_args, model_args, prompt_tokens, total)

    def peak(**changes) -> float:
        return sum(estimate_memory(model_config, **{**options, **changes}).values())

    needed = peak()
    logger.info(f"GPU memory: about {needed / GiB:.1f} GiB needed, {free / GiB:.1f} of {total / GiB:.1f} GiB free")
    if needed <= free:
        return
    half = "bfloat16" if training_args.bf16 else "float16"
    smaller = max(1, training_args.per_device_train_batch_size // 2)
    candidates = {"--use_peft": dict(use_peft=True, weight_dtype=half, reference_model=False),
                  "--use_peft --load_in_4bit": dict(use_peft=True, load_in_4bit=True, use_vllm=False, vllm_bytes=0.0,
                                                    reference_model=False),
                  f"--per_device_train_batch_size {smaller}": dict(batch=smaller),
                  "--gradient_checkpointing true": dict(checkpointing=True),
                  "--vllm_gpu_memory_utilization 0.15": dict(vllm_bytes=0.15 * total if options["vllm_bytes"] else 0)}
    fits = [f"{flags} (~{peak(**change) / GiB:.1f} GiB)" for flags, change in candidates.items()
            if peak(**change) <= free and peak(**change) < needed]
    sys.exit(f"this run needs about {needed / GiB:.1f} GiB of GPU memory and {free / GiB:.1f} GiB are free: "
             + (f"try {'; or '.join(fits)}" if fits else "use a smaller model, or a GPU with more memory")
             + " (--skip_memory_check runs it anyway)")


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


THINKING_TOKENS = 2048  # completions shorter than this are mostly cut inside <think> on GSM8K-level problems


def check_thinking_template(tokenizer, model_name: str, thinking: bool | None,
                            max_completion_length: int | None = None) -> None:
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
    if thinking is not False and max_completion_length is not None and max_completion_length < THINKING_TOKENS:
        logger.warning(f"{model_name} thinks before it answers, in at most max_completion_length "
                       f"{max_completion_length} tokens: a completion cut inside <think> has no answer and scores 0 "
                       f"(no gradient). Pass --max_completion_length {THINKING_TOKENS} or more, or --thinking false.")

RUN_FILE = "recipe_run.json"  # what the run in a folder trains: check_resume compares a resume with it
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
_LOCKS: dict[str, int] = {}  # output folder -> the descriptor whose lock this process holds


def checkpoints_in(output: Path) -> list[Path]:
    """checkpoint-* folders in output, oldest step first."""
    return sorted(output.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]) if
                  p.name.split("-")[-1].isdigit() else -1) if output.is_dir() else []


def complete(checkpoint: Path) -> bool:
    """Whether a checkpoint was saved to the end: the Trainer writes trainer_state.json last, so a run stopped while
    saving (Ctrl-C, a kill, a full disk) leaves it missing or cut short; earlier checkpoints are untouched."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
        return True
    except (OSError, ValueError):
        return False


def check_output_dir(training_args) -> None:
    """Never lose work: refuse to start over on checkpoints or a trained model unless asked, refuse a second run
    into a folder a run is writing (a lock), resolve `--resume_from_checkpoint last` and refuse a resume whose recipe,
    model or data differ from the checkpoint's (check_resume); find an unwritable output directory now, not at the
    first save. Records what this run trains in the folder (RUN_FILE)."""
    output = Path(training_args.output_dir)
    try:
        output.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=output).close()
    except OSError as err:
        sys.exit(f"--output_dir {output}: cannot write there ({err.strerror}); pass a writable --output_dir")
    each_node = getattr(training_args, "save_on_each_node", False)
    writes = os.environ.get("LOCAL_RANK" if each_node else "RANK", "0") == "0"
    if writes:
        lock_output_dir(output)
    checkpoints = checkpoints_in(output)
    identity = getattr(training_args, "run_identity", None)
    recorded = read_run(output)
    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("last", "latest", "true"):
        saved = [p for p in checkpoints if complete(p)]  # the newest complete checkpoint is the one to resume
        if not saved:
            sys.exit(f"--resume_from_checkpoint {resume}: {output} holds no complete checkpoint "
                     f"({', '.join(p.name for p in checkpoints) or 'none'}); start without it")
        incomplete = checkpoints[checkpoints.index(saved[-1]) + 1:]
        if incomplete:
            logger.warning(f"skipping {', '.join(p.name for p in incomplete)}: its trainer_state.json is missing or "
                           "cut short (the run stopped while saving it)")
        training_args.resume_from_checkpoint = resume = str(saved[-1])
    elif resume and not Path(resume).is_dir():
        found = ", ".join(p.name for p in checkpoints) or "none"
        sys.exit(f"--resume_from_checkpoint {resume}: no such folder (checkpoints in {output}: {found}; "
                 "`--resume_from_checkpoint last` takes the newest)")
    elif resume and not complete(Path(resume)):
        saved = [p.name for p in checkpoints_in(Path(resume).parent) if complete(p)]
        sys.exit(f"--resume_from_checkpoint {resume}: not a complete checkpoint (no readable trainer_state.json: "
                 f"a run stopped while saving it, or not a checkpoint); "
                 + (f"the newest complete one is {saved[-1]}, or pass `last`" if saved else "start without it"))
    if resume:
        check_resume(Path(resume), identity)
        logger.info(f"resuming from {resume}")
    finished = [name for name in MODEL_FILES if (output / name).is_file()]
    if (checkpoints or finished) and not resume:
        held = ", ".join([p.name for p in checkpoints] + (["a trained model"] if finished else []))
        other_run = differences(recorded, identity) if recorded and identity else []
        if not training_args.overwrite_output_dir:
            if other_run:
                sys.exit(f"{output} already holds {held} of another run ({'; '.join(other_run)}): pass another "
                         "--output_dir, or --overwrite_output_dir to delete them")
            resume_hint = "continue with --resume_from_checkpoint last, or " if checkpoints else ""
            sys.exit(f"{output} already holds {held}: {resume_hint}pass another --output_dir, or start over with "
                     "--overwrite_output_dir (deletes them)")
        if writes:  # one process deletes: two racing over the same files crash the one that loses
            for checkpoint in checkpoints:  # asked for: --overwrite_output_dir
                shutil.rmtree(checkpoint)
            for name in finished:
                (output / name).unlink()
            logger.warning(f"--overwrite_output_dir: deleted {held} in {output}")
    if writes and identity and not resume:
        (output / RUN_FILE).write_text(json.dumps(identity, indent=1) + "\n")


def lock_output_dir(output: Path) -> None:
    """Hold a lock on the output folder itself until the run has saved (release_output_dir) or its process ends: a
    second run into the same folder, started at the same time, would write the same checkpoint-N and final model
    files. Leaves no file behind."""
    import fcntl

    key = str(output.resolve())
    if key in _LOCKS:  # this process's earlier run (a notebook cell run again, a test): it has finished
        return
    descriptor = os.open(output, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        sys.exit(f"--output_dir {output}: another run is writing there ({lock_holder(output)}); wait for it to end, or "
                 "pass another --output_dir")
    _LOCKS[key] = descriptor


def release_output_dir(output: Path) -> None:
    """Let another process use output once this run has saved (a notebook's kernel lives on after its run)."""
    descriptor = _LOCKS.pop(str(Path(output).resolve()), None)
    if descriptor is not None:
        os.close(descriptor)  # closing the descriptor drops its flock


def lock_holder(folder: Path) -> str:
    """'pid N: its command line' of the process holding a flock on folder, read from /proc/locks (Linux)."""
    inode = os.stat(folder).st_ino
    try:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "FLOCK" in fields and fields[-3].rsplit(":", 1)[-1] == str(inode):
                pid = fields[-4]
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                return f"pid {pid}: {command.strip()}"
    except (OSError, IndexError):
        pass
    return "another process holds its lock"


def read_run(folder: Path) -> dict | None:
    try:
        return json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None


def differences(recorded: dict, identity: dict) -> list[str]:
    """What differs between the run recorded in a folder and this one, in words ('model runs/a, not runs/b')."""
    words = {"recipe": "recipe", "model": "model", "data": "data", "use_peft": "LoRA"}
    shown = {"data": lambda v: v or "the recipe's Hub dataset", "recipe": lambda v: f"{v}.py",
             "use_peft": lambda v: "on" if v else "off"}
    return [f"{words[key]} {shown.get(key, str)(recorded.get(key))}, not {shown.get(key, str)(identity[key])}"
            for key in words if key in recorded and recorded.get(key) != identity.get(key)]


def check_resume(checkpoint: Path, identity: dict | None) -> None:
    """Resume means resume: the checkpoint's run (RUN_FILE beside it) must have this run's recipe, model, data and
    LoRA choice; otherwise one line says what differs and how to start a new run from the checkpoint's weights."""
    recorded = read_run(checkpoint.parent) or read_run(checkpoint)
    if identity is None:
        return
    if recorded is None:
        logger.warning(f"{checkpoint}: no {RUN_FILE} beside it (a run before this check, or another program's): "
                       "resuming without checking that its recipe, model and data are this run's")
        return
    different = differences(recorded, identity)
    if different:
        sys.exit(f"--resume_from_checkpoint {checkpoint} continues a run of {'; '.join(different)}: to train from its "
                 f"weights in a new run, pass --model_name_or_path {checkpoint} (and another --output_dir) without "
                 "--resume_from_checkpoint")


@lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the Hugging Face Hub answers within 5 seconds (its client would retry for about a minute)."""
    try:
        huggingface_hub.utils.get_session().head(huggingface_hub.constants.ENDPOINT, timeout=5)
        return True
    except Exception:  # noqa: BLE001 - any failure to get an answer means: not reachable from here
        return False


OFFLINE_HINT = "run offline with HF_HUB_OFFLINE=1 and a cached or local model (`python offline.py` builds a CPU kit)"


WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_folder(folder: Path, name: str) -> None:
    """A local --model_name_or_path must be a full model (config.json and weights): an empty folder, a file, a
    tokenizer alone, a config without weights, and a LoRA adapter (what --use_peft saves) are each named in one line,
    the adapter with the command that merges it into the full model it stands for."""
    if not folder.is_dir():
        sys.exit(f"--model_name_or_path {name} is a file: pass the folder that holds config.json and the weights")
    inside = sorted(p.name for p in folder.iterdir())
    if not inside:
        sys.exit(f"--model_name_or_path {name} is an empty folder: pass a model folder (config.json and weights)")
    if (folder / "adapter_config.json").is_file():
        try:
            base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        except ValueError:
            base = None
        sys.exit(f"--model_name_or_path {name} is a LoRA adapter (on {base or 'an unnamed base'}), not a model: merge "
                 f"it into one with `python merge_models.py {name} --output_dir {name.rstrip('/')}-merged` and pass "
                 "that, or train a new adapter on the base: --model_name_or_path "
                 f"{base or '<its base>'} --use_peft")
    weights = any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS)
    if not (folder / "config.json").is_file():
        what = "a tokenizer but no model" if any(n in inside for n in TOKENIZER_FILES) else \
            f"no model ({', '.join(inside[:5])}{', …' if len(inside) > 5 else ''})"
        hint = "; the checkpoints of a run are in its checkpoint-* folders" if any(
            n.startswith("checkpoint-") for n in inside) else ""
        sys.exit(f"--model_name_or_path {name} holds {what}: no config.json{hint}")
    if not weights:
        sys.exit(f"--model_name_or_path {name} has a config.json but no weights (*.safetensors): the save did not "
                 "finish, or the weights are elsewhere")


def check_model_source(name: str) -> None:
    """A local folder that does not exist, or a Hub model that cannot be fetched, is one line, not a minute of retries.
    """
    if Path(name).expanduser().exists():
        check_model_folder(Path(name).expanduser(), name)
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
