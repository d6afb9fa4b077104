"""grpo_recipes/memory.py: the GPU memory estimate against hand arithmetic and measured peaks, and the refusal with
what fits."""

import pytest

import gsm8k_grpo
from grpo_recipes import configs, contract, memory, options
from grpo_recipes.refusal import Refusal


def parse_args(argv: list[str]):
    return options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv)


QWEN = {  # the published Qwen2.5 configurations, and their published parameter counts
    "0.5B": (dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True), 494_032_768),
    "1.5B": (dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True), 1_543_714_304),
    "7B": (dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False), 7_615_616_512),
}


def by_hand(shape: dict) -> tuple[int, int]:
    """(parameters of the decoder's linear layers, LoRA parameters per unit of rank), from the shapes alone."""
    h, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    linear = layers * (2 * h * h + 2 * h * kv + 3 * h * i)  # q, o; k, v; gate, up, down
    lora = layers * (2 * (h + h) + 2 * (h + kv) + 3 * (h + i))
    return linear, lora


@pytest.mark.parametrize("size", sorted(QWEN))
@pytest.mark.parametrize("variant", ["full", "lora", "qlora"])
def test_the_memory_estimate_counts_the_published_parameters_in_the_dtypes_that_train(size, variant):
    """The parameter counts against the published ones and the shapes' arithmetic; the activation terms are checked
    against measurement (test_the_memory_estimate_is_within_25_percent_of_measured_peaks)."""
    from transformers import Qwen2Config

    shape, params = QWEN[size]
    linear, lora_per_rank = by_hand(shape)
    estimate = memory.estimate_memory(Qwen2Config(**shape), weight_dtype="float32" if variant == "full" else
                                        "bfloat16", half=True, use_peft=variant != "full",
                                        load_in_4bit=variant == "qlora", lora_r=16, batch=8, generation_batch=32,
                                        prompt=256, completion=512, checkpointing=True, use_vllm=True)
    lora = 16 * lora_per_rank
    base = linear * 0.5625 + (params - linear) * 2 if variant == "qlora" else params * (4 if variant == "full" else 2)
    assert estimate["weights"] == pytest.approx(base + (0 if variant == "full" else lora * 4))  # LoRA in float32
    trainable_bytes = params * 4 if variant == "full" else lora * 4  # float32 masters; LoRA in float32
    head = shape["vocab_size"] * shape["hidden_size"] * 4 if variant == "full" else 0  # the fused head's buffer
    assert estimate["gradients"] == pytest.approx(trainable_bytes + head)
    assert estimate["optimizer"] == pytest.approx(2 * trainable_bytes)


def write_config(folder, size: str):
    from transformers import Qwen2Config

    Qwen2Config(**QWEN[size][0]).save_pretrained(folder)
    return str(folder)


def on_a_bf16_gpu(recipe, argv: list[str]):
    """A recipe's arguments as a bf16 GPU with vLLM gets them (this CPU refuses --bf16 and has no vLLM)."""
    _, args, model_args = options.parse_args(recipe.ScriptArguments, recipe.RECIPE_DEFAULTS, argv)
    args.bf16, args.use_vllm, args.vllm_mode = True, True, "colocate"  # vLLM beside training
    configs.apply_dependent_defaults(args, model_args, {a[2:] for a in argv if a.startswith("--")})
    memory.size_colocated_vllm(args, model_args, total=GPU_24GB[1])  # its share of a 24 GB GPU
    return args, model_args


GPU_24GB = (int(22.5 * memory.GiB), 24 * memory.GiB)  # free after the CUDA driver, and total


@pytest.mark.parametrize("recipe", contract.RECIPES)
def test_every_recipes_defaults_fit_one_24_gb_gpu(tmp_path, recipe):
    """The recipes say they fit one 24 GB GPU: the search agent's 2,048-token completions too (the estimate once
    charged full logits TRL never allocates, 13.9 GiB of them, and refused it)."""
    import importlib

    args, model_args = on_a_bf16_gpu(importlib.import_module(recipe), ["--model_name_or_path",
                                                                       write_config(tmp_path, "1.5B")])
    memory.check_memory(args, model_args, gpu=GPU_24GB)  # no exit


def test_a_full_fine_tune_is_refused_on_24_gb_with_what_fits_and_the_check_can_be_skipped(tmp_path):
    argv = ["--model_name_or_path", write_config(tmp_path, "1.5B"), "--use_peft", "false"]
    args, model_args = on_a_bf16_gpu(gsm8k_grpo, argv)
    assert model_args.dtype == "float32"  # master weights: 16 bytes a parameter with AdamW
    with pytest.raises(Refusal, match=r"needs about 3\d\.\d GiB .* 22\.5 GiB are free: try --use_peft \(~\d+\.\d "
                       r"GiB\).* \(--skip_memory_check runs it anyway\)"):
        memory.check_memory(args, model_args, gpu=GPU_24GB)
    memory.check_memory(args, model_args, gpu=(78 * memory.GiB, 80 * memory.GiB))  # fits an 80 GB card
    args, model_args = on_a_bf16_gpu(gsm8k_grpo, [*argv, "--skip_memory_check", "true"])
    memory.check_memory(args, model_args, gpu=GPU_24GB)


def test_zero_3_and_fsdp_divide_what_they_shard(monkeypatch, tmp_path):
    from transformers import AutoConfig

    args, model_args = on_a_bf16_gpu(gsm8k_grpo, ["--model_name_or_path", write_config(tmp_path, "1.5B"),
                                                  "--use_peft", "false"])
    config = AutoConfig.from_pretrained(tmp_path)
    one = memory.estimate_memory(config, **memory.memory_options(args, model_args))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    four = memory.estimate_memory(config, **memory.memory_options(args, model_args))
    for part in ("weights", "gradients", "optimizer"):
        assert four[part] == pytest.approx(one[part] / 4)
    assert four["activations"] == one["activations"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_a_torch_without_cuda_refuses_to_train_a_large_model_on_the_cpu_unless_asked(tmp_path):
    _, args, model_args = parse_args(["--model_name_or_path", write_config(tmp_path, "1.5B")])
    with pytest.raises(Refusal, match=r"no CUDA GPU here .* training 1\.5B parameters on the CPU takes days.* "
                       r"--use_cpu true"):
        memory.check_memory(args, model_args)
    args.use_cpu = True
    memory.check_memory(args, model_args)  # asked for


@pytest.mark.slow  # two real-shaped GRPO runs under torch's profiler: with the learning checks
def test_the_memory_estimate_is_within_25_percent_of_measured_peaks():
    """benchmarks/bench_memory.py: two gsm8k steps under bf16 autocast with Qwen2.5-0.5B's layer shapes, with LoRA and
    with a full fine-tune, two layers each (-1.5B's full fine-tune took 5.9 of CI's minutes under load; the bench's
    default, four configurations of 4-8 layers, took 7.5 minutes and gives docs/recipes.md's table); it exits
    non-zero when an estimate is off by more than 25%."""
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--configs", "0.5B:lora:2",
                           "0.5B:full:2"], capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith(("| 0.5B", "| 1.5B"))]
    assert [row[2].strip() for row in rows] == ["LoRA r=16", "full"]
    assert all(abs(float(row[-2].strip().rstrip("%"))) <= 25 for row in rows)


def test_evaluation_log_probs_and_ddp_buckets_are_counted(tmp_path, monkeypatch):
    """Two peaks the training step misses: evaluation with vLLM scores per_device_eval_batch_size whole sequences in
    one no-grad forward (search_agent_grpo's 2,048-token completions), and DDP keeps its gradient buckets, a second
    copy of the gradients (a full fine-tune: 4 bytes a parameter more)."""
    import search_agent_grpo
    from transformers import AutoConfig

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    folder = write_config(tmp_path, "1.5B")
    config = AutoConfig.from_pretrained(folder)
    args, model_args = on_a_bf16_gpu(search_agent_grpo, ["--model_name_or_path", folder])
    evaluating = memory.estimate_memory(config, **memory.memory_options(args, model_args))
    args.eval_strategy = "no"
    training = memory.estimate_memory(config, **memory.memory_options(args, model_args))
    assert evaluating["activations"] > training["activations"]  # the eval forward is this recipe's peak
    args, model_args = on_a_bf16_gpu(gsm8k_grpo, ["--model_name_or_path", folder, "--use_peft", "false"])
    one = memory.estimate_memory(config, **memory.memory_options(args, model_args))
    monkeypatch.setenv("WORLD_SIZE", "2")
    ddp = memory.estimate_memory(config, **memory.memory_options(args, model_args))
    params = memory.count_parameters(config)[0]
    assert ddp["gradients"] - one["gradients"] == pytest.approx(params * 4)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # FSDP shards instead: no buckets of the whole model
    assert memory.estimate_memory(config, **memory.memory_options(args, model_args))["gradients"] < one["gradients"]


def test_a_run_beside_a_vllm_server_on_its_gpu_is_told_the_server_share_that_fits(tmp_path, monkeypatch):
    """async_grpo.py: the trainer holds no KV cache and runs no evaluation; on the server's GPU, where vLLM's default
    reserved 92%, the line names the --gpu-memory-utilization that leaves the trainer room; on a GPU of its own the
    same run starts."""
    import async_grpo

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    defaults, _ = async_grpo.recipe_defaults(gsm8k_grpo)
    _, args, model_args = options.parse_args(gsm8k_grpo.ScriptArguments, defaults,
                                             ["--model_name_or_path", write_config(tmp_path, "1.5B")],
                                             config_class=async_grpo.AsyncRecipeConfig, ignore_keys={})
    args.bf16, model_args.dtype = True, "bfloat16"
    memory.check_memory(args, model_args, gpu=GPU_24GB, server_share=0.92, generation_server=True)  # its own GPU
    shared = (int(24 * 0.08 * memory.GiB), 24 * memory.GiB)
    with pytest.raises(Refusal, match=r"if the vLLM server shares this GPU \(it reserves 92% of its GPU\), restart "
                       r"it with --gpu-memory-utilization 0\.\d+, or serve on another GPU"):
        memory.check_memory(args, model_args, gpu=shared, server_share=0.92, generation_server=True)


@pytest.mark.parametrize("recipe", contract.RECIPES)
def test_colocated_vllm_is_sized_from_the_gpu_and_the_runs_lengths_unless_given(tmp_path, recipe):
    """vLLM's share covers its weights and one generation batch's KV cache on every card, and no more than that
    rounded up (a fixed 0.3 held 24 GB for a 3 GB model on 80 GB). Its context stays the model's where one sequence
    of it fits that share (32,768 tokens of the 1.5B model everywhere), and is capped at a prompt allowance + the run's
    completions where it would not (a 131,072-token context on 16 GB, where vLLM would refuse to start)."""
    import importlib

    from transformers import AutoConfig

    module = importlib.import_module(recipe)
    folder = write_config(tmp_path, "1.5B")
    weights = memory.count_parameters(AutoConfig.from_pretrained(folder))[0] * 2
    shares = {}
    for gigabytes in (16, 24, 80):
        args, model_args = on_a_bf16_gpu(module, ["--model_name_or_path", folder])
        args.vllm_gpu_memory_utilization = None  # on_a_bf16_gpu sized it for 24 GB
        memory.size_colocated_vllm(args, model_args, total=gigabytes * memory.GiB)
        shares[gigabytes] = args.vllm_gpu_memory_utilization
        assert shares[gigabytes] * gigabytes * memory.GiB > weights + memory.GiB  # room for a KV cache
        assert args.vllm_max_model_length is None  # the model's own 32,768 fits
    assert shares[80] == 0.1 and shares[16] > shares[24] > shares[80], shares
    long_context = tmp_path / "long"
    AutoConfig.from_pretrained(folder, max_position_embeddings=131072).save_pretrained(long_context)
    for gigabytes, context in ((16, memory.PROMPT_ALLOWANCE + module.RECIPE_DEFAULTS["max_completion_length"]),
                               (80, None)):
        args, model_args = on_a_bf16_gpu(module, ["--model_name_or_path", str(long_context)])
        args.vllm_gpu_memory_utilization = args.vllm_max_model_length = None
        memory.size_colocated_vllm(args, model_args, total=gigabytes * memory.GiB)
        assert args.vllm_max_model_length == context, gigabytes
    args, model_args = on_a_bf16_gpu(module, ["--model_name_or_path", folder, "--vllm_gpu_memory_utilization", "0.5",
                                              "--vllm_max_model_length", "8192"])
    assert (args.vllm_gpu_memory_utilization, args.vllm_max_model_length) == (0.5, 8192)  # given: kept
