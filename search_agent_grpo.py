"""A multi-turn search agent trained with GRPO over a local BM25 index (Search-R1 style, one or two GPUs).

One GPU (HotpotQA distractor):   python search_agent_grpo.py
Your own corpus and questions:   python search_agent_grpo.py --corpus_path docs.jsonl --dataset_path questions/
Offline on CPU (tiny model warm-started to search, generated corpus):
    python offline.py --search && python search_agent_grpo.py --config offline/search_agent_grpo.yaml
Jupyter or Colab (free T4):      notebooks/search_agent_grpo.ipynb, generated from this file

The model searches the corpus (`search`), reads whole passages (`read`) over several turns, then answers. Only the
answer is rewarded, and only when the model searched; the retrieved text is never trained on (TRL masks tool output
tokens out of the loss). The bm25s index is built once, then reloaded from --index_dir while the corpus is unchanged.
"""

# %%
from dataclasses import dataclass

import bm25s
from datasets import Dataset, concatenate_datasets
from trl import GRPOTrainer

import plumbing
import rewards
from plumbing import arg, logger

# %% [markdown]
# ## Config
# GRPO over whole agent episodes: each completion is a conversation of searches, reads and an answer, scored at the
# end. The defaults are sized for one GPU; every field is a flag, a `--config` YAML key, or an entry of `NOTEBOOK_ARGS`.

# %%
MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"
HOTPOTQA = ("hotpotqa/hotpot_qa", "distractor")
# A notebook on Colab's free T4 puts these first: 0.5B with LoRA, fewer steps, room for three tool rounds.
COLAB_ARGS = plumbing.COLAB_T4_ARGS + ["--max_completion_length", "1024", "--max_tool_calling_iterations", "3"]

RECIPE_DEFAULTS = {
    "model_name_or_path": MODEL_NAME, "output_dir": "runs/search_agent_grpo",
    "learning_rate": 1e-6, "lr_scheduler_type": "cosine", "warmup_steps": 0.05, "max_grad_norm": 0.1,
    "gradient_checkpointing": True,  # off: --gradient_checkpointing false (or --activation_checkpointing false)
    "num_generations": 8,
    "scale_rewards": "none",  # the group mean removed, no std division: as gsm8k_grpo.py, measured there (README)
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,  # 4 questions × 8 rollouts per optimizer step
    "max_completion_length": 2048,  # every turn after the prompt: searches, results, reads, the answer
    "max_tool_calling_iterations": 6,  # multi-hop: a few searches and reads
    "num_train_epochs": 1, "logging_steps": 1, "save_steps": 100, "save_total_limit": 3,
    "eval_strategy": "steps", "eval_steps": 100, "per_device_eval_batch_size": 16, "num_generations_eval": 4,
    "vllm_gpu_memory_utilization": 0.3,
    "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["all-linear"],  # LoRA: one 24 GB GPU
}


@dataclass
class ScriptArguments(plumbing.ReaderArguments):  # and the reader's flags: --reader_base_url, ...
    corpus_path: str | None = arg(None, "JSONL of {'title', 'text'} passages; default: HotpotQA's paragraphs.")
    dataset_path: str | None = arg(None, "Questions (question, answer, optional supporting_titles): a JSON/JSONL/"
                                         "parquet file or a folder of split files; default: HotpotQA distractor.")
    index_dir: str = arg("runs/bm25_index", "Where the bm25s index is saved, one folder per corpus hash.")
    num_eval_examples: int = arg(200, "Held-out questions scored with the same rewards at each evaluation.")
    search_top_k: int = arg(3, "Passages a search returns.")
    snippet_chars: int = arg(200, "Characters of each passage a search shows.")
    passage_chars: int = arg(1500, "Characters of a passage `read` returns at most.")


# %% [markdown]
# ## Data
# The corpus is HotpotQA's own paragraphs (no Wikipedia dump), de-duplicated by title; the questions are its
# multi-hop questions with their answers and the titles of the passages that support them.

# %%
def hotpotqa_split(split: str) -> Dataset:
    """HotpotQA's test split has no answers: its validation split is the held-out one."""
    return plumbing.load_split("validation" if split == "test" else split, None, *HOTPOTQA)


def build_corpus(corpus_path: str | None = None) -> list[dict]:
    """Passages as {'title', 'text'}: a JSONL file, or HotpotQA's paragraphs de-duplicated by title."""
    if corpus_path is not None:  # plumbing reads it: a missing file or a malformed line is one line, not a traceback
        return list(plumbing.load_split("train", corpus_path))
    passages = {}
    for row in concatenate_datasets([hotpotqa_split("train"), hotpotqa_split("test")])["context"]:
        for title, sentences in zip(row["title"], row["sentences"], strict=True):
            passages.setdefault(title, "".join(sentences))
    return [{"title": title, "text": text} for title, text in passages.items()]


def build_dataset(split: str = "train", dataset_path: str | None = None) -> Dataset:
    """Questions as conversational `prompt`s, gold `answer`s and the `supporting_titles` a good search finds."""
    raw = plumbing.load_split(split, dataset_path) if dataset_path else hotpotqa_split(split)
    if not {"question", "answer"} <= set(raw.column_names):
        raise ValueError(f"{dataset_path} ({split}) needs `question` and `answer` columns; it has {raw.column_names}.")

    def row_to_example(row):
        titles = row["supporting_facts"]["title"] if "supporting_facts" in row else row.get("supporting_titles") or []
        return {"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
                "answer": row["answer"], "supporting_titles": sorted(set(titles))}

    return raw.map(row_to_example, remove_columns=raw.column_names)


# %% [markdown]
# ## System prompt
# The prompt tells the model to search before answering and to put a short answer inside `<answer>` tags.

# %%
SYSTEM_PROMPT = """Answer the question using the search tools: search for the people, places and things it mentions, \
read the passages that look relevant, and search again for what they lead to. Questions often need two or more \
searches. When you know the answer, reply with only the answer inside <answer></answer> tags, for example \
<answer>Paris</answer>."""


# %% [markdown]
# ## Tools
# `search` returns the top BM25 passages (title and snippet); `read` returns a whole passage by title. Both are plain
# functions over a bm25s index that is built once and reloaded; a bad query or title returns an error string.

# %%
class SearchIndex:
    """A bm25s index over the corpus, saved under index_dir/<corpus hash> and reloaded while the corpus is unchanged."""

    def __init__(self, corpus: list[dict], index_dir: str, top_k=3, snippet_chars=200, passage_chars=1500):
        self.top_k, self.snippet_chars, self.passage_chars = top_k, snippet_chars, passage_chars
        self.retriever, self.corpus, self.rebuilt = plumbing.bm25_index(corpus, index_dir)
        self.by_title = {str(p["title"]).casefold(): p for p in self.corpus}

    def search(self, query: str) -> str:
        tokens = bm25s.tokenize([str(query)[:1000]], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return "Error: the query has no searchable words. Search for names or keywords."
        docs, scores = self.retriever.retrieve(tokens, corpus=self.corpus, k=min(self.top_k, len(self.corpus)),
                                               show_progress=False)
        hits = [doc for doc, score in zip(docs[0], scores[0], strict=True) if score > 0]
        if not hits:
            return f"Error: no results for {str(query)[:100]!r}. Try other keywords."
        return "\n".join(f"[{p['title']}] {p['text'][:self.snippet_chars]}" for p in hits)

    def read(self, title: str) -> str:
        passage = self.by_title.get(str(title).strip().strip("[]").casefold())
        if passage is None:
            return f"Error: no passage titled {str(title)[:100]!r}. Search, then read a title it returns."
        text = passage["text"]
        cut = f" [... {len(text) - self.passage_chars} more characters]" if len(text) > self.passage_chars else ""
        return f"[{passage['title']}] {text[:self.passage_chars]}{cut}"


INDEX: SearchIndex | None = None  # set by load_index() before the tools run


def load_index(corpus_path=None, index_dir="runs/bm25_index", top_k=3, snippet_chars=200, passage_chars=1500):
    """Point the tools at the corpus (building or reloading its index); evaluate.py calls this too."""
    global INDEX
    INDEX = SearchIndex(build_corpus(corpus_path), index_dir, top_k, snippet_chars, passage_chars)


def search(query: str) -> str:
    """Search the document collection and return the best matching passages as [title] snippet lines.

    Args:
        query: Keywords to look for, such as a name, a place or a title.
    """
    return INDEX.search(query)


def read(title: str) -> str:
    """Read the whole passage with this title.

    Args:
        title: A title exactly as a search result showed it, without the brackets.
    """
    return INDEX.read(title)


TOOLS = [search, read]


# %% [markdown]
# A sub-agent reader (`--reader_base_url`): a frozen model returns only what a passage says about the policy's question,
# so long passages stay out of its context; on a timeout or an error, `read` returns the passage (the log counts them).

# %%
READER_PROMPT = ("You read passages for a search agent. Reply with at most two sentences from the passage that "
                 "bear on the question, copying names, dates and numbers exactly, or with 'Nothing relevant.' if "
                 "none do.")

READER: plumbing.Reader | None = None  # set by main() with --reader_base_url


def read_for(title: str, question: str) -> str:
    """Read the passage with this title: a reader returns what it says about your question.

    Args:
        title: A title exactly as a search result showed it, without the brackets.
        question: What you want to find out from the passage.
    """
    passage = INDEX.read(title)
    return passage if passage.startswith("Error:") else READER.summarise(passage, str(question)[:500])


read_for.__name__ = "read"  # the tool keeps its name; only what it returns (and asks for) changes
READER_TOOLS = [search, read_for]


# %% [markdown]
# ## Rewards
# Exact match and token F1 against the gold answer pay only when the model searched, so answering from memory earns
# nothing; a small format reward pays for the `<answer>` tags. Turn-level credit (each search that finds a supporting
# passage first) is logged per turn, weight 0: paid, it did not speed learning (benchmarks/turn_credit.py, README).

# %%
REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({
    rewards.RequiresToolCall(rewards.exact_match_reward, "search"): 1.0,
    rewards.RequiresToolCall(rewards.token_f1_reward, "search"): 1.0,
    rewards.answer_format_reward: 0.2,
    rewards.new_evidence_reward: 0.0,
})


# %% [markdown]
# ## Trainer
# The shared pre-flight checks (tool-call template included) and trainer, with the tools; TRL masks their output out.

# %%
def main(argv: list[str] | None = None) -> GRPOTrainer:
    script_args, training_args, model_args = plumbing.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv,
                                                                 reward_weights=REWARD_WEIGHTS)
    global READER
    READER = plumbing.start_reader(script_args, READER_PROMPT)  # None without --reader_base_url
    tools = READER_TOOLS if READER else TOOLS
    tokenizer = plumbing.prepare(training_args, model_args, REWARD_FUNCS, tools=tools)
    load_index(script_args.corpus_path, script_args.index_dir, script_args.search_top_k, script_args.snippet_chars,
               script_args.passage_chars)
    train_dataset, eval_dataset = plumbing.load_splits(build_dataset, script_args, training_args)
    return plumbing.train(model_args, training_args, tokenizer, train_dataset, eval_dataset, REWARD_FUNCS, tools=tools)


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags.
# In the curves, exact match and F1 should rise together; F1 rising alone means longer, vaguer answers.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/search_agent_grpo.yaml"]

# %% tags=["active-ipynb"]
# trainer = main(plumbing.notebook_argv(NOTEBOOK_ARGS, COLAB_ARGS))
# plumbing.show_training(trainer.args.output_dir, trainer)

# %% tags=["active-py"]
if __name__ == "__main__":
    main()
