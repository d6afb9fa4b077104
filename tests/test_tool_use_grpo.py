"""tool_use_grpo.py: real GRPO steps in which the tiny warm-started model calls the sandboxed tool.

The kit's tiny model was SFT-ed on a few dozen tool-call conversations (offline.py --tools), so it emits parseable
tool calls at temperature 1; nothing here is mocked: TRL parses the calls, the sandbox runs them, the rewards score
the whole conversation.
"""

import json
import re
import shutil
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from transformers.utils import get_json_schema

import rewards
import tool_use_grpo
from grpo_recipes import contract, logs
from grpo_recipes.refusal import Refusal, StopRun
from grpo_recipes.sandbox import Sandbox
from test_rewards import final, tool_turn  # the conversation builders the rubric tests share


def interpreters(count: int = 1, **options) -> list:
    """What TRL does before a batch's generation: one PythonInterpreter per rollout from the recipe's
    environment_factory (the sandbox and budget setup() built from these options), each reset with its row."""
    task = tool_use_grpo.setup(tool_use_grpo.ScriptArguments(**options))
    rollouts = [task.environment_factory() for _ in range(count)]
    for rollout in rollouts:
        rollout.reset(prompt=[{"role": "user", "content": "6 * 7?"}], answer="42")
    return rollouts


def test_the_tool_is_a_typed_method_trl_can_describe():
    (interpreter,) = interpreters()
    assert [tool.__name__ for tool in contract.environment_tools(interpreter)] == ["python"]
    schema = get_json_schema(interpreter.python)["function"]
    assert schema["name"] == "python" and schema["parameters"]["required"] == ["code"]
    assert schema["parameters"]["properties"]["code"]["description"].startswith("Python source code")


def test_build_dataset_uses_the_tool_prompt_and_gold_numbers(kit):
    dataset = tool_use_grpo.build_dataset("test", str(kit / "gsm8k_toy"))
    assert dataset[0]["prompt"][0]["content"] == tool_use_grpo.SYSTEM_PROMPT
    assert all(answer.lstrip("-").isdigit() for answer in dataset["answer"])
    with pytest.raises(ValueError, match="unknown --dataset_name 'gsm9k'"):
        tool_use_grpo.build_dataset("train", dataset_name="gsm9k")


def test_a_chat_template_without_tool_call_parsing_is_refused_before_training(kit, tmp_path):
    model = shutil.copytree(kit / "tiny-qwen2-tools", tmp_path / "plain-template")
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(Refusal, match="TRL cannot parse tool calls.*Qwen2.5, Qwen3"):
        tool_use_grpo.main(["--model_name_or_path", str(model), "--dataset_path", str(kit / "gsm8k_toy"),
                            "--output_dir", str(tmp_path / "out")])


@pytest.fixture(scope="module")
def trained(kit, tmp_path_factory):
    """Two real GRPO steps of the recipe, in process, through its own entry point."""
    out = tmp_path_factory.mktemp("tool_run")
    trainer = tool_use_grpo.main(["--config", str(kit / "tool_use_grpo.yaml"), "--output_dir", str(out),
                                  "--max_steps", "2", "--save_steps", "2", "--eval_strategy", "no",
                                  "--log_completions"])
    return trainer, out


def test_grpo_steps_call_the_tool(trained):
    trainer, out = trained
    logs = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
    assert len(logs) == 2 and all(log["tools/call_frequency"] > 0 for log in logs)
    assert (out / "checkpoint-2").is_dir()


def test_each_steps_tool_time_calls_and_failures_are_in_the_saved_history(trained):
    _, out = trained
    saved = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    steps = [log for log in saved if "loss" in log]
    assert len(steps) == 2
    for log in steps:  # the time from the run's own callback, the calls and failures from TRL
        assert log["tools/seconds"] > 0 and log["tools/call_frequency"] > 0 and "tools/failure_frequency" in log


def test_turn_level_credit_reaches_the_logs_per_turn(trained):
    trainer, out = trained
    logs = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
    assert all(0.0 <= log["used_output/turn_1"] <= 1.0 for log in logs)
    frame = pd.concat(pd.read_parquet(f) for f in sorted((out / "completions").glob("*.parquet")))
    assert "used_output_per_turn" in frame.columns


def test_logged_completions_print_each_turn_with_its_tool_call_and_result(trained):
    trainer, _ = trained  # the run had --log_completions: these are the blocks it printed for its last step
    text = logs.completions_text(trainer._logs, None, "at step 2", stride=trainer.args.num_generations)
    blocks = text.split("--- completion ")[1:]
    assert len(blocks) == len(trainer._logs["completion"]) and all("\nuser: " in block for block in blocks)
    with_tool = [block for block in blocks if "\ntool: " in block]
    assert with_tool, "no printed completion shows a tool result"
    call = re.search(r"\[python\((\{.*\})\)\]$", with_tool[0], flags=re.MULTILINE)  # the call, as JSON
    assert call and "code" in json.loads(call.group(1)), with_tool[0]


def tool_turns(completions_dir: Path) -> list[tuple[dict, dict]]:
    """(logged row, tool message) for every tool result in the completions TRL logged."""
    frame = pd.concat(pd.read_parquet(f) for f in sorted(completions_dir.glob("*.parquet")))
    return [(row, message) for _, row in frame.iterrows() for message in row["completion"] if message["role"] == "tool"]


def test_the_sandbox_really_ran_each_call(trained):
    _, out = trained
    turns = tool_turns(out / "completions")
    assert turns, "no tool result reached the logged completions"
    fresh = Sandbox(timeout=5)
    for row, tool_message in turns[:8]:
        call = next(m for m in row["completion"] if m["role"] == "assistant" and m.get("tool_calls") is not None
                    and len(m["tool_calls"]))["tool_calls"][0]
        arguments = call["function"]["arguments"]
        code = (json.loads(arguments) if isinstance(arguments, str) else arguments)["code"]
        assert tool_message["content"] == fresh.run(code)
    fresh.close()


def test_the_rewards_saw_the_whole_conversation(trained):
    _, out = trained
    for row, _ in tool_turns(out / "completions"):
        completion = [dict(m) for m in row["completion"]]
        for message in completion:
            if message.get("tool_calls") is not None:
                message["tool_calls"] = [
                    {**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                                       if isinstance(c["function"]["arguments"], dict)
                                       else json.loads(c["function"]["arguments"])}} for c in message["tool_calls"]]
        # tool_use_reward is non-zero only when it sees the tool call and its result, not just the final message
        assert row["tool_use_reward"] == rewards.tool_use_reward([completion])[0] != 0.0


def test_tool_output_tokens_are_masked_from_the_loss(trained, kit):
    trainer, _ = trained
    example = tool_use_grpo.build_dataset("train", str(kit / "gsm8k_toy"))[0]
    batch = trainer._generate_and_score_completions([example] * trainer.args.num_generations)
    tokenizer = trainer.processing_class
    masked_some = False
    for ids, tool_mask, mask in zip(batch["completion_ids"], batch["tool_mask"], batch["completion_mask"], strict=True):
        ids, tool_mask = ids[mask.bool()], tool_mask[mask.bool()]
        if tool_mask.min() == 1:
            continue  # this completion called no tool
        masked_some = True
        trained_text = tokenizer.decode(ids[tool_mask == 1])
        hidden_text = tokenizer.decode(ids[tool_mask == 0])
        assert "<tool_response>" in hidden_text and "<tool_response>" not in trained_text
        assert "<tool_call>" in trained_text and "<tool_call>" not in hidden_text
    assert masked_some, "no completion in the batch called the tool"


def test_the_readme_shows_the_tool_recipe_rubric():
    from conftest import ROOT

    table = rewards.rubric_table(tool_use_grpo.REWARD_FUNCS, tool_use_grpo.REWARD_WEIGHTS)
    assert table in (ROOT / "README.md").read_text()


def test_each_rollout_gets_its_own_share_of_a_steps_tool_time():
    greedy, other = interpreters(2, tool_seconds_per_step=4.0)  # 2 s each: one timed-out call (2 s) spends a share
    budget = greedy.budget
    greedy.sandbox.start()  # the zygote's start-up is not a call's time
    try:
        budget.on_train_begin(None, None, None)
        budget.on_step_begin(None, None, None)
        for rollout in (greedy, other):  # the batch's rollouts, counted after TRL reset the budget at the step
            rollout.reset()
        assert greedy.python("while True:\n    pass").startswith("Error: timed out")
        start = time.monotonic()
        assert greedy.python("6 * 7") == "Error: this rollout's time for running code is used up; answer without " \
                                         "the tool"
        assert time.monotonic() - start < 0.05
        assert other.python("6 * 7") == "42"  # the greedy rollout did not spend the other's time
        assert other.python("while True:\n    pass").startswith("Error: timed out")
        assert other.python("6 * 7").startswith("Error: this rollout's time")
        budget.on_step_end(None, None, None)  # the Trainer's order: step end, then the step's log, then evaluation
        logs = {"loss": 0.1}
        budget.on_log(None, None, None, logs=logs)
        assert logs["tools/seconds"] >= 4.0
        # An evaluation after a step that spent its budget still runs its tools, each batch with its own budget.
        evaluated = other
        evaluated.reset()
        assert evaluated.python("6 * 7") == "42"
        budget.on_prediction_step(None, None, None)
        logs = {"eval_reward": 0.0}
        budget.on_log(None, None, None, logs=logs)
        assert 0 < logs["eval_tools/seconds"] < 1.0
        budget.on_step_begin(None, None, None)  # the next step's rollouts start with their whole share
        fresh = other
        fresh.reset()
        assert fresh.python("6 * 7") == "42"
        # Outside a training run (evaluate.py, async_grpo.py's rollout process) no step ends to renew the budget: none
        # applies there, however much tool time the calls have taken.
        budget.on_train_end(None, None, None)
        alone = greedy
        alone.reset()
        for _ in range(3):
            assert alone.python("while True:\n    pass").startswith("Error: timed out")
        assert alone.seconds > budget.seconds_per_step and alone.python("6 * 7") == "42"
    finally:
        greedy.sandbox.close()


def test_waiting_for_another_callers_call_is_not_charged_as_tool_time():
    rollouts = interpreters(8)
    rollouts[0].sandbox.start()
    threads = [threading.Thread(target=rollout.python, args=("import time\ntime.sleep(0.1)",)) for rollout in rollouts]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - start >= 0.8  # the sandbox serves one call at a time
    assert all(0.1 <= rollout.seconds < 0.3 for rollout in rollouts), [rollout.seconds for rollout in rollouts]
    rollouts[0].sandbox.close()


def test_a_sandbox_that_cannot_start_again_stops_the_run_in_one_line():
    (interpreter,) = interpreters()
    box = interpreter.sandbox
    box.start()
    warmup, box.warmup = box.warmup, "import os\nos._exit(3)"  # every new zygote dies while it starts
    try:
        box._zygote.kill()
        box._zygote.wait()
        with pytest.raises(StopRun) as stopped:
            interpreter.python("6 * 7")
        assert not isinstance(stopped.value, Exception)  # TRL's `except Exception` around a tool would go on training
        message = str(stopped.value)
        assert message.startswith("sandbox: ") and message.endswith("(the sandbox stopped working during the run)")
        assert "\n" not in message
    finally:
        box.warmup = warmup
    assert interpreter.python("6 * 7") == "42"
    box.close()


def test_an_unknown_sandbox_engine_is_one_line_not_a_weaker_mode(kit):
    with pytest.raises(Refusal, match="unknown engine 'bubblewarp'"):
        interpreters(tool_sandbox="bubblewarp")
    with pytest.raises(Refusal, match=r"--tool_sandbox.*invalid choice: 'bubblewarp' \(choose from 'bubblewrap', "
                       r"'landlock'\)"):  # from the command line: before anything loads
        tool_use_grpo.main(["--config", str(kit / "tool_use_grpo.yaml"), "--tool_sandbox", "bubblewarp"])


# ------------------------------------------------------------------------------------------------------- the rubric
def test_no_tool_use_pattern_outscores_a_correct_answer():
    def total(completion):
        return sum(w * f(completions=[completion], answer=["18"])[0]
                   for f, w in zip(tool_use_grpo.REWARD_FUNCS, tool_use_grpo.REWARD_WEIGHTS, strict=True))

    genuine = tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>")
    correct_without_tools = final("<answer>18</answer>")
    correct_with_errors = tool_turn("1/0", "Error: ZeroDivisionError") * 3 + final("<answer>18</answer>")
    tool_spam = sum((tool_turn(f"print({i})", str(i)) for i in range(20)), []) + final("<answer>17</answer>")
    answer_only_in_tool_code = tool_turn("print(18)", "18") + final("I computed it above.")
    for gamed in (tool_spam, answer_only_in_tool_code):
        assert total(gamed) < total(correct_with_errors) < total(correct_without_tools) < total(genuine)




@pytest.mark.parametrize("credit_weight", [None, 0.5, 0.99])
def test_turn_level_credit_never_lifts_a_wrong_answer_over_a_right_one(credit_weight):
    """For the recipe's weight of used_output_reward and any weight below 1 (agent_demo --turn_credit refuses more)."""
    weights = [credit_weight if credit_weight is not None and f is rewards.used_output_reward else w
               for f, w in zip(tool_use_grpo.REWARD_FUNCS, tool_use_grpo.REWARD_WEIGHTS, strict=True)]

    def total(completion):
        return sum(w * f(completions=[completion], answer=["18"])[0]
                   for f, w in zip(tool_use_grpo.REWARD_FUNCS, weights, strict=True))

    right = [tool_turn("print(3 * 6)", "18") + final("<answer>18</answer>"), final("<answer>18</answer>"),
             tool_turn("1/0", "Error: ZeroDivisionError") * 3 + final("<answer>18</answer>"),
             tool_turn("print(3 * 6)", "18") * 4 + final("<answer>18</answer>")]
    wrong = [tool_turn("print(3 + 6)", "9") + final("<answer>9</answer>"),                   # the used, wrong result
             tool_turn("print(17)", "17") + final("<answer>17</answer>"),                    # a printed guess
             sum((tool_turn(f"print({i} + 1)", str(i + 1)) for i in range(20)), []) + final("<answer>21</answer>"),
             tool_turn("print(18)", "18") + final("I computed it above."),
             tool_turn("print(3 * 6)", "18") + final("<answer>18</answer><answer>17</answer>")]
    assert max(map(total, wrong)) < min(map(total, right))
