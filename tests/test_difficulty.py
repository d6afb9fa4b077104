"""grpo_recipes/difficulty.py: prompts' pass rates written by evaluate.py and the training prompts a run keeps by them
(--pass_rates, --keep_pass_rate_between), through a real server and a recipe's entry point."""

import json
import logging
import subprocess
import sys

import pytest
from datasets import Dataset

import evaluate
from conftest import ROOT
from grpo_recipes import difficulty
from grpo_recipes.refusal import Refusal


def prompt(text: str) -> list[dict]:
    return [{"role": "system", "content": "Answer."}, {"role": "user", "content": text}]


def rates_file(tmp_path, rates: dict) -> str:
    path = tmp_path / "rates.jsonl"
    lines = [{"prompt": prompt(text), "columns": {"answer": "1"}, "samples": 4, "passed": None, "pass_rate": rate}
             for text, rate in rates.items()]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


DATA = Dataset.from_dict({"prompt": [prompt(text) for text in ["never", "half", "always", "failed", "unrated"]],
                          "answer": ["1"] * 5})
RATES = {"never": 0.0, "half": 0.5, "always": 1.0, "failed": None}  # "unrated" is not in the file


@pytest.mark.parametrize(("between", "kept"), [
    ([0.0, 1.0], ["half", "failed", "unrated"]),  # the default: what no sample or every sample solved is dropped
    ([0.0, 0.5], ["failed", "unrated"]),  # strictly between: 0.5 is out
    ([0.4, 1.0], ["half", "failed", "unrated"]),
])
def test_a_run_keeps_the_prompts_whose_pass_rate_lies_strictly_inside_the_band(tmp_path, caplog, between, kept):
    with caplog.at_level(logging.INFO, logger="grpo-recipes"):
        rows = difficulty.keep_by_pass_rate(DATA, rates_file(tmp_path, RATES), between)
    assert [p[1]["content"] for p in rows["prompt"]] == kept
    assert f"kept {len(kept)} of 5 training prompts" in caplog.text and "2 not rated (kept)" in caplog.text


@pytest.mark.parametrize(("lines", "between", "says"), [
    (None, [0.0, 1.0], "no such file; write one with evaluate.py <recipe> --split train --rollouts 8 --pass_rates"),
    ("not json\n", [0.0, 1.0], "line 1 is not a line evaluate.py --pass_rates writes"),
    ('{"prompt": []}\n', [0.0, 1.0], "line 1 is not a line evaluate.py --pass_rates writes"),
    (RATES, [0.5, 0.5], "--keep_pass_rate_between 0.5 0.5: give LOW HIGH with 0 <= LOW < HIGH <= 1"),
    (RATES, [0.0], "--keep_pass_rate_between 0.0: give LOW HIGH"),
    (RATES, [0.6, 0.9], "no training prompt has a pass rate between 0.6 and 0.9 (2 at or below, 1 at or above)"),
])
def test_a_pass_rates_file_or_band_that_cannot_be_used_is_one_line(tmp_path, lines, between, says):
    path = tmp_path / "rates.jsonl"
    if isinstance(lines, dict):
        rates_file(tmp_path, lines)
    elif lines is not None:
        path.write_text(lines)
    rated = DATA.select(range(3))  # never, half, always: with the band 0.6-0.9, none is kept
    with pytest.raises(Refusal) as refusal:
        difficulty.keep_by_pass_rate(rated, str(path), between)
    assert says in str(refusal.value) and "\n" not in str(refusal.value)


def test_rows_that_share_a_prompt_are_rated_and_kept_by_their_other_columns(tmp_path):
    """game_grpo's games: one prompt, a seed each; evaluate.py's line for each carries its columns."""
    games = [{"prompt": prompt("A new game."), "seed": seed} for seed in range(4)]
    rows = [{"example": i, "error": None, "strict": strict} for i, wins in enumerate([0, 1, 2, 1])
            for strict in [True] * wins + [False] * (2 - wins)]
    path = tmp_path / "rates.jsonl"
    path.write_text("".join(json.dumps(rate) + "\n" for rate in difficulty.pass_rates(rows, games)))
    kept = difficulty.keep_by_pass_rate(Dataset.from_list(games), str(path), [0.0, 1.0])
    assert kept["seed"] == [1, 3]


def test_a_settled_row_is_the_one_scored_even_with_an_environments_first_observation_in_its_prompt():
    """TRL appends an environment's first observation to the prompt the rewards get; the record still finds the row
    the data loader handed out (by its other columns), so a game that every episode won settles, and no other."""
    settled = difficulty.SettledPrompts(after=1)
    settled.raw = Dataset.from_list([{"prompt": prompt("A new game."), "seed": seed} for seed in range(3)])
    settled.columns = settled.raw.column_names
    batch = settled.swap({"prompt": [prompt("A new game.")] * 4, "seed": [0, 0, 1, 1]})
    assert batch["seed"] == [0, 0, 1, 1]
    shown = [prompt("A new game.\n\nI am thinking of a number.")] * 4
    settled.record(shown, [1.0, 1.0, 0.0, 1.0], {"seed": batch["seed"], "completion_ids": [[1]] * 4})
    assert settled.settled == {difficulty.row_key({"prompt": prompt("A new game."), "seed": 0})}
    assert settled.groups == 2 and settled.alike == 1 and not settled.drawn


def test_a_failed_request_is_no_sample_and_the_rate_is_of_correctness_alone():
    rows = [{"example": 0, "error": None, "strict": True}, {"example": 0, "error": None, "strict": False},
            {"example": 0, "error": "HTTP 500", "strict": False}, {"example": 1, "error": "HTTP 500", "strict": False}]
    rates = difficulty.pass_rates(rows, [{"prompt": prompt("a")}, {"prompt": prompt("b")}])
    assert [(r["samples"], r["passed"], r["pass_rate"]) for r in rates] == [(2, 1, 0.5), (0, 0, None)]
    assert difficulty.describe(rates) == ("0 solved by no sample, 0 by every sample, 1 in between, 1 without a sample "
                                          "(their requests failed)")


def test_evaluate_writes_pass_rates_and_a_recipe_trains_on_the_prompts_they_keep(reader_server, base_kit, tmp_path,
                                                                                   capsys):
    base_url, model = reader_server
    rates = tmp_path / "rates.jsonl"
    evaluate.main(["gsm8k_grpo", "--base_url", base_url, "--model", model, "--split", "train", "-n", "6", "-r", "2",
                   "--dataset_path", str(base_kit / "gsm8k_toy"), "--max_tokens", "8", "--out",
                   str(tmp_path / "rollouts.jsonl"), "--pass_rates", str(rates)])
    written = [json.loads(line) for line in rates.read_text().splitlines()]
    assert len(written) == 6 and all(r["samples"] == 2 for r in written)
    printed = capsys.readouterr()
    assert "wrote the pass rates of 6 prompts to" in printed.out
    # the tiny model's generation_config.json leaves do_sample unset: transformers serve decodes greedily at any
    # temperature, so each prompt's 2 samples are the same text, and evaluate.py says what that does to the rates
    assert "each of the 6 prompts got the same completion in every sample: the server may not" in printed.err
    # the tiny server solves none, so 6 of the toy set's 48 training prompts are dropped, the other 42 kept (unrated)
    never = sum(r["pass_rate"] == 0.0 for r in written)
    proc = subprocess.run([sys.executable, str(ROOT / "gsm8k_grpo.py"), "--config", str(base_kit / "gsm8k_grpo.yaml"),
                           "--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--eval_strategy", "no",
                           "--save_strategy", "no", "--pass_rates", str(rates)], capture_output=True, text=True,
                          timeout=300, cwd=base_kit, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"kept {48 - never} of 48 training prompts; dropped {never} with a pass rate <= 0" in proc.stderr


def test_identical_samples_are_named_only_when_no_prompt_got_two_different_completions():
    def rows(*per_prompt):
        return [{"example": i, "error": None, "completion": [{"role": "assistant", "content": text}]}
                for i, texts in enumerate(per_prompt) for text in texts]

    assert difficulty.unsampled(rows(["4", "4"], ["7", "7", "7"])).startswith("each of the 2 prompts got the same")
    assert difficulty.unsampled(rows(["4", "4"], ["7", "8"])) is None  # one prompt's samples differ: it samples
    assert difficulty.unsampled(rows(["4", "4"], ["7"])) is None  # one prompt with two samples is no evidence
    failed = rows(["4", "4"], ["7", "7"])
    failed[0]["error"] = "HTTP 500"  # a failed request is no sample: prompt 0 has one left
    assert difficulty.unsampled(failed) is None


def test_evaluate_never_replaces_pass_rates_that_were_paid_for(tmp_path):
    (tmp_path / "rates.jsonl").write_text('{"prompt": [], "pass_rate": 0.5}\n')
    with pytest.raises(Refusal, match=r"--pass_rates .*rates.jsonl already holds 1 prompts' pass rates: pass another"):
        evaluate.main(["gsm8k_grpo", "--base_url", "http://127.0.0.1:9/v1", "--model", "m", "--out",
                       str(tmp_path / "out.jsonl"), "--pass_rates", str(tmp_path / "rates.jsonl")])


def test_a_prompt_whose_groups_all_scored_alike_is_replaced_when_drawn_again(base_kit, tmp_path):
    """The real trainer on four prompts, one prompt a step: "easy" scores 1.0 on every completion, so after its first
    group it is settled and the run never spends another generation on it (without the swap it is drawn again in the
    second pass over the prompts); every group the reward sees is still one prompt's."""
    import gsm8k_grpo
    from trl import GRPOTrainer

    from grpo_recipes import options, training
    from grpo_recipes.contract import Setup
    from grpo_recipes.logs import KeepCallbacksMetrics

    groups = []

    def parity_reward(completions, prompts, **kwargs) -> list[float]:
        """1.0 on "easy", else the parity of the completion's length: groups that differ.

        Gaming it: a test's reward.
        """
        asked = [prompt[-1]["content"] for prompt in prompts]
        groups.extend(asked[i:i + 4] for i in range(0, len(asked), 4))
        return [1.0 if text == "easy" else float(len(c[0]["content"]) % 2) for text, c in zip(asked, completions,
                                                                                              strict=True)]

    _, args, model_args = options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, [
        "--config", str(base_kit / "gsm8k_grpo.yaml"), "--output_dir", str(tmp_path / "out"), "--max_steps", "8",
        "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--skip_settled_after", "1"])
    task = Setup([parity_reward], [1.0])
    tokenizer = training.prepare(args, model_args, task)
    dataset = Dataset.from_dict({"prompt": [prompt(text) for text in ("easy", "a", "bb", "ccc")]})
    trainer = GRPOTrainer(model=str(base_kit / "tiny-qwen2"), reward_funcs=task.reward_funcs, args=args,
                          train_dataset=dataset, processing_class=tokenizer,
                          callbacks=training.trainer_callbacks(task.callbacks))
    trainer.add_callback(KeepCallbacksMetrics())  # as training.run adds: the callbacks' keys reach the history
    trainer.train()
    assert all(len(set(group)) == 1 for group in groups), groups  # a replacement is the same for a whole group
    assert [group[0] for group in groups].count("easy") == 1, [group[0] for group in groups]
    logged = [log for log in trainer.state.log_history if "settled/prompts" in log]
    assert len(logged) == 8 and logged[-1]["settled/prompts"] >= 1 and logged[0]["settled/zero_variance_groups"] == 1
    assert logged[-1]["settled/generations_saved"] >= 4  # one group of 4, at least


@pytest.mark.parametrize(("argv", "says"), [
    (["--skip_settled_after", "1"], "--skip_settled_after: this recipe generates its prompts as it trains"),
    (["--pass_rates", "x.jsonl"], "--pass_rates: this recipe generates its prompts as it trains"),
])
def test_a_recipe_that_generates_its_prompts_refuses_both_filters(argv, says):
    import reasoning_gym_grpo

    from grpo_recipes import options

    script_args, training_args, _ = options.parse_args(reasoning_gym_grpo.ScriptArguments,
                                                       reasoning_gym_grpo.RECIPE_DEFAULTS, ["--tasks", "chain_sum",
                                                                                             *argv])
    with pytest.raises(Refusal, match=says):
        reasoning_gym_grpo.datasets(script_args, reasoning_gym_grpo.setup(script_args), training_args)
