"""`galahad warm --pin` measured (issue 23): ingest time, the first question after a restart,
the break-even number of questions, and an eviction storm against a pinned document.

1. A server on a fresh store with a budget (`--budget-docs` documents' worth of pages, half of
   it the pin limit). One cold prefill of an unrelated document of the same length: the
   server's own prefill rate. Then `hicache_galahad.warm(url, [document], pin=True)`: ingest
   seconds per 1,000 tokens (prefill plus waiting for the write-back and the check).
2. SIGKILL the server's process group, start it again: the first question (document + a
   question's tokens, streamed) restores the document from the store; its TTFT against the same
   question over another, never-seen document of the same length (recompute). Seconds saved per
   question, and break-even = ingest seconds / seconds saved (the Galahad paper: 16).
3. An eviction storm: other documents worth `--storm` times the budget, then a flush. Every
   pinned page is still on disk with the same bytes (sha256 of each record file), `ready` still
   says the same, the question restores the same tokens with bit-identical output, and the store
   stays within its budget.

Runs stock SGLang on a GPU when one is present, else the CPU test harness. For the record:
    .venv/bin/python bench/bench_warm.py --size demo --tokens 4096
Smoke (seconds of compute, a minute or two of server starts):
    .venv/bin/python bench/bench_warm.py --size tiny --tokens 256 --storm 10
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hicache_galahad  # noqa: E402
from bench import serving  # noqa: E402
from bench.bench_store import machine  # noqa: E402
from hicache_galahad.warming.keys import page_keys  # noqa: E402

PAGE_SIZE = 16
PAPER_BREAK_EVEN = 16  # questions, time (the paper: 13 for energy)
QUESTION_TOKENS = 32


def ids(length: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed * 1_000_003 + length)
    return [rng.randrange(10, vocab) for _ in range(length)]


def record_digests(root: Path) -> dict[str, str]:
    """sha256 of every KV record file, by key."""
    found = {}
    for description in Path(root, "ns").glob("*/namespace.json"):
        if json.loads(description.read_text())["pool"] != "kv":
            continue
        for path in description.parent.glob("*.rec"):
            with contextlib.suppress(FileNotFoundError):  # evicted since the listing
                found[path.stem] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def store_bytes(root: Path) -> int:
    total = 0
    for path in Path(root, "ns").glob("*/*.rec"):
        with contextlib.suppress(FileNotFoundError):  # evicted since the listing
            total += path.stat().st_size
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="demo", help="model size (make_model.py)")
    parser.add_argument("--tokens", type=int, default=4096, help="document length")
    parser.add_argument("--budget-docs", type=float, default=3.0, help="budget in documents")
    parser.add_argument("--storm", type=float, default=10.0, help="storm, in budgets")
    args = parser.parse_args()
    model = serving.e2e.ensure_model("llama", args.size)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    work = Path(tempfile.mkdtemp(prefix="galahad-warm-"))
    root = work / "store"
    document = ids(args.tokens, 1, vocab)
    question = ids(QUESTION_TOKENS, 2, vocab)
    device = "GPU (stock SGLang)" if serving.has_gpu() else "CPU (test harness)"
    print(f"# bench_warm on {machine()}; {device}; model {Path(model).name}; page {PAGE_SIZE}")
    try:
        # the page size in bytes, from a probe server's namespace (a budget in pages)
        probe_args = serving.server_args(
            "galahad", root, page_size=PAGE_SIZE, max_tokens=args.tokens * 2 + 512
        )
        server = serving.start(model, probe_args, work / "probe.log")
        try:
            description = next(Path(root, "ns").glob("*/namespace.json"))
            page_bytes = json.loads(description.read_text())["geometry"]["page_bytes"] + 4096
        finally:
            server.stop()
        shutil.rmtree(root)
        doc_bytes = args.tokens // PAGE_SIZE * page_bytes
        budget = int(args.budget_docs * doc_bytes)
        options = {"max_bytes": budget, "max_pinned_bytes": budget // 2 + page_bytes}
        server_args = serving.server_args(
            "galahad",
            root,
            page_size=PAGE_SIZE,
            max_tokens=args.tokens * 2 + 512,
            galahad_options=options,
        )

        # 1. prefill rate, then ingest
        server = serving.start(model, server_args, work / "warm.log")
        try:
            serving.stream_generate(server, ids(64, 99, vocab), 1)  # first-request costs
            cold = serving.stream_generate(server, ids(args.tokens, 3, vocab), 1)
            prefill_tps = args.tokens / cold.ttft_s
            started = time.perf_counter()
            (report,) = hicache_galahad.warm(
                server.url, [("document", document)], root=str(root), pin=True
            )
            ingest_s = time.perf_counter() - started
        finally:
            os.killpg(server.pgid, signal.SIGKILL)
            server.stop(grace_s=1.0)
        assert report.complete, report
        print(
            f"ingest: {args.tokens} tokens in {ingest_s:.2f} s = {ingest_s / args.tokens * 1000:.3f}"
            f" s per 1,000 tokens; the server's own prefill {prefill_tps:.0f} tokens/s = "
            f"{1000 / prefill_tps:.3f} s per 1,000 (ratio {ingest_s / (args.tokens / prefill_tps):.2f});"
            f" pinned {report.pinned}"
        )

        # 2. restart: the first question, restored vs recomputed
        server = serving.start(model, server_args, work / "restart.log")
        try:
            (state,) = hicache_galahad.ready(server.url, [("document", document)], root=str(root))
            serving.stream_generate(server, ids(64, 98, vocab), 1)  # first-request costs
            restored = serving.stream_generate(server, document + question, 8)
            recomputed = serving.stream_generate(server, ids(args.tokens, 4, vocab) + question, 8)
            saved_s = recomputed.ttft_s - restored.ttft_s
            break_even = ingest_s / saved_s if saved_s > 0 else float("inf")
            print(
                f"after restart: ready {state.continuation_tokens} tokens, restored "
                f"{restored.storage_tokens}; TTFT restored {restored.ttft_s:.3f} s, recompute "
                f"{recomputed.ttft_s:.3f} s ({restored.ttft_s / recomputed.ttft_s:.0%}); saved "
                f"{saved_s:.3f} s per question; break-even after {break_even:.1f} questions "
                f"(the paper: {PAPER_BREAK_EVEN})"
            )
            assert restored.storage_tokens == state.continuation_tokens, (restored, state)

            # 3. the storm
            pinned = {
                key: digest
                for key, digest in record_digests(root).items()
                if key in set(page_keys(document, PAGE_SIZE))
            }
            storm_docs = int(args.storm * budget / doc_bytes) + 1
            storm_s = time.perf_counter()
            for seed in range(storm_docs):
                serving.e2e.generate(server, ids(args.tokens, 100 + seed, vocab), 1)
            serving.e2e.wait_settled(
                lambda: store_bytes(root), quiet_s=2.0, timeout_s=600, what="the storm's writes"
            )
            serving.e2e.flush_cache(server)
            after = record_digests(root)
            kept = sum(1 for key, digest in pinned.items() if after.get(key) == digest)
            (again,) = hicache_galahad.ready(server.url, [("document", document)], root=str(root))
            second = serving.stream_generate(server, document + question, 8)
            same = (
                second.output_ids == restored.output_ids
                and second.storage_tokens == restored.storage_tokens
            )
            print(
                f"storm: {storm_docs} documents ({storm_docs * doc_bytes / budget:.1f} budgets) "
                f"in {time.perf_counter() - storm_s:.1f} s; pinned pages kept bit-exact "
                f"{kept}/{len(pinned)}; ready {again.continuation_tokens}; restored "
                f"{second.storage_tokens}, same output {same}; store {store_bytes(root)} bytes "
                f"of a {budget}-byte budget"
            )
            assert kept == len(pinned) == args.tokens // PAGE_SIZE
            assert same and again.continuation_tokens == state.continuation_tokens
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
