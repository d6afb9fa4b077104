"""search_agent_grpo.py --reader_base_url: a sub-agent reader. A frozen model behind an OpenAI-compatible endpoint (a
real `transformers serve` of a tiny model, conftest.reader_server) summarises what `read` returns for the policy's
question; a reader that hangs, fails or is missing never stops an episode: `read` returns the passage itself."""

import socket
import threading
import time

import pytest

import search_agent_grpo as agent
from conftest import free_port


@pytest.fixture
def index(kit):
    agent.load_index(str(kit / "search_toy" / "corpus.jsonl"), str(kit / "bm25_index"), 2, 90)
    yield agent.INDEX
    agent.READER = None


def a_title() -> str:
    return agent.INDEX.corpus[0]["title"]


def test_read_returns_the_readers_short_summary_instead_of_the_passage(reader_server, index):
    base_url, model = reader_server
    agent.READER = agent.Reader(base_url, model, timeout=60, max_tokens=8, prompt=agent.READER_PROMPT)
    result = agent.read_for(a_title(), "Where was this person born?")
    assert result.startswith(f"[{a_title()}] (summary) ") and result != index.read(a_title())
    from transformers import AutoTokenizer

    summary = result.split("(summary) ", 1)[1]
    assert len(AutoTokenizer.from_pretrained(model)(summary)["input_ids"]) <= 8 + 1  # + a re-tokenisation seam
    assert (agent.READER.calls, agent.READER.fallbacks) == (1, 0)
    assert agent.read_for("No Such Passage", "?").startswith("Error: no passage titled")  # no reader call
    assert agent.READER.calls == 1


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
        agent.READER = agent.Reader(base_url, "m", timeout=1.0, max_tokens=32, prompt=agent.READER_PROMPT)
        start = time.monotonic()
        assert agent.read_for(a_title(), "Where?") == index.read(a_title())
        assert time.monotonic() - start < 4
        assert (agent.READER.calls, agent.READER.fallbacks) == (1, 1)


@pytest.mark.parametrize("flags, message", [
    (["--reader_base_url", "http://127.0.0.1:1/v1"], "--reader_base_url needs --reader_model"),
    (["--reader_base_url", "http://127.0.0.1:1/v1", "--reader_model", "m", "--reader_timeout", "0"],
     "--reader_timeout 0: must be positive"),
    (["--reader_base_url", "http://127.0.0.1:1/v1", "--reader_model", "m", "--reader_timeout", "2"],
     "no OpenAI-compatible server answers .*transformers serve m"),
])
def test_bad_reader_options_are_one_line(kit, tmp_path, flags, message):
    with pytest.raises(SystemExit, match=message):
        agent.main(["--config", str(kit / "search_agent_grpo.yaml"), "--output_dir", str(tmp_path), *flags])


def test_grpo_runs_with_the_reader_and_the_policy_sees_its_read_tool(reader_server, kit, tmp_path):
    base_url, model = reader_server
    try:
        trainer = agent.main(["--config", str(kit / "search_agent_grpo.yaml"), "--output_dir", str(tmp_path),
                              "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
                              "--reader_base_url", base_url, "--reader_model", model])
    finally:
        agent.READER = None
    assert trainer.state.global_step == 1
    assert trainer.tools[1] is agent.read_for  # the schema the policy is shown asks for the question too
