"""The main job: SGLang restarted, a long document read once is loaded instead of recomputed.

1. Start SGLang with GalahadStorage on a fresh store; send a long document and a question.
2. Restart the server (nothing survives in GPU or host memory); send the same document with a
   different question: the document's pages come from our store.
3. Start a server without storage and send that second prompt: the reference.
Prints tokens served from storage, time to first token cold vs restored vs recomputed, and
whether the restored run's output equals the recomputed one.

Runs stock SGLang on a GPU when one is present, else the CPU test harness (tests/sglang_cpu).
Usage: .venv/bin/python bench/demo.py [--words N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import serving  # noqa: E402

PAGE_SIZE = 16
MAX_NEW_TOKENS = 16


def synthetic_document(words: int, seed: int = 7) -> str:
    """Deterministic English-like prose (a random model reads anything)."""
    rng = random.Random(seed)
    subjects = ["The storage tier", "A prefill", "The scheduler", "Each page", "The operator"]
    verbs = ["keeps", "verifies", "restores", "evicts", "writes", "reads", "measures"]
    objects = [
        "the recurrent state",
        "every record",
        "the page hashes",
        "a checkpoint",
        "the budget",
    ]
    sentences, count = [], 0
    while count < words:
        sentence = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} at step {rng.randint(1, 9999)}."
        sentences.append(sentence)
        count += len(sentence.split())
    return " ".join(sentences)


def prompt(document: str, question: str) -> str:
    return f"Read the report and answer.\n\n{document}\n\nQuestion: {question}\nAnswer:"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--words", type=int, default=1600, help="document length in words")
    parser.add_argument("--size", default="demo", help="model size for make_model.py")
    parser.add_argument("--keep", help="keep the store and logs in this directory")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="galahad-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    print(f"device: {'GPU (stock SGLang)' if serving.has_gpu() else 'CPU (test harness)'}")
    print("building the local demo model (first run only) ...", flush=True)
    model = serving.e2e.ensure_model("llama", args.size)
    document = synthetic_document(args.words)
    first = prompt(document, "Which step did the scheduler restore first?")
    second = prompt(document, "How many records were verified?")
    galahad = serving.server_args("galahad", store, page_size=PAGE_SIZE, max_tokens=8192)
    try:
        print("1/3 server with GalahadStorage, cold ...", flush=True)
        server = serving.start(model, galahad, work / "cold.log")
        try:
            cold = serving.stream_generate(server, first, MAX_NEW_TOKENS)
            prompt_tokens = int(cold.meta_info.get("prompt_tokens", 0))
            serving.wait_for_records(store, (prompt_tokens - 1) // PAGE_SIZE - 8, "ns/*/*.rec")
        finally:
            server.stop()
        print("2/3 restarted server, same store, another question ...", flush=True)
        server = serving.start(model, galahad, work / "restored.log")
        try:
            restored = serving.stream_generate(server, second, MAX_NEW_TOKENS)
        finally:
            server.stop()
        print("3/3 server without storage (reference) ...", flush=True)
        plain = serving.server_args("none", None, page_size=PAGE_SIZE, max_tokens=8192)
        server = serving.start(model, plain, work / "reference.log")
        try:
            reference = serving.stream_generate(server, second, MAX_NEW_TOKENS)
        finally:
            server.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    tokens = int(restored.meta_info.get("prompt_tokens", 0))
    print()
    print(f"prompt: {tokens} tokens (document of {args.words} words + question)")
    print(f"tokens served from storage after the restart: {restored.storage_tokens} of {tokens}")
    print(f"time to first token, cold (first question, empty store): {cold.ttft_s:7.2f} s")
    print(f"time to first token, restored after restart:             {restored.ttft_s:7.2f} s")
    print(f"time to first token, recomputed without storage:         {reference.ttft_s:7.2f} s")
    print(f"restored / recomputed: {restored.ttft_s / reference.ttft_s:.0%}")
    same = restored.output_ids == reference.output_ids
    print(f"restored output equals the no-storage output: {same}")
    if not same or restored.storage_tokens == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
