"""async_grpo.py's pieces that need no vLLM server: the weighted rubric the async trainer can send to its reward
process, and how a recipe's defaults carry over (the server checks run in the vLLM tier, tests/test_vllm.py)."""

import pickle

import pytest
from trl.trainer.utils import get_callable_name

import async_grpo
import gsm8k_grpo
import rewards


def completion(answer: str) -> list[dict]:
    return [{"role": "assistant", "content": f"<reasoning>\nsums\n</reasoning>\n<answer>\n{answer}\n</answer>"}]


def test_each_reward_is_scaled_by_its_weight_under_its_own_name_and_survives_pickling():
    weighted = [async_grpo.WeightedReward(f, w) for f, w in zip(gsm8k_grpo.REWARD_FUNCS, gsm8k_grpo.REWARD_WEIGHTS)]
    copies = pickle.loads(pickle.dumps(weighted))  # what the trainer's child process receives
    scored = {get_callable_name(f): f([completion("18"), completion("17")], answer=["18", "18"]) for f in copies}
    assert scored["correctness_reward"] == [2.0, 0.0]  # weight 2
    assert scored["integer_answer_reward"] == [0.5, 0.5]  # weight 0.5
    assert list(scored) == [rewards.reward_name(f) for f in gsm8k_grpo.REWARD_FUNCS]
    # the async trainer sums with weight 1: the same totals the recipe's weighted sum gives
    assert sum(s[0] for s in scored.values()) == 4.0


def test_a_reward_that_cannot_pickle_is_one_line():
    with pytest.raises(SystemExit, match="lambda_reward cannot be sent .*module-level function"):
        async_grpo.check_picklable({"lambda_reward": lambda completions, **kw: [0.0] * len(completions)})


def test_the_recipe_defaults_carry_over_and_the_differences_are_named():
    defaults, differences = async_grpo.recipe_defaults(gsm8k_grpo)
    assert defaults["num_generations"] == gsm8k_grpo.RECIPE_DEFAULTS["num_generations"]
    assert "eval_strategy" not in defaults and "scale_rewards" not in defaults
    assert differences == ["scale_rewards 'none': each group's rewards are divided by their std (TRL's async trainer "
                           "has no scale_rewards)"]
