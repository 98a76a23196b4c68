"""Keeping the byte ledger true against the disk: recounts, dead processes' leftovers.

`LedgerRepair` recounts a root's records (under the ledger's lock: exact) when the ledger is
found missing, damaged or claiming more than the filesystem holds, or when an operator asks
(`galahad verify --fix`, `gc`); takes back the reservations of processes that died (their
lock file is free); and sweeps dead writers' temp files in a background thread, only when a
dead writer is found. Opening a store reads no directory of records (open_scan).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from .context import StoreContext
from .disk_count import DiskCount
from .layout import PROCS_DIR, temp_is_stale
from .ledger import Ledger
from .liveness import ProcessLock, token_alive
from .quarantine import Quarantine

LEDGER_REBUILD_INTERVAL_S = 10.0
RECLAIM_INTERVAL_S = 1.0


class LedgerRepair:
    def __init__(
        self,
        context: StoreContext,
        ledger: Ledger,
        process: ProcessLock | None,
        quarantine: Quarantine,
        disk_count: DiskCount,
    ):
        self.layout = context.layout
        self.read_only = context.read_only
        self.counters = context.counters
        self._warn = context.warn
        self.unreadable_dir = context.unreadable_dir
        self.ledger = ledger
        self.process = process
        self.quarantine = quarantine
        self.disk_count = disk_count
        self._last_rebuild_s = -1e9
        self._last_reclaim_s = -1e9
        self._rebuild_lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self._closed = threading.Event()

    def disk_bytes(self) -> int:
        """Bytes the ledger should count as committed: records plus quarantined files (a
        walk of every record: tools and repairs only)."""
        records = sum(e.accounted_bytes for e in self.layout.records(on_error=self.unreadable_dir))
        return records + self.quarantine.total_bytes()

    def open_scan(self) -> None:
        """What opening a store does: nothing proportional to its records. Takes back the
        reservations of dead processes (a liveness test per ledger entry and lock file) and
        recovers a dead writer's journal (the ledger does, under its lock); a ledger that is
        new, damaged or replaced is recounted (exact: under the lock). Dead writers' temp
        files are swept in the background."""
        if self.read_only:
            return
        dead = self._dead_tokens()
        self.ledger.reclaim_dead()
        if self.ledger.needs_rebuild:
            self.rebuild()
        if dead:
            self.sweep_temps_later()

    def _dead_tokens(self) -> list[str]:
        if self.process is None:
            return []
        return [token for token in self.process.tokens() if not self.process.is_alive(token)]

    def is_alive(self, token: str) -> bool:
        if self.process is not None:
            return self.process.is_alive(token)
        return token_alive(os.path.join(self.layout.root, PROCS_DIR), token)

    def remove_stale_temps(self) -> None:
        for entry in self.layout.temp_files(on_error=self.unreadable_dir):
            if self._closed.is_set():
                return
            if temp_is_stale(entry, self.is_alive):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    self.counters.add("stale_temp_removed")

    def sweep_temps_later(self) -> None:
        """Removes dead writers' temp files in a background thread (it lists every
        namespace directory once: never on a caller's path)."""
        if self.read_only or (self._sweeper is not None and self._sweeper.is_alive()):
            return

        def sweep():
            with contextlib.suppress(Exception):
                self.remove_stale_temps()

        self._sweeper = threading.Thread(target=sweep, name="galahad-sweep", daemon=True)
        self._sweeper.start()

    def wait_for_sweep(self, timeout_s: float | None = None) -> None:
        """Returns once the background sweep of dead writers' temp files (if one runs) ends."""
        sweeper = self._sweeper
        if sweeper is not None:
            sweeper.join(timeout_s)

    # ------------------------------------------------------------- the ledger

    def rebuild(self) -> int:
        """Recounts committed bytes from disk (a walk of every record, under the ledger's
        lock: exact, and writers wait meanwhile) and reclaims reservations of dead processes;
        returns the ledger's new total. For repairs: an operator's command, or the put that
        found the ledger damaged or claiming what nothing explains (rebuild_if_due), never a
        put of a sound ledger."""
        if self.read_only:
            return self.ledger.read()
        with self._rebuild_lock:
            self.remove_stale_temps()
            total = self.ledger.rebuild(self.disk_count.counts)
            self._last_rebuild_s = time.monotonic()
        self.counters.add("ledger_rebuilds")
        return total

    def rebuild_if_due(self) -> bool:
        """rebuild when the ledger was found damaged or replaced, or (at most once every
        LEDGER_REBUILD_INTERVAL_S) when it claims more than anything could explain: the
        budget found the shortfall larger than the bytes on disk."""
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
            self.sweep_temps_later()
        return freed > 0

    def close(self) -> None:
        self._closed.set()
