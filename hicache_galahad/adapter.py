"""GalahadStorage: the SGLang HiCache storage backend over RecordStore.

Loaded by SGLang with `--hicache-storage-backend dynamic` and the extra config
`{"backend_name": "galahad", "module_path": "hicache_galahad", "class_name": "GalahadStorage",
...}` (docs/CONFIG.md). SGLang calls it from its prefetch and backup threads concurrently, one
instance per rank. An exception in those threads would disable storage for the life of the
process, so every I/O method here turns every failure into a miss or a False.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    PoolHitPolicy,
    PoolName,
    PoolTransferResult,
)

from checkpoint.policy import trailing_pages_hits

from .config import parse_options
from .fingerprint import resolve_fingerprint
from .metrics import RateLimitedLog
from .namespace import Namespace
from .pages import PageLayout, describe_pool
from .store import RecordStore

log = logging.getLogger("hicache_galahad")

KV = str(PoolName.KV)
# Pools holding per-rank state that TP ranks never share, even for MLA models.
RANK_SHARDED_POOLS = frozenset({str(PoolName.MAMBA), str(PoolName.SWA)})


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a CPU tensor (a flat page), without a copy when it is contiguous."""
    return memoryview(tensor.detach().contiguous().view(torch.uint8).reshape(-1).numpy())


def _never_raise(fallback):
    """Turns any exception of an SGLang-facing method into `fallback(self, *args)`."""

    def decorate(method):
        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            if self._closed:
                # The store's file descriptors are closed and their numbers may already belong
                # to other files: never touch them again.
                return fallback(self, *args, **kwargs)
            try:
                return method(self, *args, **kwargs)
            except Exception as error:
                self._errors += 1
                self._warn.warning(
                    method.__name__,
                    "galahad: %s failed (%r); reporting a miss",
                    method.__name__,
                    error,
                )
                return fallback(self, *args, **kwargs)

        return guarded

    return decorate


def _page_bytes(binding, tensor: torch.Tensor) -> memoryview:
    """The bytes of a flat page given by the caller, refused unless it is exactly one page of
    the pool: the store takes a size mismatch for a damaged record and would quarantine a sound
    one (on a read) or publish a record no reader can use (on a write)."""
    data = _tensor_bytes(tensor)
    if data.nbytes != binding.page_bytes:
        raise ValueError(
            f"a flat page of {data.nbytes} bytes for pool {binding.name}, whose pages are "
            f"{binding.page_bytes} bytes"
        )
    return data


SERVING_DTYPE_ARGS = ("kv_cache_dtype", "mamba_ssm_dtype", "dtype")


def _server_args():
    """SGLang's server arguments in this (scheduler) process, or None outside a server."""
    try:
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except Exception:
        return None


def _keys_of(args, kwargs):
    return kwargs.get("keys", args[0] if args else [])


class _PoolBinding:
    """A registered host pool, its namespace and how to reach its pages' memory."""

    def __init__(self, name: str, pool, namespace: Namespace):
        self.name = name
        self.pool = pool
        self.namespace = namespace
        self.layout = PageLayout(pool)
        self.page_size = self.layout.page_size
        self.page_bytes = self.layout.page_bytes


class GalahadStorage(HiCacheStorage):
    """Persistent, verified HiCache L3 storage on local disk."""

    def __init__(self, storage_config, extra_kwargs=None):
        self._warn = RateLimitedLog(log)
        self._errors = 0
        self._closed = False
        self.storage_config = storage_config
        self.options = parse_options(getattr(storage_config, "extra_config", None))
        self.model_name = getattr(storage_config, "model_name", None) or ""
        server_args = _server_args()
        self.serving_dtypes = {
            name: str(getattr(server_args, name, None)) for name in SERVING_DTYPE_ARGS
        }
        model_path = getattr(server_args, "model_path", None)
        self.model_fingerprint = resolve_fingerprint(
            self.options.model_fingerprint,
            self.model_name if os.path.isdir(self.model_name) or not model_path else model_path,
        )
        self.store = RecordStore(self.options.root, **self.options.store_kwargs())
        self._bindings: dict[str, _PoolBinding] = {}
        self._bind_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._prefetch_pages: list[int] = []
        self._prefetch_gbps: list[float] = []
        self._backup_pages: list[int] = []
        self._backup_gbps: list[float] = []
        self.registered_pools = {}
        log.info(
            "galahad: store %s, tenant %r, model fingerprint %s, compression %s, encryption %s",
            self.options.root,
            self.options.tenant,
            self.model_fingerprint,
            self.options.compression,
            "on" if self.options.encryption_key_file else "off",
        )

    # ------------------------------------------------------------- registration

    def _parallel_coordinates(self, pool_name: str) -> dict:
        config = self.storage_config
        coordinates = {
            name: getattr(config, name, None)
            for name in (
                "tp_size",
                "pp_rank",
                "pp_size",
                "attn_cp_rank",
                "attn_cp_size",
                "dp_rank",
                "dcp_rank",
                "dcp_size",
                "logical_page_size",
                "tp_lcm_size",
                "should_split_heads",
                "is_mla_model",
            )
        }
        # MLA KV is replicated over TP ranks (rank 0 writes, all read); recurrent and
        # windowed state is always the rank's own shard.
        kv_replicated = bool(getattr(config, "is_mla_model", False)) and pool_name not in (
            RANK_SHARDED_POOLS
        )
        coordinates["tp_rank"] = None if kv_replicated else getattr(config, "tp_rank", 0)
        return coordinates

    def _bind(self, name: str, pool) -> _PoolBinding:
        with self._bind_lock:
            binding = self._bindings.get(name)
            if binding is not None and binding.pool is pool:
                return binding
            geometry = describe_pool(pool) | {
                "model_name": self.model_name,
                "parallel": self._parallel_coordinates(name),
                # Host pools keep fp8 KV as uint8: the server's dtype choices tell e4m3 from e5m2.
                "serving_dtypes": self.serving_dtypes,
            }
            if name != KV:
                # A state is only ever used together with KV pages of the KV namespace (SGLang
                # registers the KV pool first), and its value depends on how they were computed
                # (e.g. the KV dtype): tie it to that namespace, so that another KV geometry
                # never finds it (an existing state is never rewritten, so it would be kept).
                kv = self._bindings.get(KV)
                geometry["kv_namespace"] = kv.namespace.dirname if kv is not None else None
            namespace = self.store.register_namespace(
                Namespace(self.options.tenant, self.model_fingerprint, name, geometry)
            )
            binding = _PoolBinding(name, pool, namespace)
            self._bindings[name] = binding
            log.info(
                "galahad: pool %s bound to namespace %s (%d-byte pages, zero-copy %s)",
                name,
                namespace.dirname,
                binding.page_bytes,
                "on" if binding.layout.supported else "off",
            )
            return binding

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self._bind(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._bind(str(host_pool_name), host_pool)

    def _kv(self) -> _PoolBinding:
        binding = self._bindings.get(KV)
        if binding is None:
            raise RuntimeError("no KV host pool registered yet")
        return binding

    # ------------------------------------------------------------- generic KV path

    @_never_raise(lambda self, key, *args, **kwargs: False)
    def exists(self, key: str) -> bool:
        return self.store.contains(self._kv().namespace, key)

    @_never_raise(lambda self, *args, **kwargs: 0)
    def batch_exists(self, keys, extra_info=None) -> int:
        return self.store.leading_run(self._kv().namespace, keys)

    @_never_raise(lambda self, *args, **kwargs: None)
    def get(self, key, target_location=None, target_sizes=None):
        binding = self._kv()
        target = self._flat_target(binding, target_location)
        if self.store.get_into(binding.namespace, key, _page_bytes(binding, target)):
            return target
        return None

    @_never_raise(lambda self, *args, **kwargs: [None] * len(_keys_of(args, kwargs)))
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        binding = self._kv()
        if target_locations is None:
            target_locations = [None] * len(keys)
        targets = [self._flat_target(binding, target) for target in target_locations]
        start_s = time.perf_counter()
        results = self.store.get_many_into(
            binding.namespace, list(keys), [_page_bytes(binding, target) for target in targets]
        )
        self._record("prefetch", results, binding.page_bytes, start_s)
        return [target if ok else None for target, ok in zip(targets, results, strict=True)]

    @staticmethod
    def _flat_target(binding: _PoolBinding, target):
        if target is None:
            return binding.pool.get_dummy_flat_data_page()
        if not target.is_contiguous() or target.device.type != "cpu":
            raise ValueError("target page must be a contiguous CPU tensor")
        return target

    @_never_raise(lambda self, *args, **kwargs: False)
    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        if value is None:
            return False
        binding = self._kv()
        return self.store.put(binding.namespace, key, _page_bytes(binding, value))

    @_never_raise(lambda self, *args, **kwargs: False)
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        if values is None or len(values) != len(keys):
            return False
        binding = self._kv()
        start_s = time.perf_counter()
        results = self.store.put_many(
            binding.namespace, list(keys), [_page_bytes(binding, value) for value in values]
        )
        self._record("backup", results, binding.page_bytes, start_s)
        return all(results)

    # ------------------------------------------------------------- zero-copy KV path (v1)

    @_never_raise(lambda self, keys, *args, **kwargs: [False] * len(keys))
    def batch_get_v1(self, keys, host_indices, extra_info=None):
        return self._pages_io(self._kv(), list(keys), host_indices, write=False)

    @_never_raise(lambda self, keys, *args, **kwargs: [False] * len(keys))
    def batch_set_v1(self, keys, host_indices, extra_info=None):
        return self._pages_io(self._kv(), list(keys), host_indices, write=True)

    def _pages_io(self, binding: _PoolBinding, keys, host_indices, *, write: bool):
        """Moves pages between records and the host pool slots named by host_indices."""
        if host_indices is None or host_indices.numel() != len(keys) * binding.page_size:
            self._warn.warning(
                "indices",
                "galahad: %d host indices for %d pages of %d tokens (pool %s): refused",
                0 if host_indices is None else host_indices.numel(),
                len(keys),
                binding.page_size,
                binding.name,
            )
            return [False] * len(keys)
        starts = host_indices[:: binding.page_size].tolist()
        start_s = time.perf_counter()
        if binding.layout.supported:
            buffers = [binding.layout.segments(start) for start in starts]
            if write:
                results = self.store.put_many(binding.namespace, keys, buffers)
            else:
                results = self.store.get_many_into(binding.namespace, keys, buffers)
        elif write:
            pages = [
                _tensor_bytes(binding.pool.get_data_page(start, flat=True)) for start in starts
            ]
            results = self.store.put_many(binding.namespace, keys, pages)
        else:
            targets = [binding.pool.get_dummy_flat_data_page() for _ in starts]
            results = self.store.get_many_into(
                binding.namespace, keys, [_tensor_bytes(target) for target in targets]
            )
            for start, target, ok in zip(starts, targets, results, strict=True):
                if ok:
                    binding.pool.set_from_flat_data_page(start, target)
        self._record("backup" if write else "prefetch", results, binding.page_bytes, start_s)
        return results

    # ------------------------------------------------------------- pools (v2)

    def _binding_for(self, name) -> _PoolBinding | None:
        binding = self._bindings.get(str(name))
        if binding is None:
            pool = getattr(self, "registered_pools", {}).get(name)
            if pool is not None:
                binding = self._bind(str(name), pool)
        return binding

    @_never_raise(lambda self, *args, **kwargs: PoolTransferResult(0, {}, []))
    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        keys = list(keys)
        kv_pages = self.store.leading_run(self._kv().namespace, keys)
        hit_pages = {KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if not restorable:
                break
            name = str(transfer.name)
            binding = self._binding_for(transfer.name)
            if binding is None:
                pool_restorable = set()
            elif transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                present = self.store.leading_run(binding.namespace, keys[:kv_pages])
                pool_restorable = set(range(1, present + 1))
            elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(transfer.keys) if transfer.keys else 1)
                pool_restorable = self._trailing_restorable(binding, keys, kv_pages, window)
            else:
                # A policy this backend does not implement is a miss, never a guess.
                pool_restorable = set()
            boundary = max(pool_restorable, default=0)
            if boundary:
                hit_pages[name] = boundary
            restorable = [length for length in restorable if length in pool_restorable]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit_pages, restorable)

    def _trailing_restorable(self, binding, keys, kv_pages: int, window: int) -> set[int]:
        """Prefix lengths whose last `window` pages all have this pool's record; the deepest
        candidate is read and verified in full, and damaged ones (quarantined by the read) drop
        out until an intact one is found, so the boundary snaps back to an intact state."""
        present = [self.store.contains(binding.namespace, key) for key in keys[:kv_pages]]
        restorable = set(
            trailing_pages_hits(kv_pages, present.__getitem__, window).restorable_prefix_pages
        )
        for length in sorted(restorable, reverse=True):
            window_keys = keys[max(0, length - window) : length]
            intact = all(
                self.store.verify(binding.namespace, key, binding.page_bytes) for key in window_keys
            )
            if intact:
                break
            restorable.discard(length)
        return restorable

    @_never_raise(
        lambda self, transfers, *args, **kwargs: {
            str(t.name): [False] * len(t.keys or []) for t in transfers
        }
    )
    def batch_get_v2(self, transfers, extra_info=None):
        return self._transfers_io(transfers, write=False)

    @_never_raise(
        lambda self, transfers, *args, **kwargs: {
            str(t.name): [False] * len(t.keys or []) for t in transfers
        }
    )
    def batch_set_v2(self, transfers, extra_info=None):
        return self._transfers_io(transfers, write=True)

    def _transfers_io(self, transfers, *, write: bool) -> dict:
        results = {}
        for transfer in transfers:
            keys = list(transfer.keys or [])
            binding = self._binding_for(transfer.name)
            if binding is None:
                results[str(transfer.name)] = [False] * len(keys)
                continue
            try:
                results[str(transfer.name)] = self._pages_io(
                    binding, keys, transfer.host_indices, write=write
                )
            except Exception as error:
                self._errors += 1
                self._warn.warning(
                    "transfer", "galahad: %s transfer failed: %r", binding.name, error
                )
                results[str(transfer.name)] = [False] * len(keys)
        return results

    # ------------------------------------------------------------- admin

    @_never_raise(lambda self, *args, **kwargs: None)
    def clear(self) -> None:
        """Removes this instance's records only (its namespaces), never another model's,
        tenant's or rank's."""
        for binding in list(self._bindings.values()):
            self.store.clear_namespace(binding.namespace)

    def _record(self, direction: str, results, page_bytes: int, start_s: float) -> None:
        pages = sum(1 for ok in results if ok)
        if not pages or not getattr(self.storage_config, "enable_storage_metrics", False):
            return
        elapsed_s = max(time.perf_counter() - start_s, 1e-9)
        with self._stats_lock:
            if direction == "prefetch":
                self._prefetch_pages.append(pages)
                self._prefetch_gbps.append(pages * page_bytes / elapsed_s / 1e9)
            else:
                self._backup_pages.append(pages)
                self._backup_gbps.append(pages * page_bytes / elapsed_s / 1e9)

    @_never_raise(lambda self, *args, **kwargs: None)
    def get_stats(self):
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._stats_lock:
            metrics = StorageMetrics(
                prefetch_pgs=self._prefetch_pages,
                backup_pgs=self._backup_pages,
                prefetch_bandwidth=self._prefetch_gbps,
                backup_bandwidth=self._backup_gbps,
            )
            self._prefetch_pages, self._backup_pages = [], []
            self._prefetch_gbps, self._backup_gbps = [], []
        return metrics

    def stats(self) -> dict:
        """The store's counters plus this adapter's caught-exception count."""
        return self.store.stats() | {"adapter_errors": self._errors}

    def close(self) -> None:
        self._closed = True
        try:
            self.store.close()
        except Exception as error:
            self._warn.warning("close", "galahad: close failed: %r", error)
