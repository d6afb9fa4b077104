"""search_agent_grpo.py: a real bm25s index, tools that never raise, index reuse, and GRPO steps that search."""

import json

import pandas as pd
import pytest
from datasets import Dataset

import rewards
import search_agent_grpo as agent


@pytest.fixture(scope="module")
def corpus(kit):
    return agent.build_corpus(str(kit / "search_toy" / "corpus.jsonl"))


def corpus_file(folder, passages: list[dict]) -> str:
    """passages as a JSON Lines corpus in folder (--corpus_path)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"corpus-{len(passages)}.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in passages))
    return str(path)


@pytest.fixture(scope="module")
def index(kit, tmp_path_factory):
    return agent.SearchIndex(str(kit / "search_toy" / "corpus.jsonl"), str(tmp_path_factory.mktemp("index")), top_k=3,
                             snippet_chars=100)


def test_search_finds_the_passage_a_question_names(index, kit):
    question = json.loads((kit / "search_toy" / "questions" / "test.jsonl").read_text().splitlines()[0])
    person, city = question["supporting_titles"]
    first = index.search(person)
    assert first.startswith(f"[{person}]") and city in first
    assert f"[{city}]" in index.search(city) and question["answer"] in index.read(city)


@pytest.mark.parametrize("query", ["", "   ", "the of and", "x" * 10_000, "東京 ü ñ 🙂", "\x00\n\t", "[", "a" * 3])
def test_bad_queries_get_a_clean_tool_result(index, query):
    result = index.search(query)
    assert isinstance(result, str) and len(result) < 2000


@pytest.mark.parametrize("title", ["", "No Such Passage", "42", "x" * 10_000, "🙂", None, 7])
def test_unknown_passages_get_a_clean_tool_result(index, title):
    result = index.read(title)
    assert result.startswith("Error: no passage titled") and len(result) < 300


def test_read_caps_the_passage_and_says_so(corpus, tmp_path):
    long = [{"title": "Long", "text": "word " * 2000}, *corpus[:5]]
    result = agent.SearchIndex(corpus_file(tmp_path, long), str(tmp_path / "index"), passage_chars=300).read("[long]")
    assert result.startswith("[Long] word") and result.endswith("more characters]") and len(result) < 400


def test_the_index_is_reused_while_the_corpus_is_unchanged_and_rebuilt_when_it_changes(corpus, tmp_path):
    indexes = tmp_path / "index"
    first = agent.SearchIndex(corpus_file(tmp_path / "a", corpus), str(indexes))
    again = agent.SearchIndex(corpus_file(tmp_path / "b", corpus), str(indexes))
    new = corpus + [{"title": "New", "text": "A new passage about zebras."}]
    changed = agent.SearchIndex(corpus_file(tmp_path / "c", new), str(indexes))
    for each in (first, again, changed):
        each.start()
    assert first.rebuilt and not again.rebuilt and changed.rebuilt
    assert len(list(indexes.iterdir())) == 2  # one saved index per corpus, no half-built folder left
    assert again.search(corpus[0]["title"]) == first.search(corpus[0]["title"])
    assert "[New]" in changed.search("zebras") and again.search("zebras").startswith("Error: no results")


def test_hotpotqa_paragraphs_are_pooled_and_deduplicated_by_title(monkeypatch):
    rows = [{"question": "Q1?", "answer": "A1", "supporting_facts": {"title": ["T1", "T2", "T1"], "sent_id": [0, 0, 1]},
             "context": {"title": ["T1", "T2"], "sentences": [["One. ", "More."], ["Two."]]}},
            {"question": "Q2?", "answer": "A2", "supporting_facts": {"title": ["T3"], "sent_id": [0]},
             "context": {"title": ["T2", "T3"], "sentences": [["Two again."], ["Three."]]}}]
    monkeypatch.setattr(agent, "hotpotqa_split", lambda split: Dataset.from_list(rows))
    corpus = agent.build_corpus()
    assert sorted(p["title"] for p in corpus) == ["T1", "T2", "T3"]
    assert {p["title"]: p["text"] for p in corpus}["T1"] == "One. More."
    dataset = agent.build_dataset("train")
    assert dataset[0]["supporting_titles"] == ["T1", "T2"] and dataset[0]["answer"] == "A1"


@pytest.fixture(scope="module")
def trained(kit, tmp_path_factory):
    out = tmp_path_factory.mktemp("search_run")
    trainer = agent.main(["--config", str(kit / "search_agent_grpo.yaml"), "--output_dir", str(out),
                          "--max_steps", "2", "--save_steps", "2", "--eval_strategy", "no", "--log_completions"])
    return trainer, out


def run_index(trainer) -> agent.SearchIndex:
    """The index the run's tools searched: every environment TRL made shares setup()'s."""
    return trainer.environment_factories[None]().index


def test_grpo_steps_search_the_index_and_reuse_the_saved_one(trained):
    trainer, _ = trained
    assert not run_index(trainer).rebuilt, "offline.py built this index; the run must load it, not rebuild it"
    logs = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
    assert len(logs) == 2 and all(log["tools/call_frequency"] > 0 for log in logs)
    assert all(0.0 <= log["new_evidence/turn_1"] <= 1.0 for log in logs)  # turn-level credit, logged per turn


def test_the_tool_results_the_model_saw_came_from_the_index(trained):
    trainer, out = trained
    index = run_index(trainer)
    frame = pd.concat(pd.read_parquet(f) for f in sorted((out / "completions").glob("*.parquet")))
    checked = 0
    for completion in frame["completion"]:
        messages = list(completion)
        for call_message, result in zip(messages, messages[1:], strict=False):
            if result["role"] != "tool" or call_message.get("tool_calls") is None:
                continue
            call = call_message["tool_calls"][0]["function"]
            arguments = call["arguments"] if isinstance(call["arguments"], dict) else json.loads(call["arguments"])
            tool = {"search": index.search, "read": index.read}[call["name"]]
            assert result["content"] == tool(**{k: v for k, v in arguments.items() if v is not None})
            checked += 1
    assert checked > 0


# ------------------------------------------------------------------------------------------------------ the rubric
def total(completion, gold="Paris", titles=("Eiffel Tower",)) -> float:
    return sum(w * (f(completions=[completion], answer=[gold], supporting_titles=[list(titles)])[0] or 0.0)
               for f, w in zip(agent.REWARD_FUNCS, agent.REWARD_WEIGHTS, strict=True))


def searched(query, result):
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": query}}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "search", "content": result}]


PASSAGE = "[Eiffel Tower] The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France."


def test_answering_without_searching_or_pasting_a_passage_does_not_pay():
    genuine = searched("Eiffel Tower", PASSAGE) + [{"role": "assistant", "content": "<answer>Paris</answer>"}]
    from_memory = [{"role": "assistant", "content": "<answer>Paris</answer>"}]
    failed_search = searched("zzz", "Error: no results for 'zzz'. Try other keywords.") + from_memory
    pasted = searched("Eiffel Tower", PASSAGE) + [{"role": "assistant", "content": f"<answer>{PASSAGE}</answer>"}]
    assert total(genuine) == pytest.approx(2.2)
    for gamed in (from_memory, failed_search, pasted):
        assert total(gamed) < 0.6 * total(genuine)


def test_retrieval_recall_counts_the_gold_titles_the_tools_returned():
    completion = searched("Eiffel Tower", PASSAGE) + [{"role": "assistant", "content": "<answer>Paris</answer>"}]
    scores = rewards.retrieval_recall_reward([completion] * 3, supporting_titles=[["Eiffel Tower", "Paris"],
                                                                                  ["Eiffel Tower"], []])
    assert scores == [0.5, 1.0, None]


def read(title, result):
    call = {"type": "function", "function": {"name": "read", "arguments": {"title": title}}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "read", "content": result}]


PARIS = "[Paris] Paris is the capital of France."
ANSWER = [{"role": "assistant", "content": "<answer>Paris</answer>"}]


@pytest.mark.parametrize("completion, titles, expected", [
    (searched("Eiffel Tower", PASSAGE) + searched("Paris", PARIS) + ANSWER, ["Eiffel Tower", "Paris"], 1.0),
    (searched("Eiffel Tower", PASSAGE) + ANSWER, ["Eiffel Tower", "Paris"], 0.5),             # one hop short
    (searched("Eiffel Tower", PASSAGE) * 3 + ANSWER, ["Eiffel Tower", "Paris"], 0.5),         # repeats earn nothing
    (searched("Eiffel Tower", PASSAGE) + read("Eiffel Tower", PASSAGE) + ANSWER, ["Eiffel Tower"], 1.0),
    (searched("zzz", "Error: no results for 'zzz'. Try other keywords.") + ANSWER, ["Eiffel Tower"], 0.0),
    (searched("Eiffel Tower", "[Eiffel Tower Replica] A copy in Las Vegas.") + ANSWER, ["Eiffel Tower"], 0.0),
    (searched("Eiffel Tower", PASSAGE) + ANSWER, [], None),                                     # no gold: no score
])
def test_new_evidence_credits_each_search_that_finds_a_supporting_passage_first(completion, titles, expected):
    assert rewards.new_evidence_reward([completion], supporting_titles=[titles]) == [expected]


def test_new_evidence_is_logged_per_turn():
    metrics = {}
    episodes = [searched("Eiffel Tower", PASSAGE) + searched("Paris", PARIS) + ANSWER, searched("x", PASSAGE) + ANSWER]
    rewards.new_evidence_reward(episodes, supporting_titles=[["Eiffel Tower", "Paris"]] * 2,
                                log_metric=metrics.__setitem__)
    assert metrics == {"new_evidence/turn_1": 0.5, "new_evidence/turn_2": 0.5}


@pytest.mark.parametrize("credit_weight", [None, 0.5, 0.99])
def test_turn_level_credit_never_lifts_a_wrong_answer_over_a_right_one(credit_weight):
    """For the recipe's weight of new_evidence_reward and any weight below 1 (agent_demo --turn_credit refuses more)."""
    weights = [credit_weight if credit_weight is not None and f is rewards.new_evidence_reward else w
               for f, w in zip(agent.REWARD_FUNCS, agent.REWARD_WEIGHTS, strict=True)]
    titles = ["Eiffel Tower", "Paris"]

    def total(completion, gold="Paris France"):
        return sum(w * (f(completions=[completion], answer=[gold], supporting_titles=[titles])[0] or 0.0)
                   for f, w in zip(agent.REWARD_FUNCS, weights, strict=True))

    both = searched("Eiffel Tower", PASSAGE) + searched("Paris", PARIS)
    right = [both + [{"role": "assistant", "content": "<answer>Paris France</answer>"}],
             searched("capital", "[Elsewhere] Nothing here.") + [{"role": "assistant",
                                                                   "content": "<answer>Paris, France</answer>"}]]
    wrong = [both + [{"role": "assistant", "content": "<answer>France Paris</answer>"}],     # F1 1.0, not exact
             both + [{"role": "assistant", "content": "<answer>Paris</answer>"}],
             both * 5 + [{"role": "assistant", "content": f"<answer>{PASSAGE}</answer>"}],
             both + [{"role": "assistant", "content": "Paris France"}]]
    assert max(map(total, wrong)) < min(map(total, right))


def test_the_readme_shows_the_search_rubric():
    from conftest import ROOT

    assert rewards.rubric_table(agent.REWARD_FUNCS, agent.REWARD_WEIGHTS) in (ROOT / "README.md").read_text()


def test_under_accelerate_launch_one_process_builds_the_index_and_the_other_loads_it(kit, tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    index_dir, out, corpus = tmp_path / "index", tmp_path / "ddp", tmp_path / "corpus.jsonl"
    rows = (kit / "search_toy" / "corpus.jsonl").read_text().splitlines()
    filler = [json.dumps({"title": f"Filler {i}", "text": f"Filler passage {i} about topic {i % 97}."})
              for i in range(40_000)]  # a build that takes a while: time for the other rank to start its own
    corpus.write_text("\n".join(rows + filler) + "\n")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(ROOT / "search_agent_grpo.py"), "--config", str(kit / "search_agent_grpo.yaml"), "--output_dir",
           str(out), "--index_dir", str(index_dir), "--corpus_path", str(corpus), "--max_steps", "1", "--save_steps",
           "1",
           "--per_device_train_batch_size", "2", "--eval_strategy", "no"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=kit, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("building the bm25s index") == 1  # every rank would say so: only the main one built it
    assert proc.stderr.count("reusing the bm25s index") == 1  # and the other one loaded it
    assert [p.name for p in index_dir.iterdir()] == [next(index_dir.iterdir()).name]  # one index, no half-built one
    assert (out / "checkpoint-1").is_dir()
