"""The checks a run makes before its model loads, so that a mistake costs one line, not a traceback minutes later.

`training.prepare` runs them in this order: the launch (several GPUs seen by one process; tools where every generation
is a collective), the model options TRL would reject after loading, the output folder (output_dir.py), the model's
source (a missing folder, a LoRA adapter, no network), GPU memory (memory.py), LoRA's target layers, the loggers, the
chat template (tool calls, thinking) and wandb. Each ends in one line that names the fix; a real bug still shows its
traceback.
"""

import difflib
import importlib.util
import json
import logging
import os
import shlex
import sys
from pathlib import Path

import datasets
import huggingface_hub
import torch
from trl import GRPOConfig, ModelConfig
from trl.chat_template_utils import add_response_schema, supports_tool_calling

from grpo_recipes.data import check_cache, hub_reachable
from grpo_recipes.refusal import Refusal

logger = logging.getLogger("grpo-recipes")


def check_launch(script: str, gpus: int | None = None, generation_server: bool = False) -> None:
    """A plain `python` run sees several GPUs: transformers would split one model across them (device_map="auto", a
    pipeline that runs one GPU at a time) while vLLM and the memory check use the first. Name the launch that uses
    them all, or the one-GPU run; with a vLLM server generating (async_grpo.py), the GPU beside the server's."""
    gpus = torch.cuda.device_count() if gpus is None else gpus
    if gpus > 1 and "WORLD_SIZE" not in os.environ:
        command = " ".join([script, *map(shlex.quote, sys.argv[1:])])
        if generation_server:  # the documented layout serves on GPU 0 (async_grpo.py's docstring)
            raise Refusal(f"{gpus} GPUs are visible to one process: train on the one the vLLM server does not use, "
                          f"e.g. `CUDA_VISIBLE_DEVICES=1 python {command}` beside `CUDA_VISIBLE_DEVICES=0 vllm serve "
                          "...`")
        raise Refusal(f"{gpus} GPUs are visible to one process: train on all of them with `accelerate launch "
                      f"--config_file accelerate/multi_gpu.yaml --num_processes {gpus} {command}`, or on one with "
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
        raise Refusal(f"tools across {processes} processes with {'; '.join(reasons)} can hang: TRL's tool loop runs a "
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
            raise Refusal(f"--report_to {name}: not a logger transformers knows ("
                          + (f"did you mean {close[0]}? " if close else "") + "one of: "
                                                                              f"{', '.join(INTEGRATION_TO_CALLBACK)}, "
                                                                              "or none)")
        if name not in get_available_reporting_integrations():
            raise Refusal(f"--report_to {name}: it is not installed; `pip install {PIP_NAMES.get(name, name)}`, or "
                          "pass --report_to none")


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
        raise Refusal(f"--lora_target_modules {' '.join(unmatched)}: no layer of {model_args.model_name_or_path} is "
                      f"called so (its linear layers: {', '.join(linear)}; all-linear takes every one but the output "
                      "head)")


def setup_wandb(training_args: GRPOConfig) -> None:
    """Never block on wandb's interactive login: without credentials, log offline (sync later with `wandb sync`)."""
    if "wandb" not in training_args.report_to:
        return
    if importlib.util.find_spec("wandb") is None:
        raise Refusal("--report_to wandb: wandb is not installed; `pip install wandb`.")
    netrc_path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))  # where `wandb login` stores the key
    logged_in = netrc_path.is_file() and "api.wandb.ai" in netrc_path.read_text(errors="ignore")
    if not (os.environ.get("WANDB_API_KEY") or logged_in or os.environ.get("WANDB_MODE")):
        os.environ["WANDB_MODE"] = "offline"
        logger.warning("wandb: no API key (WANDB_API_KEY or `wandb login`): logging offline; upload with `wandb sync`.")


def check_model_options(training_args: GRPOConfig, model_args: ModelConfig) -> None:
    """Fail in one line on options TRL would only reject after loading the model."""
    quantized = model_args.load_in_4bit or model_args.load_in_8bit
    if quantized and not model_args.use_peft:
        raise Refusal("--load_in_4bit/--load_in_8bit freeze the quantized model: add --use_peft to train LoRA "
                      "adapters.")
    if quantized and (training_args.use_cpu or not torch.cuda.is_available()):
        raise Refusal("--load_in_4bit/--load_in_8bit quantize with bitsandbytes, which needs a CUDA GPU: drop it to "
                      "train on this machine, or run on a GPU")
    if quantized and importlib.util.find_spec("bitsandbytes") is None:
        raise Refusal("--load_in_4bit/--load_in_8bit need bitsandbytes: `pip install bitsandbytes`.")


def check_rubric(reward_weights: list[float], reward_funcs: list, names: list[str]) -> None:
    """One weight per reward function (--reward_weights, or the recipe's own); a warning for a rubric that teaches
    nothing (every weight 0) and for a reward listed twice (TRL logs both under one name, and it counts twice)."""
    if len(reward_weights) != len(reward_funcs):
        raise Refusal(f"--reward_weights has {len(reward_weights)} values for {len(reward_funcs)} reward functions "
                      f"({', '.join(names)}).")
    if reward_funcs and not any(reward_weights):
        logger.warning(f"every reward weight is 0 ({', '.join(names)}): every completion totals 0, so GRPO's "
                       "advantages are 0 and the run learns nothing; give the rewards that matter a weight")
    if twice := sorted({name for name in names if names.count(name) > 1}):
        logger.warning(f"the rubric lists {', '.join(twice)} more than once: TRL logs them as one column and their "
                       "weights add up; list each reward once, with the weight you mean")



def check_tool_template(tokenizer, model_name: str) -> None:
    """TRL must be able to render tool calls with this chat template and parse them back out of completions."""
    try:
        add_response_schema(tokenizer)
        parses = True
    except ValueError:
        parses = False
    if not (parses and supports_tool_calling(tokenizer)):
        raise Refusal(f"{model_name}: TRL cannot parse tool calls with this chat template. Use a model from a "
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
            raise Refusal(f"--thinking: {model_name}'s chat template has no enable_thinking switch (Qwen3-style "
                          "templates have one); drop --thinking for this model.")
        return
    try:
        add_response_schema(tokenizer)
    except ValueError:
        raise Refusal(f"{model_name}: its chat template thinks (enable_thinking) but TRL cannot parse the thinking out "
                      "of its completions; use a Qwen3 or Qwen3.5 model, or a template TRL knows.") from None
    if thinking is not False and max_completion_length is not None and max_completion_length < THINKING_TOKENS:
        logger.warning(f"{model_name} thinks before it answers, in at most max_completion_length "
                       f"{max_completion_length} tokens: a completion cut inside <think> has no answer and scores 0 "
                       f"(no gradient). Pass --max_completion_length {THINKING_TOKENS} or more, or --thinking false.")


OFFLINE_HINT = "run offline with HF_HUB_OFFLINE=1 and a cached or local model (`python offline.py` builds a CPU kit)"


WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_folder(folder: Path, name: str) -> None:
    """A local --model_name_or_path must be a full model (config.json and weights): an empty folder, a file, a
    tokenizer alone, a config without weights, and a LoRA adapter (what --use_peft saves) are each named in one line,
    the adapter with the command that merges it into the full model it stands for."""
    if not folder.is_dir():
        raise Refusal(f"--model_name_or_path {name} is a file: pass the folder that holds config.json and the weights")
    inside = sorted(p.name for p in folder.iterdir())
    if not inside:
        raise Refusal(f"--model_name_or_path {name} is an empty folder: pass a model folder (config.json and weights)")
    if (folder / "adapter_config.json").is_file():
        try:
            base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        except ValueError:
            base = None
        raise Refusal(f"--model_name_or_path {name} is a LoRA adapter (on {base or 'an unnamed base'}), not a model: "
                      f"merge it into one with `python merge_models.py {name} --output_dir {name.rstrip('/')}-merged` "
                      f"and pass that, or train a new adapter on the base: --model_name_or_path {base or '<its base>'} "
                      "--use_peft")
    weights = any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS)
    if not (folder / "config.json").is_file():
        what = "a tokenizer but no model" if any(n in inside for n in TOKENIZER_FILES) else \
            f"no model ({', '.join(inside[:5])}{', …' if len(inside) > 5 else ''})"
        hint = "; the checkpoints of a run are in its checkpoint-* folders" if any(
            n.startswith("checkpoint-") for n in inside) else ""
        raise Refusal(f"--model_name_or_path {name} holds {what}: no config.json{hint}")
    if not weights:
        raise Refusal(f"--model_name_or_path {name} has a config.json but no weights (*.safetensors): the save did not "
                      "finish, or the weights are elsewhere")


def check_caches(model_name: str) -> None:
    """The caches a run writes, each one line where it cannot: datasets' (every data load writes there) and, online
    with a Hub model, the Hub's (a download, or the check for a newer copy; a read-only shared cache serves offline)."""
    check_cache(datasets.config.HF_DATASETS_CACHE, "datasets", "HF_DATASETS_CACHE")
    if not huggingface_hub.constants.HF_HUB_OFFLINE and not Path(model_name).expanduser().exists():
        check_cache(huggingface_hub.constants.HF_HUB_CACHE, "Hugging Face Hub", "HF_HUB_CACHE")


def check_model_source(name: str) -> None:
    """A local folder that does not exist, or a Hub model that cannot be fetched, is one line, not a minute of retries.
    """
    if Path(name).expanduser().exists():
        check_model_folder(Path(name).expanduser(), name)
        return
    first = name.split("/")[0]
    if name.startswith(("/", ".", "~")) or name.endswith("/") or name.count("/") > 1 or (
            "/" in name and Path(first).is_dir()):
        raise Refusal(f"--model_name_or_path {name}: no such folder")
    cached = isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str)
    if huggingface_hub.constants.HF_HUB_OFFLINE and not cached:
        raise Refusal(f"--model_name_or_path {name}: not a local folder, and not in the Hugging Face cache "
                      "(HF_HUB_OFFLINE is set); download it once online or point to a local model folder")
    if not huggingface_hub.constants.HF_HUB_OFFLINE and not hub_reachable():
        fix = "run with HF_HUB_OFFLINE=1 to use the cached copy" if cached else OFFLINE_HINT
        raise Refusal(f"cannot reach {huggingface_hub.constants.ENDPOINT} for {name} (no network?): {fix}")
