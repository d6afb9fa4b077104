"""Latency of sandbox.Sandbox, with every isolation mechanism this machine has, against a plain subprocess.run a call.

    python benchmarks/bench_sandbox.py [--calls 200]

The baseline is what a user would write instead: `subprocess.run([python, "-I", "-c", runner], input=code,
timeout=...)` from the same process, in a fresh temporary directory, which Python starts without a full fork (no
preexec_fn). It isolates nothing: no limits, no namespaces, no Landlock, no seccomp. Prints the protections in
force, calls/second and p50/p95/p99 latency for both and their ratio, a call that imports sympy, what a hostile call
(a timeout, a 4,096-file flood, a memory bomb) costs the next call, and the recipe's own tool (tool_use_grpo's python,
one rollout's interpreter) in a process that also holds what a trainer does (torch, TRL, a model that has run a
forward pass), beside the same baseline started from that process, with bubblewrap and with engine="landlock".
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_recipes import sandbox  # noqa: E402

CALLS = ["print(17 * 23 + 4)", "x = [i * i for i in range(100)]\nsum(x)", "import math\nmath.comb(30, 12)",
         "from fractions import Fraction\nFraction(3, 4) + Fraction(5, 6)", "1 / 0"]
RUNNER = ("import ast, sys\ncode = sys.stdin.read()\ntree = ast.parse(code)\n"
          "last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None\nns = {}\n"
          "try:\n    exec(compile(tree, '<tool>', 'exec'), ns)\n"
          "    if last is not None:\n        v = eval(compile(ast.Expression(last.value), '<tool>', 'eval'), ns)\n"
          "        print(repr(v)) if v is not None else None\n"
          "except BaseException as e:\n    print('Error:', type(e).__name__, e)\n")


def plain_subprocess_call(code: str, timeout: float = 5.0) -> str:
    """The baseline: a fresh `python -I -c` per call through a plain subprocess.run, in a fresh directory."""
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as workdir:
        try:
            proc = subprocess.run([sys.executable, "-I", "-c", RUNNER], input=code, capture_output=True, text=True,
                                  timeout=timeout, cwd=workdir, check=False)
        except subprocess.TimeoutExpired:
            return f"Error: timed out after {timeout:g} s"
        return proc.stdout[:2000].strip()


def measure(name: str, call, n: int) -> float:
    """Prints the call's rate and latencies; returns its p50 in ms."""
    latencies = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        call(CALLS[i % len(CALLS)])
        latencies.append(1000 * (time.perf_counter() - t))
    seconds = time.perf_counter() - start
    cuts = statistics.quantiles(latencies, n=100)
    print(f"{name:>28}: {n / seconds:7.1f} calls/s   p50 {statistics.median(latencies):6.1f} ms   p95 {cuts[94]:6.1f} "
          f"ms   p99 {cuts[98]:6.1f} ms")
    return statistics.median(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    light = sandbox.Sandbox(timeout=5)
    recipe = sandbox.Sandbox(timeout=5, preload=sandbox.PRELOAD + sandbox.SCIENTIFIC,  # tool_use_grpo.py's
                             warmup=sandbox.SCIENTIFIC_WARMUP)
    start = time.perf_counter()
    print(f"protections here: {light.protections()}; zygote start {time.perf_counter() - start:.2f} s (once)")
    start = time.perf_counter()
    recipe.start()
    print(f"the recipe's zygote (numpy, sympy, warm-up) starts in {time.perf_counter() - start:.2f} s (once)")
    assert light.run("6 * 7") == recipe.run("6 * 7") == plain_subprocess_call("6 * 7") == "42"
    plain = measure("plain subprocess.run per call", plain_subprocess_call, args.calls)
    sandboxed = measure("Sandbox(), stdlib preloaded", light.run, args.calls)
    measure("Sandbox(+numpy, sympy)", recipe.run, args.calls)
    print(f"{'Sandbox() / plain subprocess.run':>34}: {sandboxed / plain:.2f}x at p50")
    sympy_call = "import sympy\nsympy.factorint(360)"
    for name, call in (("plain subprocess, sympy call", plain_subprocess_call),
                       ("Sandbox(+sympy), sympy call", recipe.run)):
        latencies = [1000 * _timed(call, sympy_call) for _ in range(10)]
        print(f"{name:>28}: p50 {statistics.median(latencies):6.1f} ms (10 calls)")
    attacks = {"timeout": "while True:\n    pass", "4,096-file flood": "for i in range(10**6):\n    open(f'f{i}', 'w')",
               "memory bomb": "x = bytearray(10**11)", "signal the zygote": "import os\nos.kill(os.getppid(), 9)"}
    recipe.limits["timeout"] = 1.0
    for name, code in attacks.items():
        after = []
        for _ in range(5):
            recipe.run(code)
            after.append(1000 * _timed(recipe.run, "print(17 * 23)"))
        print(f"{'next call after ' + name:>34}: p50 {statistics.median(after):6.1f} ms, max {max(after):6.1f} ms")
    light.close()
    recipe.close()
    in_a_trainer_process(args.calls)


def in_a_trainer_process(calls: int) -> None:
    """The recipe's tool where it runs in training: a process holding torch, TRL and a model."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import tool_use_grpo

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2))
    with torch.no_grad():
        model(torch.randint(0, 4096, (8, 256)))  # torch's thread pools and a model's memory, as in a trainer
    for engine in ("bubblewrap", "landlock"):
        task = tool_use_grpo.setup(tool_use_grpo.ScriptArguments(tool_sandbox=engine))  # as a run builds it
        tool = task.environment_factory()
        print(tool.sandbox.describe())
        tool.reset()
        tool_p50 = measure(f"recipe's tool ({engine})", tool.python, calls)
        plain_p50 = measure("plain subprocess.run per call", plain_subprocess_call, calls)
        print(f"{f'tool ({engine}) / plain subprocess.run':>34}: {tool_p50 / plain_p50:.2f}x at p50")
        tool.sandbox.close()


def _timed(call, code: str) -> float:
    start = time.perf_counter()
    call(code)
    return time.perf_counter() - start


if __name__ == "__main__":
    from grpo_recipes.refusal import run_script

    run_script(main)
