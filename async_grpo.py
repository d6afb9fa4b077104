"""Asynchronous GRPO for a recipe: a vLLM server generates the next rollouts while the trainer takes its steps.

TRL's `AsyncGRPOTrainer` (experimental in TRL 1.16) sends generation to a vLLM server and scores completions in a
child process, so generation, rewards and the optimizer step overlap instead of taking turns. A rollout may then come
from a policy up to `--max_staleness` updates old (slightly off-policy; the loss's importance ratio corrects for it).
With `--use_peft` each update reaches the server as adapter files (`{name}-v{N}`), loaded between a pause and a resume.

The recipe supplies its dataset, system prompt, rubric and defaults through harness.py's contract, as it does for
evaluate.py; the trainer call that differs is here, in one place. Why a script and not a switch in every recipe: a
recipe keeps one `GRPOTrainer(...)` call that reads top to bottom, and the async trainer takes different arguments
(a server, no eval loop, no `reward_weights`) that would double each recipe's trainer section.

    # the server: the recipe's model, LoRA slots for max_staleness + 2 adapters, the dev endpoints TRL calls
    VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 vllm serve Qwen/Qwen2.5-1.5B-Instruct --port 8000 \\
        --enable-lora --max-lora-rank 16 --max-loras 4
    python async_grpo.py gsm8k_grpo --max_staleness 1    # any recipe flag or --config works as with the recipe

What works where: a CUDA GPU for the trainer (TRL 1.16's async trainer computes attention with flash-attn3 from the
`kernels` package; a CPU is refused in one line), any vLLM server for generation. LoRA (`--use_peft`, every recipe's
default) syncs as adapter files; a full fine-tune streams weights over NCCL, CUDA on both sides. Tool recipes are not
wired yet.
"""

import importlib.util
import os
import pickle
import sys
from dataclasses import dataclass, field, fields

import requests
import torch
from trl import ModelConfig, get_peft_config

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # the run summary says it is TRL's experimental trainer
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

import harness
import plumbing
import preflight
import rewards


@dataclass
class AsyncRecipeConfig(AsyncGRPOConfig):
    """AsyncGRPOConfig with what the recipes' own config adds: reward weights (the async trainer sums its rewards
    unweighted, so each reward is scaled before it is summed), LoRA's rate, and the output-folder guard."""

    reward_weights: list[float] | None = field(default=None, metadata={"help": "One weight per reward function "
                                               "(default: the recipe's REWARD_WEIGHTS)."})
    lora_learning_rate: float | None = field(default=None, metadata={"help": "The learning rate with --use_peft, "
                                             "unless --learning_rate is given."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Start over in an output_dir that holds "
                                       "checkpoints, deleting them. Default: refuse, and say how to resume."})
    # --dtype is ModelConfig's, as in the recipes (AsyncGRPOConfig has its own; main() copies the one given here)
    dtype: str = field(default="float32", init=False)
    skip_memory_check: bool = field(default=True, metadata={"help": "The memory estimate is for colocated vLLM; "
                                    "here vLLM runs on its own device."})

    def __post_init__(self):
        plumbing.default_precision(self)  # as the recipes: bf16 where the GPU has it, fp16 on a T4, fp32 on a CPU
        super().__post_init__()
        preflight.check_ranges(self)


class WeightedReward:
    """A reward scaled by its weight, under the reward's own name (the async trainer logs each reward by name and
    sums them with weight 1). Picklable: the rewards run in the trainer's child process."""

    def __init__(self, reward, weight: float):
        self.reward, self.weight, self.__name__ = reward, weight, rewards.reward_name(reward)

    def __call__(self, *args, **kwargs):
        return [None if score is None else self.weight * score for score in self.reward(*args, **kwargs)]


NO_EVAL = "the async trainer does not evaluate during training (evaluate.py scores a saved model)"
EVAL_KEYS = ("eval_strategy", "eval_steps", "num_generations_eval", "per_device_eval_batch_size", "num_eval_examples")


DIFFERENCES = {  # a recipe default the async trainer has no option for -> what it does instead
    "scale_rewards": "each group's rewards are divided by their std (TRL's async trainer has no scale_rewards)",
    "vllm_gpu_memory_utilization": None, "use_vllm": None, "vllm_mode": None,  # colocated vLLM: the server's own
}


def recipe_defaults(recipe) -> tuple[dict, list[str]]:
    """The recipe's defaults that the async trainer has, and how the run differs where it has none."""
    known = {f.name for f in fields(AsyncRecipeConfig)} | {f.name for f in fields(ModelConfig)}
    kept = {key: value for key, value in recipe.RECIPE_DEFAULTS.items() if key in known and key not in EVAL_KEYS}
    differences = [f"{key} {value!r}: " + (DIFFERENCES.get(key) or "not an option here")
                   for key, value in recipe.RECIPE_DEFAULTS.items()
                   if key not in kept and key not in EVAL_KEYS and DIFFERENCES.get(key, "") is not None]
    return kept, differences


def check_server(training_args, model_args) -> None:
    """The vLLM server is up, serves this model under its name, and (LoRA) holds enough adapters of a large enough
    rank; each missing piece is one line naming the fix."""
    url = training_args.vllm_server_base_url.rstrip("/")
    try:
        served = [m["id"] for m in requests.get(f"{url}/v1/models", timeout=10).json()["data"]]
    except requests.ConnectionError:
        sys.exit(f"no vLLM server at {url}: start one with `vllm serve {model_args.model_name_or_path} --port ...` "
                 "(async_grpo.py's docstring has the whole command), or pass --vllm_server_base_url")
    if model_args.model_name_or_path not in served:
        sys.exit(f"the server at {url} serves {', '.join(served)}, not {model_args.model_name_or_path}: serve that "
                 "model, or pass the served one as --model_name_or_path")
    earlier = sorted(name for name in served if name.startswith("trl-policy-v"))
    if earlier:  # TRL numbers each run's adapters from v1: loading v1 again fails halfway into the first sync
        sys.exit(f"the server at {url} still holds an earlier run's adapters ({', '.join(earlier)}): restart it")
    if not model_args.use_peft:
        if not torch.cuda.is_available():
            sys.exit("a full fine-tune syncs weights to vLLM over NCCL, which needs CUDA: add --use_peft (adapter files)")
        return
    answer = requests.get(f"{url}/server_info", params={"config_format": "json"}, timeout=10)
    if answer.status_code == 404:
        sys.exit(f"{url}/server_info is missing: start the server with VLLM_SERVER_DEV_MODE=1 (TRL pauses, resumes "
                 "and loads adapters through its dev endpoints)")
    lora = answer.json()["vllm_config"]["lora_config"]
    needed = training_args.max_staleness + 2
    if lora is None:
        sys.exit(f"the server was started without LoRA: add --enable-lora --max-lora-rank {model_args.lora_r} "
                 f"--max-loras {needed} and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1")
    if lora["max_lora_rank"] < model_args.lora_r or lora["max_loras"] < needed:
        sys.exit(f"the server holds {lora['max_loras']} adapters of rank <= {lora['max_lora_rank']}; this run needs "
                 f"{needed} (--max_staleness {training_args.max_staleness} + 2) of rank {model_args.lora_r}: restart "
                 f"it with --max-lora-rank {max(model_args.lora_r, lora['max_lora_rank'])} --max-loras {needed}")


def check_attention() -> None:
    """TRL 1.16's async trainer packs rollouts into trees and computes their attention with flash-attn3, fetched by
    the `kernels` package: CUDA (or ROCm) only; torch has no CPU kernel for variable-length attention either."""
    if not torch.cuda.is_available():
        sys.exit("TRL's async trainer computes attention with flash-attn3 kernels, which need a CUDA GPU: train on a "
                 "GPU, or here with the recipe's own script (synchronous)")
    if importlib.util.find_spec("kernels") is None:
        sys.exit("TRL's async trainer loads flash-attn3 with the kernels package: `pip install kernels`")


def check_picklable(named: dict) -> None:
    """The rewards run in a child process: each must pickle (a module-level function or a class instance)."""
    for name, value in named.items():
        try:
            pickle.dumps(value)
        except Exception as err:  # noqa: BLE001 - pickle raises several types
            sys.exit(f"{name} cannot be sent to the async trainer's reward process ({err}): use a module-level "
                     "function or a class instance, not a lambda or a closure")


def main(argv: list[str] | None = None) -> AsyncGRPOTrainer:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    if not argv or argv[0].startswith("-"):
        sys.exit(f"usage: python async_grpo.py <recipe> [its flags]; recipes: {', '.join(harness.RECIPES)}")
    recipe = harness.load_recipe(argv.pop(0))
    if harness.tools_of(recipe):
        sys.exit(f"{recipe.__name__} has tools: async_grpo.py trains single-turn recipes so far (gsm8k_grpo, "
                 "code_grpo); train it with its own script")
    defaults, differences = recipe_defaults(recipe)
    script_args, training_args, model_args = plumbing.parse_args(
        recipe.ScriptArguments, defaults, argv, config_class=AsyncRecipeConfig,
        ignore_keys=dict.fromkeys(EVAL_KEYS, NO_EVAL), reward_weights=recipe.REWARD_WEIGHTS)
    training_args.dtype = model_args.dtype
    if training_args.eval_strategy != "no":
        sys.exit(f"--eval_strategy {getattr(training_args.eval_strategy, 'value', '')}: {NO_EVAL}; drop it")
    if model_args.attn_implementation is not None:
        sys.exit(f"--attn_implementation {model_args.attn_implementation}: the async trainer sets its own (tree "
                 "attention over packed rollouts); drop it")
    tokenizer = plumbing.prepare(training_args, model_args, recipe.REWARD_FUNCS)
    training_args.model_init_kwargs.pop("attn_implementation")  # see above: the trainer passes it itself
    check_server(training_args, model_args)
    check_attention()
    if differences:
        plumbing.logger.warning(f"where this run differs from {recipe.__name__}.py: {'; '.join(differences)}")
    harness.setup_rubric(recipe, script_args)
    reward_funcs = [WeightedReward(f, w) for f, w in zip(recipe.REWARD_FUNCS, training_args.reward_weights)]
    check_picklable({rewards.reward_name(f): f for f in reward_funcs})
    train_dataset, _ = plumbing.load_splits(recipe.build_dataset, training_args, script_args.dataset_path, 0)
    trainer = AsyncGRPOTrainer(
        model=model_args.model_name_or_path,  # also the name the vLLM server serves it under
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),  # LoRA: each update reaches the server as adapter files
    )
    return plumbing.run(trainer, recipe.REWARD_FUNCS)


if __name__ == "__main__":
    main()
