"""What each recipe costs on a GPU: seconds/step, generated tokens/second and peak memory, with no network.

    python benchmarks/gpu_check.py                   # on a CUDA machine: 0.5B and 1.5B shapes, bf16
    python benchmarks/gpu_check.py --cpu --shapes tiny --steps 1     # the plumbing, on any CPU (what CI runs)

Models are randomly initialised with the real shapes of Qwen2.5-0.5B and Qwen2.5-1.5B (configs below, nothing is
downloaded) and use the offline kit's tiny tokenizer and toy data, so the figures measure the machine and the recipe,
not the model's skill: a random model writes until max_completion_length and never calls a tool, so the tool recipes'
figures are for generation and training without tool turns. Each recipe runs through its own main(): LoRA with vLLM
colocated (the default on a GPU; skipped without vLLM), async_grpo.py against a vLLM server on the same GPU
(gsm8k_grpo; the async trainer's speed-up over the cell above), full fine-tune (float32 master weights),
LoRA with transformers generation and 4-bit QLoRA, with and without activation checkpointing. Each cell starts on a
clean slate (a garbage collection first). Prints a markdown table for the README.
"""

import argparse
import gc
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "experiments"))  # servers.py
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

import torch  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

import offline  # noqa: E402
from grpo_recipes.contract import RECIPES  # noqa: E402
from grpo_recipes import kit_judge  # noqa: E402

SHAPES = {  # Qwen2.5 architectures, from their published configs
    "0.5B": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    "1.5B": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 2048, "tie_word_embeddings": True},
}
VARIANTS = {"lora+vllm": ["--use_peft", "--use_vllm", "--vllm_mode", "colocate"],  # the recipes' default on a GPU
            "full": ["--use_peft", "false"], "lora": ["--use_peft", "--use_vllm", "false"],
            "qlora": ["--use_peft", "--load_in_4bit"],
            # async_grpo.py against a `vllm serve` on the same GPU (gsm8k_grpo only: a random model calls no tool, so
            # the other recipes would time the same work): the synchronous lora+vllm cell's speed-up, if any. sdpa
            # tree attention where the kernels package (flash-attn3) is missing.
            "lora+async": ["--use_peft", "--max_staleness", "1"],
            # an evaluation at step 1 of per_device_eval_batch_size 64 whole sequences: its log-prob forward against
            # the estimate's evaluation term (search_agent_grpo's is the longest)
            "lora+vllm+eval": ["--use_peft", "--use_vllm", "--vllm_mode", "colocate", "--eval_strategy", "steps",
                               "--eval_steps", "1", "--per_device_eval_batch_size", "64", "--num_generations_eval",
                               "4", "--num_eval_examples", "16"]}


def build_model(shape: str, kit: Path, out: Path) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(kit / "tiny-qwen2")
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1_000_000.0,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tokenizer.pad_token_id)
    Qwen2ForCausalLM(config).to(torch.bfloat16 if torch.cuda.is_available() else torch.float32).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def recipe_argv(recipe: str, kit: Path, judge_url: str) -> list[str]:
    if recipe == "judge_grpo":  # the kit's stand-in judge (a program): this measures the GPU, not a judge model
        return ["--dataset_path", str(kit / "passage_toy"), "--judge_base_url", judge_url, "--judge_model",
                kit_judge.MODEL]
    if recipe == "search_agent_grpo":
        return ["--dataset_path", str(kit / "search_toy" / "questions"), "--corpus_path",
                str(kit / "search_toy" / "corpus.jsonl"), "--index_dir", str(kit / "bm25_index")]
    if recipe == "tool_use_grpo":  # a random model writes no tool call: this measures the GPU, not the sandbox,
        return ["--dataset_path", str(kit / "gsm8k_toy"), "--unsafe_tool_sandbox"]  # which a GPU box may not host
    if recipe == "code_grpo":  # the tests of a random model's code fail at once: the GPU again, not the sandbox
        return ["--dataset_path", str(kit / "code_toy"), "--unsafe_test_sandbox", "--test_workers", "1"]
    if recipe == "reasoning_gym_grpo":  # generates its prompts: chain_sum's are a tiny model's size
        return ["--tasks", "chain_sum"]
    if recipe == "game_grpo":  # generates its games: the kit's size of game
        return ["--max_number", "8", "--turn_limit", "4"]
    return ["--dataset_path", str(kit / "gsm8k_toy")]


def skipped(recipe: str, variant: str, args) -> str | None:
    """Why a cell is not run here, or None."""
    if variant == "qlora" and args.cpu:
        return "4-bit needs CUDA"
    if variant == "lora+async" and recipe != "gsm8k_grpo":
        return "one async cell, gsm8k_grpo's"
    if variant == "lora+vllm+eval" and recipe != "search_agent_grpo":
        return "one evaluation cell, search_agent_grpo's"
    needs_vllm = "vllm" in variant or "async" in variant
    if needs_vllm and (args.cpu or importlib.util.find_spec("vllm") is None):
        return "CPU" if args.cpu else "vLLM is not installed"
    return None


def estimate(shape: str, variant: str, checkpointing: bool, args) -> float:
    """memory.estimate_memory for one cell, in GiB: what the recipes' memory check would have predicted."""
    from grpo_recipes import memory

    total = torch.cuda.mem_get_info()[1] if torch.cuda.is_available() and not args.cpu else 24 * 2**30
    colocated = variant in ("lora+vllm", "lora+vllm+eval")
    share = 0.0
    if colocated:  # the share the recipes size for this GPU (memory.size_colocated_vllm), from a config folder
        folder = Path(tempfile.mkdtemp(prefix="estimate-"))
        estimate_config(shape).save_pretrained(folder)
        sized = SimpleNamespace(max_completion_length=args.max_completion_length, vllm_max_model_length=None,
                                vllm_gpu_memory_utilization=None, generation_batch_size=None,
                                per_device_train_batch_size=8, gradient_accumulation_steps=1)
        memory.size_colocated_vllm(sized, SimpleNamespace(model_name_or_path=str(folder), model_revision=None),
                                   total=total)
        share = sized.vllm_gpu_memory_utilization
    parts = memory.estimate_memory(
        estimate_config(shape), weight_dtype="float32" if variant == "full" else "bfloat16", half=True,
        use_peft=variant != "full", load_in_4bit=variant == "qlora", lora_r=16, batch=8, generation_batch=8,
        prompt=256, completion=args.max_completion_length, checkpointing=checkpointing,
        use_vllm=variant in ("lora+vllm", "lora+async", "lora+vllm+eval"), vllm_bytes=share * total,
        eval_batch=64 if variant == "lora+vllm+eval" else 0)
    return sum(parts.values()) / 2**30


def estimate_config(shape: str) -> Qwen2Config:
    return Qwen2Config(**SHAPES[shape])


def run(recipe: str, model: Path, kit: Path, variant: str, checkpointing: bool, args, out: Path,
        judge_url: str) -> dict:
    import importlib

    module = importlib.import_module(recipe)
    argv = [*recipe_argv(recipe, kit, judge_url), "--model_name_or_path", str(model), "--output_dir", str(out),
            "--max_steps", str(args.steps), "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
            "--num_generations", "8", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
            "--max_completion_length", str(args.max_completion_length), "--logging_steps", "1",
            "--gradient_checkpointing", str(checkpointing).lower(), *VARIANTS[variant],
            "--overwrite_output_dir"]  # one scratch folder: each cell replaces the last cell's model
    if args.cpu:
        argv += ["--use_cpu", "true"]
    else:  # a clean slate: the previous cell's model can survive in a reference cycle until a collection
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    if variant == "lora+async":
        import async_grpo

        argv += [] if importlib.util.find_spec("kernels") else ["--tree_attention", "sdpa"]
        # the cell's model on 30% of the GPU, as async_grpo.py's docstring starts it
        from servers import vllm_server  # experiments/servers.py

        with vllm_server(model, out.parent / "vllm-serve.log", 3, "--gpu-memory-utilization", "0.3",
                                    "--max-model-len", "2048") as url:
            trainer = async_grpo.main([recipe, *argv, "--vllm_server_base_url", url])
    else:
        trainer = module.main(argv)
    seconds = time.perf_counter() - start
    key = "perf/step_s" if variant == "lora+async" else "step_time"
    steps = [log for log in trainer.state.log_history if key in log]
    step_time = sum(log[key] for log in steps) / len(steps)
    tokens = sum(log["completions/mean_length"] * 8 for log in steps) / sum(log[key] for log in steps)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() and not args.cpu else float("nan")
    gaps = [log["sampling/sampling_logp_difference/mean"] for log in trainer.state.log_history
            if "sampling/sampling_logp_difference/mean" in log]
    notes = [f"vLLM logp gap {max(gaps):.4f}"] if gaps else []  # TRL's trainer vs vLLM, LoRA dropout 0: < 0.02
    trained = {str(p.dtype).removeprefix("torch.") for p in trainer.model.parameters() if p.requires_grad}
    notes.append(f"trained {'/'.join(sorted(trained))}")  # float32 everywhere, QLoRA's adapter included
    del trainer
    return {"s/step": step_time, "tokens/s": tokens, "peak GiB": peak, "wall s": seconds, "notes": ", ".join(notes)}


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--shapes", nargs="+", default=["0.5B", "1.5B"], choices=sorted(SHAPES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--checkpointing", nargs="+", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max_completion_length", type=int, default=256)
    parser.add_argument("--cpu", action="store_true", help="run the plumbing on CPU (fp32); QLoRA is skipped")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        raise Refusal("no CUDA GPU here: pass --cpu --shapes tiny to check the plumbing.")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    offline.main(["--out_dir", str(work / "kit")])
    offline.write_toy_code(work / "kit" / "code_toy")  # code_grpo's problems (its warm start is not needed here)
    _, judge_url = kit_judge.start()  # judge_grpo's judge, for as long as this process runs
    device = "CPU" if args.cpu else torch.cuda.get_device_name()
    rows = [f"{device}, {time.strftime('%Y-%m-%d')}: {args.steps} GRPO steps of 8 completions × "
            f"{args.max_completion_length} tokens per cell", "",
            "| recipe | shape | variant | activation ckpt | s/step | generated tokens/s | peak GPU GiB | estimate GiB "
            "| fits 24 GB | notes |", "|---|---|---|---|---|---|---|---|---|---|"]
    attempted = failed = 0
    for shape in args.shapes:
        model = build_model(shape, work / "kit", work / f"model-{shape}")
        for recipe in args.recipes:
            for variant in args.variants:
                for checkpointing in [mode == "on" for mode in args.checkpointing]:
                    label = f"| {recipe} | {shape} | {variant} | {'on' if checkpointing else 'off'} |"
                    guess = estimate(shape, variant, checkpointing, args)
                    if why := skipped(recipe, variant, args):
                        rows.append(f"{label} skipped: {why} | | | {guess:.1f} | | |")
                        continue
                    attempted += 1
                    try:
                        m = run(recipe, model, work / "kit", variant, checkpointing, args, work / "out",
                                judge_url)
                        peak = "-" if args.cpu else f"{m['peak GiB']:.1f}"
                        fits = "-" if args.cpu else "yes" if m["peak GiB"] <= 24 else "**no**"
                        rows.append(f"{label} {m['s/step']:.2f} | {m['tokens/s']:.0f} | {peak} | {guess:.1f} | "
                                    f"{fits} | {m['notes']} |")
                    except Exception as err:  # noqa: BLE001 - one failed cell must not hide the rest (a Refusal too)
                        failed += 1
                        rows.append(f"{label} failed: {str(err).splitlines()[0][:80]} | | | {guess:.1f} | | |")
                    print(rows[-1], flush=True)
    print("\n".join(rows))
    if attempted and failed == attempted:  # a table of failures is not a measurement: the device kit must see it
        raise Refusal(f"gpu_check: all {failed} cells failed (the first: {next(r for r in rows if 'failed:' in r)})")
    return rows


if __name__ == "__main__":
    run_script(main)
