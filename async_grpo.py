"""Asynchronous GRPO for a recipe: a vLLM server generates the next rollouts while the trainer takes its steps.

TRL's `AsyncGRPOTrainer` (experimental in TRL 1.16) sends generation to a vLLM server and scores completions in a
child process, so generation, rewards and the optimizer step overlap instead of taking turns. A rollout may then come
from a policy up to `--max_staleness` updates old (slightly off-policy; the loss's importance ratio corrects for it).
With `--use_peft` each update reaches the server as adapter files (`{name}-v{N}`), loaded between a pause and a resume.

The recipe supplies its dataset, system prompt, rubric, tools and defaults through the contract in
grpo_recipes/contract.py, as it does for evaluate.py; the trainer call that differs is here, in one place. Why a script
and not a switch in every recipe: a recipe keeps one `GRPOTrainer(...)` call that reads top to bottom, and the async
trainer takes different arguments (a server, no eval loop, no `reward_weights`) that would double each recipe's trainer
section.

    # two GPUs: the server on GPU 0 (the recipe's model, LoRA slots for max_staleness + 2 adapters, the dev endpoints
    # TRL calls, log-probs after temperature and top-p as the trainer computes them), the trainer on GPU 1
    CUDA_VISIBLE_DEVICES=0 VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 vllm serve \\
        Qwen/Qwen2.5-1.5B-Instruct --port 8000 --enable-lora --max-lora-rank 16 --max-loras 4 \\
        --logprobs-mode processed_logprobs --max-model-len 4096
    CUDA_VISIBLE_DEVICES=1 python async_grpo.py gsm8k_grpo --max_staleness 1   # any recipe flag or --config works
    # one GPU: the same, both on GPU 0, the server held to a share of it (vLLM's default takes 92%)
    ... vllm serve ... --gpu-memory-utilization 0.35

Before the model loads it checks, one line each, what the run needs of the server (the model under its name, LoRA
slots, the dev endpoints, `--logprobs-mode processed_logprobs`), of this GPU (memory beside the server; flash-attn3's
kernels exist for sm80 and sm90 only, so other GPUs attend with SDPA) and of the options. Without --max_steps the run
is num_train_epochs over the data and its LR schedule is sized to that length (schedule_length says how).

What works where: LoRA (`--use_peft`, every recipe's default) syncs as adapter files, on a GPU or a CPU (vLLM's CPU
build serves; on a CPU start it with `--no-enable-chunked-prefill`: its engine fails seeded requests prefilled in
chunks). A full fine-tune streams weights over NCCL: CUDA on both sides. On a GPU the trainer attends with flash-attn3
from the `kernels` package (`pip install kernels`); on a CPU (or with `--tree_attention sdpa`) this script computes the
same tree attention with transformers' SDPA and a mask. Each step line shows the staleness of its rollouts, the
trainer's wait for them, the server's busy share and the adapter version it generates with.

Tool recipes (tool_use_grpo, search_agent_grpo, a fork whose setup returns an environment_factory) run their tools in
the trainer's rollout process, a spawned one: the recipe's environment factory and rewards are pickled there with the
run's options and start their sandbox or load their index on first use. TRL's multi-turn loop parses the calls from the
completion text (the server needs no tool-call parser) and masks the tool output out of the loss. tool_use_grpo's
per-step tool-time budget has no steps to share there: each call stops at `--tool_timeout`.
"""

import importlib.util
import logging
import math
import os
import pickle
import re
import sys
import threading
from dataclasses import dataclass, field, fields

import requests
import torch
from trl import ModelConfig, get_peft_config

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # the run summary says it is TRL's experimental trainer
from transformers import TrainerCallback
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

import rewards
from grpo_recipes import contract, data, options, training, trl_patches
from grpo_recipes.configs import default_precision
from grpo_recipes.difficulty import DifficultyOptions
from grpo_recipes.console import logger
from grpo_recipes.ranges import check_ranges
from grpo_recipes.refusal import Refusal, run_script

# TRL's async trainer logs five lines per weight sync; the step line carries what they measure (perf/weight_sync_s)
logging.getLogger("trl.experimental.async_grpo").setLevel(logging.WARNING)


@dataclass
class AsyncRecipeConfig(AsyncGRPOConfig, DifficultyOptions):
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
    skip_memory_check: bool = field(default=False, metadata={"help": "Start even when the GPU memory estimate says "
                                    "the run does not fit beside the server's share."})
    tree_attention: str = field(default="flash-attn3", metadata={
        "choices": ["flash-attn3", "sdpa"], "help": "How the packed rollouts' tree attention is computed: TRL's "
        "flash-attn3 (CUDA; the kernels package fetches it from the Hub), or transformers' SDPA with a tree mask (the "
        "same attention, slower; any device, no download). Without CUDA: sdpa."})
    token_budget: int | None = field(default=0, metadata={"help": "Tokens per packed micro-batch row. Default 0: "
                                     "per_device_train_batch_size samples, as in the recipe (TRL's default, the "
                                     "server's max_model_len, packs as many samples as fit, so a step's batch size "
                                     "would vary)."})

    def __post_init__(self):
        default_precision(self)  # as the recipes: bf16 where the GPU has it, fp16 on a T4, fp32 on a CPU
        super().__post_init__()
        check_ranges(self)


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


def check_server(training_args, model_args) -> dict:
    """The vLLM server is up, serves this model under its name, exposes TRL's dev endpoints, returns the log-probs
    the trainer compares against, and (LoRA) holds enough adapters of a large enough rank; each missing piece is one
    line naming the fix. Returns the server's vLLM config."""
    url = training_args.vllm_server_base_url.rstrip("/")
    try:
        served = [m["id"] for m in requests.get(f"{url}/v1/models", timeout=10).json()["data"]]
    except requests.ConnectionError:
        raise Refusal(f"no vLLM server at {url}: start one with `vllm serve {model_args.model_name_or_path} --port "
                      "...` (async_grpo.py's docstring has the whole command), or pass "
                      "--vllm_server_base_url") from None
    if model_args.model_name_or_path not in served:
        raise Refusal(f"the server at {url} serves {', '.join(served)}, not {model_args.model_name_or_path}: serve "
                      "that model, or pass the served one as --model_name_or_path")
    earlier = sorted(name for name in served if name.startswith("trl-policy-v"))
    if earlier:  # TRL numbers each run's adapters from v1: loading v1 again fails halfway into the first sync
        raise Refusal(f"the server at {url} still holds an earlier run's adapters ({', '.join(earlier)}): restart it")
    if not model_args.use_peft and not torch.cuda.is_available():
        raise Refusal("a full fine-tune syncs weights to vLLM over NCCL, which needs CUDA: add --use_peft (adapter "
                      "files)")
    answer = requests.get(f"{url}/server_info", params={"config_format": "json"}, timeout=10)
    if answer.status_code == 404:
        raise Refusal(f"{url}/server_info is missing: start the server with VLLM_SERVER_DEV_MODE=1 (TRL pauses, "
                      "resumes and loads adapters through its dev endpoints)")
    config = answer.json()["vllm_config"]
    if model_args.use_peft:
        check_lora_slots(config["lora_config"], training_args, model_args)
    problems, fixes = [], []  # both at once: a server that has both needs one restart, not two
    device = str((config.get("device_config") or {}).get("device"))
    if device == "cpu" and (config.get("scheduler_config") or {}).get("enable_chunked_prefill"):
        # TRL seeds every request, and vLLM's CPU engine fails a seeded request whose prefill is split in chunks
        # ("CPU Generator does not use offset"): the server would die mid-run, at the first long prompt
        problems.append("runs vLLM's CPU engine with chunked prefill, which fails the seeded requests TRL sends")
        fixes.append("--no-enable-chunked-prefill")
    mode = (config.get("model_config") or {}).get("logprobs_mode")
    if mode != "processed_logprobs":
        # vLLM's default returns log-probs before temperature and top-p/top-k; TRL's async worker stores them as the
        # rollout's old log-probs while the trainer's are computed after temperature: every importance ratio would be
        # off once --temperature or --top_p moves from 1 (as TRL's own `trl vllm-serve` avoids)
        problems.append(f"returns {mode} (vLLM's default), not the sampled distribution's log-probs the importance "
                        "ratio needs")
        fixes.append("--logprobs-mode processed_logprobs")
    if problems:
        raise Refusal(f"the server {'; and it '.join(problems)}: restart it with {' '.join(fixes)}")
    return config


def check_lora_slots(lora: dict | None, training_args, model_args) -> None:
    """The server loads adapters at runtime: enough slots (max_staleness + 2) of this run's rank."""
    needed = training_args.max_staleness + 2
    if lora is None:
        raise Refusal(f"the server was started without LoRA: add --enable-lora --max-lora-rank {model_args.lora_r} "
                      f"--max-loras {needed} and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1")
    if lora["max_lora_rank"] < model_args.lora_r or lora["max_loras"] < needed:
        raise Refusal(f"the server holds {lora['max_loras']} adapters of rank <= {lora['max_lora_rank']}; this run "
                      f"needs {needed} (--max_staleness {training_args.max_staleness} + 2) of rank "
                      f"{model_args.lora_r}: restart it with --max-lora-rank "
                      f"{max(model_args.lora_r, lora['max_lora_rank'])} --max-loras {needed}")


def server_memory_share(config: dict) -> float | None:
    """The share of its GPU a CUDA server reserves (--gpu-memory-utilization), or None for a CPU server."""
    if str((config.get("device_config") or {}).get("device")) == "cpu":
        return None
    return float((config.get("cache_config") or {}).get("gpu_memory_utilization", 0.92))


FLASH_ATTN3_CAPABILITIES = ((8, 0), (9, 0))  # the kernels package's flash-attn3 builds: sm80 (A100), sm90 (H100/H200)


def check_attention(training_args, capability: tuple[int, int] | None = None) -> None:
    """Tree attention the trainer can run here: flash-attn3 needs CUDA, a GPU it is built for and the `kernels`
    package; without CUDA, or on another GPU (a T4, an L4, a Blackwell card), SDPA with a tree mask computes the same
    attention, said in one line. `capability` is the GPU's (default: this machine's first)."""
    if training_args.tree_attention != "flash-attn3":
        return
    if capability is None and not torch.cuda.is_available():
        training_args.tree_attention = "sdpa"
        return
    capability = capability or torch.cuda.get_device_capability()
    if tuple(capability) not in FLASH_ATTN3_CAPABILITIES:
        training_args.tree_attention = "sdpa"
        logger.warning(f"this GPU is sm{capability[0]}{capability[1]}: TRL's flash-attn3 kernels exist for sm80 and "
                       "sm90 only, so tree attention by transformers' SDPA with a tree mask (the same attention, "
                       "slower)")
    elif importlib.util.find_spec("kernels") is None:
        raise Refusal("TRL's async trainer loads flash-attn3 with the kernels package: `pip install kernels`, or pass "
                      "--tree_attention sdpa")


def schedule_length(training_args, num_prompts: int) -> None:
    """Without --max_steps, TRL's async trainer stops after num_train_epochs passes over the prompts but sizes its LR
    schedule by a safety ceiling (about 32x the run): the recipes' warmup and cosine decay would never be reached, and
    the run would train at a fraction of its rate. Set max_steps to the run's length, num_train_epochs x prompts x
    num_generations / samples per step, which becomes both the schedule's length and the stop (one training row per
    completion; a multi-turn conversation TRL forks into several rows, where a chat template rewrites earlier turns,
    makes a step hold fewer prompts, and the run then ends before its last epoch does)."""
    if training_args.max_steps > 0:
        return
    samples_per_step = (training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
                        * training_args.world_size)
    rows = training_args.num_train_epochs * num_prompts * training_args.num_generations
    training_args.max_steps = max(1, math.ceil(rows / samples_per_step))
    logger.info(f"max_steps {training_args.max_steps}: {training_args.num_train_epochs:g} epoch(s) of {num_prompts} "
                f"prompts x {training_args.num_generations} completions / {samples_per_step} per step, the length of "
                f"the {getattr(training_args.lr_scheduler_type, 'value', '')} LR schedule")


def check_picklable(named: dict) -> None:
    """The rewards run in a child process: each must pickle (a module-level function or a class instance)."""
    for name, value in named.items():
        try:
            pickle.dumps(value)
        except Exception as err:  # noqa: BLE001 - pickle raises several types
            raise Refusal(f"{name} cannot be sent to the async trainer's reward process ({err}): use a module-level "
                          "function or a class instance, not a lambda or a closure") from None


class ServerLoad(TrainerCallback):
    """Logs what the trainer's own metrics leave out: the adapter version the server generates with
    (`sync/adapter_version`) and the share of the time since the last log that it was generating
    (`server/busy_frac`, sampled from vLLM's `num_requests_running` every `interval` seconds)."""

    def __init__(self, trainer: AsyncGRPOTrainer, interval: float = 0.5):
        self.trainer, self.interval, self.samples = trainer, interval, []
        self.url = trainer.args.vllm_server_base_url.rstrip("/") + "/metrics"
        self.stopped = threading.Event()
        threading.Thread(target=self.sample, daemon=True).start()

    def sample(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                text = requests.get(self.url, timeout=5).text
            except requests.RequestException:
                continue  # a busy server is late to answer: skip the sample rather than count it either way
            running = re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)", text, re.MULTILINE)
            self.samples.append(sum(float(value) for value in running) > 0)

    def on_log(self, args, state, control, logs=None, **kwargs):
        samples, self.samples = self.samples, []
        if logs is None or "train_runtime" in logs:
            return
        added = {"sync/adapter_version": self.trainer.model_version}
        if samples:
            added["server/busy_frac"] = sum(samples) / len(samples)
        logs.update(added)  # for the step line
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(added)  # for the checkpoint's trainer_state.json (a copy of logs)

    def on_train_end(self, args, state, control, **kwargs):
        self.stopped.set()


def unload_adapters(training_args) -> None:
    """Unload the adapters this run left on the server (TRL keeps the newest max_staleness + 1), so the next run
    against it starts clean; their files stay in output_dir/.vllm_lora."""
    url = training_args.vllm_server_base_url.rstrip("/")
    for name in [m["id"] for m in requests.get(f"{url}/v1/models", timeout=10).json()["data"]]:
        if name.startswith("trl-policy-v"):  # none was there when the run started (check_server)
            requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def main(argv: list[str] | None = None) -> AsyncGRPOTrainer:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        raise Refusal(__doc__, exit_code=0)
    if not argv or argv[0].startswith("-"):
        raise Refusal(f"usage: python async_grpo.py <recipe> [its flags]; recipes: {', '.join(contract.RECIPES)}")
    recipe = contract.load_recipe(argv.pop(0))
    defaults, differences = recipe_defaults(recipe)
    script_args, training_args, model_args = options.parse_args(
        recipe.ScriptArguments, defaults, argv, config_class=AsyncRecipeConfig,
        ignore_keys=dict.fromkeys(EVAL_KEYS, NO_EVAL))
    training_args.dtype = model_args.dtype
    if training_args.eval_strategy != "no":
        raise Refusal(f"--eval_strategy {getattr(training_args.eval_strategy, 'value', '')}: {NO_EVAL}; drop it")
    if model_args.attn_implementation is not None:
        raise Refusal(f"--attn_implementation {model_args.attn_implementation}: the async trainer sets its own (tree "
                      "attention over packed rollouts); drop it")
    task = contract.checked_setup(recipe, script_args)  # pickled into the trainer's rollout process, restarted there
    if movers := [hooks for hooks in task.callbacks if hooks.moves_rollouts]:  # they would step in this process only
        raise Refusal(f"{recipe.__name__}'s {type(movers[0]).__name__} moves what the rollouts read as training "
                      f"steps, and here the rollouts are generated and scored in another process: pass "
                      f"{movers[0].moves_rollouts}")
    server = check_server(training_args, model_args)
    # here first: a sandbox that cannot start is one line; the memory check counts the server's share of the GPU
    tokenizer = training.prepare(training_args, model_args, task, generation_server=True,
                                 server_share=server_memory_share(server))
    training_args.model_init_kwargs.pop("attn_implementation")  # see above: the trainer passes it itself
    check_attention(training_args)
    if differences:
        logger.warning(f"where this run differs from {recipe.__name__}.py: {'; '.join(differences)}")
    reward_funcs = [WeightedReward(f, w) for f, w in zip(task.reward_funcs, training_args.reward_weights, strict=True)]
    check_picklable({rewards.reward_name(f): f for f in reward_funcs} | {"the tools": task.environment_factory})
    train_dataset, _ = data.load_splits(task.build_dataset, training_args, script_args.dataset_path, 0)
    training.check_rows(task, train_dataset, tokenizer)  # prompts rendered, each reward called on real rows
    schedule_length(training_args, len(train_dataset))
    if not torch.cuda.is_available():  # TRL 1.16's async trainer assumes a GPU here (and for flash-attn3)
        trl_patches.no_mfu_without_cuda()
        logger.warning("no CUDA: tree attention by transformers' SDPA with a tree mask instead of flash-attn3 (the "
                       "same attention, slower), MFU not logged")
    trainer = AsyncGRPOTrainer(
        model=model_args.model_name_or_path,  # also the name the vLLM server serves it under
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),  # LoRA: each update reaches the server as adapter files
        environment_factory=task.environment_factory,  # a tool recipe's tools, run in the rollout process
    )  # (task.callbacks act on tools in this process: here the tools run in the rollout process, which has no steps)
    if training_args.tree_attention == "sdpa":  # replaces the flash-attn3 one the trainer registered under this name
        trl_patches.use_sdpa_tree_attention()
    trainer.callback_handler.callbacks.insert(0, ServerLoad(trainer))  # first: the step line shows what it adds
    try:
        return training.run(trainer, task.reward_funcs)
    finally:
        if model_args.use_peft:
            unload_adapters(training_args)


if __name__ == "__main__":
    run_script(main)
