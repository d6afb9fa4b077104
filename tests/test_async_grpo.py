"""async_grpo.py's pieces that need no vLLM server: the weighted rubric the async trainer can send to its reward
process, how a recipe's defaults carry over, and the CPU's tree attention (the server checks run in the vLLM tier,
tests/test_vllm.py; every recipe's rewards and tools rebuilding in a spawned process, in tests/test_contract.py)."""

import pickle
from pathlib import Path

import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from trl.experimental.async_grpo import packing
from trl.trainer.utils import get_callable_name

import async_grpo
import gsm8k_grpo
import rewards
from grpo_recipes import options, trl_patches
from grpo_recipes.refusal import Refusal

ROOT = Path(__file__).resolve().parent.parent


def completion(answer: str) -> list[dict]:
    return [{"role": "assistant", "content": f"<reasoning>\nsums\n</reasoning>\n<answer>\n{answer}\n</answer>"}]


def test_each_reward_is_scaled_by_its_weight_under_its_own_name_and_survives_pickling():
    weighted = [async_grpo.WeightedReward(f, w)
                for f, w in zip(gsm8k_grpo.REWARD_FUNCS, gsm8k_grpo.REWARD_WEIGHTS, strict=True)]
    copies = pickle.loads(pickle.dumps(weighted))  # what the trainer's child process receives
    scored = {get_callable_name(f): f([completion("18"), completion("17")], answer=["18", "18"]) for f in copies}
    assert scored["correctness_reward"] == [2.0, 0.0]  # weight 2
    assert scored["integer_answer_reward"] == [0.5, 0.5]  # weight 0.5
    assert list(scored) == [rewards.reward_name(f) for f in gsm8k_grpo.REWARD_FUNCS]
    # the async trainer sums with weight 1: the same totals the recipe's weighted sum gives
    assert sum(s[0] for s in scored.values()) == 4.0


def test_a_reward_that_cannot_pickle_is_one_line():
    with pytest.raises(Refusal, match="lambda_reward cannot be sent .*module-level function"):
        async_grpo.check_picklable({"lambda_reward": lambda completions, **kw: [0.0] * len(completions)})


def test_the_recipe_defaults_carry_over_and_the_differences_are_named():
    defaults, differences = async_grpo.recipe_defaults(gsm8k_grpo)
    assert defaults["num_generations"] == gsm8k_grpo.RECIPE_DEFAULTS["num_generations"]
    assert "eval_strategy" not in defaults and "scale_rewards" not in defaults
    assert differences == ["scale_rewards 'none': each group's rewards are divided by their std (TRL's async trainer "
                           "has no scale_rewards)"]


def shared_prompt_samples() -> list[dict]:
    """Three completions of one prompt (TRL's packing forwards the prompt once) and a sample of another prompt."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 100, (7,), generator=generator)
    samples = []
    for group, (head, length) in enumerate([(prompt, 5), (prompt, 9), (prompt, 3), (prompt[:2] + 1, 4)]):
        ids = torch.cat([head, torch.randint(0, 100, (length,), generator=generator)])
        samples.append({"input_ids": ids, "completion_mask": torch.cat([torch.zeros(len(head)), torch.ones(length)]),
                        "old_log_probs": torch.zeros(len(ids)), "group_id": group // 3, "advantage": 1.0})
    return samples


def test_the_cpu_tree_attention_gives_each_packed_sample_the_logits_it_has_alone(kit):
    """TRL's async trainer forwards a batch as one prefix trie; on a CPU, async_grpo.py computes its attention with
    transformers' SDPA and a tree mask. Every trained token's logits match the sample's own unpacked forward; a
    plain causal mask over the same packed row (each sample seeing the others) does not."""
    packing.register_tree_attention()
    AttentionInterface.register(packing.TREE_ATTENTION, trl_patches.sdpa_tree_attention)
    alone = AutoModelForCausalLM.from_pretrained(kit / "tiny-qwen2", attn_implementation="sdpa").eval()
    tree = AutoModelForCausalLM.from_pretrained(kit / "tiny-qwen2", attn_implementation=packing.TREE_ATTENTION).eval()
    row = packing.TreeRow()
    samples = shared_prompt_samples()
    for sample in samples:
        row.add(sample)
    packed = row.pack()
    assert len(packed["input_ids"]) < sum(len(s["input_ids"]) for s in samples)  # the prompt is forwarded once
    with torch.no_grad():
        logits = tree(input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None],
                      tree_kv_index=packed["tree_kv_index"], tree_cu_seqlens_q=packed["tree_cu_seqlens_q"],
                      tree_cu_seqlens_k=packed["tree_cu_seqlens_k"]).logits[0]
        causal = alone(input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None]).logits[0]
        expected = torch.cat([alone(input_ids=s["input_ids"][None]).logits[0, s["completion_mask"][1:].nonzero()[:, 0]]
                              for s in samples])  # the logits that predict each trained token
    assert len(expected) == len(packed["token_index"])
    torch.testing.assert_close(logits[packed["token_index"]], expected, atol=1e-5, rtol=1e-5)
    assert (causal[packed["token_index"]] - expected).abs().max() > 0.01


def parse(*argv: str):
    defaults, _ = async_grpo.recipe_defaults(gsm8k_grpo)
    return options.parse_args(gsm8k_grpo.ScriptArguments, defaults, list(argv),
                               config_class=async_grpo.AsyncRecipeConfig)[1]


def test_max_staleness_0_is_trls_strict_policy_and_a_step_takes_the_recipes_batch():
    assert parse("--max_staleness", "0").max_staleness == 0  # only rollouts of the current policy version
    with pytest.raises(Refusal, match="--max_staleness -1"):
        parse("--max_staleness", "-1")
    args = parse("--per_device_train_batch_size", "8")
    assert args.token_budget == 0 and args.per_device_train_batch_size == 8  # 8 samples a step, not what fits


def learning_rates(args, steps: int) -> list[float]:
    """The LR of each of `steps` optimizer steps under args' schedule, built as transformers' Trainer builds it."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(torch.nn.Linear(1, 1).parameters(), lr=args.learning_rate)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, args.get_warmup_steps(args.max_steps),
                              args.max_steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("recipe", ["gsm8k_grpo", "tool_use_grpo"])
def test_without_max_steps_the_lr_schedule_spans_the_run_the_trainer_stops_at(recipe):
    """The documented command gives no --max_steps: the run is one epoch, and its cosine schedule must warm up over
    its first 10% and decay to ~0 at its end (TRL's safety ceiling, ~32x the run, left GSM8K's run in warmup at ~15%
    of the rate)."""
    import importlib

    module = importlib.import_module(recipe)
    defaults, _ = async_grpo.recipe_defaults(module)
    args = options.parse_args(module.ScriptArguments, defaults, [], config_class=async_grpo.AsyncRecipeConfig)[1]
    assert args.max_steps <= 0
    prompts = 7473  # GSM8K's train split
    async_grpo.schedule_length(args, prompts)
    steps = -(-prompts * args.num_generations // (args.per_device_train_batch_size * args.gradient_accumulation_steps))
    assert args.max_steps == steps  # the stop and the schedule's length are one number
    rates = learning_rates(args, steps)
    peak = max(rates)
    assert peak == pytest.approx(args.learning_rate, rel=0.01)
    assert rates.index(peak) == pytest.approx(defaults["warmup_steps"] * steps, abs=1)  # a share of the run
    assert rates[-1] < 0.01 * args.learning_rate  # decayed by the end
    mean = defaults["warmup_steps"] / 2 + (1 - defaults["warmup_steps"]) / 2  # linear warmup, then cosine to 0
    assert sum(rates) / steps == pytest.approx(mean * args.learning_rate, rel=0.02)
    given = options.parse_args(module.ScriptArguments, defaults, ["--max_steps", "30"],
                               config_class=async_grpo.AsyncRecipeConfig)[1]
    async_grpo.schedule_length(given, prompts)
    assert given.max_steps == 30  # an explicit --max_steps is kept


@pytest.mark.parametrize(("capability", "attention"), [((7, 5), "sdpa"), ((8, 9), "sdpa"), ((12, 0), "sdpa"),
                                                       ((8, 0), "flash-attn3"), ((9, 0), "flash-attn3")])
def test_a_gpu_without_trls_flash_attn3_kernels_attends_with_sdpa_said_in_one_line(capability, attention, caplog):
    """TRL loads flash-attn3 builds for sm80 and sm90 only: a T4, an L4 or a Blackwell card would fail at the first
    forward. They attend with SDPA's tree mask instead, with one line saying why."""
    import importlib.util

    args = parse()
    if attention == "flash-attn3" and importlib.util.find_spec("kernels") is None:
        with pytest.raises(Refusal, match="`pip install kernels`, or pass --tree_attention sdpa"):
            async_grpo.check_attention(args, capability=capability)
        return
    async_grpo.check_attention(args, capability=capability)
    assert args.tree_attention == attention
    if attention == "sdpa":
        assert f"this GPU is sm{capability[0]}{capability[1]}: TRL's flash-attn3 kernels exist for sm80 and sm90 only" \
            in caplog.text


def test_two_gpus_seen_by_the_async_trainer_name_the_one_beside_the_servers(monkeypatch):
    from grpo_recipes import preflight

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr("sys.argv", ["async_grpo.py", "gsm8k_grpo", "--max_staleness", "1"])
    with pytest.raises(Refusal, match=r"train on the one the vLLM server does not use, e\.g\. `CUDA_VISIBLE_DEVICES=1 "
                       r"python async_grpo.py gsm8k_grpo --max_staleness 1` beside `CUDA_VISIBLE_DEVICES=0 vllm serve"):
        preflight.check_launch("async_grpo.py", gpus=2, generation_server=True)
