"""GPU memory: what one training process of TRL 1.16's GRPO step needs, by part (weights, gradients, optimizer,
activations, vLLM's share, CUDA's context), and a check before the model loads that says, in one line, which options
would fit when the run would not. benchmarks/bench_memory.py measures the estimate against torch's profiler."""

import json
import logging
import math
import os
from functools import lru_cache

import torch

from grpo_recipes.refusal import Refusal

logger = logging.getLogger("grpo-recipes")
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


def key_value_width(model_config) -> int:
    """Values a token's keys (or values) hold in one layer: key-value heads × head size."""
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    return (getattr(model_config, "num_key_value_heads", None) or heads) * head_dim


def estimate_memory(model_config, *, weight_dtype: str, half: bool, use_peft: bool, load_in_4bit: bool, lora_r: int,
                    batch: int, generation_batch: int, prompt: int, completion: int, checkpointing: bool,
                    use_vllm: bool, reference_model: bool = False, sharded: tuple[str, ...] = (), processes: int = 1,
                    vllm_bytes: float = 0.0, device: str = "cuda", eval_batch: int = 0,
                    ddp_buckets: bool = False) -> dict[str, float]:
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
    FSDP divide by `processes`. Evaluation with vLLM (`eval_batch` sequences a forward): TRL scores the completions'
    log-probs without gradients, one layer's transient working set (about 4 hidden-sized and 3 intermediate-sized
    values a token) and the log-prob head over `eval_batch` whole sequences at once, beside the resident optimizer.
    `ddp_buckets`: DDP's gradient buckets, a second copy of the gradients. Plus what vLLM reserves beside it
    (colocate) and 1 GiB of CUDA context.
    benchmarks/bench_memory.py measures the torch-allocated parts against torch's profiler (tests/test_preflight.py).
    """
    params, linear, lora_per_rank = count_parameters(model_config)
    weight_bytes = DTYPE_BYTES.get(weight_dtype, 4)
    compute_bytes = 2 if half else weight_bytes
    lora = lora_r * lora_per_rank if use_peft else 0
    base = linear * (0.5 + 4 / 64) + (params - linear) * 2 if load_in_4bit else params * weight_bytes
    trainable, train_bytes = (lora, 4) if use_peft else (params, weight_bytes)
    hidden, layers, vocab = model_config.hidden_size, model_config.num_hidden_layers, model_config.vocab_size
    kv_width = key_value_width(model_config)
    act_bytes = 4 if weight_bytes == 4 and not use_peft else compute_bytes  # float32 weights keep a float32 stream
    tokens = batch * (prompt + completion)
    working_set = tokens * (hidden * 16 + model_config.intermediate_size * 3) * act_bytes
    backbone = tokens * hidden * act_bytes * layers + working_set if checkpointing else working_set * layers
    scored = batch * completion if device == "cuda" else tokens
    tile = min(scored, LM_HEAD_TILE[0]) * min(vocab, LM_HEAD_TILE[1])
    head = tile * (compute_bytes + (4 * CPU_TILE_COPIES if device != "cuda" else 0)) + scored * hidden * 4
    generation = 0 if use_vllm else generation_batch * ((prompt + completion) * layers * 2 * kv_width * weight_bytes
                                                        + vocab * 4)
    eval_tokens = eval_batch * (prompt + completion) if use_vllm else 0  # no vLLM: TRL computes no eval log-probs
    evaluation = (eval_tokens * (hidden * 5 + model_config.intermediate_size * 3) * compute_bytes
                  + min(eval_batch * completion, LM_HEAD_TILE[0]) * min(vocab, LM_HEAD_TILE[1]) * compute_bytes
                  if eval_tokens else 0)
    head_gradient = 0 if use_peft else vocab * hidden * 4  # the fused head's float32 buffer beside the weight's .grad
    parts = {"weights": base * (2 if reference_model else 1) + lora * 4,
             "gradients": trainable * train_bytes * (2 if ddp_buckets else 1) + head_gradient,
             "optimizer": 2 * trainable * train_bytes, "activations": max(backbone + head, generation, evaluation)}
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


def memory_options(training_args, model_args, prompt_tokens: int = 256, total: int = 0,
                   generation_server: bool = False) -> dict:
    """The keyword arguments of estimate_memory for this run. `generation_server`: a vLLM server generates (the async
    trainer), so this process holds no KV cache and no vLLM share, and runs no evaluation."""
    use_vllm = generation_server or bool(getattr(training_args, "use_vllm", False))
    colocated = use_vllm and not generation_server and training_args.vllm_mode == "colocate"
    batch = training_args.per_device_train_batch_size
    steps = getattr(training_args, "steps_per_generation", None) or training_args.gradient_accumulation_steps
    sharded, processes = sharding(training_args)
    evaluates = not generation_server and str(getattr(training_args.eval_strategy, "value",
                                                      training_args.eval_strategy)) != "no"
    return dict(weight_dtype=str(model_args.dtype or "float32"), half=bool(training_args.bf16 or training_args.fp16),
                use_peft=model_args.use_peft, load_in_4bit=model_args.load_in_4bit, lora_r=model_args.lora_r,
                batch=batch, generation_batch=getattr(training_args, "generation_batch_size", None) or batch * steps,
                prompt=prompt_tokens, completion=getattr(training_args, "max_completion_length", 512),
                checkpointing=checkpointing_on(training_args), use_vllm=use_vllm,
                reference_model=getattr(training_args, "beta", 0.0) != 0 and not model_args.use_peft,
                sharded=sharded, processes=processes,
                vllm_bytes=training_args.vllm_gpu_memory_utilization * total if colocated else 0.0,
                eval_batch=training_args.per_device_eval_batch_size if evaluates else 0,
                ddp_buckets=processes > 1 and not sharded)


PROMPT_ALLOWANCE = 2048  # tokens a prompt may take in a capped vLLM context, beside max_completion_length


def size_colocated_vllm(training_args, model_args, total: int | None = None, prompt_tokens: int = 256) -> None:
    """Colocated vLLM's share of the GPU and its context, where the user set neither. Its share: the bf16 weights,
    the KV cache of one generation batch of `prompt_tokens` + max_completion_length tokens, and 1 GiB for its graphs
    and buffers, of the GPU's `total` bytes (default: this machine's first GPU), rounded up to 0.05 and at least 0.1
    (a fixed 0.3 reserves 24 GB for a 3 GB model on 80 GB). Its context stays the model's own unless one sequence of
    it would not fit that share's KV cache, by this arithmetic (vLLM then refuses to start: a 131,072-token context of
    the 1.5B shape on 16 GB); only then is it PROMPT_ALLOWANCE + max_completion_length, and a longer prompt needs
    --vllm_max_model_length. Without CUDA: TRL's 0.3 and the model's context (vLLM's CPU build sizes its KV cache by
    VLLM_CPU_KVCACHE_SPACE)."""
    if total is None and not torch.cuda.is_available():
        if training_args.vllm_gpu_memory_utilization is None:
            training_args.vllm_gpu_memory_utilization = 0.3
        return
    from transformers import AutoConfig

    total = total or torch.cuda.mem_get_info()[1]
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    completion = training_args.max_completion_length
    kv_per_token = config.num_hidden_layers * 2 * key_value_width(config) * 2  # keys and values, bf16
    weights = count_parameters(config)[0] * 2 + GiB
    if training_args.vllm_gpu_memory_utilization is None:
        sequences = training_args.generation_batch_size or (training_args.per_device_train_batch_size
                                                            * training_args.gradient_accumulation_steps)
        needed = weights + sequences * (prompt_tokens + completion) * kv_per_token
        training_args.vllm_gpu_memory_utilization = min(0.9, max(0.1, math.ceil(needed / total * 20) / 20))
    context = getattr(config, "max_position_embeddings", None)
    kv_room = training_args.vllm_gpu_memory_utilization * total - weights
    if training_args.vllm_max_model_length is None and context and context * kv_per_token > kv_room:
        training_args.vllm_max_model_length = min(context, PROMPT_ALLOWANCE + completion)


def check_memory(training_args, model_args, prompt_tokens: int = 256, gpu: tuple[int, int] | None = None,
                 server_share: float | None = None, generation_server: bool = False) -> None:
    """On a GPU, before the model loads: exit in one line, with options that fit, when the estimate exceeds its free
    memory. `gpu` is (free, total) bytes; by default this machine's first GPU, and nothing to check without one.
    `generation_server`: a vLLM server generates (async_grpo.py), reserving `server_share` of its GPU (None: a CPU
    server); when that GPU may be this one, the line names the share that would fit. --skip_memory_check skips it (an
    estimate, not an allocator)."""
    if getattr(training_args, "skip_memory_check", False):
        return
    from transformers import AutoConfig

    if gpu is None and not torch.cuda.is_available() and not training_args.use_cpu:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
        params = count_parameters(config)[0]
        if params > CPU_PARAMETERS:  # a CPU-only torch build, or a machine without a working driver
            raise Refusal(f"no CUDA GPU here (torch {torch.__version__} sees none): training {params / 1e9:.1f}B "
                          "parameters on the CPU takes days; use a GPU (a CPU-only torch needs the CUDA build), or "
                          "pass --use_cpu true to train on the CPU anyway")
    if gpu is None and (not torch.cuda.is_available() or training_args.use_cpu):
        return

    free, total = gpu or torch.cuda.mem_get_info()
    model_config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    options = memory_options(training_args, model_args, prompt_tokens, total, generation_server)

    def peak(**changes) -> float:
        return sum(estimate_memory(model_config, **{**options, **changes}).values())

    needed = peak()
    logger.info(f"GPU memory: about {needed / GiB:.1f} GiB needed, {free / GiB:.1f} of {total / GiB:.1f} GiB free")
    if needed <= free:
        return
    half = "bfloat16" if training_args.bf16 else "float16"
    smaller = max(1, training_args.per_device_train_batch_size // 2)
    candidates = {"--use_peft": dict(use_peft=True, weight_dtype=half, reference_model=False),
                  "--use_peft --load_in_4bit": dict(use_peft=True, load_in_4bit=True, use_vllm=generation_server,
                                                    vllm_bytes=0.0, reference_model=False, eval_batch=0),
                  f"--per_device_train_batch_size {smaller}": dict(batch=smaller),
                  "--gradient_checkpointing true": dict(checkpointing=True),
                  "--vllm_gpu_memory_utilization 0.15": dict(vllm_bytes=0.15 * total if options["vllm_bytes"] else 0)}
    if options["eval_batch"] > 1:  # evaluation's log-probs can be the peak (a batch of whole sequences at once)
        candidates[f"--per_device_eval_batch_size {options['eval_batch'] // 4 or 1}"] = dict(
            eval_batch=options["eval_batch"] // 4 or 1)
    fits = [f"{flags} (~{peak(**change) / GiB:.1f} GiB)" for flags, change in candidates.items()
            if peak(**change) <= free and peak(**change) < needed]
    if server_share is not None:
        share = int((1 - (needed + GiB) / total) * 20) / 20  # a margin of 1 GiB, in steps of 0.05
        fits.insert(0, f"if the vLLM server shares this GPU (it reserves {server_share:.0%} of its GPU), "
                       + (f"restart it with --gpu-memory-utilization {share:.2f}, or " if share >= 0.1 else "")
                       + "serve on another GPU")
    raise Refusal(f"this run needs about {needed / GiB:.1f} GiB of GPU memory and {free / GiB:.1f} GiB are free: "
                  + (f"try {'; or '.join(fits)}" if fits else "use a smaller model, or a GPU with more memory")
                  + " (--skip_memory_check runs it anyway)")

