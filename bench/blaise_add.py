"""add() and select() of Blaise on the issue's corpus shape: the 13 articles of
bench_blaise.py and the 79 largest pydoc topics (about 905 KB in 92 documents), storage and
its deferred durability included; select over gen2's held-out hard questions.

    python bench/blaise_add.py [--runs 9] [--seeds 5]

Prints add() wall and CPU (all threads) per run, each into a fresh root, then select's wall
and thread-CPU percentiles over every question of the seeds. For a side by side with another
tree, run this file with that tree first on PYTHONPATH, alternating.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import blaise_gen2 as gen2  # noqa: E402
from bench_blaise import load_articles, percentile  # noqa: E402

from hicache_galahad.blaise import Blaise  # noqa: E402

NUM_TOPICS = 79


def corpus() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    ordered = sorted(topics.items(), key=lambda item: (-len(item[1].encode()), item[0]))
    return load_articles() + ordered[:NUM_TOPICS]


def time_add(docs) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="blaise-add-") as root:
        memory = Blaise(root)
        wall, cpu = time.perf_counter(), time.process_time()
        for doc_id, text in docs:
            memory.add(doc_id, text)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        memory.close()
    return wall, cpu


def time_select(articles, seeds: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for seed in range(gen2.SPLIT_SEEDS["heldout"], gen2.SPLIT_SEEDS["heldout"] + seeds):
        docs, facts = gen2.build_case(articles, seed, "heldout", True)
        with tempfile.TemporaryDirectory(prefix="blaise-select-") as root:
            memory = Blaise(root)
            for doc_id, text in docs:
                memory.add(doc_id, text)
            for fact in facts:
                wall, cpu = time.perf_counter(), time.thread_time()
                memory.select(fact.question)
                walls.append((time.perf_counter() - wall) * 1000)
                cpus.append((time.thread_time() - cpu) * 1000)
            memory.close()
    return walls, cpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args(argv)
    docs = corpus()
    size = sum(len(text.encode()) for _, text in docs)
    print(f"corpus: {size:,} bytes in {len(docs)} documents; load {os.getloadavg()[0]:.2f}")
    walls, cpus = [], []
    for _ in range(args.runs):
        wall, cpu = time_add(docs)
        walls.append(wall * 1000)
        cpus.append(cpu * 1000)
    print(
        f"add(): wall median {statistics.median(walls):.0f} ms (min {min(walls):.0f}), "
        f"CPU median {statistics.median(cpus):.0f} ms (min {min(cpus):.0f})"
    )
    walls, cpus = time_select(load_articles(), args.seeds)
    print(
        f"select ({len(walls)} calls): wall p50 {percentile(walls, 0.5):.2f} p95 "
        f"{percentile(walls, 0.95):.2f} ms; CPU p50 {percentile(cpus, 0.5):.2f} p95 "
        f"{percentile(cpus, 0.95):.2f} ms; load {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
