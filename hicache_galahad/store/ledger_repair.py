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
from collections.abc import Callable

from ..record import format as fmt
from ..telemetry.metrics import Counters, RateLimitedLog
from .layout import (
    PROCS_DIR,
    QUARANTINE_DIRNAME,
    StoreLayout,
    is_namespace_dirname,
    temp_is_stale,
)
from .ledger import Ledger
from .ledger_state import NamespaceCount
from .liveness import ProcessLock, token_alive
from .quarantine import Quarantine

LEDGER_REBUILD_INTERVAL_S = 10.0
RECLAIM_INTERVAL_S = 1.0
LOGICAL_SAMPLE_RECORDS = 1024  # headers a recount reads per namespace (the rest: their ratio)


class LedgerRepair:
    def __init__(
        self,
        layout: StoreLayout,
        ledger: Ledger,
        process: ProcessLock | None,
        quarantine: Quarantine,
        *,
        read_only: bool,
        counters: Counters,
        warn: RateLimitedLog,
        unreadable_dir: Callable[[str, OSError], None],
    ):
        self.layout = layout
        self.ledger = ledger
        self.process = process
        self.quarantine = quarantine
        self.read_only = read_only
        self.counters = counters
        self._warn = warn
        self.unreadable_dir = unreadable_dir
        # The oldest record of each namespace as the last recount of this process found it
        # (the ledger cannot keep it under eviction); `galahad stats --recount` shows it.
        self.recounted_oldest_ns: dict[str, int] = {}
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

    def disk_counts(self) -> tuple[int, dict[str, NamespaceCount] | None]:
        """disk_bytes, and the namespace counts the ledger keeps (records, bytes, logical
        bytes, newest and oldest modification): a walk of every record, a stat each (it runs
        under the ledger's lock). Logical bytes are read from the headers of the first
        LOGICAL_SAMPLE_RECORDS records of each namespace (hashed names: an unbiased sample),
        the rest taken at the sample's ratio, so a recount reads a bounded number of headers
        (at 10^7 cold records, reading every one would add minutes of the lock). The counts
        are None when a directory could not be read or records lie in a directory that is no
        namespace's."""
        counts: dict[str, NamespaceCount] = {}
        oldest: dict[str, int] = {}
        sampled: dict[str, list[int]] = {}  # dirname: [disk bytes, logical bytes] read
        complete = True

        def unreadable(path, error):
            nonlocal complete
            complete = False
            self.unreadable_dir(path, error)

        total = 0
        for dirname in self.layout.namespace_dirnames(unreadable):
            for entry in self.layout.records([dirname], unreadable):
                total += entry.accounted_bytes
                if not entry.accounted_bytes:
                    continue  # no regular file, or an empty one: no record to count
                if not is_namespace_dirname(dirname) or dirname == QUARANTINE_DIRNAME:
                    complete = False
                    continue
                count = counts.get(dirname)
                if count is None:
                    count = counts[dirname] = NamespaceCount()
                count.records += 1
                count.disk_bytes += entry.accounted_bytes
                if count.records <= LOGICAL_SAMPLE_RECORDS:
                    sample = sampled.setdefault(dirname, [0, 0])
                    sample[0] += entry.accounted_bytes
                    sample[1] += self._logical_of(dirname, entry.name)
                count.newest_ns = max(count.newest_ns, entry.mtime_ns)
                oldest[dirname] = min(oldest.get(dirname, entry.mtime_ns), entry.mtime_ns)
        for dirname, (sample_disk, sample_logical) in sampled.items():
            count = counts[dirname]
            rest = count.disk_bytes - sample_disk
            count.logical_bytes = sample_logical + (
                rest * sample_logical // sample_disk if sample_disk else 0
            )
        quarantined = self.layout.quarantined()
        quarantine_bytes = sum(entry.accounted_bytes for entry in quarantined)
        total += quarantine_bytes
        if quarantined:
            counts[QUARANTINE_DIRNAME] = NamespaceCount(len(quarantined), quarantine_bytes)
        self.recounted_oldest_ns = oldest
        return total, (counts if complete else None)

    def _logical_of(self, dirname: str, filename: str) -> int:
        """The page bytes a record's header declares (0 when it has no readable header)."""
        try:
            fd = os.open(
                filename,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=self.layout.namespace_fd(dirname),
            )
        except OSError:
            return 0
        try:
            return fmt.declared_raw_len(os.pread(fd, fmt.FIXED_HEADER_BYTES, 0))
        except OSError:
            return 0
        finally:
            os.close(fd)

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
            total = self.ledger.rebuild(self.disk_counts)
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
