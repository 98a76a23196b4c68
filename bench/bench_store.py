"""Record store throughput against a plain-file baseline and an in-memory copy, one run.

Prints GB/s for put and get of 32 KiB and 8 MiB records (warm page cache), single calls and
batched calls, with the digest, zstd and AES-GCM on and off, next to:
  - plain files: the same bytes written (write + rename, no fsync) and read (readinto) with no
    header and no checks;
  - an in-memory copy of the same bytes into preallocated buffers (a warm read's ceiling).
Each figure is the best of several alternating repetitions; ratios matter, not absolutes.

Usage: .venv/bin/python bench/bench_store.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import zstandard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hicache_galahad.record.namespace import Namespace  # noqa: E402
from hicache_galahad.store import RecordStore  # noqa: E402


def bf16_pages(count: int, page_bytes: int, seed: int = 0) -> list[np.ndarray]:
    """Random-normal values truncated to bf16 (the top 16 bits of float32), as uint8 pages."""
    rng = np.random.default_rng(seed)
    pages = []
    for _ in range(count):
        values = rng.standard_normal(page_bytes // 2, dtype=np.float32)
        pages.append((values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8))
    return pages


def best_rate(action, total_bytes: int, repeats: int) -> float:
    best_s = float("inf")
    for _ in range(repeats):
        start_s = time.perf_counter()
        action()
        best_s = min(best_s, time.perf_counter() - start_s)
    return total_bytes / best_s / 1e9


def plain_files(directory: str, keys, pages, outs, repeats: int) -> tuple[float, float]:
    os.makedirs(directory, exist_ok=True)

    def write():
        for key, page in zip(keys, pages, strict=True):
            path = os.path.join(directory, key)
            with open(path + ".tmp", "wb", buffering=0) as target:
                target.write(page)
            os.replace(path + ".tmp", path)

    def read():
        for key, out in zip(keys, outs, strict=True):
            with open(os.path.join(directory, key), "rb", buffering=0) as source:
                source.readinto(out)

    total = sum(len(page) for page in pages)
    write_rate = best_rate(write, total, repeats)
    read()
    return write_rate, best_rate(read, total, repeats)


def memory_copy(pages, outs, repeats: int) -> float:
    def copy():
        for page, out in zip(pages, outs, strict=True):
            np.copyto(out, page)

    copy()
    return best_rate(copy, sum(len(page) for page in pages), repeats)


def store_rates(root, config: dict, keys, pages, outs, repeats: int) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    store = RecordStore(root, **config)
    namespace = store.register_namespace(Namespace("bench", "bench-model", "kv", {}))
    total = sum(len(page) for page in pages)
    results = {}

    def put_batched():
        store.clear_namespace(namespace)
        start_s = time.perf_counter()
        assert all(store.put_many(namespace, keys, pages))
        return time.perf_counter() - start_s

    results["put batched"] = total / min(put_batched() for _ in range(repeats)) / 1e9

    def put_single():
        store.clear_namespace(namespace)
        start_s = time.perf_counter()
        for key, page in zip(keys, pages, strict=True):
            assert store.put(namespace, key, page)
        return time.perf_counter() - start_s

    results["put single"] = total / min(put_single() for _ in range(repeats)) / 1e9

    def get_single():
        for key, out in zip(keys, outs, strict=True):
            assert store.get_into(namespace, key, out)

    def get_batched():
        assert all(store.get_many_into(namespace, keys, outs))

    get_batched()
    results["get single"] = best_rate(get_single, total, repeats)
    results["get batched"] = best_rate(get_batched, total, repeats)
    assert all(np.array_equal(out, page) for out, page in zip(outs, pages, strict=True))
    results["on disk / raw"] = store.usage_bytes() / total
    store.close()
    return results


def machine() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            )
    except (OSError, StopIteration):
        model = platform.processor()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, commit {commit}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer records and repeats")
    args = parser.parse_args()
    repeats = 2 if args.quick else 3
    work = tempfile.mkdtemp(prefix="galahad-bench-", dir=os.environ.get("BENCH_DIR"))
    key_file = os.path.join(work, "master.key")
    with open(key_file, "wb") as key:
        key.write(os.urandom(32))
    os.chmod(key_file, 0o600)
    configs = {
        "digest (default)": {},
        "no digest": {"digest": "none", "allow_unverified": True},
        "zstd": {"compression": "zstd"},
        "aes-gcm": {"encryption_key_file": key_file},
        "digest, no fsync": {"durability": "none"},
    }
    print(f"# bench_store on {machine()}")
    try:
        for page_bytes, count in (
            (32 * 1024, 512 if args.quick else 2048),
            (8 << 20, 8 if args.quick else 24),
        ):
            keys = [f"{index:064x}" for index in range(count)]
            pages = bf16_pages(count, page_bytes)
            outs = [np.empty(page_bytes, np.uint8) for _ in range(count)]
            ceiling = memory_copy(pages, outs, repeats)
            plain_write, plain_read = plain_files(
                os.path.join(work, "plain"), keys, pages, outs, repeats
            )
            print(f"\n## {page_bytes // 1024} KiB records x {count} (bf16 random-normal)")
            print(f"in-memory copy           {ceiling:7.2f} GB/s")
            print(f"plain files (no checks)  write {plain_write:6.2f}  read {plain_read:6.2f} GB/s")
            print(
                f"{'store':24s} {'put 1':>7s} {'put N':>7s} {'get 1':>7s} {'get N':>7s}  "
                f"{'get N/copy':>10s} {'get N/plain':>11s} {'disk/raw':>8s}"
            )
            for name, config in configs.items():
                rates = store_rates(os.path.join(work, "store"), config, keys, pages, outs, repeats)
                print(
                    f"{name:24s} {rates['put single']:7.2f} {rates['put batched']:7.2f} "
                    f"{rates['get single']:7.2f} {rates['get batched']:7.2f}  "
                    f"{rates['get batched'] / ceiling:10.0%} {rates['get batched'] / plain_read:11.2f}x "
                    f"{rates['on disk / raw']:8.3f}"
                )
        page = bf16_pages(1, 8 << 20)[0]
        zeros = np.zeros(8 << 20, np.uint8)
        print("\n## zstd on 8 MiB pages (level 3): ratio and speed")
        for name, data in (("bf16 random-normal", page), ("all-zero", zeros)):
            compressor = zstandard.ZstdCompressor(level=3)
            start_s = time.perf_counter()
            compressed = compressor.compress(data)
            compress_s = time.perf_counter() - start_s
            start_s = time.perf_counter()
            zstandard.ZstdDecompressor().decompress(compressed, max_output_size=len(data))
            decompress_s = time.perf_counter() - start_s
            print(
                f"{name:20s} ratio {len(data) / len(compressed):8.2f}  compress "
                f"{len(data) / compress_s / 1e9:5.2f} GB/s  decompress {len(data) / decompress_s / 1e9:5.2f} GB/s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
