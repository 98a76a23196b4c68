"""Keeping the byte ledger true, and deleting records so that it stays true.

`Accounting` owns what the budget (budget.py) relies on: the shared ledger, this process's
liveness lock, the LRU index of records, and every deletion of a record or a quarantined file
(each releases exactly the bytes it freed). It recounts the ledger from disk when it is
opened, when the ledger is found damaged or replaced, and when the ledger claims more than the
disk explains (rate-limited); it takes back the reservations of processes that died (their
lock file is free) before any eviction. It is also the budget's Evictor.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from ..errors import ConfigError
from ..telemetry.metrics import Counters, RateLimitedLog
from .eviction import LruIndex
from .layout import StoreLayout, is_record_name, temp_is_stale
from .ledger import PROCS_DIR, Ledger, ProcessLock, token_alive
from .lifetime import retire
from .quarantine import Quarantine

LEDGER_REBUILD_INTERVAL_S = 10.0
RECLAIM_INTERVAL_S = 1.0


class Accounting:
    def __init__(
        self,
        layout: StoreLayout,
        *,
        read_only: bool,
        counters: Counters,
        warn: RateLimitedLog,
    ):
        self.layout = layout
        self.read_only = read_only
        self.counters = counters
        self._warn = warn
        self.index = LruIndex()
        self.process = None
        try:
            self.process = None if read_only else ProcessLock(layout.root)
            self.ledger = Ledger(layout.ledger_path, self.process, read_only=read_only)
        except OSError as error:  # e.g. a directory where the ledger is
            if self.process is not None:
                self.process.close()
            raise ConfigError(
                f"hicache_galahad option 'root': {layout.root!r} cannot hold a store: its "
                f"ledger or process lock cannot be opened ({error}); expected a store root "
                "whose `ledger` is a regular file"
            ) from error
        self.quarantine = Quarantine(layout.quarantine_dir, self.ledger, self.index, counters)
        self.ledger.recount = self.disk_bytes
        self._last_rebuild_s = -1e9
        self._last_reclaim_s = -1e9
        self._rebuild_lock = threading.Lock()

    @property
    def token(self) -> str:
        return self.process.token if self.process is not None else "readonly"

    # ------------------------------------------------------------- scans

    def unreadable_dir(self, path: str, error: OSError) -> None:
        self.counters.add("unreadable_dirs")
        self._warn.warning("unreadable-dir", "galahad: skipping %s: %s", path, error)

    def disk_bytes(self) -> int:
        """Bytes the ledger should count as committed: records plus quarantined files."""
        records = sum(e.accounted_bytes for e in self.layout.records(on_error=self.unreadable_dir))
        return records + self.quarantine.total_bytes()

    def open_scan(self) -> None:
        """Removes temp files of writers that are gone, recounts the ledger from disk
        (dropping reservations of processes that died) and indexes every record for eviction,
        oldest modification first."""
        self.remove_stale_temps()
        entries = []

        def committed_on_disk() -> int:
            entries.extend(self.layout.records(on_error=self.unreadable_dir))
            return sum(e.accounted_bytes for e in entries) + self.quarantine.total_bytes()

        self.ledger.rebuild(committed_on_disk)
        self._last_rebuild_s = time.monotonic()
        entries.sort(key=lambda entry: entry.mtime_ns)
        self.index.load((entry.location, entry.accounted_bytes) for entry in entries)

    def is_alive(self, token: str) -> bool:
        if self.process is not None:
            return self.process.is_alive(token)
        return token_alive(os.path.join(self.layout.root, PROCS_DIR), token)

    def remove_stale_temps(self) -> None:
        for entry in self.layout.temp_files(on_error=self.unreadable_dir):
            if temp_is_stale(entry, self.is_alive):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    self.counters.add("stale_temp_removed")

    # ------------------------------------------------------------- the ledger

    def rebuild(self) -> int:
        """Recounts committed bytes from disk and reclaims reservations of dead processes
        (and their temp files); returns the ledger's new total."""
        if self.read_only:
            return self.ledger.read()
        with self._rebuild_lock:
            self.remove_stale_temps()
            total = self.ledger.rebuild(self.disk_bytes)
            self._last_rebuild_s = time.monotonic()
        self.counters.add("ledger_rebuilds")
        return total

    def rebuild_if_due(self) -> bool:
        """rebuild, at most once every LEDGER_REBUILD_INTERVAL_S unless the ledger itself was
        found damaged or replaced."""
        due = time.monotonic() - self._last_rebuild_s >= LEDGER_REBUILD_INTERVAL_S
        if self.read_only or not (due or self.ledger.needs_rebuild):
            return False
        self._warn.warning(
            "ledger-rebuild",
            "galahad: the byte ledger of %s claims more than the records on disk explain "
            "(or was damaged); recounting it from disk",
            self.layout.root,
        )
        self.rebuild()
        return True

    def reclaim_dead(self) -> bool:
        """Takes back the reservations of processes that died (at most once a second)."""
        if self.read_only or time.monotonic() - self._last_reclaim_s < RECLAIM_INTERVAL_S:
            return False
        self._last_reclaim_s = time.monotonic()
        freed = self.ledger.reclaim_dead()
        if freed:
            self.counters.add("reclaimed_bytes", freed)
            self.remove_stale_temps()
        return freed > 0

    # ------------------------------------------------------------- deletions

    def unlink_record(self, dirname: str, filename: str) -> int | None:
        """Deletes one record file and releases its bytes; its size, or None if it was gone."""
        if self.read_only or not is_record_name(filename):
            return None
        freed = self.layout.unlink_record(dirname, filename)
        if freed is None:
            return None
        self.index.discard((dirname, filename))
        self.ledger.release(freed)
        return freed

    def evict_to(self, max_bytes: int) -> tuple[int, int]:
        """Evicts least recently used records (quarantined files first) until the ledger is
        at most `max_bytes`; returns (files evicted, bytes freed)."""
        evicted = freed = 0
        self.load_unindexed()
        while not self.read_only and self.ledger.read() > max_bytes:
            if self.evict_quarantined():
                evicted += 1
                continue
            victim = self.index.pop_oldest()
            if victim is None:
                break
            size = self.remove(victim[0])
            if size is not None:
                evicted += 1
                freed += size
                self.counters.add_many(evictions=1, evicted_bytes=size)
        return evicted, freed

    # ------------------------------------------------------------- budget.Evictor

    def evict_quarantined(self) -> bool:
        return self.quarantine.trim(keep_files=0, max_files=1) > 0

    def quarantined_bytes(self) -> int:
        return self.quarantine.total_bytes()

    def remove(self, location) -> int | None:
        return self.unlink_record(*location)

    def load_unindexed(self) -> None:
        """Adds records other processes wrote since the last scan to the LRU index."""
        entries = sorted(
            self.layout.records(on_error=self.unreadable_dir), key=lambda e: e.mtime_ns
        )
        self.index.load((entry.location, entry.accounted_bytes) for entry in entries)

    def close(self) -> None:
        self.ledger.close()
        if self.process is not None:
            with contextlib.suppress(OSError):  # this process's counters: no live server's now
                retire(self.layout.root, self.process.token)
            self.process.close()
