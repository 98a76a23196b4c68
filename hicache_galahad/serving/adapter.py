"""GalahadStorage: the SGLang HiCache storage backend over RecordStore.

Loaded by SGLang with `--hicache-storage-backend dynamic` and the extra config
`{"backend_name": "galahad", "module_path": "hicache_galahad", "class_name": "GalahadStorage",
...}` (docs/CONFIG.md). SGLang calls it from its prefetch and backup threads concurrently, one
instance per rank. SGLang 0.5.23 catches an exception from a backend call, logs it and counts
the whole query or batch as missed (older releases lost the storage thread itself), so every
method SGLang calls runs under `_never_raise`: any failure, including a malformed argument,
becomes a miss or a False of the right length, for the pages concerned only.

The work is done elsewhere: binding.py (pools to namespaces), transfer.py (pages to and from
host memory), checkpoint/hits.py (how much of a hybrid prompt can be restored), startup.py
(SGLang's storage-key hash made ready while the backend is constructed), and the store it holds
(store/record_store.py, or tier/tiered.py with the shared tier).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolHitPolicy, PoolTransferResult

from checkpoint.hits import ALL_PAGES, TRAILING_PAGES, PoolQuery, combine_pool_hits

from ..config.fingerprint import resolve_fingerprint
from ..config.options import parse_options
from ..errors import RefusedRequest
from ..store import RecordStore
from ..store.kvstore import KVStore, StoreStats
from ..store.order_stats import OrderFigureCache
from ..telemetry.exporter import Exporter
from ..telemetry.metrics import Counters, RateLimitedLog, count_bug
from .binding import KV, Binder, server_args
from .startup import KeyHashWarmup
from .transfer import PageTransfer, exact_page_bytes, flat_target

log = logging.getLogger("hicache_galahad")

_POLICIES = {PoolHitPolicy.ALL_PAGES: ALL_PAGES, PoolHitPolicy.TRAILING_PAGES: TRAILING_PAGES}


# ----------------------------------------------------------------------------- fallbacks
# Each is total: whatever SGLang passed, it returns a value of the shape SGLang expects.


def _size(value) -> int:
    try:
        return len(value)
    except Exception:
        return 0


def _keys_arg(args, kwargs):
    return kwargs.get("keys", args[0] if args else None)


def _falses(*args, **kwargs) -> list:
    return [False] * _size(_keys_arg(args, kwargs))


def _nones(*args, **kwargs) -> list:
    return [None] * _size(_keys_arg(args, kwargs))


def _false(*args, **kwargs) -> bool:
    return False


def _none(*args, **kwargs):
    return None


def _zero(*args, **kwargs) -> int:
    return 0


def _no_pool_hits(*args, **kwargs):
    return PoolTransferResult(0, {}, [])


def _pool_falses(*args, **kwargs) -> dict:
    results = {}
    try:
        for transfer in kwargs.get("transfers", args[0] if args else None) or []:
            results[str(transfer.name)] = [False] * _size(transfer.keys)
    except Exception:
        pass
    return results


def _never_raise(fallback):
    """Runs an SGLang-facing method; any exception becomes `fallback(*args, **kwargs)`."""

    def decorate(method):
        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            try:
                if not self._closed:
                    # Once closed, the store's descriptors are closed and their numbers may
                    # already belong to other files: never touch them again.
                    return method(self, *args, **kwargs)
            except Exception as error:
                self._caught(method.__name__, error, f"{method.__name__} failed")
            return fallback(*args, **kwargs)

        return guarded

    return decorate


class GalahadStorage(HiCacheStorage):
    """Persistent, verified HiCache L3 storage on local disk."""

    def _local_store(self) -> RecordStore:
        """The store on the local disk (under a Mooncake tier: its local store)."""
        return getattr(self.store, "local", self.store)

    def _order_figures_failed(self, error: Exception) -> None:
        count_bug(self.counters, self._warn, "order-figures", "galahad: %r", error)

    def _caught(self, where: str, error: Exception, what: str) -> None:
        """The one guard of every SGLang-facing call: an exception becomes a miss, counted in
        `adapter_errors`; a refused argument (RefusedRequest) is warned about in a line, any
        other exception is a bug, counted in `unexpected_errors` with its traceback."""
        self.counters.add("adapter_errors")
        if isinstance(error, RefusedRequest):
            self._warn.warning(f"{where}-refused", "galahad: %s: %s; a miss", what, error)
            return
        count_bug(self.counters, self._warn, where, "galahad: %s (%r); a miss", what, error)

    def __init__(self, storage_config, extra_kwargs=None):
        # SGLang's key hash is built/loaded while the store opens; the constructor returns
        # only once it is ready (or its bound passed), before the scheduler reports ready.
        key_hash = KeyHashWarmup(log).start()
        self._warn = RateLimitedLog(log)
        self.counters = Counters()
        self._closed = False
        self.storage_config = storage_config
        self.options = parse_options(getattr(storage_config, "extra_config", None))
        self.model_name = getattr(storage_config, "model_name", None) or ""
        model_path = getattr(server_args(), "model_path", None)
        self.model_fingerprint = resolve_fingerprint(
            self.options.model_fingerprint,
            self.model_name if os.path.isdir(self.model_name) or not model_path else model_path,
        )
        self.store: KVStore = RecordStore(self.options.store)
        if self.options.mooncake is not None:
            from ..tier.mooncake.tier import MooncakeTier
            from ..tier.tiered import TieredStore

            self.store = TieredStore(self.store, MooncakeTier(self.options.mooncake, log))
        self.counters = self.store.counters  # one set of counters: persisted and exported
        self.exporter = (
            Exporter(self.options.tenant)
            if getattr(storage_config, "enable_storage_metrics", False)
            else None
        )
        self._order_figures = (
            OrderFigureCache(self._local_store().layout, self._order_figures_failed)
            if self.exporter is not None
            else None
        )
        self.binder = Binder(
            self.store,
            tenant=self.options.tenant,
            model_fingerprint=self.model_fingerprint,
            model_name=self.model_name,
            storage_config=storage_config,
        )
        self.transfer = PageTransfer(self.store, self._warn, self._record_batch)
        self._stats_lock = threading.Lock()
        self._batches: dict[str, tuple[list[int], list[float]]] = {
            "prefetch": ([], []),
            "backup": ([], []),
        }
        self.registered_pools = {}
        log.info(
            "galahad: store %s, tenant %r, model fingerprint %s, compression %s, encryption %s",
            self.store.root,
            self.options.tenant,
            self.model_fingerprint,
            self.options.store.compression,
            "on" if self.options.store.encryption_key_file else "off",
        )
        self.key_hash_startup = key_hash.wait()

    # ------------------------------------------------------------- registration

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self.binder.bind(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self.binder.bind(str(host_pool_name), host_pool)

    # ------------------------------------------------------------- generic KV path

    @_never_raise(_false)
    def exists(self, key: str) -> bool:
        return self.store.contains(self.binder.kv().namespace, key)

    @_never_raise(_zero)
    def batch_exists(self, keys, extra_info=None) -> int:
        return self.store.leading_run(self.binder.kv().namespace, list(keys))

    @_never_raise(_none)
    def get(self, key, target_location=None, target_sizes=None):
        binding = self.binder.kv()
        target = flat_target(binding, target_location)
        if self.store.get_into(binding.namespace, key, exact_page_bytes(binding, target)):
            return target
        return None

    @_never_raise(_nones)
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        binding = self.binder.kv()
        keys = list(keys)
        if target_locations is None:
            target_locations = [None] * len(keys)
        targets = [flat_target(binding, target) for target in target_locations]
        start_s = time.perf_counter()
        results = self.store.get_many_into(
            binding.namespace, keys, [exact_page_bytes(binding, target) for target in targets]
        )
        self._record_batch("prefetch", results, binding.page_bytes, start_s)
        return [target if ok else None for target, ok in zip(targets, results, strict=True)]

    @_never_raise(_false)
    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        if value is None:
            return False
        binding = self.binder.kv()
        return self.store.put(binding.namespace, key, exact_page_bytes(binding, value))

    @_never_raise(_false)
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        keys = list(keys)
        if values is None or len(values) != len(keys):
            return False
        binding = self.binder.kv()
        start_s = time.perf_counter()
        results = self.store.put_many(
            binding.namespace, keys, [exact_page_bytes(binding, value) for value in values]
        )
        self._record_batch("backup", results, binding.page_bytes, start_s)
        return all(results)

    # ------------------------------------------------------------- zero-copy KV path (v1)

    @_never_raise(_falses)
    def batch_get_v1(self, keys, host_indices, extra_info=None):
        return self.transfer.pages_io(self.binder.kv(), list(keys), host_indices, write=False)

    @_never_raise(_falses)
    def batch_set_v1(self, keys, host_indices, extra_info=None):
        return self.transfer.pages_io(self.binder.kv(), list(keys), host_indices, write=True)

    # ------------------------------------------------------------- pools (v2)

    @_never_raise(_no_pool_hits)
    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        keys = list(keys)
        kv_pages = self.store.leading_run(self.binder.kv().namespace, keys)
        queries = [self._pool_query(transfer, keys) for transfer in pool_transfers or []]
        hits = combine_pool_hits(KV, kv_pages, queries)
        return PoolTransferResult(hits.hit_pages, hits.pool_hit_pages, hits.restorable_prefix_pages)

    def _pool_query(self, transfer, keys: list) -> PoolQuery:
        name = str(transfer.name)
        binding = self.binder.get(transfer.name, self.registered_pools)
        if binding is None:
            return PoolQuery(name, "unbound", 0, lambda page: False)
        window = max(1, len(transfer.keys) if transfer.keys else 1)
        store, namespace = self.store, binding.namespace

        def is_intact(prefix_pages: int) -> bool:
            window_keys = keys[max(0, prefix_pages - window) : prefix_pages]
            return all(store.verify(namespace, key, binding.page_bytes) for key in window_keys)

        return PoolQuery(
            name,
            _POLICIES.get(transfer.hit_policy, str(transfer.hit_policy)),
            window,
            lambda page: store.contains(namespace, keys[page]),
            is_intact,
        )

    @_never_raise(_pool_falses)
    def batch_get_v2(self, transfers, extra_info=None):
        return self._transfers_io(transfers, write=False)

    @_never_raise(_pool_falses)
    def batch_set_v2(self, transfers, extra_info=None):
        return self._transfers_io(transfers, write=True)

    def _transfers_io(self, transfers, *, write: bool) -> dict:
        results = {}
        for transfer in transfers:
            name, keys = str(transfer.name), list(transfer.keys or [])
            try:
                binding = self.binder.get(transfer.name, self.registered_pools)
                results[name] = (
                    self.transfer.pages_io(binding, keys, transfer.host_indices, write=write)
                    if binding is not None
                    else [False] * len(keys)
                )
            except Exception as error:  # one pool's failure never fails the others
                self._caught("transfer", error, f"{name} transfer failed")
                results[name] = [False] * len(keys)
        return results

    # ------------------------------------------------------------- admin

    @_never_raise(_none)
    def clear(self) -> None:
        """Removes this instance's records only (its namespaces), never another model's,
        tenant's or rank's."""
        for binding in list(self.binder.bindings.values()):
            self.store.clear_namespace(binding.namespace)

    def _record_batch(self, direction: str, results, page_bytes: int, start_s: float) -> None:
        if self.exporter is None:
            return
        elapsed_s = max(time.perf_counter() - start_s, 1e-9)
        self.exporter.observe_batch(direction, elapsed_s)
        pages = sum(1 for ok in results if ok)
        if not pages:
            return
        with self._stats_lock:
            page_counts, gbps = self._batches[direction]
            page_counts.append(pages)
            gbps.append(pages * page_bytes / elapsed_s / 1e9)

    @_never_raise(_none)
    def get_stats(self):
        from sglang.srt.observability.metrics_collector import StorageMetrics

        if self.exporter is not None:
            self.exporter.sync(self.store.counters.snapshot())
            pinned = self.store.pinned_bytes_by_tenant(cached=True)  # one stat
            self.exporter.set_pinned_bytes(pinned.get(self.options.tenant, 0))
            figures = self._order_figures.latest()  # refreshed on a thread of its own
            self.exporter.set_eviction_order(
                figures.as_dict() if figures is not None else None,
                self._local_store().accounting.order.reaper.pending_bytes,
            )
        with self._stats_lock:
            (prefetch_pages, prefetch_gbps), (backup_pages, backup_gbps) = (
                self._batches["prefetch"],
                self._batches["backup"],
            )
            self._batches = {"prefetch": ([], []), "backup": ([], [])}
        return StorageMetrics(
            prefetch_pgs=prefetch_pages,
            backup_pgs=backup_pages,
            prefetch_bandwidth=prefetch_gbps,
            backup_bandwidth=backup_gbps,
        )

    def stats(self) -> StoreStats:
        """The store's stats, its counters including this adapter's caught exceptions
        (adapter_errors, shown from the start)."""
        stats = self.store.stats()
        return dataclasses.replace(stats, counters={"adapter_errors": 0} | dict(stats.counters))

    def close(self) -> None:
        self._closed = True
        try:
            self.store.close()
        except Exception as error:
            self._warn.warning("close", "galahad: close failed: %r", error)
