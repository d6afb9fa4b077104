"""Merge checkpoints fine-tuned from one base (full fine-tunes, LoRA adapters, or a mix) into one model.

    python merge_models.py runs/math runs/tool --output_dir runs/merged                  # linear: the weights' average
    python merge_models.py runs/math runs/tool --method ties --base runs/sft --output_dir runs/merged
    python merge_models.py runs/lora_run --output_dir runs/lora_run-merged     # one LoRA adapter: the full model it is
    python tool_use_grpo.py --model_name_or_path runs/merged ...   # or evaluate.py, or `transformers serve runs/merged`

RL updates for different skills are nearly orthogonal, so two specialists trained from the same start can often be
averaged into one model that keeps both skills (README: "Merging specialists", measured by merge_demo.py). mergekit
does the arithmetic; this script checks that the inputs can be merged at all and turns a LoRA adapter (a folder with
adapter_config.json, as `--use_peft` saves it) into the full model it stands for, so adapters and full fine-tunes mix.

Methods, with θ_i each model's weights, w_i their --weights, and τ_i = θ_i - base each model's task vector:
  linear            Σ w_i θ_i / Σ w_i: the weighted average; needs no base
  task_arithmetic   base + Σ w_i τ_i: weights of 1 add each specialist's whole update
  ties              trim each τ_i to its --density largest entries, elect each entry's sign by total mass, and average
                    the entries that agree (weighted); keeps an update made by one model whole where the others are 0
  dare_ties         drop a random 1 - --density share of each τ_i and rescale the rest (seeded), then as ties
  dare_linear       the same drop and rescale, then base + Σ w_i τ_i

Refused with one line: inputs that are neither a model nor an adapter, architectures or tokenizers that differ,
adapters on different bases, and models that do not look fine-tuned from one base (a weight matrix's median relative
distance above 1.2; two random initialisations sit at about 1.41, a fine-tune from one below 0.9, README).
"""

import argparse
import json
import math
import shutil
import statistics
import tempfile
from pathlib import Path

from grpo_recipes.refusal import Refusal, run_script

METHODS = ("linear", "task_arithmetic", "ties", "dare_ties", "dare_linear")
SPARSE = ("ties", "dare_ties", "dare_linear")  # the methods that read --density
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")
UNRELATED = 1.2  # median relative distance of weight matrices above which two models do not share a base


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("models", nargs="+", help="two or more checkpoint folders (full models or LoRA adapters), or "
                        "one LoRA adapter to merge into its base")
    parser.add_argument("--output_dir", required=True, help="the merged model, a --model_name_or_path for any recipe")
    parser.add_argument("--method", choices=METHODS, default="linear")
    parser.add_argument("--weights", type=float, nargs="+", default=None,
                        help="one per model; default: equal (linear: 1/n each; the others: 1 each)")
    parser.add_argument("--base", default=None, help="the checkpoint the models were fine-tuned from (every method "
                        "but linear needs it; default: the LoRA adapters' own base)")
    parser.add_argument("--density", type=float, default=0.5, help="ties/dare: the share of each task vector kept")
    parser.add_argument("--seed", type=int, default=0, help="dare: the random drop")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="replace an earlier merge there")
    parser.error = refuse_usage
    return parser.parse_args(argv)


def refuse_usage(message: str):
    """argparse's usage error as one line (its default prints the usage and exits)."""
    raise Refusal(f"{message} (--help lists every option)")


# ----------------------------------------------------------------------------------------------------------- inputs
def describe(path: str) -> dict:
    """What a folder holds: a full model, or a LoRA adapter and the base it was trained on."""
    folder = Path(path)
    if not folder.is_dir():
        raise Refusal(f"{path}: no such folder")
    if (folder / "adapter_config.json").exists():
        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base:
            raise Refusal(f"{path}: a LoRA adapter that does not name its base (base_model_name_or_path); set it in "
                          "adapter_config.json")
        return {"path": str(folder), "lora": True, "base": base}
    if (folder / "config.json").exists() and any(folder.glob("*.safetensors")):
        return {"path": str(folder), "lora": False, "base": None}
    raise Refusal(f"{path}: neither a model (config.json and *.safetensors) nor a LoRA adapter (adapter_config.json); "
                  "pass the folder a recipe saved with --output_dir")


def same_model(a: str, b: str) -> bool:
    """The same checkpoint named two ways: one string, or two paths to one folder."""
    return a == b or (Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve())


def check_architectures(models: list[dict], base: str | None) -> None:
    from transformers import AutoConfig

    def shape(path):
        config = AutoConfig.from_pretrained(path).to_dict()
        return {key: config.get(key) for key in SHAPE_KEYS}

    named = [(m["path"], shape(m["base"] if m["lora"] else m["path"])) for m in models]
    if base:
        named.insert(0, (base, shape(base)))
    first, reference = named[0]
    for path, config in named[1:]:
        differ = [f"{key} {config[key]} vs {reference[key]}" for key in SHAPE_KEYS if config[key] != reference[key]]
        if differ:
            raise Refusal(f"{path}: its architecture differs from {first}'s ({', '.join(differ)}); merge models "
                          "fine-tuned from one base")


def tokenizer_folder(model: dict) -> str:
    """Where a checkpoint's tokenizer lives: its own folder (the recipes save it there), or an adapter's base."""
    own = Path(model["path"])
    return str(own) if any(own.glob("tokenizer*")) or not model["lora"] else model["base"]


def check_tokenizers(models: list[dict]) -> None:
    from transformers import AutoTokenizer

    vocabularies = [(m["path"], AutoTokenizer.from_pretrained(tokenizer_folder(m)).get_vocab()) for m in models]
    first, reference = vocabularies[0]
    for path, vocabulary in vocabularies[1:]:
        if vocabulary != reference:
            moved = len(set(vocabulary.items()) ^ set(reference.items())) // 2
            raise Refusal(f"{path}: its tokenizer differs from {first}'s ({len(vocabulary)} and {len(reference)} "
                          f"tokens, {moved} differ); merge models that share one tokenizer")


def weight_matrices(path: str) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        tensors.update({name: t.float() for name, t in load_file(file).items() if t.ndim >= 2})
    return tensors


def median_relative_distance(a: dict, b: dict) -> float:
    """Median over weight matrices of |a - b| / |b|: about 1.41 between two random initialisations."""
    distances = [((a[name] - b[name]).norm() / b[name].norm().clamp_min(1e-12)).item()
                 for name in a.keys() & b.keys() if a[name].shape == b[name].shape]
    return statistics.median(distances) if distances else math.inf


def check_shared_base(full_paths: list[str], base: str | None) -> None:
    """Fine-tunes of one base stay near it; models that were initialised apart sit about √2 apart."""
    if len(full_paths) + bool(base) < 2:
        return
    reference = base or full_paths[0]
    reference_weights = weight_matrices(reference)
    for path in full_paths:
        if same_model(path, reference):
            continue
        distance = median_relative_distance(weight_matrices(path), reference_weights)
        if distance > UNRELATED:
            raise Refusal(f"{path} does not look fine-tuned from the same base as {reference}: its weight matrices are "
                          f"{distance:.2f} of their norm away (fine-tunes stay below {UNRELATED}; unrelated models sit "
                          "near 1.41); merge models trained from one start")


def resolve_base(models: list[dict], base: str | None, method: str) -> str | None:
    adapter_bases = {m["base"] for m in models if m["lora"]}
    if len(adapter_bases) > 1 and not all(same_model(b, next(iter(adapter_bases))) for b in adapter_bases):
        raise Refusal(f"the LoRA adapters were trained on different bases ({', '.join(sorted(adapter_bases))}); merge "
                      "adapters of one base")
    if base is not None:
        if not Path(base).is_dir() and "/" not in base:
            raise Refusal(f"--base {base}: no such folder")
        for m in models:
            if m["lora"] and not same_model(m["base"], base):
                raise Refusal(f"{m['path']} is a LoRA adapter on {m['base']}, not on --base {base}: pass --base "
                              f"{m['base']}, or merge models of one base")
        return base
    if adapter_bases:
        return next(iter(adapter_bases))
    if method != "linear":
        raise Refusal(f"--method {method} adds task vectors (model - base): pass --base, the checkpoint the models "
                      "were fine-tuned from (for example the SFT start)")
    return None


def check_arguments(args) -> list[float]:
    one_adapter = len(args.models) == 1 and (Path(args.models[0]) / "adapter_config.json").is_file()
    if len(args.models) < 2 and not one_adapter:
        raise Refusal(f"merging needs two or more models, or one LoRA adapter (merged into its base), got "
                      f"{len(args.models)} model(s)")
    for i, path in enumerate(args.models):
        if any(same_model(path, earlier) for earlier in args.models[:i]):
            raise Refusal(f"{path} is given twice: give each model once, and its share with --weights")
    weights = args.weights or [1.0 / len(args.models) if args.method == "linear" else 1.0] * len(args.models)
    if len(weights) != len(args.models):
        raise Refusal(f"--weights has {len(weights)} values for {len(args.models)} models: give one per model")
    if not all(math.isfinite(w) for w in weights) or (args.method == "linear" and abs(sum(weights)) < 1e-12):
        raise Refusal(f"--weights {' '.join(map(str, weights))}: give finite weights (linear: not summing to 0)")
    if args.method in SPARSE and not 0 < args.density <= 1:
        raise Refusal(f"--density {args.density}: the share of each task vector kept, in (0, 1]")
    check_output(Path(args.output_dir), [*args.models, *filter(None, [args.base])], args.overwrite_output_dir)
    return weights


def check_output(output: Path, inputs: list[str], overwrite: bool) -> None:
    """The merge goes to a new folder, or replaces an earlier merge when asked: never an input or anything else."""
    if any(same_model(path, str(output)) for path in inputs):
        raise Refusal(f"--output_dir {output} is one of the inputs: write the merge to a new folder")
    if output.exists() and any(output.iterdir()):
        if not overwrite:
            raise Refusal(f"--output_dir {output} is not empty: pass --overwrite_output_dir to replace it, or another "
                          "folder")
        if not (output / "mergekit_config.yml").exists():  # replace an earlier merge, never anything else
            raise Refusal(f"--output_dir {output} holds something other than a merge: write the merge to a new folder")


# ------------------------------------------------------------------------------------------------------------ merge
def saved_dtype(model: dict) -> str:
    """The dtype the first model was saved in (bf16 after a GPU run), so that the merge is no larger than its inputs
    (the arithmetic itself is done in float32)."""
    config = json.loads((Path(model["base"] if model["lora"] else model["path"]) / "config.json").read_text()) \
        if not model["lora"] or Path(model["base"]).is_dir() else {}
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def reference(model: dict) -> dict:
    """mergekit's model reference: a LoRA adapter is its base plus the adapter, merged by PEFT before the merge."""
    if model["lora"]:
        return {"model": {"path": local_or_hub(model["base"])}, "lora": {"path": local_or_hub(model["path"])}}
    return {"model": {"path": local_or_hub(model["path"])}}


def local_or_hub(path: str) -> str:
    """A folder here as an absolute path, else a Hub id: mergekit asks the Hub about a relative path with one slash
    (`offline/tiny-qwen2`, an adapter's base as the run named it), which fails offline."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def merge(models: list[str], output_dir: str, method: str = "linear", weights: list[float] | None = None,
          base: str | None = None, density: float = 0.5, seed: int = 0, overwrite_output_dir: bool = False) -> Path:
    """Check the inputs, merge with mergekit, save the model with the first input's tokenizer and chat template."""
    args = argparse.Namespace(models=models, output_dir=output_dir, method=method, weights=weights, base=base,
                              density=density, seed=seed, overwrite_output_dir=overwrite_output_dir)
    weights = check_arguments(args)
    described = [describe(path) for path in models]
    base = resolve_base(described, base, method)
    check_architectures(described, base)
    check_tokenizers(described)
    check_shared_base([m["path"] for m in described if not m["lora"]], base if base and Path(base).is_dir() else None)

    try:
        from mergekit.config import MergeConfiguration
        from mergekit.merge import run_merge
        from mergekit.options import MergeOptions
    except ImportError:
        raise Refusal("merge_models.py needs mergekit: `pip install 'mergekit>=0.1.5,<0.2'`") from None
    from transformers import AutoTokenizer, GenerationConfig

    parameters = lambda w: {"weight": w, **({"density": density} if method in SPARSE else {})}  # noqa: E731
    config = {"merge_method": method, "dtype": "float32", "out_dtype": saved_dtype(described[0]),
              "models": [{"model": reference(m), "parameters": parameters(w)}
                         for m, w in zip(described, weights, strict=True)]}
    if method != "linear":
        config["base_model"] = {"model": {"path": local_or_hub(base)}}
    output = Path(output_dir)
    if output.exists() and overwrite_output_dir:
        shutil.rmtree(output)  # an earlier merge (checked above), never an input or anything else
    with tempfile.TemporaryDirectory(prefix="merge-lora-") as lora_cache:  # adapters merged into their base, then gone
        run_merge(MergeConfiguration.model_validate(config), str(output),
                  MergeOptions(lora_merge_cache=lora_cache, copy_tokenizer=False, random_seed=seed, quiet=True,
                               write_model_card=True))
    first = described[0]
    AutoTokenizer.from_pretrained(tokenizer_folder(first)).save_pretrained(output)  # and its chat template
    try:
        GenerationConfig.from_pretrained(first["base"] if first["lora"] else first["path"]).save_pretrained(output)
    except OSError:  # a model without generation_config.json: transformers' defaults apply, as for the inputs
        pass
    return output


def main(argv=None) -> Path:
    args = parse_args(argv)
    output = merge(args.models, args.output_dir, args.method, args.weights, args.base, args.density, args.seed,
                   args.overwrite_output_dir)
    print(f"merged {len(args.models)} models ({args.method}) into {output}: pass --model_name_or_path {output}")
    return output


if __name__ == "__main__":
    run_script(main)
