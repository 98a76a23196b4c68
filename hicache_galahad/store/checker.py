"""`check`: every record under a root verified with the reader's own rules.

A record is sound, damaged (it broke a rule no reader configuration explains: quarantined by
`fix`) or unverifiable (what failed could be this checker's configuration: a missing or wrong
key, a plaintext record in an encrypted store; never touched). The decision is
reader.reader_may_be_wrong, the same one the read path makes; each record is checked by
file_verifier.py (`reader.files`), with the read paths' rules.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..record import format as fmt
from .context import StoreContext
from .layout import FileEntry, is_record_name, is_temp_name, temp_is_stale
from .quarantine import QUARANTINE_KEEP_FILES, Quarantine
from .reader import RecordReader, reader_may_be_wrong

CHUNK_RECORDS = 1024  # records verified at once (check streams the walk)
_WAITS = object()  # a record that is not all in the page cache: for the pool
TASK_RECORDS = 64  # records one thread verifies per hand-off (a future per record cost more)


@dataclass
class CheckReport:
    records: int = 0
    record_bytes: int = 0
    damaged: list = field(default_factory=list)  # (path, "Vn: what failed")
    unverifiable: list = field(default_factory=list)  # (path, "Vn: what failed")
    stray_temp_files: list = field(default_factory=list)
    unreadable_dirs: list = field(default_factory=list)  # (path, error)
    quarantined_files: int = 0
    ledger_bytes: int = 0
    actual_bytes: int = 0
    fixed: bool = False
    scanned_records: int = 0  # record files read (sound, damaged or unverifiable)
    scanned_bytes: int = 0
    elapsed_s: float = 0.0

    @property
    def records_per_s(self) -> float | None:
        return self.scanned_records / self.elapsed_s if self.elapsed_s > 0 else None

    @property
    def mb_per_s(self) -> float | None:
        return self.scanned_bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else None

    @property
    def ledger_drift_bytes(self) -> int:
        return self.ledger_bytes - self.actual_bytes

    @property
    def clean(self) -> bool:
        return not self.damaged and not self.stray_temp_files and self.ledger_drift_bytes == 0

    def as_dict(self) -> dict:
        return {
            "records": self.records,
            "record_bytes": self.record_bytes,
            "damaged": [list(item) for item in self.damaged],
            "unverifiable": [list(item) for item in self.unverifiable],
            "stray_temp_files": self.stray_temp_files,
            "unreadable_dirs": [list(item) for item in self.unreadable_dirs],
            "quarantined_files": self.quarantined_files,
            "ledger_bytes": self.ledger_bytes,
            "actual_bytes": self.actual_bytes,
            "ledger_drift_bytes": self.ledger_drift_bytes,
            "clean": self.clean,
            "fixed": self.fixed,
            "scanned_records": self.scanned_records,
            "scanned_bytes": self.scanned_bytes,
            "elapsed_s": self.elapsed_s,
            "records_per_s": self.records_per_s,
            "mb_per_s": self.mb_per_s,
        }


def _problem(error: fmt.FormatError) -> str:
    return f"{error.rule}: {error}"


class Checker:
    def __init__(
        self,
        context: StoreContext,
        reader: RecordReader,
        quarantine: Quarantine,
        *,
        rebuild_ledger: Callable[[], int],
        read_ledger: Callable[[], int],
        disk_bytes: Callable[[], int],
        is_alive: Callable[[str], bool],
    ):
        self.layout = context.layout
        self.reader = reader
        self.quarantine = quarantine
        self._rebuild_ledger = rebuild_ledger
        self._read_ledger = read_ledger
        self.disk_bytes = disk_bytes
        self._is_alive = is_alive

    def check(
        self,
        fix: bool = False,
        on_record: Callable[[FileEntry], None] | None = None,
        dirnames: list[str] | None = None,
        threads: int = 1,
    ) -> CheckReport:
        """Checks the namespaces `dirnames` (default: all), `threads` records at a time. One
        pass over each directory: its records are verified as they are listed, and the bytes
        on disk (`actual_bytes`) are those of the records read plus the quarantined files (no
        second walk; `fix` recounts the ledger, exactly, under its lock)."""
        report = CheckReport()
        started_s = time.monotonic()

        def unreadable(path, error):
            report.unreadable_dirs.append((path, str(error)))

        if dirnames is None:
            dirnames = self.layout.namespace_dirnames(unreadable)
        pool = None
        if threads > 1:
            pool = ThreadPoolExecutor(threads, thread_name_prefix="galahad-verify")
        try:
            for dirname in dirnames:
                self._check_namespace(dirname, report, fix, on_record, unreadable, pool)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        report.elapsed_s = time.monotonic() - started_s
        report.damaged.sort()
        report.unverifiable.sort()
        if fix:
            self.quarantine.trim(QUARANTINE_KEEP_FILES)
        report.quarantined_files = len(self.quarantine.names())
        report.actual_bytes += self.quarantine.total_bytes()
        report.ledger_bytes = self._read_ledger()
        if fix:
            report.ledger_bytes = self._rebuild_ledger()
            report.actual_bytes = self.disk_bytes()
            report.fixed = True
        return report

    def _check_namespace(self, dirname, report, fix, on_record, unreadable, pool) -> None:
        temps = []

        def records():
            """The directory listed once: records streamed, temp files kept aside."""
            directory = self.layout.namespace_dir(dirname)
            for entry in self.layout._entries(directory, dirname, _record_or_temp, unreadable):
                if is_record_name(entry.name):
                    yield entry
                else:
                    temps.append(entry)

        tag_failures = []  # judged once we know whether this key opens any record here
        sound, sound_bytes, sound_accounted_bytes = 0, 0, 0  # (added to the report after)
        for entry, error in self._verified(records(), pool, dirname):
            if on_record is not None:
                on_record(entry)
            if error is None:
                sound += 1
                sound_bytes += entry.size_bytes
                sound_accounted_bytes += entry.accounted_bytes
                continue
            if isinstance(error, FileNotFoundError):
                continue  # evicted or purged while we scanned: not damage
            report.scanned_records += 1
            report.scanned_bytes += entry.size_bytes
            report.actual_bytes += entry.accounted_bytes
            if isinstance(error, fmt.AuthenticationError):
                tag_failures.append((entry, error))
            elif isinstance(error, fmt.FormatError):
                self._judge(entry, error, report, fix, key_proven=True)
            elif isinstance(error, OSError):
                report.unverifiable.append((entry.path, f"unreadable: {error}"))
        report.scanned_records += sound
        report.scanned_bytes += sound_bytes
        report.actual_bytes += sound_accounted_bytes
        report.records += sound
        report.record_bytes += sound_bytes
        key_proven = self.reader.key_proven(dirname)
        for entry, error in tag_failures:
            self._judge(entry, error, report, fix, key_proven)
        for entry in sorted(temps, key=_name):
            if temp_is_stale(entry, self._is_alive):
                report.stray_temp_files.append(entry.path)
                if fix:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def _verified(self, entries, pool, dirname: str):
        """(entry, error or None) for each record, in order, streamed: CHUNK_RECORDS at a
        time, so memory stays bounded whatever the number of records. With a pool, a small
        record whose bytes are all in the page cache is checked on this thread (the threads
        would only contend for the interpreter); the others go to the pool, TASK_RECORDS per
        hand-off, as soon as that many are found. The directory's namespace.json is looked
        up once a chunk (it is cached for seconds anyway), not once a record."""
        iterator = iter(entries)
        load_namespace = self.layout.load_namespace_cached
        while True:
            chunk = list(itertools.islice(iterator, CHUNK_RECORDS))
            if not chunk:
                return
            namespace = load_namespace(dirname)
            if pool is None:
                yield from zip(chunk, self._verify_all(chunk, namespace), strict=True)
                continue
            results, waiting, futures = [], [], []
            for entry in chunk:
                result = self._verify_cached(entry, namespace)
                results.append(result)
                if result is _WAITS:
                    waiting.append(entry)
                    if len(waiting) == TASK_RECORDS:
                        futures.append(pool.submit(self._verify_all, waiting, namespace))
                        waiting = []
            if waiting:
                futures.append(pool.submit(self._verify_all, waiting, namespace))
            waited = itertools.chain.from_iterable(future.result() for future in futures)
            for entry, result in zip(chunk, results, strict=True):
                yield entry, next(waited) if result is _WAITS else result

    def _verify_cached(self, entry: FileEntry, namespace):
        """The error (or None) of a record checked from the page cache, or _WAITS."""
        try:
            if not self.reader.files.verify(entry, namespace, nowait=True):
                return _WAITS
        except (fmt.FormatError, OSError) as error:
            return error
        return None

    def _verify_all(self, entries: list, namespace) -> list:
        """The error (or None) of each record of one namespace."""
        verify_file = self.reader.files.verify
        errors = []
        for entry in entries:
            try:
                verify_file(entry, namespace)
            except (fmt.FormatError, OSError) as error:
                errors.append(error)
            else:
                errors.append(None)
        return errors

    def _judge(self, entry: FileEntry, error, report: CheckReport, fix: bool, key_proven: bool):
        if reader_may_be_wrong(error, key_proven):
            report.records += 1
            report.record_bytes += entry.size_bytes
            report.unverifiable.append((entry.path, _problem(error)))
            return
        report.damaged.append((entry.path, _problem(error)))
        if fix:
            self.quarantine.move(entry.path, entry.dirname, entry.inode)


def _name(entry: FileEntry) -> str:
    return entry.name


def _record_or_temp(name: str) -> bool:
    return is_record_name(name) or is_temp_name(name)
