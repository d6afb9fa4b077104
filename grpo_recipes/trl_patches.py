"""Where the recipes reach into TRL's and transformers' private code, each for a named version, each with a test
(tests/test_trl_patches.py) that fails when the code it relies on changes.

- `sync_lora_out_of_place`, for TRL 1.16's `VLLMGeneration._iter_named_params`: LoRA's weights reach vLLM without
  rewriting the frozen base in place (bf16 drift).
- `reentrant_checkpointing_for_peft_zero3`, for transformers 5.17-5.25's two names for checkpointing kwargs: LoRA under
  ZeRO-3 needs reentrant checkpointing, which TRL sets under the old name only.
- `use_sdpa_tree_attention`, for TRL 1.16's async trainer: `packing.TREE_ATTENTION` and its `tree_*` keyword arguments:
  its flash-attn3 tree attention has no CPU kernel.
- `no_mfu_without_cuda`, for TRL 1.16's `async_grpo_trainer.get_peak_flops_per_device`: it asks CUDA for the device's
  name.
"""

import torch

from grpo_recipes.memory import checkpointing_on


# -------------------------------------------------------------------------------------------- LoRA's weights to vLLM
def lora_weights_for_vllm(model, fix_name=lambda name: name):
    """(name, tensor) pairs for vLLM's load_weights: every base weight, with each LoRA layer's adapter added out of
    place, one layer at a time (PEFT's safe merge, applied to a new tensor). The frozen base is only read.

    TRL's own sync merges the adapter into the base and unmerges it, in place, at every step; in bf16 each add and
    subtract rounds, and the base drifts (1,000 syncs changed 25.6% of a tiny model's: tests/test_precision.py), so the
    policy trained and sampled is base + drift + adapter while the saved adapter has no drift. Costs one layer's
    weight in memory at a time, and no unmerge."""
    from peft.tuners.lora import LoraLayer

    layers = {id(module.get_base_layer().weight): module for module in model.modules()
              if isinstance(module, LoraLayer)}
    biases = {id(module.get_base_layer().bias): module for module in layers.values()
              if getattr(module.get_base_layer(), "bias", None) is not None}
    for name, param in model.named_parameters():
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")  # the base model's own names
        if model.prefix in name or "original_module" in name:  # adapter weights, and modules_to_save's originals
            continue
        name = fix_name(name.replace("modules_to_save.default.", ""))
        tensor = param.data
        if id(param) in layers:
            tensor = merged_lora_weight(layers[id(param)])
        elif id(param) in biases:
            layer = biases[id(param)]
            for adapter in (a for a in layer.active_adapters if a in layer.lora_A and layer.lora_bias[a]):
                tensor = tensor + layer.lora_B[adapter].bias * layer.scaling[adapter]
        yield name, tensor


def merged_lora_weight(layer) -> torch.Tensor:
    """A LoRA layer's base weight plus its active adapters, as a new tensor in the base's dtype."""
    weight = layer.get_base_layer().weight.data
    for adapter in (a for a in layer.active_adapters if a in layer.lora_A):
        if adapter in layer.lora_variant:  # DoRA and the other variants merge their own way, on a copy
            weight = layer.lora_variant[adapter].merge_safe(layer, adapter, weight.clone())
        else:
            weight = (weight + layer.get_delta_weight(adapter)).to(weight.dtype)  # one rounding, as PEFT's merge
    return weight


def sync_lora_out_of_place() -> None:
    """Make TRL 1.16's vLLM weight sync (`VLLMGeneration._iter_named_params`, which yields the names and tensors vLLM
    loads) read LoRA models through lora_weights_for_vllm; FSDP keeps TRL's own path. Installing twice wraps TRL's
    method once."""
    from accelerate.utils import is_peft_model
    from trl.generation.vllm_generation import VLLMGeneration

    installed = VLLMGeneration._iter_named_params
    trl_iter_named_params = getattr(installed, "trl_original", installed)

    def iter_named_params(self):
        if not is_peft_model(self.model) or self._dist.is_fsdp:
            yield from trl_iter_named_params(self)
            return
        with self._dist.gather_params(list(self.model.parameters())):  # ZeRO-3: the whole model, as TRL does
            yield from lora_weights_for_vllm(self.model, self._fix_param_name_to_vllm)

    iter_named_params.trl_original = trl_iter_named_params
    VLLMGeneration._iter_named_params = iter_named_params


# -------------------------------------------------------------------------------------------------- checkpointing
def reentrant_checkpointing_for_peft_zero3(training_args, use_peft: bool) -> None:
    """LoRA under DeepSpeed ZeRO-3 needs reentrant activation checkpointing. TRL forces it, but into the deprecated
    `gradient_checkpointing_kwargs`, which transformers 5.23+ no longer reads once the config is built (it reads
    `activation_checkpointing_kwargs`; 5.17-5.22 have only the old name): set every name the release has."""
    plugin = getattr(training_args, "deepspeed_plugin", None)
    if use_peft and plugin is not None and plugin.zero_stage == 3 and checkpointing_on(training_args):
        names = [n for n in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")
                 if hasattr(training_args, n)]
        kwargs = {**(getattr(training_args, names[0]) or {}), "use_reentrant": True}
        for name in names:
            setattr(training_args, name, kwargs)


# ------------------------------------------------------------------------------------- the async trainer on a CPU
def tree_mask(length: int, tree_kv_index, tree_cu_seqlens_q, tree_cu_seqlens_k) -> torch.Tensor:
    """Which packed tokens each packed token attends to: TRL's tree packing lays a prefix trie out in segments, and a
    segment's queries see the keys of its root-to-segment path (`tree_kv_index`), causally within the segment, as
    flash-attn's variable-length kernel reads the same tensors. True = attend."""
    mask = torch.zeros(length, length, dtype=torch.bool, device=tree_kv_index.device)
    starts_q, starts_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for q0, q1, k0, k1 in zip(starts_q[:-1], starts_q[1:], starts_k[:-1], starts_k[1:], strict=True):
        path_length = k1 - k0  # the path ends with the segment itself: its i-th query is key path_length-(q1-q0)+i
        causal = torch.ones(q1 - q0, path_length, dtype=torch.bool, device=mask.device).tril(path_length - (q1 - q0))
        mask[q0:q1, tree_kv_index[k0:k1]] = causal
    return mask


def sdpa_tree_attention(module, query, key, value, attention_mask, *, tree_kv_index, tree_cu_seqlens_q,
                        tree_cu_seqlens_k, sliding_window=None, softcap=None, **kwargs):
    """TRL's tree attention, computed by transformers' SDPA attention with the tree as a boolean mask: for a CPU
    (flash-attn3 has no CPU kernel, nor does torch's variable-length attention) and a GPU that cannot fetch
    flash-attn3. Same attention; memory quadratic in the packed length."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from grpo_recipes.refusal import Refusal

    if sliding_window or softcap:
        raise Refusal(f"{type(module).__name__} uses a sliding window or a logit softcap, which async_grpo.py's "
                      "CPU attention does not compute: train this model on a GPU")
    mask = tree_mask(query.shape[2], tree_kv_index, tree_cu_seqlens_q, tree_cu_seqlens_k)
    scaling, dropout = kwargs.get("scaling"), kwargs.get("dropout", 0.0)
    return sdpa_attention_forward(module, query, key, value, mask[None, None], dropout=dropout, scaling=scaling,
                                  is_causal=False)


def use_sdpa_tree_attention() -> None:
    """Register sdpa_tree_attention under the name TRL 1.16's async trainer gives its tree attention
    (`packing.TREE_ATTENTION`), replacing the flash-attn3 one it registered; call after building the trainer."""
    from transformers import AttentionInterface
    from trl.experimental.async_grpo import packing

    AttentionInterface.register(packing.TREE_ATTENTION, sdpa_tree_attention)


def no_peak_flops(accelerator, dtype) -> None:
    """TRL's MFU probe asks `torch.cuda.get_device_name`, which fails without CUDA; None is its own answer for a device
    it does not know (MFU off, throughput still logged)."""


def no_mfu_without_cuda() -> None:
    """Replace TRL 1.16's `async_grpo_trainer.get_peak_flops_per_device` (imported there by name) with no_peak_flops."""
    from trl.experimental.async_grpo import async_grpo_trainer

    async_grpo_trainer.get_peak_flops_per_device = no_peak_flops
