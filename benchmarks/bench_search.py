"""BM25 retrieval speed: bm25s (what search_agent_grpo.py uses) against rank-bm25, on a generated corpus.

    python benchmarks/bench_search.py [--passages 100000] [--queries 200]

Both libraries index the same passages with the same tokenisation (bm25s's, stopwords removed) and answer the same
queries; rank-bm25 scores every passage per query in Python, so it gets a tenth of the queries. Prints index build
time, queries/second and p50/p99 query latency, and checks that both return the same top passage.
"""

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bm25s  # noqa: E402
from rank_bm25 import BM25Okapi  # noqa: E402

import search_agent_grpo  # noqa: E402


def generate_corpus(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(30_000)]  # a Zipf-like draw over a 30k-word vocabulary
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    return [{"title": f"Passage {i}", "text": " ".join(rng.choices(vocabulary, weights, k=rng.randint(30, 90)))}
            for i in range(n)]


def latency_report(name: str, latencies: list[float]) -> None:
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else latencies[0]
    print(f"{name:>10} query: {1000 / statistics.mean(latencies):8.1f} queries/s   "
          f"p50 {statistics.median(latencies):8.2f} ms   p99 {p99:8.2f} ms   ({len(latencies)} queries)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    corpus = generate_corpus(args.passages)
    rng = random.Random(1)
    queries = [" ".join(rng.sample(corpus[rng.randrange(len(corpus))]["text"].split(), 4)) for _ in range(args.queries)]

    folder = Path(tempfile.mkdtemp())
    corpus_path = folder / "corpus.jsonl"
    corpus_path.write_text("".join(json.dumps(passage) + "\n" for passage in corpus))
    start = time.perf_counter()
    index = search_agent_grpo.SearchIndex(str(corpus_path), str(folder / "index"), top_k=3)
    index.start()  # read the file, tokenise, index, save
    print(f"bm25s index build (read, tokenise, index, save): {time.perf_counter() - start:.1f} s, "
          f"{len(corpus):,} passages")
    start = time.perf_counter()
    tokenized = [bm25s.tokenize(f"{p['title']}\n{p['text']}", stopwords="en", return_ids=False, show_progress=False)[0]
                 for p in corpus]
    rank_bm25 = BM25Okapi(tokenized)
    print(f"rank-bm25 index build (same tokens): {time.perf_counter() - start:.1f} s")

    latencies, top_bm25s = [], []
    for query in queries:
        start = time.perf_counter()
        result = index.search(query)
        latencies.append(1000 * (time.perf_counter() - start))
        top_bm25s.append(result.split("]")[0].lstrip("["))
    latency_report("bm25s", latencies)

    latencies, agree = [], 0
    for query, expected in list(zip(queries, top_bm25s, strict=True))[: max(args.queries // 10, 2)]:
        start = time.perf_counter()
        scores = rank_bm25.get_scores(bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0])
        best = max(range(len(scores)), key=scores.__getitem__)
        latencies.append(1000 * (time.perf_counter() - start))
        agree += corpus[best]["title"] == expected
    latency_report("rank-bm25", latencies)
    print(f"same top passage on {agree} of {len(latencies)} queries")


if __name__ == "__main__":
    main()
