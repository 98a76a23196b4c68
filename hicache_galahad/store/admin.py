"""StoreAdmin: the operator's verbs over an open store (`galahad` commands, warm, tools).

`StoreAdmin(store)` works over the same parts as the store's data path (parts.StoreParts:
nothing is opened twice, so it is cheap to build): verify and repair (`check`,
`rebuild_ledger`), what the ledger and the shared eviction order say, scans of the namespace
directories and record files, a record file's header and verdict, the live processes'
settings and lifetime counters, deletions by file name (purge) and eviction down to a cap.
None of it is on SGLang's path.
"""

from __future__ import annotations

import os

from ..record import format as fmt
from ..record.namespace import Namespace
from .checker import CheckReport
from .layout import QUARANTINE_DIRNAME, record_filename
from .lifetime import lifetime_totals
from .order_stats import SAMPLE_ENTRIES, order_figures
from .reader import open_record
from .record_store import RecordStore


class StoreAdmin:
    def __init__(self, store: RecordStore):
        self.store = store
        self._parts = store.parts
        self._accounting = store.parts.accounting
        self._layout = store.parts.layout

    def rebuild_ledger(self) -> int:
        """Recounts the ledger from disk now (and reclaims dead writers' reservations)."""
        return self._accounting.repair.rebuild()

    def namespace_counts(self) -> dict | None:
        """Per namespace directory, what the ledger keeps (ledger.NamespaceCount: records,
        disk_bytes, logical_bytes, newest_ns), read without reading any record; the
        quarantine is not among them. None while the counts are not complete."""
        counts = self._accounting.ledger.namespace_counts()
        if counts is not None:
            counts.pop(QUARANTINE_DIRNAME, None)
        return counts

    def eviction_queues(self) -> dict:
        """The shared eviction order's state (fifo.py), for the operator: bytes named by the
        small queue (records not used since they were written) and the main queue (used at
        least once), and the ledger's bytes; `main_bytes / ledger_bytes` is the share of the
        store that was read again. {} without a log (a read-only store)."""
        return self._accounting.order.queue_state()

    def check(
        self, fix: bool = False, on_record=None, dirnames=None, threads: int = 1
    ) -> CheckReport:
        """Verifies every record of every namespace under root (or of `dirnames`). With fix:
        quarantines damaged records, removes temp files of dead writers and recounts the
        ledger, and drops the pins of records removed behind the store's back."""
        fix = fix and not self.store.read_only
        report = self._parts.checker.check(
            fix=fix, on_record=on_record, dirnames=dirnames, threads=threads
        )
        if fix:
            for dirname in self._parts.pins.pinned_dirnames():
                if dirnames is None or dirname in dirnames:
                    self._parts.drop_pins(dirname, None)
        return report

    # ----------------------------------------------------------------- scans and files

    def namespaces_on_disk(self, on_error=None) -> list[tuple[str, Namespace | None]]:
        """(directory name, its namespace.json or None) of every namespace directory under
        the root; `on_error(path, error)` is told of a directory that cannot be read."""
        return [
            (dirname, self._layout.load_namespace(dirname))
            for dirname in self._layout.namespace_dirnames(on_error)
        ]

    def record_files(self, dirnames=None, on_error=None):
        """The record files on disk (layout.FileEntry), of the given namespace directories
        (all when None): a scan that follows no link."""
        return self._layout.records(dirnames, on_error)

    def record_file_path(self, dirname: str, key: str) -> str:
        """Where the record of `key` lives in a namespace directory."""
        return os.path.join(self._layout.namespace_dir(dirname), record_filename(key))

    def file_header(self, path: str) -> fmt.Header:
        """A record file's header after its structural rules (V0-V9) only: what it claims,
        for the operator, not a verdict. Raises format.FormatError or OSError."""
        fd = open_record(path)
        try:
            prefix = os.pread(fd, fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES, 0)
            return fmt.parse_header(prefix, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def verify_file(self, entry, namespace: Namespace | None) -> None:
        """Every rule on a record file found by record_files (reader.files.verify), as
        `galahad verify` applies them; raises format.FormatError or OSError."""
        self._parts.reader.files.verify(entry, namespace)

    # ----------------------------------------------------------------- processes

    def eviction_order(self, sample: int = SAMPLE_ENTRIES) -> dict:
        """What the eviction order holds, read from its logs without writing or locking
        (order_stats.py: the queues, the ghost, the restorable share estimated from `sample`
        entries), and the bytes live processes hold reserved: puts in flight and evicted
        files their reapers have not unlinked yet."""
        figures = order_figures(self._layout, sample).as_dict()
        figures["reserved_bytes"] = sum(self._accounting.ledger.reservations().values())
        return figures

    def live_settings(self) -> list[dict]:
        """The settings of the processes alive on this root (lifetime.live_settings)."""
        return self._parts.live_settings()

    def quarantined_files(self) -> int:
        return len(self._accounting.quarantine.names())

    def lifetime_counters(self) -> dict:
        """The counters of every process that used this root, summed (lifetime.py)."""
        return lifetime_totals(self.store.root)

    # ----------------------------------------------------------------- deletions

    def delete_file(
        self, dirname: str, filename: str, *, drop_pin: bool = True, keep_pinned: bool = False
    ) -> int | None:
        """Deletes one record file of a namespace directory through the store (ledger and
        index stay right); the bytes freed, or None if it was not there (its pin, if any,
        is dropped: purge removes pins with the records; without `drop_pin`, the caller
        drops them in batches with drop_pins). With `keep_pinned`, a record pinned by then
        is kept (checked under the ledger's lock, where pins are made)."""
        freed = self._accounting.unlink_record(dirname, filename, keep_pinned=keep_pinned)
        if freed is None and keep_pinned:
            return None
        if drop_pin:
            self._parts.drop_pins(dirname, [filename])
        return freed

    def drop_pins(self, dirname: str, filenames: list[str] | None) -> None:
        """Drops the pins of records of `filenames` (None: any) that left namespace
        `dirname`, in one locked change per batch (after delete_file(..., drop_pin=False))."""
        self._parts.drop_pins(dirname, filenames)

    def evict_to(self, max_bytes: int) -> tuple[int, int]:
        """Evicts least recently used records (quarantined files first) until the ledger is
        at most `max_bytes`; returns (files evicted, bytes freed)."""
        return self._accounting.evict_to(max_bytes)
