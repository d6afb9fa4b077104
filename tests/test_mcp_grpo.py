"""mcp_grpo.py and grpo_recipes/mcp_tools.py against real MCP servers: the example server (grpo_recipes/
mcp_example_server.py) as a process over stdio and over streamable HTTP on 127.0.0.1, started through the official
SDK. Nothing is mocked: the tools the model is shown are the listed ones, each call reaches the server.
"""

import json
import re
import socket
import subprocess
import sys
import time

import pytest
from transformers.utils import get_json_schema

import mcp_grpo
from conftest import ROOT, free_port, serve
from grpo_recipes import options
from grpo_recipes.contract import environment_tools
from grpo_recipes.mcp_tools import McpServer, McpTools, ToolCallFailed
from grpo_recipes.refusal import Refusal, StopRun, run_script


EXAMPLE = "python -m grpo_recipes.mcp_example_server"


def toolbox(**server) -> dict:
    """One rollout's tools, as TRL makes them: a toolbox from the factory, reset, its methods by name (one shared
    session unless `session` says otherwise: a server process, not one to list and one to call)."""
    factory = McpTools(McpServer(**{"command": f"{EXAMPLE} --faults", "session": "shared", **server}))
    factory.start()
    box = factory()
    box.reset()
    return {tool.__name__: tool for tool in environment_tools(box)}


@pytest.fixture(scope="module")
def http_server():
    """The example server over streamable HTTP on a free 127.0.0.1 port, until the module's tests end."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "grpo_recipes.mcp_example_server", "--faults", "--http",
                                "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            assert process.poll() is None, "the example server exited"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp", process
    process.kill()
    process.wait()


def test_each_tool_is_shown_with_the_servers_name_description_and_schema():
    tools = toolbox()
    assert set(tools) == {"calculate", "write_note", "read_note", "sleep", "fail", "long_text", "crash", "shapes",
                          "environment"}
    calculate = get_json_schema(tools["calculate"])["function"]
    assert calculate["description"].startswith("Evaluate an arithmetic expression")
    assert calculate["parameters"] == {"type": "object", "properties": {"expression": {
        "type": "string", "description": "Expression"}}, "required": ["expression"]}
    shapes = get_json_schema(tools["shapes"])["function"]
    assert shapes["description"] == "Take an argument of every JSON schema shape."  # its Args: are the arguments'
    shown = shapes["parameters"]["properties"]
    assert {name: shown[name]["type"] for name in ("word", "count", "ratio", "flag", "numbers", "point")} == {
        "word": "string", "count": "integer", "ratio": "number", "flag": "boolean", "numbers": "array",
        "point": "object"}
    assert shown["numbers"]["items"] == {"type": "integer"} and shown["mode"]["enum"] == ["fast", "slow"]
    assert shown["word"]["description"] == "A word."  # from the server's own Args: lines
    assert set(shapes["parameters"]["required"]) == {"word", "count", "ratio", "flag", "numbers", "mode", "point"}
    # what a type hint cannot carry is written out: the point's fields (a $ref the server declared) and a default
    written = json.loads(re.search(r"\(JSON schema: (\{.*\})\)", shown["point"]["description"]).group(1))
    assert written["properties"] == {"x": {"type": "number"}, "y": {"type": "number"}}
    assert "(default: 5)" in shown["limit"]["description"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_calls_reach_the_server_and_a_shared_session_shares_its_state(transport, http_server):
    server = {"command": None, "url": http_server[0]} if transport == "http" else {}
    first, second = toolbox(**server), toolbox(**server)
    assert first["calculate"](expression="6 * (3 + 4)") == "42"
    assert first["shapes"](word="a", count=2, ratio=0.5, flag=True, numbers=[1], mode="fast",
                           point={"x": 1, "y": 2}) == "a 2 0.5 True [1] fast 1.0,2.0 None 5"
    first["write_note"](title="shared", text="seen by all")
    if transport == "http":  # one server process: every client shares its notebook
        assert second["read_note"](title="shared") == "seen by all"


def test_a_rollout_session_keeps_its_state_from_every_other_rollout():
    factory = McpTools(McpServer(command=f"{EXAMPLE} --faults", session="rollout"))
    factory.start()
    first, second = factory(), factory()
    first.reset()
    second.reset()
    call = {box: {tool.__name__: tool for tool in environment_tools(box)} for box in (first, second)}
    call[first]["write_note"](title="mine", text="secret")
    assert call[first]["read_note"](title="mine") == "secret"
    with pytest.raises(ToolCallFailed, match="no note titled 'mine'"):
        call[second]["read_note"](title="mine")  # another rollout, another server process
    first.reset()  # the next rollout of the same pooled toolbox starts clean
    with pytest.raises(ToolCallFailed, match="no note titled 'mine'"):
        call[first]["read_note"](title="mine")


def server_children(command: str) -> set[int]:
    """The pids of this process's descendants whose command line holds `command` (the servers it started)."""
    import psutil

    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if command in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.Error:  # gone meanwhile
            pass
    return found


def test_rollouts_take_warm_spares_that_no_other_rollout_used_and_idle_spares_are_closed(monkeypatch):
    """Issue 66: a rollout's own server starts ahead of it, so its first call does not wait for a server to start: with
    a server that takes 3 s to start, the first call after a reset is answered within 1.5 s once the spares are up.
    Each spare is fresh (a note written in one rollout is in no other), there is one per toolbox that started a rollout
    within SPARE_IDLE_SECONDS, and the others' servers end."""
    from grpo_recipes import mcp_tools

    slow = f"sh -c 'sleep 3; exec {sys.executable} -m grpo_recipes.mcp_example_server --faults'"
    marker = "mcp_example_server --faults"  # in a server's command line once `sh` execs it
    before = server_children(marker)
    factory = McpTools(McpServer(command=slow, session="rollout"))
    factory.start()
    boxes = [factory(), factory()]
    calls = [{tool.__name__: tool for tool in environment_tools(box)} for box in boxes]
    for box in boxes:
        box.reset()
    assert factory.spares() == 2  # one per toolbox, started with the first batch
    calls[0]["write_note"](title="mine", text="secret")  # the first batch's servers start as its calls wait
    assert factory.stats["start_waits"] == 1
    deadline = time.monotonic() + 30
    while not all(spare.ready.done() for spare in factory._spares) and time.monotonic() < deadline:
        time.sleep(0.1)  # the spares start in the background (3 s and more on a loaded machine)
    for box, call in zip(boxes, calls, strict=True):
        started = time.monotonic()
        box.reset()
        with pytest.raises(ToolCallFailed, match="no note titled 'mine'"):
            call["read_note"](title="mine")  # a server no rollout has used
        assert time.monotonic() - started < 1.5
    assert factory.stats["start_waits"] == 1 and factory.spares() == 2
    monkeypatch.setattr(mcp_tools, "SPARE_IDLE_SECONDS", 2.0)
    for _ in range(8):  # only the first toolbox goes on (as training's after an evaluation's larger batch)
        boxes[0].reset()
        time.sleep(0.5)
    assert factory.spares() == 1
    while (factory.spares() or len(server_children(marker) - before) > 2) and time.monotonic() < deadline + 20:
        time.sleep(0.2)  # then none: their servers exit
    assert factory.spares() == 0 and len(server_children(marker) - before) == 2  # the two rollouts' own servers


def test_without_the_warm_pool_each_rollout_starts_its_server_at_its_reset():
    from grpo_recipes.mcp_tools import McpCallLog

    script_args, _, _ = options.parse_args(mcp_grpo.ScriptArguments, mcp_grpo.RECIPE_DEFAULTS,
                                           ["--mcp_warm_pool", "false", "--output_dir", "unused"])
    task = mcp_grpo.setup(script_args)
    cold = task.environment_factory
    assert cold.server.warm_pool is False
    cold.start()
    box = cold()
    for _ in range(3):
        box.reset()
        assert {tool.__name__: tool for tool in environment_tools(box)}["calculate"](expression="2*3") == "6"
    assert cold.session == "rollout" and cold.spares() == 0 and cold.stats["start_waits"] == 3
    logs = {"loss": 0.0}
    next(hook for hook in task.callbacks if isinstance(hook, McpCallLog)).on_log(None, None, None, logs=logs)
    assert logs["mcp/start_waits"] == 3 and logs["mcp/spares"] == 0 and logs["mcp/timeouts"] == 0


def test_a_stdio_server_gets_the_variables_mcp_env_names_read_where_it_starts(monkeypatch):
    """The SDK gives a stdio server only PATH, HOME and a few: an API key reaches it when --mcp_env names it; its value
    is read where the server starts (a spawned rollout process inherits it), never pickled with the options."""
    import pickle

    monkeypatch.setenv("MCP_TEST_TOKEN", "s3cret")
    monkeypatch.setenv("MCP_TEST_OTHER", "not for the server")
    tools = toolbox(env=("MCP_TEST_TOKEN",))
    assert tools["environment"](name="MCP_TEST_TOKEN") == "s3cret"
    assert tools["environment"](name="MCP_TEST_OTHER") == "unset"
    assert toolbox()["environment"](name="MCP_TEST_TOKEN") == "unset"  # not named: not given
    assert b"s3cret" not in pickle.dumps(McpTools(McpServer(command=EXAMPLE, env=("MCP_TEST_TOKEN",))))
    with pytest.raises(Refusal, match="--mcp_env names MCP_TEST_UNSET, which this run's environment does not set"):
        McpServer(command=EXAMPLE, env=("MCP_TEST_UNSET",))
    with pytest.raises(Refusal, match="the server at --mcp_url has its own environment"):
        McpServer(url="http://127.0.0.1:8000/mcp", env=("MCP_TEST_TOKEN",))  # refused before any connection


def test_errors_timeouts_and_long_results_are_the_tools_answer_and_counted():
    factory = McpTools(McpServer(command=f"{EXAMPLE} --faults", timeout=1.5, max_result_chars=40))
    factory.start()
    tools = {tool.__name__: tool for tool in environment_tools(factory())}
    with pytest.raises(ToolCallFailed, match="boom"):
        tools["fail"](message="boom")
    with pytest.raises(ToolCallFailed, match="tool calculate: cannot c\n\\[32 more characters cut"):
        tools["calculate"](expression="1/0")  # '1/0': division by zero, cut like a result
    with pytest.raises(ToolCallFailed, match="calculate: 1 valida"):  # arguments the server's schema rejects
        tools["calculate"](expr="1")
    started = time.monotonic()
    with pytest.raises(ToolCallFailed, match="sleep did not answer within 1.5 s"):
        tools["sleep"](seconds=30)
    assert time.monotonic() - started < 10
    assert tools["calculate"](expression="2 + 2") == "4"  # the session goes on after a timeout
    answer = tools["long_text"](characters=100)
    assert answer.startswith("x" * 40 + "\n[60 more characters cut")
    assert factory.stats["truncated"] == 3  # this result, and the two errors above cut like results
    # TRL's loop turns an Exception into the tool message {"error": ...} and counts it as a failure
    assert issubclass(ToolCallFailed, Exception)


def test_one_call_cannot_hold_the_example_server():
    """Issue 66: `(((9**64)**64)**64)**64` held the server for ~159 s of CPU (the exponent check bounded only the right
    operand); every intermediate result is bounded now, and the next call is answered at once."""
    tools = toolbox(session="shared")
    for bomb in ("(((9**64)**64)**64)**64", "((9**64)**64)**64", "9**9**9", "(10**999)*(10**999)", "2.0**99999"):
        started = time.monotonic()
        with pytest.raises(ToolCallFailed, match="cannot calculate"):
            tools["calculate"](expression=bomb)
        assert time.monotonic() - started < 2, bomb
    assert tools["calculate"](expression="1+1") == "2"


def test_by_default_rollouts_share_a_session_only_where_every_tool_is_read_only():
    """The example server's notes keep state: under the default (auto) each rollout gets its own server, so a rollout
    cannot read a note a group mate wrote, and the error does not list the titles there are."""
    stateful = McpTools(McpServer(command=EXAMPLE))
    stateful.start()
    assert stateful.session == "rollout" and "auto: write_note may keep state" in stateful.describe()
    first, second = stateful(), stateful()
    first.reset()
    second.reset()
    call = {box: {tool.__name__: tool for tool in environment_tools(box)} for box in (first, second)}
    call[first]["write_note"](title="answer", text="42")
    with pytest.raises(ToolCallFailed) as refused:
        call[second]["read_note"](title="the answer")
    assert "answer" not in str(refused.value).replace("'the answer'", "")  # no list of others' titles
    stateless = McpTools(McpServer(command=EXAMPLE, tools=("calculate",)))
    stateless.start()
    assert stateless.session == "shared" and "every tool is read-only" in stateless.describe()


def test_an_error_result_is_cut_like_a_result():
    factory = McpTools(McpServer(command=f"{EXAMPLE} --faults", session="shared", max_result_chars=40))
    factory.start()
    tools = {tool.__name__: tool for tool in environment_tools(factory())}
    with pytest.raises(ToolCallFailed) as failed:
        tools["fail"](message="y" * 8433)
    assert len(str(failed.value)) < 200 and "more characters cut" in str(failed.value)


@pytest.mark.parametrize("session", ["shared", "rollout"])
def test_a_server_that_stops_answering_is_replaced_and_repeated_timeouts_stop_the_run(session, monkeypatch):
    from grpo_recipes import mcp_tools

    factory = McpTools(McpServer(command=f"{EXAMPLE} --faults", session=session, timeout=1.0))
    factory.start()
    first, second = factory(), factory()
    first.reset()
    second.reset()
    call = {box: {tool.__name__: tool for tool in environment_tools(box)} for box in (first, second)}
    with pytest.raises(ToolCallFailed, match="did not answer within 1 s"):
        call[first]["sleep"](seconds=300)  # holds its server: the connection is closed, the next call opens one
    started = time.monotonic()
    assert call[first]["calculate"](expression="1+1") == "2"
    assert call[second]["calculate"](expression="2+2") == "4"
    assert time.monotonic() - started < 30 and factory.stats["timeouts"] == 1
    if session == "shared":  # a call in flight on the connection a timeout closes fails; the run goes on
        import threading

        outcomes = {}

        def outcome(who, box, seconds):
            try:
                outcomes[who] = call[box]["sleep"](seconds=seconds)
            except BaseException as err:  # noqa: BLE001 - StopRun included: what each call ended with
                outcomes[who] = type(err).__name__

        threads = [threading.Thread(target=outcome, args=("stalled", first, 300)),
                   threading.Thread(target=outcome, args=("waiting", second, 0.8))]
        threads[0].start()
        time.sleep(0.3)
        threads[1].start()
        for thread in threads:
            thread.join(30)
        assert outcomes["stalled"] in ("ToolCallTimedOut", "ToolCallFailed"), outcomes
        assert outcomes["waiting"] != "StopRun", outcomes  # it failed or finished; the run goes on
        assert call[second]["calculate"](expression="3+3") == "6"
        factory._timeouts_in_a_row = 0
    monkeypatch.setattr(mcp_tools, "MAX_TIMEOUTS_IN_A_ROW", 2)
    with pytest.raises(ToolCallFailed):
        call[first]["sleep"](seconds=300)
    with pytest.raises(StopRun, match="did not answer 2 calls in a row within --mcp_timeout 1 s"):
        call[first]["sleep"](seconds=300)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_server_that_dies_stops_the_run_in_one_line_without_hanging(transport, tmp_path):
    if transport == "http":
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "grpo_recipes.mcp_example_server", "--faults", "--http",
                                    "--port", str(port)], cwd=ROOT, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/mcp"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        tools = toolbox(command=None, url=url, session="shared")  # connected before the server dies
        process.kill()
        process.wait()
        call = lambda: tools["calculate"](expression="1")  # noqa: E731
    else:
        tools = toolbox()
        call = lambda: tools["crash"](status=7)  # noqa: E731
    started = time.monotonic()
    with pytest.raises(StopRun) as stopped:
        call()
    assert time.monotonic() - started < 15
    assert "stopped answering" in str(stopped.value) and "\n" not in str(stopped.value)
    assert not isinstance(stopped.value, Exception)  # TRL's `except Exception` around a tool cannot swallow it


def test_a_server_that_cannot_start_or_be_reached_is_one_line_before_the_model_loads(base_kit, tmp_path, capsys):
    config = ["--config", str(base_kit / "gsm8k_grpo.yaml"), "--output_dir", str(tmp_path / "run")]
    broken = f"{sys.executable} -c \"import sys; sys.exit('no licence key for this service')\""
    with pytest.raises(SystemExit) as exited:  # the script's entry point: its line on stderr, exit status 1
        run_script(mcp_grpo.main, [*config, "--mcp_command", broken])
    stderr = capsys.readouterr().err
    assert exited.value.code == 1 and stderr.count("\n") == 1, stderr[-2000:]
    assert stderr.startswith("the MCP server `") and "did not start" in stderr
    assert "no licence key for this service" in stderr
    with pytest.raises(Refusal, match=r"could not be reached"):
        mcp_grpo.main([*config, "--mcp_url", f"http://127.0.0.1:{free_port()}/mcp"])
    with pytest.raises(Refusal, match=r"--mcp_tools names search, which the MCP server .* offers calculate"):
        mcp_grpo.main([*config, "--mcp_tools", "search"])
    assert not (tmp_path / "run").exists()  # refused before the output folder was made


def test_a_tool_trl_cannot_offer_is_refused_by_name():
    from grpo_recipes.mcp_tools import unusable

    assert "TRL keeps the name 'reset'" in unusable("reset", {})
    assert "'file-path' is not a Python name" in unusable("read", {"properties": {"file-path": {}}})
    assert "'from' is not a Python name" in unusable("move", {"properties": {"from": {}}})
    assert unusable("read", {"properties": {"path": {"type": "string"}}}) == ""


def test_a_config_file_others_could_write_cannot_name_the_command(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("mcp_command: python -m grpo_recipes.mcp_example_server\nmax_steps: 1\n")
    config.chmod(0o600)
    script_args, _, _ = options.parse_args(mcp_grpo.ScriptArguments, mcp_grpo.RECIPE_DEFAULTS,
                                           ["--config", str(config)])
    assert script_args.mcp_command == "python -m grpo_recipes.mcp_example_server"
    config.chmod(0o666)
    with pytest.raises(Refusal, match=r"sets mcp_command, a command this run starts with your rights, but the file "
                                      r"can be written by others"):
        options.parse_args(mcp_grpo.ScriptArguments, mcp_grpo.RECIPE_DEFAULTS, ["--config", str(config)])


def test_the_recipe_trains_a_step_with_the_servers_tools_offered(base_kit, tmp_path):
    """On the base kit (its untrained model seldom calls a tool): TRL takes the toolbox the server's listing made, and
    the run goes through its entry point with the server started (the learning tier's tests make the calls)."""
    trainer = mcp_grpo.main(["--config", str(base_kit / "mcp_grpo.yaml"), "--output_dir", str(tmp_path / "run"),
                             "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no"])
    assert [tool.__name__ for tool in trainer.tools] == ["calculate"] and trainer.state.global_step == 1


@pytest.fixture(scope="module")
def trained(mcp_kit, tmp_path_factory):
    """Two real GRPO steps of the recipe on the kit (over stdio, the default), in process, through its entry point."""
    out = tmp_path_factory.mktemp("mcp_run")
    trainer = mcp_grpo.main(["--config", str(mcp_kit / "mcp_grpo.yaml"), "--output_dir", str(out),
                             "--max_steps", "2", "--save_steps", "2", "--eval_strategy", "no", "--log_completions"])
    return trainer, out


@pytest.mark.slow  # needs the `offline.py --mcp` kit, a warm start of its own (37 s): with the learning checks
def test_grpo_steps_call_the_servers_tool_its_answers_reach_the_rewards_and_are_masked(trained, mcp_kit):
    import pandas as pd

    trainer, out = trained
    steps = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
    assert len(steps) == 2 and all(log["tools/call_frequency"] > 0 for log in steps)
    assert all("mcp/truncated" in log for log in steps)
    frame = pd.concat(pd.read_parquet(f) for f in sorted((out / "completions").glob("*.parquet")))
    answered = [(row, m) for _, row in frame.iterrows() for m in row["completion"] if m["role"] == "tool"]
    assert answered, "no tool result reached the logged completions"
    fresh = toolbox()
    for row, message in answered[:8]:  # each result is what the server answers to the call the model made
        call = next(m for m in row["completion"] if m["role"] == "assistant" and m.get("tool_calls") is not None
                    and len(m["tool_calls"]))["tool_calls"][0]["function"]
        arguments = json.loads(call["arguments"]) if isinstance(call["arguments"], str) else call["arguments"]
        try:
            expected = fresh[call["name"]](**arguments)
        except ToolCallFailed as err:
            expected = str({"error": str(err)})
        assert message["content"] == expected
    # the server's answers are masked out of the loss: the model is trained on its calls, never on the results
    example = mcp_grpo.build_dataset("train", str(mcp_kit / "gsm8k_toy"))[0]
    batch = trainer._generate_and_score_completions([example] * trainer.args.num_generations)
    tokenizer, masked = trainer.processing_class, 0
    for ids, tool_mask, mask in zip(batch["completion_ids"], batch["tool_mask"], batch["completion_mask"], strict=True):
        ids, tool_mask = ids[mask.bool()], tool_mask[mask.bool()]
        if tool_mask.min() == 1:
            continue
        masked += 1
        assert "<tool_response>" in tokenizer.decode(ids[tool_mask == 0])
        assert "<tool_response>" not in tokenizer.decode(ids[tool_mask == 1])
    assert masked, "no completion in the batch called the tool"


@pytest.mark.slow  # needs the `offline.py --mcp` kit, a warm start of its own (37 s): with the learning checks
def test_mcp_grpo_trains_against_a_server_over_http(mcp_kit, http_server, tmp_path):
    trainer = mcp_grpo.main(["--config", str(mcp_kit / "mcp_grpo.yaml"), "--output_dir", str(tmp_path / "run"),
                             "--mcp_url", http_server[0], "--mcp_session", "rollout", "--max_steps", "1",
                             "--eval_strategy", "no", "--save_strategy", "no"])
    step = next(log for log in trainer.state.log_history if "tools/call_frequency" in log)
    assert step["tools/call_frequency"] > 0 and step["tools/failure_frequency"] < 1


@pytest.fixture(scope="module")
def mcp_model_server(mcp_kit):
    yield from serve(str(mcp_kit / "tiny-qwen2-mcp"))


@pytest.mark.slow  # needs the `offline.py --mcp` kit, a warm start of its own (37 s): with the learning checks
def test_evaluate_plays_an_api_model_against_the_servers_tools(mcp_model_server, mcp_kit, tmp_path, capsys):
    import evaluate

    base_url, model = mcp_model_server
    out = tmp_path / "rollouts.jsonl"
    evaluate.main(["mcp_grpo", "--base_url", base_url, "--model", model, "-n", "4", "--dataset_path",
                   str(mcp_kit / "gsm8k_toy"), "--mcp_tools", "calculate", "--max_tokens", "48", "--temperature",
                   "0", "--max_turns", "1", "--out", str(out)])
    saved = [json.loads(line) for line in out.read_text().splitlines()]
    assert saved[0]["tools"][0]["function"]["name"] == "calculate"
    results = [(call, result) for row in saved for call, result in zip(row["completion"], row["completion"][1:],
                                                                        strict=False) if result["role"] == "tool"]
    assert results, "the model made no tool call through the OpenAI tools API"
    fresh = toolbox()
    for call, result in results:
        arguments = call["tool_calls"][0]["function"]["arguments"]
        assert result["content"] == fresh["calculate"](**arguments)
    assert "tool calls" in capsys.readouterr().out


def test_the_example_servers_calculator_evaluates_arithmetic_and_nothing_else():
    tools = toolbox()
    assert tools["calculate"](expression="(7 - 2) * 3 / 5") == "3"
    for hostile in ("__import__('os').system('id')", "open('/etc/passwd').read()", "9 ** 9 ** 9", "[1] * 10"):
        with pytest.raises(ToolCallFailed):
            tools["calculate"](expression=hostile)


def test_a_server_gone_in_the_async_rollout_process_is_its_one_line_in_the_trainer():
    """TRL 1.16's async trainer sends a rollout process's exception to the trainer as (type name, text, traceback) and
    raises RuntimeError from RuntimeError(f"{type}: {text}\\n{traceback}") (AsyncRolloutWorker.check_health)."""
    from grpo_recipes.training import stopped_elsewhere

    line = "the MCP server `x` stopped answering during a call to crash (Connection closed)"
    def from_child(type_name: str) -> RuntimeError:
        try:
            raise RuntimeError("Rollout worker child has failed; see chained exception.") from RuntimeError(
                f"{type_name}: {line}\nTraceback (most recent call last):\n  ...")
        except RuntimeError as err:
            return err

    assert stopped_elsewhere(from_child("StopRun")) == line
    assert stopped_elsewhere(from_child("ValueError")) is None  # a real bug keeps its traceback
    assert stopped_elsewhere(RuntimeError("no cause")) is None
