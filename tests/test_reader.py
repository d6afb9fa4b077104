"""search_agent_grpo.py --reader_base_url: a sub-agent reader. A frozen model behind an OpenAI-compatible endpoint (a
real `transformers serve` of a tiny model, conftest.reader_server) summarises what `read` returns for the policy's
question; a reader that hangs, fails or is missing never stops an episode: `read` returns the passage itself."""

import inspect
import socket
import threading
import time

import pytest

import search_agent_grpo as agent
from conftest import free_port
from grpo_recipes.refusal import Refusal


@pytest.fixture
def index(kit):
    index = agent.SearchIndex(str(kit / "search_toy" / "corpus.jsonl"), str(kit / "bm25_index"), 2, 90)
    index.start()
    return index


def a_title(index) -> str:
    return index.corpus[0]["title"]


def tools_with(index, base_url: str, model: str, timeout: float, max_tokens: int) -> agent.SearchToolsWithReader:
    """One rollout's tools with a reader at base_url, as setup() builds them for --reader_base_url."""
    return agent.SearchToolsWithReader(index, agent.Reader(base_url, model, timeout, max_tokens))


def test_read_returns_the_readers_short_summary_instead_of_the_passage(reader_server, index):
    base_url, model = reader_server
    tools = tools_with(index, base_url, model, timeout=60, max_tokens=8)
    result = tools.read(a_title(index), "Where was this person born?")
    assert result.startswith(f"[{a_title(index)}] (summary) ") and result != index.read(a_title(index))
    from transformers import AutoTokenizer

    summary = result.split("(summary) ", 1)[1]
    assert len(AutoTokenizer.from_pretrained(model)(summary)["input_ids"]) <= 8 + 1  # + a re-tokenisation seam
    assert (tools.reader.calls, tools.reader.fallbacks) == (1, 0)
    assert tools.read("No Such Passage", "?").startswith("Error: no passage titled")  # no reader call
    assert tools.reader.calls == 1


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers: a reader that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


def test_a_reader_that_hangs_or_is_gone_gives_the_passage_within_its_timeout(index, silent_server):
    for base_url in (silent_server, f"http://127.0.0.1:{free_port()}/v1"):  # hangs; nothing listens
        tools = tools_with(index, base_url, "m", timeout=1.0, max_tokens=32)
        start = time.monotonic()
        assert tools.read(a_title(index), "Where?") == index.read(a_title(index))
        assert time.monotonic() - start < 4
        assert (tools.reader.calls, tools.reader.fallbacks) == (1, 1)


@pytest.mark.parametrize("flags, message", [
    (["--reader_base_url", "http://127.0.0.1:1/v1"], "--reader_base_url needs --reader_model"),
    (["--reader_base_url", "http://127.0.0.1:1/v1", "--reader_model", "m", "--reader_timeout", "0"],
     "--reader_timeout 0: must be positive"),
    (["--reader_base_url", "http://127.0.0.1:1/v1", "--reader_model", "m", "--reader_timeout", "2"],
     "no OpenAI-compatible server answers .*transformers serve m"),
])
def test_bad_reader_options_are_one_line(kit, tmp_path, flags, message):
    with pytest.raises(Refusal, match=message):
        agent.main(["--config", str(kit / "search_agent_grpo.yaml"), "--output_dir", str(tmp_path), *flags])


def test_grpo_runs_with_the_reader_and_the_policy_sees_its_read_tool(reader_server, kit, tmp_path):
    base_url, model = reader_server
    trainer = agent.main(["--config", str(kit / "search_agent_grpo.yaml"), "--output_dir", str(tmp_path),
                          "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
                          "--reader_base_url", base_url, "--reader_model", model])
    assert trainer.state.global_step == 1
    read = next(tool for tool in trainer.tools if tool.__name__ == "read")
    assert read.__func__ is agent.SearchToolsWithReader.read  # the schema the policy is shown asks for the question
    assert list(inspect.signature(read).parameters) == ["title", "question"]
