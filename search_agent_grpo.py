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

# %% [markdown]
# ## What to expect
# On Colab's free T4 the config cell's `if ON_COLAB` values apply: Qwen2.5-0.5B-Instruct with LoRA, 100 steps, up to 3
# rounds of searches and reads (not yet timed on a T4). It downloads HotpotQA and builds a BM25 index first. In the
# curves, exact match and F1 should rise together; F1 rising alone means longer, vaguer answers.

# %%
import functools
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import bm25s
from datasets import Dataset, concatenate_datasets
from openai import OpenAI

import rewards
from grpo_recipes import data, options
from grpo_recipes.contract import Setup
from grpo_recipes.console import logger
from grpo_recipes.options import arg
from grpo_recipes.refusal import Refusal, run_script

# %% [markdown]
# ## Config
# GRPO over whole agent episodes: each completion is a conversation of searches, reads and an answer, scored at the
# end. The defaults are sized for one GPU; every field is a flag, a `--config` YAML key, or an entry of `NOTEBOOK_ARGS`.

# %%
# In a notebook on Colab's free T4 (16 GB, no bf16) the `if ON_COLAB` values apply: a 0.5B model, 100 steps, 3 rounds.
ON_COLAB = options.on_colab()
MODEL_NAME = "Qwen/Qwen2.5-0.5B-Instruct" if ON_COLAB else "Qwen/Qwen2.5-1.5B-Instruct"
HOTPOTQA = ("hotpotqa/hotpot_qa", "distractor")  # the Hub dataset and its config: questions and their paragraphs

RECIPE_DEFAULTS = {
    "model_name_or_path": MODEL_NAME, "output_dir": "runs/search_agent_grpo",
    "learning_rate": 1e-6,  # a full fine-tune's rate (--use_peft false)
    "lora_learning_rate": 2e-5 if ON_COLAB else 1e-5,  # LoRA needs ~10x (Schulman et al., "LoRA Without Regret")
    "lr_scheduler_type": "cosine", "warmup_steps": 0.05,
    "max_grad_norm": 1.0,  # TRL's, not the gist's 0.1: 0.1 lost on all 3 of cpu_demo's seeds (docs/experiments.md)
    "gradient_checkpointing": True, "num_generations": 8,
    "scale_rewards": "none",  # the group mean removed, no std division: as gsm8k_grpo.py, measured there
    "per_device_train_batch_size": 16 if ON_COLAB else 8,
    "gradient_accumulation_steps": 1 if ON_COLAB else 4,  # 4 questions × 8 rollouts per optimizer step
    "max_completion_length": 1024 if ON_COLAB else 2048,  # every turn after the prompt: searches, results, reads
    "max_tool_calling_iterations": 3 if ON_COLAB else 6,  # multi-hop: a few searches and reads
    "max_steps": 100 if ON_COLAB else -1, "num_train_epochs": 1,  # -1: one epoch
    "logging_steps": 1, "num_completions_to_print": 2,  # --log_completions: 2 printed per logged step
    "save_steps": 50 if ON_COLAB else 100, "save_total_limit": 3,
    "eval_strategy": "steps", "eval_steps": 50 if ON_COLAB else 100,
    # 200 questions × 4 generations: 25 calls, not 50; 64 sequences of 2,304 tokens would make evaluation's log-prob
    # forward the run's peak (~10 GiB on a 1.5B model, memory.estimate_memory)
    "per_device_eval_batch_size": 16 if ON_COLAB else 32,
    "num_generations_eval": 4,
    "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["all-linear"],  # LoRA: one 24 GB GPU
    "lora_dropout": 0.0,  # TRL's 0.05: trained log-probs differ from what vLLM sampled (read as off-policy)
}


@dataclass
class ScriptArguments:
    corpus_path: str | None = arg(None, "JSONL of {'title', 'text'} passages; default: HotpotQA's paragraphs.")
    dataset_path: str | None = arg(None, "Questions (question, answer, optional supporting_titles): a JSON/JSONL/"
                                         "parquet file or a folder of split files; default: HotpotQA distractor.")
    index_dir: str = arg("runs/bm25_index", "Where the bm25s index is saved, one folder per corpus hash.")
    num_eval_examples: int = arg(64 if ON_COLAB else 200, "Held-out questions scored by the rubric at each evaluation.")
    search_top_k: int = arg(3, "Passages a search returns.")
    snippet_chars: int = arg(200, "Characters of each passage a search shows.")
    passage_chars: int = arg(1500, "Characters of a passage `read` returns at most.")
    reader_base_url: str | None = arg(None, "A sub-agent reader: `read` also takes the policy's question and returns "
                                      "a frozen model's short summary of the passage for it, from this OpenAI-"
                                      "compatible endpoint (key: READER_API_KEY). Default: the passage itself.")
    reader_model: str | None = arg(None, "The reader's model name at --reader_base_url.")
    reader_timeout: float = arg(20.0, "Seconds the reader may take; past them, or on any error, `read` returns the "
                                      "passage itself (counted in the log).")
    reader_max_tokens: int = arg(96, "The longest summary the reader may write, in tokens.")


# %% [markdown]
# ## System prompt
# The prompt tells the model to search before answering and to put a short answer inside `<answer>` tags.

# %%
SYSTEM_PROMPT = """Answer the question using the search tools: search for the people, places and things it mentions, \
read the passages that look relevant, and search again for what they lead to. Questions often need two or more \
searches. When you know the answer, reply with only the answer inside <answer></answer> tags, for example \
<answer>Paris</answer>."""


# %% [markdown]
# ## Data
# HotpotQA's own paragraphs (no Wikipedia dump) as the corpus; its multi-hop questions, answers and supporting titles.

# %%
def hotpotqa_split(split: str) -> Dataset:  # its test split has no answers: validation is the held-out one
    return data.load_split("validation" if split == "test" else split, None, *HOTPOTQA)


def build_corpus(corpus_path: str | None = None) -> list[dict]:
    """Passages as {'title', 'text'}: a JSONL file, or HotpotQA's paragraphs de-duplicated by title."""
    if corpus_path is not None:  # data reads it: a missing file or a malformed line is one line, not a traceback
        return list(data.load_split("train", corpus_path))
    passages = {}
    for row in concatenate_datasets([hotpotqa_split("train"), hotpotqa_split("test")])["context"]:
        for title, sentences in zip(row["title"], row["sentences"], strict=True):
            passages.setdefault(title, "".join(sentences))
    return [{"title": title, "text": text} for title, text in passages.items()]


def build_dataset(split: str = "train", dataset_path: str | None = None) -> Dataset:
    """Questions as conversational `prompt`s, gold `answer`s and the `supporting_titles` a good search finds."""
    raw = data.load_split(split, dataset_path) if dataset_path else hotpotqa_split(split)
    if not {"question", "answer"} <= set(raw.column_names):
        raise ValueError(f"{dataset_path} ({split}) needs `question` and `answer` columns; it has {raw.column_names}.")

    def row_to_example(row):
        titles = row["supporting_facts"]["title"] if "supporting_facts" in row else row.get("supporting_titles") or []
        return {"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
                "answer": row["answer"], "supporting_titles": sorted(set(titles))}

    return raw.map(row_to_example, remove_columns=raw.column_names)


# %% [markdown]
# ## Tools
# `search` returns the top BM25 passages (title and snippet), `read` a whole passage by title: methods of the rollout's
# environment over a bm25s index built once and reloaded; a bad query or title returns an error string.

# %%
class SearchIndex:
    """A bm25s index over the corpus, saved under index_dir/<corpus hash> and reloaded while the corpus is unchanged.
    It loads on first use (or start()); under accelerate launch the main process builds it and the others load it.
    Pickled, it keeps where it was saved: a spawned process (TRL's async trainer's) loads it from there."""

    def __init__(self, corpus_path: str | None = None, index_dir: str = "runs/bm25_index", top_k: int = 3,
                 snippet_chars: int = 200, passage_chars: int = 1500):
        self.corpus_path, self.index_dir = corpus_path, index_dir
        self.top_k, self.snippet_chars, self.passage_chars = top_k, snippet_chars, passage_chars
        self.path: Path | None = None  # index_dir/<corpus hash>, once known
        self.retriever = self.corpus = self.by_title = None
        self.rebuilt = False

    def __getstate__(self) -> dict:
        return {**self.__dict__, "retriever": None, "corpus": None, "by_title": None}

    def start(self) -> None:
        """Load the index, building and saving it first when this corpus has none."""
        if self.retriever is not None:
            return
        if self.path is None or not (self.path / "params.index.json").exists():
            corpus = build_corpus(self.corpus_path)
            digest = hashlib.sha256(json.dumps(corpus, sort_keys=True).encode()).hexdigest()[:16]
            self.path = Path(self.index_dir) / digest
            from accelerate import PartialState  # here: it loads torch, which evaluate.py does not need

            with PartialState().main_process_first():
                self.rebuilt = not (self.path / "params.index.json").exists()
                if self.rebuilt:
                    self.build(corpus)
        if self.retriever is None:
            logger.warning(f"reusing the bm25s index in {self.path}")  # every rank says so
            self.retriever = bm25s.BM25.load(str(self.path), load_corpus=True, show_progress=False)
            self.corpus = list(self.retriever.corpus)
        self.by_title = {str(p["title"]).casefold(): p for p in self.corpus}

    def build(self, corpus: list[dict]) -> None:
        logger.warning(f"building the bm25s index of {len(corpus)} passages in {self.path}")  # every rank says so
        self.retriever, self.corpus = bm25s.BM25(), corpus
        self.retriever.index(bm25s.tokenize([f"{p['title']}\n{p['text']}" for p in corpus], stopwords="en"))
        building = self.path.with_name(f"{self.path.name}.building-{os.getpid()}")  # complete, then in place at once:
        self.retriever.save(str(building), corpus=corpus)  # another run never reads half an index
        try:
            building.rename(self.path)
        except OSError:  # another run put the same index there first
            shutil.rmtree(building, ignore_errors=True)

    def describe(self) -> str:
        return f"search: {len(self.corpus)} passages, top {self.top_k} shown, {self.snippet_chars} characters each"

    def search(self, query: str) -> str:
        self.start()
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
        self.start()
        passage = self.by_title.get(str(title).strip().strip("[]").casefold())
        if passage is None:
            return f"Error: no passage titled {str(title)[:100]!r}. Search, then read a title it returns."
        text = passage["text"]
        cut = f" [... {len(text) - self.passage_chars} more characters]" if len(text) > self.passage_chars else ""
        return f"[{passage['title']}] {text[:self.passage_chars]}{cut}"


class SearchTools:
    """The tools of one rollout (TRL's environment_factory makes one per rollout): search and read over the run's
    index."""

    def __init__(self, index: SearchIndex):
        self.index = index

    def reset(self, **row) -> None:  # the tools keep no state of their own between rollouts
        pass

    def search(self, query: str) -> str:
        """Search the document collection and return the best matching passages as [title] snippet lines.

        Args:
            query: Keywords to look for, such as a name, a place or a title.
        """
        return self.index.search(query)

    def read(self, title: str) -> str:
        """Read the whole passage with this title.

        Args:
            title: A title exactly as a search result showed it, without the brackets.
        """
        return self.index.read(title)


# %% [markdown]
# A sub-agent reader (`--reader_base_url`): a frozen model returns only what a passage says about the policy's question,
# so long passages stay out of its context; on a timeout or an error, `read` returns the passage (the log counts them).

# %%
READER_PROMPT = ("You read passages for a search agent. Reply with at most two sentences from the passage that "
                 "bear on the question, copying names, dates and numbers exactly, or with 'Nothing relevant.' if "
                 "none do.")


class Reader:
    """A frozen model behind an OpenAI-compatible endpoint that summarises a passage for a question. On a timeout, an
    error or an empty reply: the passage itself. Pickled, it keeps its options (its client is made where it runs)."""

    def __init__(self, base_url: str, model: str, timeout: float, max_tokens: int, prompt: str = READER_PROMPT):
        self.base_url, self.model, self.timeout, self.max_tokens, self.prompt = base_url, model, timeout, max_tokens, \
            prompt
        self.calls = self.fallbacks = 0
        self._client = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None, "calls": 0, "fallbacks": 0}

    @property
    def client(self) -> OpenAI:
        if self._client is None:  # a retry would double the wait a timeout bounds
            self._client = OpenAI(base_url=self.base_url, api_key=os.environ.get("READER_API_KEY", "none"),
                                  timeout=self.timeout, max_retries=0)
        return self._client

    def start(self) -> None:
        """One line if no OpenAI-compatible server answers at base_url."""
        try:  # an HTTP error is still an answer: transformers 5.17's serve fails /v1/models when there is no Hub cache
            self.client.models.list()
        except Exception as err:  # noqa: BLE001 - unreachable, refused, not OpenAI-compatible: all one line
            if getattr(err, "status_code", None) is None:  # openai's APIStatusError carries one; no answer does not
                raise Refusal(f"--reader_base_url {self.base_url}: no OpenAI-compatible server answers "
                              f"({type(err).__name__}); start one (e.g. `transformers serve {self.model}`) or drop "
                              "--reader_base_url.") from None

    def describe(self) -> str:
        return f"reader: {self.model} at {self.base_url}, at most {self.max_tokens} tokens in {self.timeout:g} s"

    def summarise(self, passage: str, question: str) -> str:
        self.calls, why = self.calls + 1, "an empty reply"
        try:
            reply = self.client.chat.completions.create(
                model=self.model, max_tokens=self.max_tokens, temperature=0.0,
                messages=[{"role": "system", "content": self.prompt},
                          {"role": "user", "content": f"Question: {question}\n\nPassage:\n{passage}"}])
            summary = (reply.choices[0].message.content or "").strip()
        except Exception as err:  # noqa: BLE001 - whatever the endpoint does, the episode goes on with the passage
            summary, why = "", type(err).__name__
        if not summary:
            self.fallbacks += 1
            logger.warning(f"reader: {why}; `read` returned the passage itself ({self.fallbacks} of {self.calls} "
                           "reads so far)")
            return passage
        return f"{passage.split('] ', 1)[0]}] (summary) {summary}"


class SearchToolsWithReader(SearchTools):
    """search as SearchTools; read through the reader: it also takes the policy's question."""

    def __init__(self, index: SearchIndex, reader: Reader):
        super().__init__(index)
        self.reader = reader

    def read(self, title: str, question: str) -> str:
        """Read the passage with this title: a reader returns what it says about your question.

        Args:
            title: A title exactly as a search result showed it, without the brackets.
            question: What you want to find out from the passage.
        """
        passage = self.index.read(title)
        return passage if passage.startswith("Error:") else self.reader.summarise(passage, str(question)[:500])


# %% [markdown]
# ## Rewards
# Exact match and F1 pay only when the model searched (memory earns nothing); a format reward pays for `<answer>` tags.
# Turn credit (a search finding a supporting passage first) is logged, weight 0: it did not help (docs/experiments.md).

# %%
REWARD_FUNCS, REWARD_WEIGHTS = rewards.combine({
    rewards.RequiresToolCall(rewards.exact_match_reward, "search"): 1.0,
    rewards.RequiresToolCall(rewards.token_f1_reward, "search"): 1.0,
    rewards.answer_format_reward: 0.2,
    rewards.new_evidence_reward: 0.0,
})


def setup(script_args: ScriptArguments) -> Setup:
    """The rubric above, and each rollout's search and read over the index the flags name (through the reader with
    --reader_base_url). The index loads, and the reader's endpoint is checked, in training.prepare (Setup.start)."""
    index = SearchIndex(script_args.corpus_path, script_args.index_dir, script_args.search_top_k,
                        script_args.snippet_chars, script_args.passage_chars)
    if script_args.reader_base_url is None:
        return Setup(REWARD_FUNCS, REWARD_WEIGHTS, environment_factory=functools.partial(SearchTools, index),
                     services=[index])
    if not script_args.reader_model:
        raise Refusal("--reader_base_url needs --reader_model: the model name the endpoint serves.")
    if script_args.reader_timeout <= 0 or script_args.reader_max_tokens < 1:
        raise Refusal("--reader_timeout must be > 0 seconds and --reader_max_tokens >= 1.")
    reader = Reader(script_args.reader_base_url, script_args.reader_model, script_args.reader_timeout,
                    script_args.reader_max_tokens)
    return Setup(REWARD_FUNCS, REWARD_WEIGHTS, environment_factory=functools.partial(SearchToolsWithReader, index,
                                                                                     reader), services=[index, reader])


# %% [markdown]
# ## Trainer
# The shared pre-flight checks (tool-call template included), then TRL's `GRPOTrainer` with the tools.

# %%
def main(argv: list[str] | None = None):
    # The trainer's imports are here, not at the top: evaluate.py reads this file's prompt, data and rubric without
    # loading torch and TRL's trainer, seconds of start-up a user checking an environment against an API never needs.
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_recipes import training

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    task = setup(script_args)  # the rubric, and search and read (through the reader with --reader_base_url)
    tokenizer = training.prepare(training_args, model_args, task)  # one-line checks, then the index loads
    train_dataset, eval_dataset = data.load_splits(build_dataset, training_args, script_args.dataset_path,
                                                   script_args.num_eval_examples)
    training.check_rows(task, train_dataset, tokenizer)  # prompts rendered, each reward called on real rows
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,  # loaded with training_args.model_init_kwargs (dtype, ...)
        reward_funcs=task.reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),  # LoRA with --use_peft (the default here), else None
        quantization_config=get_quantization_config(model_args),  # --load_in_4bit / --load_in_8bit
        environment_factory=task.environment_factory,  # one SearchTools per rollout
        callbacks=training.trainer_callbacks(task.callbacks),  # --skip_settled_after's record, when on
    )
    return training.run(trainer)


# %% [markdown]
# ## Run
# As a script, the command line and `--config` choose the options; in a notebook, `NOTEBOOK_ARGS` takes the same flags.
# In the curves, exact match and F1 should rise together; F1 rising alone means longer, vaguer answers.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/search_agent_grpo.yaml"]

# %% tags=["active-ipynb"]
# from grpo_recipes import notebook
#
# trainer = main(NOTEBOOK_ARGS)
# notebook.show_training(trainer.args.output_dir, trainer)

# %% [markdown]
# ## Try it
# The trained agent on a few held-out questions, searching the same index as in training, scored by the same rubric.

# %% tags=["active-ipynb"]
# notebook.try_model(trainer, n=3)

# %% tags=["active-py"]
if __name__ == "__main__":
    run_script(main)
