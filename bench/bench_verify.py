"""`galahad verify` on a large store, against a plain sequential read of the same files.

Builds a store of --gb GiB of 8 MiB records (plain, xxh3-128), flushes it and drops it from
the page cache, then, alternating, times `galahad verify --json` (a subprocess, as an operator
runs it) and a plain read of every record file with no checks, each from a cold cache. Prints
GB/s and the ratio.

Usage: .venv/bin/python bench/bench_verify.py [--gb 10] [--rounds 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_store import machine  # noqa: E402
from bench.cold_cache import drop_cache, plain_read  # noqa: E402
from hicache_galahad.record.namespace import Namespace  # noqa: E402
from hicache_galahad.store import RecordStore  # noqa: E402

RECORD_BYTES = 8 << 20
BATCH = 16


def load_average() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def build(root: str, gib: float) -> int:
    count = int(gib * (1 << 30) // RECORD_BYTES)
    namespace = Namespace("bench", "verify", "kv", {"page_bytes": RECORD_BYTES})
    pages = [os.urandom(RECORD_BYTES) for _ in range(BATCH)]
    with RecordStore(root, durability="none") as store:
        store.register_namespace(namespace)
        for start in range(0, count, BATCH):
            keys = [f"{index:064x}" for index in range(start, min(count, start + BATCH))]
            assert all(store.put_many(namespace, keys, pages[: len(keys)]))
    return count


def timed_verify(root: str) -> tuple[float, dict]:
    drop_cache(root)
    start_s = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "hicache_galahad", "verify", "--root", root, "--json"],
        capture_output=True,
        text=True,
    )
    elapsed_s = time.perf_counter() - start_s
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["clean"], result.stdout[-2000:]
    return elapsed_s, report


def timed_plain(root: str) -> tuple[float, int]:
    drop_cache(root)
    start_s = time.perf_counter()
    read = plain_read(os.path.join(root, "ns"))
    return time.perf_counter() - start_s, read


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=os.environ.get("BENCH_DIR"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="galahad-bench-verify-", dir=args.dir)
    root = os.path.join(work, "store")
    print(f"# bench_verify on {machine()}; load {load_average()}")
    try:
        started = time.perf_counter()
        count = build(root, args.gb)
        print(f"store: {count} records of 8 MiB ({count * RECORD_BYTES / 1e9:.1f} GB) "
              f"built in {time.perf_counter() - started:.0f} s")  # fmt: skip
        verify_s = plain_s = float("inf")
        for _ in range(args.rounds):
            seconds, report = timed_verify(root)
            verify_s = min(verify_s, seconds)
            seconds, total = timed_plain(root)
            plain_s = min(plain_s, seconds)
        total = report["record_bytes"]
        verify_rate, plain_rate = total / verify_s / 1e9, total / plain_s / 1e9
        print(
            f"galahad verify (cold, every rule, 4 threads): {verify_rate:.2f} GB/s ({verify_s:.1f} s)"
        )
        print(
            f"plain sequential read (cold, no checks):     {plain_rate:.2f} GB/s ({plain_s:.1f} s)"
        )
        print(f"verify / plain read: {verify_rate / plain_rate:.2f}")
        print(f"load after: {load_average()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
