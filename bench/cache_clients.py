"""Storage backends as SGLang 0.5.23 builds and drives them, for bench_cache: real host pools,
backends from `StorageBackendFactory`, the cache controller's call sequence, and ranks that
replay one script in lockstep (one process per rank, forked).

`Client` is one rank's backend driven the way `HiCacheController` drives it:
  - hit query (`_storage_hit_query`): `batch_exists` over batches of STORAGE_BATCH_SIZE keys,
    stopping at the first short batch;
  - prefetch (`_page_transfer`): `batch_get_v1` into host slots (zero-copy, GalahadStorage with
    `interface_v1`) or `batch_get` into dummy flat pages (the generic path, HiCacheFile), batch
    by batch, counting the leading run of hits;
  - backup (`_page_backup`): `batch_set_v1` or `batch_set`, here in batches of 8 pages as a
    prefill writes them, stopping at the first failed batch.
Every call gets the `HiCacheStorageExtraInfo` the controller builds: prefix keys only when the
server runs with `hicache_storage_pass_prefix_keys` (`prefix_keys=True`).

`Lockstep` is what the ranks of one server share: a barrier per request and the MIN all-reduce
of the hit query (`_sync_prefetch_hit_query`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE, HiCacheStorageExtraInfo
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from bench import sglang_server
from bench.bench_backend import host_pool

WRITE_BATCH_PAGES = 8
MODEL_NAME = "bench/cache-model"
# (layers, page tokens, kv heads, head dim): bf16 pages of 512 B (fast) and of 32 KiB (costs)
SMALL_PAGES = (1, 16, 1, 8)
COST_PAGES = (4, 16, 2, 32)

FORK = multiprocessing.get_context("fork")


def make_host_pool(geometry=SMALL_PAGES):
    """A real MHA host pool (page_first_direct, bf16) with room for one prefetch batch."""
    layers, page_tokens, heads, head_dim = geometry
    return host_pool(layers, page_tokens, heads, head_dim, STORAGE_BATCH_SIZE)


def geometry_page_bytes(geometry) -> int:
    """Bytes of one bf16 MHA page (K and V) of a (layers, page tokens, heads, head dim)."""
    layers, page_tokens, heads, head_dim = geometry
    return 2 * layers * page_tokens * heads * head_dim * 2


def page_bytes_of(host) -> int:
    page = host.get_data_page(0, flat=True)
    return page.numel() * page.element_size()


def open_galahad(root, host, *, max_bytes: int | None, tp_rank=0, tp_size=1, **options):
    """GalahadStorage as a server loads it (`dynamic`, interface_v1), host pool registered."""
    extra = sglang_server.galahad_config(
        root, interface_v1=1, model_fingerprint="bench-cache", max_bytes=max_bytes, **options
    )
    config = sglang_server.storage_config(
        extra, model_name=MODEL_NAME, tp_rank=tp_rank, tp_size=tp_size
    )
    backend = StorageBackendFactory.create_backend("dynamic", config, host)
    backend.register_mem_pool_host(host)
    return backend


def open_hicache_file(
    directory, host, *, max_size_bytes: int, tp_rank=0, tp_size=1, eviction_ratio=None
):
    """SGLang's HiCacheFile (`file`) with its LRU evictor capped at `max_size_bytes` per rank
    (once over the cap it evicts down to `eviction_ratio` of it: 0.9 unless given)."""
    os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
    extra = {"file_storage_path": str(directory), "max_size": int(max_size_bytes)}
    if eviction_ratio is not None:
        extra["eviction_ratio"] = eviction_ratio
    config = sglang_server.storage_config(
        extra, model_name=MODEL_NAME, tp_rank=tp_rank, tp_size=tp_size
    )
    backend = StorageBackendFactory.create_backend("file", config, host)
    backend.register_mem_pool_host(host)
    return backend


def galahad_record_bytes(work, host, **options) -> int:
    """Bytes one page's record takes on disk (header, key echo, payload), measured."""
    root = Path(work, "record-size-probe")
    backend = open_galahad(root, host, max_bytes=None, **options)
    try:
        Client(backend, host, zero_copy=True).write(["0" * 64])
    finally:
        backend.close()
    sizes = [path.stat().st_size for path in root.glob("ns/*/*.rec")]
    assert len(sizes) == 1, sizes
    return sizes[0]


class Client:
    """One rank's backend, called as SGLang's cache controller calls it."""

    def __init__(self, backend, host, *, zero_copy: bool, prefix_keys: bool = False):
        self.backend = backend
        self.host = host
        self.zero_copy = zero_copy
        self.prefix_keys = prefix_keys
        self.page_tokens = host.page_size

    def _extra(self, prefix: Sequence[str]) -> HiCacheStorageExtraInfo:
        return HiCacheStorageExtraInfo(prefix_keys=list(prefix) if self.prefix_keys else None)

    def _slots(self, pages: int) -> torch.Tensor:
        return torch.arange(pages * self.page_tokens, dtype=torch.int64)

    def leading_run(self, keys: Sequence[str]) -> int:
        """Pages of `keys`, from the first, that the backend reports (the hit query)."""
        hit = 0
        for start in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = list(keys[start : start + STORAGE_BATCH_SIZE])
            found = self.backend.batch_exists(batch, self._extra(keys[:start]))
            hit += found
            if found < len(batch):
                break
        return hit

    def read(self, keys: Sequence[str]) -> int:
        """Reads `keys` into host memory batch by batch; the pages read before the first miss."""
        done = 0
        for start in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = list(keys[start : start + STORAGE_BATCH_SIZE])
            if self.zero_copy:
                results = self.backend.batch_get_v1(
                    batch, self._slots(len(batch)), self._extra(keys[:start])
                )
                got = leading_true(results)
            else:
                dummies = [self.host.get_dummy_flat_data_page() for _ in batch]
                pages = self.backend.batch_get(batch, dummies) or [None] * len(batch)
                got = leading_true(page is not None for page in pages)
                for index in range(got):
                    self.host.set_from_flat_data_page(index * self.page_tokens, pages[index])
            done += got
            if got < len(batch):
                break
        return done

    def write(self, keys: Sequence[str], restored: int = 0) -> int:
        """Backs up keys[restored:] (the pages a prefill computed) in batches of 8 pages; the
        pages written before the first batch that failed."""
        written = 0
        for start in range(restored, len(keys), WRITE_BATCH_PAGES):
            batch = list(keys[start : start + WRITE_BATCH_PAGES])
            if self.zero_copy:
                ok = all(
                    self.backend.batch_set_v1(
                        batch, self._slots(len(batch)), self._extra(keys[:start])
                    )
                )
            else:
                values = [
                    self.host.get_data_page(index * self.page_tokens) for index in range(len(batch))
                ]
                ok = bool(self.backend.batch_set(batch, values))
            if not ok:
                break
            written += len(batch)
        return written


def leading_true(flags) -> int:
    count = 0
    for flag in flags:
        if not flag:
            break
        count += 1
    return count


class Lockstep:
    """What the ranks of one server share: a barrier, and the MIN all-reduce of a hit count."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self._barrier = FORK.Barrier(ranks)
        self._values = FORK.Array("q", ranks, lock=False)

    def wait(self) -> None:
        if self.ranks > 1:
            self._barrier.wait()

    def abort(self) -> None:
        """Breaks the barrier: every rank waiting on it (and any that comes) raises."""
        self._barrier.abort()

    def min(self, rank: int, value: int) -> int:
        if self.ranks == 1:
            return value
        self._values[rank] = value
        self._barrier.wait()
        smallest = min(self._values[:])
        self._barrier.wait()  # nobody writes the next value before everyone has read this one
        return smallest


def run_ranks(ranks: int, job: Callable[[int, Lockstep], object], timeout_s=1800) -> list:
    """job(rank, lockstep) in one forked process per rank; their results in rank order. The
    parent never opens a store, so no store thread is ever forked."""
    lockstep = Lockstep(ranks)
    results = FORK.Queue()

    def child(rank: int) -> None:
        logging.disable(logging.WARNING)
        torch.set_num_threads(1)
        try:
            results.put((rank, True, job(rank, lockstep)))
        except BaseException:  # reported to the parent, which fails loudly
            results.put((rank, False, traceback.format_exc()))
            lockstep.abort()

    processes = [FORK.Process(target=child, args=(rank,), daemon=True) for rank in range(ranks)]
    for process in processes:
        process.start()
    gathered = {}
    deadline_s = time.monotonic() + timeout_s
    try:
        while len(gathered) < ranks:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [
                    r for r, p in enumerate(processes) if r not in gathered and not p.is_alive()
                ]
                if dead and results.empty():
                    time.sleep(2.0)  # a result put just before its process exited is in the pipe
                if (dead and results.empty()) or time.monotonic() > deadline_s:
                    lockstep.abort()
                    raise RuntimeError(f"ranks {dead} died, or ran past {timeout_s} s") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            gathered[rank] = value
    finally:
        for process in processes:
            process.join(timeout=60 if len(gathered) == ranks else 5)
            if process.is_alive():
                process.kill()
                process.join()
    return [gathered[rank] for rank in range(ranks)]
