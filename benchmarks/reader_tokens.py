"""Tokens of tool output per episode in search_agent_grpo.py, with and without the sub-agent reader.

    transformers serve <reader model> --port 8000 &
    python benchmarks/reader_tokens.py --base_url http://127.0.0.1:8000/v1 --reader_model <reader model> \
        --corpus_path docs.jsonl --dataset_path questions/ --tokenizer <policy model>

Each episode is the one an agent that knows where to look would run: a `read` of every supporting passage of the
question. The figure is what those reads put into the policy's context, in the policy tokenizer's tokens: the
passages themselves (`read`, no reader) and the reader's summaries for the question (`--reader_base_url`). The
defaults read the offline kit's toy search set (`python offline.py --search`), whose passages are one sentence: a
reader only pays where passages are long.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import search_agent_grpo as agent  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--base_url", required=True, help="the reader's OpenAI-compatible endpoint")
    parser.add_argument("--reader_model", required=True)
    parser.add_argument("--tokenizer", default="offline/tiny-qwen2", help="the policy's tokenizer")
    parser.add_argument("--corpus_path", default="offline/search_toy/corpus.jsonl")
    parser.add_argument("--dataset_path", default="offline/search_toy/questions")
    parser.add_argument("--index_dir", default="runs/bm25_index")
    parser.add_argument("--passage_chars", type=int, default=1500, help="the recipe's cap on a passage `read` returns")
    parser.add_argument("--reader_max_tokens", type=int, default=96)
    parser.add_argument("--reader_timeout", type=float, default=20.0)
    parser.add_argument("-n", type=int, default=20, help="questions")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    index = agent.SearchIndex(args.corpus_path, args.index_dir, passage_chars=args.passage_chars)
    reader = agent.Reader(args.base_url, args.reader_model, args.reader_timeout, args.reader_max_tokens)
    plain, with_reader = agent.SearchTools(index), agent.SearchToolsWithReader(index, reader)  # one rollout's each
    questions = agent.build_dataset("test", args.dataset_path).select(range(args.n))
    tokens = {"passage": [], "summary": []}
    start = time.monotonic()
    for row in questions:
        question = row["prompt"][-1]["content"]
        for arm, tools in (("passage", plain), ("summary", with_reader)):
            reads = [tools.read(title) if arm == "passage" else tools.read(title, question)
                     for title in row["supporting_titles"]]
            tokens[arm].append(sum(len(tokenizer(text)["input_ids"]) for text in reads))
    mean = {arm: statistics.mean(counts) for arm, counts in tokens.items()}
    print(f"{args.n} episodes, {sum(map(len, questions['supporting_titles']))} reads, reader {args.reader_model} "
          f"({reader.fallbacks} of {reader.calls} reads fell back to the passage, "
          f"{time.monotonic() - start:.1f} s)")
    print(f"tool-output tokens per episode: passages {mean['passage']:.1f}, reader summaries {mean['summary']:.1f} "
          f"({mean['summary'] / mean['passage']:.0%} of the passages)")
    return mean


if __name__ == "__main__":
    main()
