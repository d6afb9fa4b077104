"""merge_models.py: merges equal the hand-computed arithmetic, for full models and LoRA adapters; bad inputs get one
line."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from grpo_recipes.refusal import Refusal

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ["A crate holds 347 apples. How many apples are in 86 crates?", "print(347 * 86)", "<answer>29842</answer>"]


def tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {name: t for file in sorted(folder.glob("*.safetensors")) for name, t in load_file(file).items()}


def fine_tune(base: Path, out: Path, seed: int, only: str | None = None, scale: float = 0.05) -> Path:
    """A stand-in for a fine-tune of `base`: its weights moved by seeded noise (in one tensor only, with `only`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if only is None or name == only:
                parameter += scale * torch.randn(parameter.shape, generator=generator) * parameter.abs().mean()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    import offline

    return offline.build_tiny_model(tmp_path_factory.mktemp("merge") / "base", CORPUS, vocab_size=300, seed=0,
                                    hidden_size=32, num_layers=2)


@pytest.fixture(scope="module")
def specialists(base, tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("specialists")
    return fine_tune(base, folder / "a", seed=1), fine_tune(base, folder / "b", seed=2)


def make_adapter(base: Path, out: Path, seed: int) -> Path:
    """A LoRA adapter on `base` whose B matrices are non-zero (PEFT starts them at 0), saved as the recipes save it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory) -> Path:
    return make_adapter(base, tmp_path_factory.mktemp("lora") / "adapter", seed=3)


def lora_merged_by_hand(base: Path, adapter: Path) -> dict:
    """W + (alpha / r) B A for every adapted matrix, from the adapter's saved tensors."""
    weights = {name: t.clone() for name, t in tensors(base).items()}
    lora = tensors(adapter)
    for name in [n for n in lora if "lora_A" in n]:
        target = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        weights[target] += (8 / 4) * lora[name.replace("lora_A", "lora_B")] @ lora[name]
    return weights


def assert_weights(folder: Path, expected: dict) -> None:
    merged = tensors(folder)
    assert set(merged) == set(expected)
    for name, tensor in expected.items():
        assert merged[name].dtype == tensor.dtype, (name, merged[name].dtype, tensor.dtype)
        rtol = 2 ** -7 if tensor.dtype == torch.bfloat16 else 1e-5  # bf16: one step of its 8-bit mantissa
        torch.testing.assert_close(merged[name], tensor, rtol=rtol, atol=1e-6, msg=name)


def test_linear_merge_is_the_weighted_average_and_loads(base, specialists, tmp_path):
    import merge_models
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a, b = specialists
    out = merge_models.merge([str(a), str(b)], str(tmp_path / "merged"), weights=[0.25, 0.75])
    A, B = tensors(a), tensors(b)
    assert_weights(out, {name: 0.25 * A[name] + 0.75 * B[name] for name in A})
    model = AutoModelForCausalLM.from_pretrained(out)  # a --model_name_or_path: model, tokenizer and chat template
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(base).chat_template
    ids = tokenizer.apply_chat_template([{"role": "user", "content": CORPUS[0]}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    assert model.generate(**ids, max_new_tokens=3, do_sample=False).shape[1] == ids["input_ids"].shape[1] + 3


def test_task_arithmetic_adds_each_task_vector(base, specialists, tmp_path):
    import merge_models

    a, b = specialists
    out = merge_models.merge([str(a), str(b)], str(tmp_path / "merged"), method="task_arithmetic", base=str(base),
                             weights=[1.0, 0.5])
    W, A, B = tensors(base), tensors(a), tensors(b)
    assert_weights(out, {name: W[name] + (A[name] - W[name]) + 0.5 * (B[name] - W[name]) for name in W})


def test_ties_keeps_updates_of_different_weights_whole(base, tmp_path):
    """Where only one specialist moved a weight, TIES keeps its update whole; linear averaging would halve it."""
    import merge_models

    a = fine_tune(base, tmp_path / "a", seed=1, only="model.layers.0.self_attn.q_proj.weight", scale=1.0)
    b = fine_tune(base, tmp_path / "b", seed=2, only="model.layers.1.mlp.down_proj.weight", scale=1.0)
    out = merge_models.merge([str(a), str(b)], str(tmp_path / "ties"), method="ties", base=str(base), density=1.0)
    W, A, B = tensors(base), tensors(a), tensors(b)
    assert_weights(out, {name: A[name] + B[name] - W[name] for name in W})


def test_lora_adapter_and_full_model_merge_to_the_hand_computed_average(base, specialists, adapter, tmp_path):
    import merge_models

    a, _ = specialists
    out = merge_models.merge([str(adapter), str(a)], str(tmp_path / "mixed"))
    L, A = lora_merged_by_hand(base, adapter), tensors(a)
    assert any(not torch.equal(L[name], tensors(base)[name]) for name in L)  # the adapter does change the model
    assert_weights(out, {name: 0.5 * L[name] + 0.5 * A[name] for name in A})


def test_one_lora_adapter_merges_into_the_full_model_it_stands_for(base, adapter, tmp_path):
    import merge_models

    out = merge_models.merge([str(adapter)], str(tmp_path / "alone"))
    assert_weights(out, lora_merged_by_hand(base, adapter))


def test_two_lora_adapters_merge_on_their_own_base(base, adapter, tmp_path):
    """Adapters name their base, so task arithmetic on two adapters needs no --base."""
    import merge_models

    other = make_adapter(base, tmp_path / "other", seed=4)
    out = merge_models.merge([str(adapter), str(other)], str(tmp_path / "loras"), method="task_arithmetic",
                             weights=[1.0, 0.5])
    W, L1, L2 = tensors(base), lora_merged_by_hand(base, adapter), lora_merged_by_hand(base, other)
    assert_weights(out, {name: W[name] + (L1[name] - W[name]) + 0.5 * (L2[name] - W[name]) for name in W})


def run_cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "merge_models.py", *map(str, argv)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_cli_merges_and_names_the_output(specialists, tmp_path):
    a, b = specialists
    done = run_cli(a, b, "--output_dir", tmp_path / "merged")
    assert done.returncode == 0, done.stderr
    assert f"--model_name_or_path {tmp_path / 'merged'}" in done.stdout


@pytest.fixture(scope="module")
def strangers(base, tmp_path_factory) -> dict:
    """Models that must not be merged with `base`'s fine-tunes."""
    import offline
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("strangers")
    wider = offline.build_tiny_model(folder / "wider", CORPUS, vocab_size=300, seed=0, hidden_size=48, num_layers=2)
    other_words = offline.build_tiny_model(folder / "words", CORPUS + ["zebra quartz fjord"], vocab_size=300, seed=0,
                                           hidden_size=32, num_layers=2)
    other_init = folder / "init"
    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(base).config)
    model.save_pretrained(other_init)
    (other_init / "tokenizer.json").write_bytes((base / "tokenizer.json").read_bytes())
    (other_init / "tokenizer_config.json").write_bytes((base / "tokenizer_config.json").read_bytes())
    return {"wider": wider, "words": other_words, "init": other_init}


@pytest.mark.parametrize("case, expected", [
    ("one model", "merging needs two or more models, or one LoRA adapter (merged into its base), got 1"),
    ("twice", "is given twice"),
    ("missing", "no such folder"),
    ("not a model", "neither a model"),
    ("weights", "--weights has 3 values for 2 models"),
    ("zero weights", "not summing to 0"),
    ("density", "--density 1.5"),
    ("no base", "--method ties adds task vectors (model - base): pass --base"),
    ("architecture", "its architecture differs"),
    ("tokenizer", "its tokenizer differs"),
    ("initialisation", "does not look fine-tuned from the same base"),
    ("adapter base", "is a LoRA adapter on"),
    ("not empty", "is not empty: pass --overwrite_output_dir"),
    ("not a merge", "holds something other than a merge"),
    ("output is input", "is one of the inputs"),
])
def test_bad_inputs_get_one_line(case, expected, base, specialists, adapter, strangers, tmp_path):
    import merge_models

    a, b = specialists
    out = tmp_path / "out"
    argv = {"one model": [a], "twice": [a, b, a], "missing": [a, tmp_path / "nowhere"], "not a model": [a, tmp_path],
            "weights": [a, b, "--weights", 1, 2, 3], "zero weights": [a, b, "--weights", 1, -1],
            "density": [a, b, "--method", "ties", "--base", base, "--density", 1.5],
            "no base": [a, b, "--method", "ties"], "architecture": [a, strangers["wider"]],
            "tokenizer": [a, strangers["words"]], "initialisation": [a, strangers["init"]],
            "adapter base": [adapter, a, "--method", "ties", "--base", a], "not empty": [a, b],
            "not a merge": [a, b, "--overwrite_output_dir"], "output is input": [a, b]}[case]
    if case in ("not empty", "not a merge"):
        out.mkdir()
        (out / "notes.txt").write_text("a user's work")
    if case == "output is input":
        out = a
    with pytest.raises(Refusal) as refusal:
        merge_models.main([*map(str, argv), "--output_dir", str(out)])
    message = str(refusal.value)
    assert expected in message and "\n" not in message, message
    if case == "not a merge":
        assert (out / "notes.txt").read_text() == "a user's work"


def test_bf16_models_merge_into_bf16(specialists, tmp_path):
    """A GPU run saves bf16: the merge is no larger than its inputs, and equals their average up to bf16 rounding."""
    import merge_models
    from transformers import AutoModelForCausalLM, AutoTokenizer

    halves = []
    for folder in specialists:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        model.save_pretrained(tmp_path / folder.name)
        AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path / folder.name)
        halves.append(tmp_path / folder.name)
    out = merge_models.merge([str(h) for h in halves], str(tmp_path / "merged"), weights=[0.3, 0.7])
    A, B = tensors(halves[0]), tensors(halves[1])
    assert_weights(out, {name: (0.3 * A[name].float() + 0.7 * B[name].float()).to(torch.bfloat16) for name in A})
