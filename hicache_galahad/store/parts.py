"""StoreParts: the components of one open store, built in the order they need each other.

The data path (record_store.RecordStore) and the operator's verbs (admin.StoreAdmin) work
over the same parts: the layout, the codec, the accounting (ledger, eviction, quarantine),
the pins, the budget, the reader, the writer with its flusher and I/O threads, the checker,
the namespaces served and this process's persisted counters. Each component gets what it
needs (the shared StoreContext among it) in its constructor; `close` ends them in reverse.
"""

from __future__ import annotations

import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from ..config.options import StoreOptions
from ..record import format as fmt
from ..record.codec import RecordCodec
from ..record.crypto import load_master_key
from ..telemetry.metrics import Counters, RateLimitedLog
from .accounting import Accounting
from .budget import Budget
from .checker import Checker
from .context import StoreContext
from .eviction import RecentReads
from .flusher import Flusher
from .layout import StoreLayout
from .lifetime import CounterFile, live_settings
from .namespaces import NamespaceRegistry
from .pins import CachedCounts, Pins
from .reader import RecordReader
from .writer import RecordWriter

log = logging.getLogger("hicache_galahad.store")


class StoreParts:
    def __init__(self, options: StoreOptions):
        self.options = options
        read_only = options.read_only
        layout = StoreLayout(options.root)
        layout.prepare(read_only=read_only, min_free_bytes=options.min_free_bytes)
        self.layout = layout
        self.counters = Counters()
        self.context = StoreContext(layout, self.counters, RateLimitedLog(log), options)
        master_key = (
            load_master_key(options.encryption_key_file) if options.encryption_key_file else None
        )
        self.codec = RecordCodec(
            digest_alg={name: alg for alg, name in fmt.DIGEST_NAMES.items()}[options.digest],
            compression=options.compression,
            zstd_level=options.zstd_level,
            master_key=master_key,
            allow_unverified=options.allow_unverified,
        )
        self.recent_reads = RecentReads()  # every read, for the shared eviction order
        # The pinned bytes as last written (what eviction may not take) need only the root.
        self.pinned = CachedCounts(self.context)
        self.accounting = Accounting(
            self.context,
            recent_reads=self.recent_reads,
            pinned_bytes=self.pinned.total_bytes,
            # A read that quarantines a pinned record never waits for the pins lock. (The
            # pins come next: they link records under the accounting's ledger.)
            on_quarantined=lambda d, f: self.drop_pins(d, [f], wait=False),
        )
        self.pins = Pins(  # store/pins/: records eviction keeps
            self.context,
            self.accounting.ledger,
            token=self.accounting.token,
            counts=self.pinned,
            live_limits=lambda: [s.get("max_pinned_bytes") for s in self.live_settings()],
        )
        self.budget = Budget(
            self.accounting.ledger,
            self.accounting.index,
            self.accounting,
            max_bytes=options.max_bytes,
            min_free_bytes=options.min_free_bytes,
            free_bytes=lambda: self._free_bytes(),  # looked up per call (tests replace it)
            rebuild=self.accounting.repair.rebuild_if_due,
            reclaim=self.accounting.repair.reclaim_dead,
            on_event=self.counters.add,
            pinned_bytes=self.pinned.total_bytes,
        )
        self.reader = RecordReader(self.context, self.codec, recent_reads=self.recent_reads)
        deferred = options.durability == "deferred" and not read_only
        self.flusher = Flusher(options.flush_interval_s, self.counters) if deferred else None
        self.pool = ThreadPoolExecutor(options.io_threads, thread_name_prefix="galahad-io")
        self.writer = RecordWriter(
            self.context,
            self.codec,
            self.reader,
            self.budget,
            self.accounting.quarantine,
            self.accounting.index,
            self.parallel,
            writer_token=self.accounting.token,
            flusher=self.flusher,
        )
        self.checker = Checker(
            self.context,
            self.reader,
            self.accounting.quarantine,
            rebuild_ledger=self.accounting.repair.rebuild,
            read_ledger=self.accounting.ledger.committed,
            disk_bytes=self.accounting.repair.disk_bytes,
            is_alive=self.accounting.repair.is_alive,
        )
        self.namespaces = NamespaceRegistry(self.context)
        self._counter_file = None
        if not read_only:
            self._counter_file = CounterFile(
                options.root,
                self.accounting.token,
                self.accounting.repair.is_alive,
                self._settings(),
                self.counters.snapshot,
            )
            self.accounting.repair.open_scan()

    def _settings(self) -> dict:
        options = self.options
        return {
            "pid": os.getpid(),
            "max_bytes": options.max_bytes,
            "max_pinned_bytes": options.pin_limit_bytes,
            "min_free_bytes": options.min_free_bytes,
            "compression": options.compression,
            "encrypted": options.encryption_key_file is not None,
            "digest": options.digest,
            "durability": options.durability,
        }

    def _free_bytes(self) -> int:
        stats = os.statvfs(self.options.root)
        return stats.f_bavail * stats.f_frsize

    def live_settings(self) -> list[dict]:
        """The settings of the processes alive on this root (lifetime.live_settings)."""
        return live_settings(self.options.root, self.accounting.repair.is_alive)

    def drop_pins(self, dirname: str, filenames: list[str] | None, *, wait: bool = True) -> None:
        """Drops the pins of records of `filenames` (None: any) that left namespace
        `dirname` (deleted, purged, quarantined), in one locked change per batch, so no bytes
        stay held and counted for them. Without `wait`, deferred when the pins lock is busy
        (pins.stale.DeferredDrops)."""
        try:
            self.pins.drop_stale(dirname, filenames, wait=wait)
        except OSError as error:  # the pin stays until unpinned (or dropped next time)
            self.counters.add("io_errors")
            self.context.warn.warning("pin-drop", "galahad: a pin of %s stays: %s", dirname, error)
        except Exception as error:  # never raised into a caller
            self.context.bug("pin-drop-bug", "pin drop", error)

    def parallel(self, work, count: int) -> list:
        """Runs work(i) for i in range(count) over the I/O threads in contiguous slices."""
        if count == 0:
            return []
        slices = min(self.options.io_threads, count)
        if slices == 1:
            return [work(index) for index in range(count)]
        bounds = [count * part // slices for part in range(slices + 1)]

        def run_slice(part):
            return [work(index) for index in range(bounds[part], bounds[part + 1])]

        results = []
        for slice_results in self.pool.map(run_slice, range(slices)):
            results.extend(slice_results)
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self.flusher is not None:
            self.flusher.close()
        self.pins.close()
        with contextlib.suppress(OSError):
            self.budget.settle(0, 0)  # what the ledger refused earlier, if anything
        self.accounting.close()
        self.layout.close()
