"""preflight.py: the checks before a model loads, here the GPU memory estimate against hand arithmetic and the
refusal with what fits (the batch, template, output-directory and source checks run through the recipes' entry points
in test_mistakes.py and the recipes' tests)."""

import pytest

import gsm8k_grpo
import plumbing
import preflight


def parse_args(argv: list[str]):
    return plumbing.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv,
                               reward_weights=gsm8k_grpo.REWARD_WEIGHTS)


# ----------------------------------------------------------------------------------------------------------- memory
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
def test_the_memory_estimate_matches_hand_arithmetic(size, variant):
    from transformers import Qwen2Config

    shape, params = QWEN[size]
    linear, lora_per_rank = by_hand(shape)
    estimate = preflight.estimate_memory(Qwen2Config(**shape), bf16=True, use_peft=variant != "full",
                                        load_in_4bit=variant == "qlora", lora_r=16, batch=8, sequence=768,
                                        completion=512, checkpointing=True)
    weights = linear * 0.5625 + (params - linear) * 2 if variant == "qlora" else params * 2
    trainable_bytes = params * 2 if variant == "full" else 16 * lora_per_rank * 4  # bf16 weights; LoRA in fp32
    assert estimate["weights"] == pytest.approx(weights)
    assert estimate["gradients"] == pytest.approx(trainable_bytes)
    assert estimate["optimizer"] == pytest.approx(2 * trainable_bytes)
    logits = 8 * 512 * shape["vocab_size"] * 6
    hidden = 8 * 768 * shape["hidden_size"] * 2 * shape["num_hidden_layers"] + \
        8 * 768 * (16 * shape["hidden_size"] + 3 * shape["intermediate_size"]) * 2
    assert estimate["activations"] == pytest.approx(logits + hidden)


def write_config(folder, size: str):
    from transformers import Qwen2Config

    Qwen2Config(**QWEN[size][0]).save_pretrained(folder)
    return str(folder)


def test_the_default_fits_one_24_gb_gpu_and_a_full_fine_tune_is_refused_there_with_what_fits(tmp_path):
    _, args, model_args = parse_args(["--model_name_or_path", write_config(tmp_path, "1.5B")])
    args.bf16, model_args.dtype = True, "bfloat16"  # what a GPU with bf16 gets (this CPU refuses --bf16)
    gpu_24gb = (int(22.5 * preflight.GiB), 24 * preflight.GiB)  # free after the CUDA driver, and total
    args.use_vllm, args.vllm_mode = True, "colocate"  # vLLM beside training reserves 30% of the GPU
    preflight.check_memory(args, model_args, gpu=gpu_24gb)  # the defaults: LoRA, bf16 -- no exit
    model_args.use_peft = False
    with pytest.raises(SystemExit, match=r"needs about 2\d\.\d GiB .* 22\.5 GiB are free: try --use_peft"):
        preflight.check_memory(args, model_args, gpu=gpu_24gb)
    preflight.check_memory(args, model_args, gpu=(78 * preflight.GiB, 80 * preflight.GiB))  # fits an 80 GB card
