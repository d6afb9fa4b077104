"""The checks every recipe runs before a model loads, so that a mistake costs one line, not a traceback minutes later.

`plumbing.parse_args` runs `check_batch_divisibility`; `plumbing.prepare` runs the rest, in this order: the model
options TRL would reject after loading (`check_model_options`), the output directory (`check_output_dir`: never lose
work, resolve `--resume_from_checkpoint last`), the model's source (`check_model_source`: a missing folder, no
network), GPU memory (`check_memory`), the chat template (`check_tool_template`, `check_thinking_template`) and wandb
(`setup_wandb`). Each ends in one line that names the fix; a real bug still shows its traceback.
"""

import importlib.util
import json
import logging
import math
import os
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


def checkpointing_on(training_args) -> bool:
    """Whether activation checkpointing is on. transformers 5.23 renamed `gradient_checkpointing` to
    `activation_checkpointing` (the old name stays, a mirrored alias); 5.17, the version vLLM 0.31 pins, has only the
    old one. Read the new name where it exists: it is the one the Trainer acts on."""
    return bool(getattr(training_args, "activation_checkpointing", training_args.gradient_checkpointing))


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
                       checkpointing=checkpointing_on(training_args), vllm_bytes=vllm)
        return sum(estimate_memory(model_config, **{**options, **changes}).values())

    needed = peak()
    logger.info(f"GPU memory: about {needed / GiB:.1f} GiB needed, {free / GiB:.1f} of {total / GiB:.1f} GiB free")
    if needed <= free:
        return
    candidates = {"--use_peft": dict(use_peft=True), "--use_peft --load_in_4bit": dict(use_peft=True,
                  load_in_4bit=True), "--per_device_train_batch_size "
                  f"{max(1, training_args.per_device_train_batch_size // 2)}":
                  dict(batch=max(1, training_args.per_device_train_batch_size // 2)),
                  "--gradient_checkpointing true": dict(checkpointing=True),
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
