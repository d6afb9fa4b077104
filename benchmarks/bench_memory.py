"""The memory one GRPO training step allocates, measured, beside the recipes' pre-flight estimate of it.

    python benchmarks/bench_memory.py                 # the four configurations in docs/recipes.md, CPU, ~6.5 min
    python benchmarks/bench_memory.py --configs 0.5B:lora:24 --completion 64

Each configuration runs in a fresh process: a randomly initialised model with a Qwen2.5 shape (gpu_check.py's,
optionally fewer layers so a full fine-tune's 16 bytes a parameter fit this machine), the offline kit's tokenizer and
toy problems, and two steps (the second with AdamW's state allocated) of gsm8k_grpo.py's own main() under bf16
autocast, as on a bf16 GPU. torch's profiler records
every allocation during `trainer.train()`; the peak is what was live when the step started (the model) plus the
highest running sum of allocations and frees. It counts tensors, as `torch.cuda.max_memory_allocated` does on a GPU:
no CUDA context, no allocator slack, no vLLM. The estimate is `memory.estimate_memory` for the same configuration,
without those three terms. Prints a markdown table; exits non-zero when any estimate is off by more than 25%.
BENCH_MEMORY_DEBUG=1 prints the operations running at each configuration's peak (to stderr of its process).
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

CONFIGS = ["0.5B:lora:8", "0.5B:full:8", "1.5B:lora:6", "1.5B:full:4"]  # shape:variant:layers
TOLERANCE = 0.25


def measure(shape: str, variant: str, layers: int, args, work: Path) -> dict:
    """One configuration, in this process: the measured peak and the estimate, in bytes, by part."""
    import gpu_check
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoConfig, AutoTokenizer

    import gsm8k_grpo
    import offline
    from grpo_recipes import memory, options, training

    offline.main(["--out_dir", str(work / "kit")])
    gpu_check.SHAPES[shape] = {**gpu_check.SHAPES[shape], "num_hidden_layers": layers}
    model = gpu_check.build_model(shape, work / "kit", work / "model")
    measured = {}
    trl_run_training = training.run_training

    def profiled_run_training(trainer, training_args=None):
        # oneDNN's bf16 matmul on CPU copies the output head once per sequence when generation scores the last
        # position (a strided slice): for 8 sequences of Qwen2.5-0.5B, 2.2 GB that no GPU kernel allocates. torch's
        # own CPU kernel does not: generation's output head runs without oneDNN (training's fused head never calls
        # it), so the figures are the trainer's tensors, not one CPU library's workspace.
        head = trainer.model.get_output_embeddings()
        head.register_forward_pre_hook(lambda *_: torch._C._set_mkldnn_enabled(False))
        head.register_forward_hook(lambda *_: torch._C._set_mkldnn_enabled(True))
        live = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in
                itertools.chain(trainer.model.parameters(), trainer.model.buffers())}
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            trl_run_training(trainer, training_args)
        events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]")
        measured["at start"] = sum(live.values())
        running = list(itertools.accumulate(nbytes for _, nbytes in events))
        measured["peak"] = measured["at start"] + max(running)
        if os.environ.get("BENCH_MEMORY_DEBUG"):  # which operations were running at the peak
            when = events[running.index(max(running))][0]
            ops = [(e.start_ns(), e.name()) for e in prof.profiler.kineto_results.events()
                   if e.name() != "[memory]" and e.start_ns() <= when <= e.end_ns()]
            print("AT PEAK", [name for _, name in sorted(ops)][:40], file=sys.stderr)

    training.run_training = profiled_run_training
    argv = ["--dataset_path", str(work / "kit" / "gsm8k_toy"), "--model_name_or_path", str(model),
            "--output_dir", str(work / "out"), "--use_cpu", "true", "--bf16", "true", "--max_steps", "2",
            "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1",
            "--num_generations", str(args.batch), "--per_device_train_batch_size", str(args.batch),
            "--gradient_accumulation_steps", str(args.steps_per_generation),
            "--max_completion_length", str(args.completion), "--use_peft", str(variant == "lora").lower(),
            "--gradient_checkpointing", "true", "--warmup_steps", "0"]
    start = time.perf_counter()
    trainer = gsm8k_grpo.main(argv)
    seconds = time.perf_counter() - start
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = max(len(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                   return_dict=False))
                 for row in gsm8k_grpo.build_dataset("train", str(work / "kit" / "gsm8k_toy")))
    config = AutoConfig.from_pretrained(model)
    model_args = options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv)[2]  # as main()
    parts = memory.estimate_memory(config, **memory.memory_options(trainer.args, model_args, prompt_tokens=prompt),
                                   device="cpu")
    torch_parts = {k: v for k, v in parts.items() if k not in ("vllm", "cuda context")}
    return {"shape": shape, "variant": variant, "layers": layers, "params": sum(p.numel() for p in
            trainer.model.parameters()), "prompt tokens": prompt, "measured": measured["peak"],
            "at start": measured["at start"], "estimate": sum(torch_parts.values()), "parts": torch_parts,
            "seconds": seconds}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=CONFIGS, help="shape:variant:layers, e.g. 0.5B:lora:24")
    parser.add_argument("--batch", type=int, default=4, help="completions per step (one prompt's group)")
    parser.add_argument("--steps_per_generation", type=int, default=2, help="micro-batches per generation batch")
    parser.add_argument("--completion", type=int, default=32, help="max_completion_length (a random model fills it)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: measure this configuration, print JSON
    args = parser.parse_args(argv)
    if args.one:
        shape, variant, layers = args.one.split(":")
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as work:
            print("RESULT " + json.dumps(measure(shape, variant, int(layers), args, Path(work))))
        return []
    results = []
    for config in args.configs:
        proc = subprocess.run([sys.executable, __file__, "--one", config, "--batch", str(args.batch),
                               "--steps_per_generation", str(args.steps_per_generation), "--completion",
                               str(args.completion)], capture_output=True, text=True, check=False)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise Refusal(f"{config}: the measurement failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(line[len("RESULT "):]))
        r = results[-1]
        print(f"{config}: measured {r['measured'] / 2**30:.2f} GiB, estimate {r['estimate'] / 2**30:.2f} GiB "
              f"({r['seconds']:.0f} s)", flush=True)
    print(f"\nTwo GRPO steps, {args.batch} completions × {args.completion} tokens, {args.steps_per_generation} "
          "micro-batches per generation, bf16 autocast, activation checkpointing, CPU, "
          f"{time.strftime('%Y-%m-%d')}:\n")
    names = list(results[0]["parts"])
    print("| shape (layers) | tuning | parameters | " + " | ".join(f"{n} GiB" for n in names)
          + " | estimate GiB | measured GiB | error |")
    print("|---" * (len(names) + 6) + "|")
    worst = 0.0
    for r in results:
        error = r["estimate"] / r["measured"] - 1
        worst = max(worst, abs(error))
        print(f"| {r['shape']} ({r['layers']}) | {'LoRA r=16' if r['variant'] == 'lora' else 'full'} | "
              f"{r['params'] / 1e9:.2f}B | " + " | ".join(f"{r['parts'][n] / 2**30:.2f}" for n in names)
              + f" | {r['estimate'] / 2**30:.2f} | {r['measured'] / 2**30:.2f} | {error:+.0%} |")
    if worst > TOLERANCE:
        raise Refusal(f"bench_memory: an estimate is off by {worst:.0%} of the measured peak (more than "
                      f"{TOLERANCE:.0%})")
    return results


if __name__ == "__main__":
    run_script(main)
