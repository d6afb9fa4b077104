"""grpo_recipes/trl_patches.py: each patch of TRL's or transformers' private code does what it says, and the code it
relies on still has the shape the patch was written for (each check fails when upstream changes it)."""

import contextlib
import copy
import inspect
from types import SimpleNamespace

import pytest
import torch
from test_precision import frozen_base, tiny_bf16_lora_model

import gsm8k_grpo
from grpo_recipes import memory, options, trl_patches


def parse_args(argv: list[str]):
    return options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv)


def test_checkpointing_is_on_by_default_and_off_with_the_flag_every_transformers_release_has():
    assert memory.checkpointing_on(parse_args([])[1]) is True
    assert memory.checkpointing_on(parse_args(["--gradient_checkpointing", "false"])[1]) is False
    if hasattr(parse_args([])[1], "activation_checkpointing"):  # transformers 5.23+: the new name works too
        assert memory.checkpointing_on(parse_args(["--activation_checkpointing", "false"])[1]) is False


def test_lora_under_zero3_gets_reentrant_checkpointing_where_transformers_reads_it():
    from accelerate.utils import DeepSpeedPlugin

    _, args, model_args = parse_args([])
    trl_patches.reentrant_checkpointing_for_peft_zero3(args, model_args.use_peft)
    read = "activation_checkpointing_kwargs" if hasattr(args, "activation_checkpointing") else \
        "gradient_checkpointing_kwargs"  # the name the installed transformers' Trainer reads
    assert not (getattr(args, read) or {}).get("use_reentrant")  # no ZeRO-3: untouched
    args.deepspeed_plugin = DeepSpeedPlugin(zero_stage=3)
    trl_patches.reentrant_checkpointing_for_peft_zero3(args, model_args.use_peft)
    assert getattr(args, read)["use_reentrant"] is True


# ------------------------------------------------------------------ what each patch relies on, in the installed TRL
def test_the_lora_sync_patch_replaces_the_method_trls_vllm_sync_reads_its_weights_through():
    from trl.generation.vllm_generation import VLLMGeneration

    original = VLLMGeneration._iter_named_params
    assert inspect.isgeneratorfunction(original) and list(inspect.signature(original).parameters) == ["self"]
    source = inspect.getsource(VLLMGeneration)
    # TRL's sync reads the weights through it, and the patch calls the helpers it uses, under these names
    assert "self._iter_named_params()" in source
    for used in ("self._dist.is_fsdp", "self._dist.gather_params(", "self._fix_param_name_to_vllm(", "self.model"):
        assert used in source, f"TRL's VLLMGeneration no longer has {used}: trl_patches.sync_lora_out_of_place"
    try:
        trl_patches.sync_lora_out_of_place()
        trl_patches.sync_lora_out_of_place()  # twice: TRL's method is wrapped once
        assert VLLMGeneration._iter_named_params is not original
        assert VLLMGeneration._iter_named_params.trl_original is original
    finally:
        VLLMGeneration._iter_named_params = original


def test_the_cpu_tree_attention_takes_the_arguments_trls_tree_attention_is_called_with():
    from trl.experimental.async_grpo import packing

    trl_tree = inspect.signature(packing.tree_attention).parameters
    ours = inspect.signature(trl_patches.sdpa_tree_attention).parameters
    assert packing.TREE_ATTENTION == "tree_fa3"
    needed = {name for name, p in ours.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty}
    assert needed == {"tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k"} and needed <= set(trl_tree)
    assert [name for name in trl_tree][:5] == [name for name in ours][:5]  # module, query, key, value, mask


def test_the_mfu_patch_replaces_the_name_trls_async_trainer_calls():
    from trl.experimental.async_grpo import async_grpo_trainer

    original = async_grpo_trainer.get_peak_flops_per_device
    assert "get_peak_flops_per_device(self.accelerator, dtype)" in inspect.getsource(async_grpo_trainer)
    try:
        trl_patches.no_mfu_without_cuda()
        assert async_grpo_trainer.get_peak_flops_per_device(None, "bfloat16") is None
    finally:
        async_grpo_trainer.get_peak_flops_per_device = original


@pytest.mark.parametrize("name", ["activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"])
def test_the_checkpointing_kwargs_names_the_zero3_patch_sets_are_the_ones_this_transformers_has(name):
    from transformers import TrainingArguments

    names = {f for f in TrainingArguments.__dataclass_fields__}
    assert "gradient_checkpointing_kwargs" in names  # every release from 5.17 on
    if name == "activation_checkpointing_kwargs" and name not in names:
        pytest.skip("transformers before 5.23 has only gradient_checkpointing_kwargs")
    assert name in names


def test_trls_own_vllm_sync_sends_lora_through_the_patch_and_leaves_the_bf16_base_bitwise_unchanged():
    """TRL's colocate `sync_weights`, called as the trainer calls it after each step, on a bf16 LoRA model: with the
    patch installed the frozen base is bitwise unchanged after 200 syncs and vLLM receives the merged weights. If TRL
    stopped reading LoRA weights through `_iter_named_params` this fails; so it does without the patch (TRL merges
    and unmerges in place, and the base drifts)."""
    from trl.generation.vllm_generation import VLLMGeneration

    def synced(patched: bool) -> tuple[dict, dict]:
        model, received = tiny_bf16_lora_model(), {}
        base = frozen_base(model)
        runner_model = SimpleNamespace(load_weights=lambda weights: received.update(
            {name: tensor.clone() for name, tensor in weights}))
        generation = object.__new__(VLLMGeneration)  # the attributes sync_weights reads in colocate mode
        generation.model, generation.mode, generation.enable_sleep_mode = model, "colocate", False
        generation.accelerator = SimpleNamespace(is_main_process=True)
        generation._dist = SimpleNamespace(is_fsdp=False, gather_params=lambda params: contextlib.nullcontext())
        generation.llm = SimpleNamespace(reset_prefix_cache=lambda: None, llm_engine=SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(
                model=runner_model)))))
        original = VLLMGeneration._iter_named_params
        try:
            if patched:
                trl_patches.sync_lora_out_of_place()
            for _ in range(200):
                generation.sync_weights()
        finally:
            VLLMGeneration._iter_named_params = original
        changed = {name for name, p in frozen_base(model).items() if not torch.equal(p, base[name])}
        merged = copy.deepcopy(model).merge_and_unload().state_dict()
        return changed, {name for name in received if not torch.equal(received[name], merged[name])}

    changed, wrong = synced(patched=True)
    assert changed == set() and wrong == set()
    changed, _ = synced(patched=False)  # TRL's own path: merge and unmerge in place, in bf16
    assert changed
