"""GalahadStorage against SGLang's HiCacheFile, the same pages in the same run.

Real SGLang host pools on the CPU (bf16, page_first_direct), driven the way SGLang's cache
controller drives a backend:
  - HiCacheFile, generic path: batch_set(keys, [get_data_page(i)]) and, for reads,
    batch_get(keys, dummy flat pages) then set_from_flat_data_page (its only KV read path);
  - HiCacheFile v2: batch_set_v2 / batch_get_v2 on the KV pool;
  - GalahadStorage v1 (zero-copy): batch_set_v1 / batch_get_v1 (records <-> host memory);
  - GalahadStorage v2: batch_set_v2 / batch_get_v2 on the KV pool.
GalahadStorage runs in its default durability (deferred), with fsync per batch, and encrypted.
Pages of 32 KiB and 8 MiB; each round writes, then reads cold (every file of the backend
flushed and dropped from the page cache with posix_fadvise DONTNEED), then warm; best of
alternating rounds. Ceilings: an in-memory copy of the same pages between host slots (warm),
and a plain sequential read of the record files (cold).

`--neighbours N` runs the whole benchmark beside N busy processes (the same for every backend).

Usage: .venv/bin/python bench/bench_backend.py [--quick] [--rounds R] [--neighbours N]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheFile,
    HiCacheStorageConfig,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from bench import sglang_server  # noqa: E402
from bench.bench_store import machine  # noqa: E402
from bench.cold_cache import drop_cache, plain_read  # noqa: E402
from bench.load import Neighbours, loadavg  # noqa: E402

# (layers, page tokens, kv heads, head dim) giving 32 KiB and 8 MiB bf16 pages
GEOMETRIES = {"32 KiB": (4, 16, 2, 32), "8 MiB": (32, 64, 8, 64)}


def host_pool(layers, page_tokens, heads, head_dim, pages):
    device = MHATokenToKVPool(
        pages * page_tokens,
        page_tokens,
        torch.bfloat16,
        heads,
        head_dim,
        layers,
        "cpu",
        False,
        start_layer=0,
        end_layer=layers - 1,
    )
    host = MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2.0,
        0,
        page_tokens,
        "page_first_direct",
        pin_memory=False,
        device_capacity_tokens=device.size,
        start_layer=device.start_layer,
        end_layer=device.end_layer,
    )
    del device
    generator = torch.Generator().manual_seed(0)
    host.kv_buffer.copy_(torch.randn(host.kv_buffer.shape, generator=generator).to(torch.bfloat16))
    return host


def storage_config(extra: dict) -> HiCacheStorageConfig:
    return sglang_server.storage_config(extra, model_name="bench-model", page_first=False)


def galahad_backend(host, work: str, name: str, **options):
    """GalahadStorage through SGLang's factory at work/name, the host pool registered."""
    backend = StorageBackendFactory.create_backend(
        "dynamic",
        storage_config(
            {
                "backend_name": "galahad",
                "module_path": "hicache_galahad",
                "class_name": "GalahadStorage",
                "root": os.path.join(work, name),
                "model_fingerprint": "bench",
                **options,
            }
        ),
        host,
    )
    backend.register_mem_pool_host(host)
    backend.register_mem_host_pool_v2(host, PoolName.KV)
    return backend


def run_geometry(label, layers, page_tokens, heads, head_dim, args, rounds, work) -> None:
    pages = (64 if args.quick else 256) if label == "32 KiB" else (8 if args.quick else 16)
    host = host_pool(layers, page_tokens, heads, head_dim, pages)
    page_bytes = host.get_dummy_flat_data_page().numel() * 2
    keys = [f"{label[:2]}{index:062x}" for index in range(pages)]
    source = torch.arange(page_tokens, (pages + 1) * page_tokens, dtype=torch.int64)
    target = torch.arange(
        (pages + 1) * page_tokens, (2 * pages + 1) * page_tokens, dtype=torch.int64
    )
    total_bytes = pages * page_bytes
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = os.path.join(work, "file")
    file_backend = HiCacheFile(storage_config({}))
    file_backend.register_mem_pool_host(host)
    file_backend.register_mem_host_pool_v2(host, PoolName.KV)
    key_file = os.path.join(work, "master.key")
    with open(key_file, "wb") as handle:
        handle.write(os.urandom(32))
    os.chmod(key_file, 0o600)
    galahads = {
        "Galahad v1 (default: deferred)": galahad_backend(host, work, "deferred"),
        "Galahad v1 fsync": galahad_backend(host, work, "fsync", durability="fsync"),
        "Galahad v1 encrypted": galahad_backend(host, work, "sealed", encryption_key_file=key_file),
    }
    default = galahads["Galahad v1 (default: deferred)"]

    def transfer(indices):
        return [PoolTransfer(name=PoolName.KV, host_indices=indices, keys=keys)]

    def file_generic_set():
        pages_data = [host.get_data_page(int(i), flat=True) for i in source[::page_tokens]]
        assert file_backend.batch_set(keys, pages_data)

    def file_generic_get():
        dummies = [host.get_dummy_flat_data_page() for _ in keys]
        results = file_backend.batch_get(keys, dummies)
        for slot, page in zip(target[::page_tokens].tolist(), results, strict=True):
            host.set_from_flat_data_page(slot, page)

    def copy_ceiling():
        for src, dst in zip(
            source[::page_tokens].tolist(), target[::page_tokens].tolist(), strict=True
        ):
            host.get_data_page(dst, flat=False).copy_(host.get_data_page(src, flat=False))

    # name -> (write, read, clear, directory)
    cases = {
        "HiCacheFile generic": (
            file_generic_set,
            file_generic_get,
            file_backend.clear,
            os.path.join(work, "file"),
        ),
        "HiCacheFile v2": (
            lambda: file_backend.batch_set_v2(transfer(source)),
            lambda: file_backend.batch_get_v2(transfer(target)),
            file_backend.clear,
            os.path.join(work, "file"),
        ),
        **{
            name: (
                lambda b=backend: b.batch_set_v1(keys, source),
                lambda b=backend: b.batch_get_v1(keys, target),
                backend.clear,
                backend.store.root,
            )
            for name, backend in galahads.items()
        },
        "Galahad v2": (
            lambda: default.batch_set_v2(transfer(source)),
            lambda: default.batch_get_v2(transfer(target)),
            default.clear,
            default.store.root,
        ),
    }
    best = {name: [float("inf")] * 3 for name in cases}  # write, warm read, cold read
    best_copy = best_plain = float("inf")
    for _ in range(rounds):
        for name, (write, read, clear, directory) in cases.items():
            clear()
            start_s = time.perf_counter()
            write()
            best[name][0] = min(best[name][0], time.perf_counter() - start_s)
            drop_cache(directory)
            start_s = time.perf_counter()
            read()
            best[name][2] = min(best[name][2], time.perf_counter() - start_s)
            read()  # warm
            start_s = time.perf_counter()
            read()
            best[name][1] = min(best[name][1], time.perf_counter() - start_s)
            assert torch.equal(
                host.kv_buffer[:, 1 : pages + 1].view(torch.uint8),
                host.kv_buffer[:, pages + 1 : 2 * pages + 1].view(torch.uint8),
            ), name
            host.kv_buffer[:, pages + 1 :].zero_()
            if name == "Galahad v2":
                drop_cache(directory)
                start_s = time.perf_counter()
                assert plain_read(os.path.join(directory, "ns")) >= total_bytes
                best_plain = min(best_plain, time.perf_counter() - start_s)
        start_s = time.perf_counter()
        copy_ceiling()
        best_copy = min(best_copy, time.perf_counter() - start_s)
    ceiling = total_bytes / best_copy / 1e9
    plain = total_bytes / best_plain / 1e9
    file_write, file_read, file_cold = (
        total_bytes / seconds / 1e9 for seconds in best["HiCacheFile generic"]
    )
    print(
        f"\n## {label} pages x {pages}; in-memory copy {ceiling:.2f} GB/s; plain sequential "
        f"cold read of the records {plain:.2f} GB/s"
    )
    print(
        f"{'backend':32s} {'write':>6s} {'read':>6s} {'cold':>6s} {'write/File':>10s} "
        f"{'read/File':>9s} {'cold/File':>9s} {'cold/plain':>10s} {'read/copy':>9s}"
    )
    for name, (write_s, read_s, cold_s) in best.items():
        write_rate, read_rate, cold_rate = (
            total_bytes / seconds / 1e9 for seconds in (write_s, read_s, cold_s)
        )
        print(
            f"{name:32s} {write_rate:6.2f} {read_rate:6.2f} {cold_rate:6.2f} "
            f"{write_rate / file_write:9.2f}x {read_rate / file_read:8.2f}x "
            f"{cold_rate / file_cold:8.2f}x {cold_rate / plain:10.2f} {read_rate / ceiling:9.0%}"
        )
    for backend in galahads.values():
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--neighbours", type=int, default=0, help="busy processes for the run")
    parser.add_argument("--rounds", type=int, default=None, help="default 4 (--quick: 2)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # in the script only: importers keep their logging
    rounds = args.rounds or (2 if args.quick else 4)
    work = tempfile.mkdtemp(prefix="galahad-bench-backend-", dir=os.environ.get("BENCH_DIR"))
    print(
        f"# bench_backend on {machine()}; best of {rounds} alternating rounds; "
        f"{args.neighbours} busy neighbour(s); load {loadavg()}"
    )
    try:
        with Neighbours(args.neighbours):
            for label, geometry in GEOMETRIES.items():
                run_geometry(label, *geometry, args, rounds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload at the end: {loadavg()}")


if __name__ == "__main__":
    main()
