"""GRPO on GSM8K with the <reasoning>/<answer> format: the classic one-file recipe, on TRL 1.16.

One GPU (vLLM colocate when installed):   python gsm8k_grpo.py
LoRA, or 4-bit QLoRA on a small GPU:      python gsm8k_grpo.py --use_peft [--load_in_4bit]
Any GRPOConfig field, CLI or YAML:        python gsm8k_grpo.py --config my.yaml --learning_rate 1e-6
Offline on CPU, tiny model (< 1 min):     python offline.py && python gsm8k_grpo.py --config offline/gsm8k_grpo.yaml
Jupyter or Colab (free T4):              notebooks/gsm8k_grpo.ipynb, generated from this file
"""

# %%
import importlib.util
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset, load_dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config, get_quantization_config

import rewards

logger = logging.getLogger("grpo-recipes")

# %% [markdown]
# ## Config
# GRPO samples a group of completions for each prompt, scores each one with the rubric, and raises the probability of
# those that beat their group's mean: no value model, no reference answers beyond the final number. The defaults are
# sized for one GPU; any field can be changed from the command line, a `--config` YAML, or `NOTEBOOK_ARGS` below.

# %%
MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"
# A notebook on Colab's free T4 puts these first: 0.5B with LoRA, fewer and shorter steps ("--load_in_4bit" for 1.5B).
COLAB_ARGS = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--use_peft", "--learning_rate", "2e-5",
              "--max_steps", "100", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "1",
              "--max_completion_length", "256", "--eval_steps", "50", "--save_steps", "50", "--num_eval_examples", "64"]

# Valid on ONE GPU: per_device_train_batch_size × GPUs × steps_per_generation must be a multiple of num_generations.
RECIPE_DEFAULTS = dict(
    output_dir="runs/gsm8k_grpo",
    learning_rate=5e-6, adam_beta2=0.99, weight_decay=0.1,
    warmup_steps=0.1, lr_scheduler_type="cosine", max_grad_norm=0.1,
    activation_checkpointing=True,  # a.k.a. gradient_checkpointing: trades ~20% speed for memory
    num_generations=8,  # completions per prompt; GRPO's advantage is each one's reward relative to its group
    per_device_train_batch_size=8, max_completion_length=512,
    gradient_accumulation_steps=4,  # 32 completions (4 prompts × 8) per optimizer step
    num_train_epochs=1, logging_steps=1, save_steps=100, save_total_limit=3,
    eval_strategy="steps", eval_steps=100, per_device_eval_batch_size=16, num_generations_eval=4,
    vllm_gpu_memory_utilization=0.3,  # colocate mode (TRL's default): vLLM shares the GPU with training
    num_completions_to_print=2,  # used with --log_completions
    lora_r=16, lora_alpha=32, lora_target_modules=["all-linear"],  # used with --use_peft
)


def arg(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class ScriptArguments:
    dataset_path: str | None = arg(None, "Local GSM8K-form data: a JSON/JSONL/parquet file or a folder of split files.")
    num_eval_examples: int = arg(200, "Held-out test problems scored with the same rewards at each evaluation.")


@dataclass
class RecipeGRPOConfig(GRPOConfig):
    """GRPOConfig whose precision and vLLM switch default to what this machine supports."""

    use_vllm: bool | None = field(default=None, metadata={"nargs": "?", "const": True, "help": "Generate with vLLM. "
                                  "Default: on when vLLM is installed and a CUDA GPU is present, off otherwise."})

    def __post_init__(self):
        cuda = default_precision(self)
        vllm_installed = importlib.util.find_spec("vllm") is not None
        if self.use_vllm is None:
            self.use_vllm = cuda and vllm_installed
        elif self.use_vllm and not vllm_installed:
            sys.exit("--use_vllm: vLLM is not installed; `pip install 'trl[vllm]'` or drop --use_vllm.")
        elif self.use_vllm and not cuda:
            sys.exit("--use_vllm needs a CUDA GPU; drop --use_vllm to generate with transformers.")
        check_batch_divisibility(self)
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


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, RecipeGRPOConfig, ModelConfig]:
    parser = TrlParser((ScriptArguments, RecipeGRPOConfig, ModelConfig))  # CLI over --config YAML over RECIPE_DEFAULTS
    parser.set_defaults_with_config(**RECIPE_DEFAULTS, reward_weights=REWARD_WEIGHTS, model_name_or_path=MODEL_NAME)
    return parser.parse_args_and_config(argv)


# %% [markdown]
# ## Data
# GSM8K's grade-school word problems. The prompt is the system prompt plus the question; the gold answer is the number
# after `####` in the worked solution, which the correctness reward compares against.

# %%
def load_split(split: str, dataset_path: str | None = None, name="openai/gsm8k", config="main") -> Dataset:
    """One split of a Hub dataset or of local data: a JSON/JSONL/parquet file (train only) or a folder of splits."""
    if dataset_path is None:
        return load_dataset(name, config, split=split)
    if Path(dataset_path).is_dir():
        return load_dataset(dataset_path, split=split)
    file_format = "parquet" if dataset_path.endswith(".parquet") else "json"
    return load_dataset(file_format, data_files={"train": dataset_path}, split=split)


def build_dataset(split: str = "train", dataset_path: str | None = None) -> Dataset:
    """GSM8K as conversational `prompt`s (system + question) and numeric `answer`s (the text after '####')."""
    raw = load_split(split, dataset_path)
    if missing := {"question", "answer"} - set(raw.column_names):
        raise ValueError(f"{dataset_path or 'openai/gsm8k'} ({split}) lacks column(s) {sorted(missing)}: it has "
                         f"{raw.column_names}; rename them to `question` and `answer` ('<solution> #### <number>').")
    return raw.map(lambda row: {
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
        "answer": rewards.extract_hash_answer(row["answer"]),
    }, remove_columns=raw.column_names)


# %% [markdown]
# ## System prompt
# The model must think inside `<reasoning>` and answer inside `<answer>`, so the answer can be read without guessing.

# %%
SYSTEM_PROMPT = """Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""

# %% [markdown]
# ## Rewards
# `correctness_reward` pays 1 when the number in `<answer>` equals the gold answer; `integer_answer_reward` pays for a
# plain number there; the three format rewards pay for the tags. Format alone is cheap to farm, so its weights are
# small: a model cannot out-earn a correct answer with tags. `rewards.py` documents how each one could be gamed.

# %%
# A correct, well-formatted answer scores 2 + 0.5 × 4 = 4.0; the best any wrong or malformed completion can reach is
# 2.0 (tests/test_rewards.py probes this with adversarial completions).
REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({
    rewards.correctness_reward: 2.0,
    rewards.integer_answer_reward: 0.5,
    rewards.strict_format_reward: 0.5,
    rewards.soft_format_reward: 0.5,
    rewards.xml_tag_count_reward: 0.5,
})


# %% [markdown]
# ## Trainer
# Pre-flight checks that fail in one line before any model is loaded, then TRL's `GRPOTrainer`: generation (vLLM on a
# GPU when installed), the rubric, the GRPO loss, logging, checkpoints, and a plot of the rewards when it is done.

# %%
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


def prepare(training_args: GRPOConfig, model_args: ModelConfig, reward_funcs: list):
    """Logging, the checks TRL would only fail on after loading the model, wandb, and the tokenizer."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(name)s: %(message)s")
    if world > 1:  # one line per process, so a multi-GPU launch shows every rank came up
        logger.warning(f"process {rank} of {world} ready")
    if "OMP_NUM_THREADS" in os.environ:  # torch read it at import, before a YAML `env:` block could set it
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    check_model_options(training_args, model_args, reward_funcs)
    generation = f"vLLM ({training_args.vllm_mode})" if training_args.use_vllm else "transformers" + (
        " (install vLLM for faster generation)" if torch.cuda.is_available() else "")
    precision = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
    logger.info(f"precision {precision}; generation with {generation}")
    logger.info("rubric:\n" + rewards.rubric_table(reward_funcs, training_args.reward_weights))
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    if tokenizer.chat_template is None:
        sys.exit(f"{model_args.model_name_or_path} has no chat template; use an instruct/chat model or set "
                 "tokenizer.chat_template before training.")
    setup_wandb(training_args)
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision,
                                       "attn_implementation": model_args.attn_implementation,
                                       **(training_args.model_init_kwargs or {})}
    return tokenizer


def load_splits(build, script_args, training_args: GRPOConfig) -> tuple[Dataset, Dataset | None]:
    """`build("train")`, and `build("test")` cut to num_eval_examples when evaluating; bad data exits in one line."""
    evaluate = training_args.eval_strategy != "no"
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


def train(model_args: ModelConfig, training_args: GRPOConfig, tokenizer, train_dataset, eval_dataset, reward_funcs,
          **trainer_kwargs) -> GRPOTrainer:
    """TRL's GRPOTrainer (with LoRA/QLoRA when asked), trained (resumed from a checkpoint when asked) and saved."""
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
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.is_world_process_zero():
        rewards.plot_training(trainer.state.log_history, Path(training_args.output_dir) / rewards.PLOT_FILE)
    logger.info(f"saved the trained model and {rewards.PLOT_FILE} to {training_args.output_dir}")
    return trainer


def notebook_argv(argv: list[str], colab_argv: list[str]) -> list[str]:
    """A notebook's flags; on Colab, the recipe's T4-sized flags go first and the notebook's own override them."""
    if "google.colab" not in sys.modules:
        return argv
    print("Colab: T4-sized defaults " + " ".join(colab_argv) + " (NOTEBOOK_ARGS overrides them)")
    return colab_argv + argv


def main(argv: list[str] | None = None) -> GRPOTrainer:
    script_args, training_args, model_args = parse_args(argv)
    tokenizer = prepare(training_args, model_args, REWARD_FUNCS)
    train_dataset, eval_dataset = load_splits(build_dataset, script_args, training_args)
    return train(model_args, training_args, tokenizer, train_dataset, eval_dataset, REWARD_FUNCS)


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags.
# Then look at the curves: correctness should rise while the format rewards saturate early. A total reward that climbs
# while correctness stays flat means the model found a way to farm the cheap rewards.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/gsm8k_grpo.yaml"]

# %% tags=["active-ipynb"]
# trainer = main(notebook_argv(NOTEBOOK_ARGS, COLAB_ARGS))
# rewards.show_training(trainer.args.output_dir, trainer)

# %% tags=["active-py"]
if __name__ == "__main__":
    main()
