# TEST HARNESS ONLY -- never shipped in the hicache_galahad package.
#
# An in-process sglang.Engine with HiCache + L3 storage on CPU: generate, wait for the L3 writes,
# flush the device and host tiers, generate again, and print one JSON line with both results.
# Run it under the CPU harness (the Engine's scheduler subprocesses inherit the patches through
# PYTHONPATH / sitecustomize):
#
#   tests/sglang_cpu/run python tests/sglang_cpu/engine_roundtrip.py --model DIR \
#       --layout layer_first --storage-dir DIR        # sets SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR
"""Engine round trip through a HiCache storage backend (test harness only)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def summarize(out: dict) -> dict:
    meta = out["meta_info"]
    triples = meta.get("output_token_logprobs") or []
    return {
        "output_ids": out.get("output_ids") or [t[1] for t in triples],
        "output_logprobs": [t[0] for t in triples],
        "cached_tokens": meta.get("cached_tokens"),
        "cached_tokens_details": meta.get("cached_tokens_details"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--layout", default="layer_first")
    parser.add_argument("--storage-dir", required=True)
    parser.add_argument("--page-size", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=43)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--backend", default="file", help="file, or dynamic (our backend)")
    parser.add_argument(
        "--extra-config",
        default=None,
        help="the storage extra config as given to SGLang: a JSON string or @file.json",
    )
    parser.add_argument("--record-glob", default="*.bin", help="files that mark a written page")
    args = parser.parse_args()

    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = args.storage_dir
    import sglang

    engine = sglang.Engine(
        model_path=args.model,
        device="cpu",
        max_total_tokens=2048,
        page_size=args.page_size,
        enable_hierarchical_cache=True,
        hicache_ratio=2.0,
        hicache_io_backend="direct",
        hicache_mem_layout=args.layout,
        hicache_write_policy="write_through",
        hicache_storage_backend=args.backend,
        hicache_storage_prefetch_policy="wait_complete",
        hicache_storage_backend_extra_config=args.extra_config
        or json.dumps({"prefetch_threshold": 4}),
        log_level="warning",
    )
    try:
        prompt = list(range(10, 10 + args.prompt_len))
        params = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
        first = engine.generate(input_ids=prompt, sampling_params=params, return_logprob=True)
        # L3 writes are asynchronous and a flush drops queued ones: wait for the prefix pages.
        want = (args.prompt_len - 1) // args.page_size
        deadline = time.monotonic() + 60
        while len(list(Path(args.storage_dir).glob(args.record_glob))) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {want} pages written to {args.storage_dir}")
            time.sleep(0.1)
        # A flush is refused while the scheduler is not fully idle: retry until it succeeds.
        while True:
            flushed = bool(getattr(engine.flush_cache(), "success", False))
            if flushed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        second = engine.generate(input_ids=prompt, sampling_params=params, return_logprob=True)
    finally:
        engine.shutdown()
    result = {
        "first": summarize(first),
        "second": summarize(second),
        "flush_success": flushed,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":  # required: the Engine spawns subprocesses
    sys.exit(main())
