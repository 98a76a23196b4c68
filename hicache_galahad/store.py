"""RecordStore: verified, crash-safe, budgeted records on a local filesystem.

The public verbs of the store; each job is done by its own module:

    layout.py      paths under the root, directory scans, namespace descriptions
    codec.py       digest, zstd and AES-GCM settings: pages to records and back
    reader.py      the verified read paths (the one place that decides validity)
    writer.py      the staged write: temp files, one flush, publication with link(2)
    budget.py      the cap and the free-space floor; eviction policy
    quarantine.py  damaged records moved aside
    checker.py     `check`: every record verified with the reader's rules
    flusher.py     deferred durability: published records fsynced in the background
    ledger.py      the byte count shared by every process on the root
    eviction.py    the LRU order of the records this process knows
    lifetime.py    counters and settings persisted for `galahad stats`
    metrics.py     counters and rate-limited warnings

Every public method is safe to call from many threads and from several processes on one
root. Data errors never raise: a read that fails any check is a miss (counted, quarantined,
warned about at a limited rate); a write that cannot be completed returns False and leaves
no partial record behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from . import format as fmt
from .budget import Budget
from .checker import Checker, CheckReport
from .codec import RecordCodec
from .config import StoreOptions
from .crypto import load_master_key
from .errors import ConfigError
from .eviction import LruIndex
from .flusher import Flusher
from .layout import StoreLayout, is_record_name, record_filename, temp_is_stale
from .ledger import PROCS_DIR, Ledger, ProcessLock, token_alive
from .lifetime import CounterFile
from .metrics import Counters, RateLimitedLog
from .namespace import Namespace
from .quarantine import Quarantine
from .reader import RecordReader, open_record, reader_may_be_wrong
from .writer import RecordWriter

log = logging.getLogger("hicache_galahad.store")

LEDGER_REBUILD_INTERVAL_S = 10.0
DESCRIPTION_CHECK_INTERVAL_S = 60.0
RECLAIM_INTERVAL_S = 1.0

__all__ = ["CheckReport", "RecordStore", "record_filename"]


def _nbytes(out) -> int:
    if isinstance(out, list | tuple):
        return sum(memoryview(segment).nbytes for segment in out)
    return memoryview(out).nbytes


class _Evictor:
    """What the budget may delete: quarantined files first, then indexed records."""

    def __init__(self, store: RecordStore):
        self._store = store

    def evict_quarantined(self) -> bool:
        return self._store.quarantine_box.trim(keep_files=0, max_files=1) > 0

    def quarantined_bytes(self) -> int:
        return self._store.quarantine_box.total_bytes()

    def remove(self, location) -> int | None:
        dirname, filename = location
        return self._store._unlink_record(dirname, filename)

    def load_unindexed(self) -> None:
        self._store._index_records()


class RecordStore:
    """Records of many namespaces under one root directory (see config.StoreOptions)."""

    def __init__(self, root: str | StoreOptions, **options):
        self.options = root if isinstance(root, StoreOptions) else StoreOptions(root, **options)
        options = self.options
        self.root = options.root
        self.max_bytes = options.max_bytes
        self.read_only = options.read_only
        self.counters = Counters()
        self._warn = RateLimitedLog(log)
        self.layout = StoreLayout(self.root)
        self._check_root()
        self.codec = RecordCodec(
            digest_alg={name: alg for alg, name in fmt.DIGEST_NAMES.items()}[options.digest],
            compression=options.compression,
            zstd_level=options.zstd_level,
            master_key=(
                load_master_key(options.encryption_key_file)
                if options.encryption_key_file
                else None
            ),
            allow_unverified=options.allow_unverified,
        )
        self.index = LruIndex()
        self._process = None if self.read_only else ProcessLock(self.root)
        self._ledger = Ledger(self.layout.ledger_path, self._process, read_only=self.read_only)
        self._last_rebuild_s = -1e9
        self._last_reclaim_s = -1e9
        self._rebuild_lock = threading.Lock()
        self.quarantine_box = Quarantine(
            self.layout.quarantine_dir, self._ledger, self.index, self.counters
        )
        self.budget = Budget(
            self._ledger,
            self.index,
            _Evictor(self),
            max_bytes=options.max_bytes,
            min_free_bytes=options.min_free_bytes,
            free_bytes=lambda: self._free_bytes(),  # looked up per call (tests replace it)
            rebuild=self._rebuild_if_due,
            reclaim=self._reclaim_dead,
            on_event=self.counters.add,
        )
        self.reader = RecordReader(self.layout, self.codec, read_only=self.read_only)
        self.flusher = (
            Flusher(options.flush_interval_s, self.counters)
            if options.durability == "deferred" and not self.read_only
            else None
        )
        self._io_threads = options.io_threads
        self._pool = ThreadPoolExecutor(self._io_threads, thread_name_prefix="galahad-io")
        self.writer = RecordWriter(
            self.layout,
            self.codec,
            self.reader,
            self.budget,
            self.quarantine_box,
            self.index,
            self.counters,
            self._warn,
            self._parallel,
            writer_token=self._process.token if self._process else "readonly",
            durability=options.durability,
            flusher=self.flusher,
        )
        self.checker = Checker(
            self.layout,
            self.reader,
            self.quarantine_box,
            self.rebuild_ledger,
            self._ledger.committed,
            self._is_alive,
        )
        self._ledger.recount = self.checker.disk_bytes
        self._counter_file = None
        if not self.read_only:
            self._counter_file = CounterFile(
                self.root, self._process.token, self._is_alive, self._settings()
            )
        self._namespaces: dict[str, Namespace] = {}
        self._described_s: dict[str, float] = {}
        self._ns_lock = threading.Lock()
        self._closed = False
        if not self.read_only:
            self._open_scan()

    def _settings(self) -> dict:
        options = self.options
        return {
            "pid": os.getpid(),
            "max_bytes": options.max_bytes,
            "min_free_bytes": options.min_free_bytes,
            "compression": options.compression,
            "encrypted": options.encryption_key_file is not None,
            "digest": options.digest,
            "durability": options.durability,
        }

    def _persist_counters(self, force: bool = False) -> None:
        if self._counter_file is not None:
            self._counter_file.maybe_flush(self.counters.snapshot, force)

    def _check_root(self) -> None:
        """The root is a real directory (created if missing) whose `ns` and `quarantine` are
        real directories too: never a file or a symbolic link (ConfigError naming root)."""
        if self.read_only:
            if not os.path.isdir(self.layout.ns_root):
                raise ConfigError(f"root {self.root!r}: not a hicache-galahad store")
            return
        try:
            self.layout.create()
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"hicache_galahad option 'root': {self.root!r} cannot hold a store ({error}); "
                "expected a directory (or a path where one can be created)"
            ) from error
        for path in (self.root, self.layout.ns_root, self.layout.quarantine_dir):
            if os.path.islink(path) or not os.path.isdir(path):
                raise ConfigError(
                    f"hicache_galahad option 'root': {path!r} is a symbolic link or not a "
                    "directory; expected a real directory"
                )
        stats = os.statvfs(self.root)
        capacity_bytes = stats.f_blocks * stats.f_frsize
        if self.options.min_free_bytes >= capacity_bytes:
            raise ConfigError(
                f"hicache_galahad option 'min_free_bytes': got {self.options.min_free_bytes}, "
                f"expected less than the size of the filesystem holding {self.root!r} "
                f"({capacity_bytes} bytes)"
            )

    # ----------------------------------------------------------------- open and scan

    def _open_scan(self) -> None:
        """Removes temp files of writers that are gone, recounts the ledger from disk
        (dropping reservations of processes that died) and indexes every record for eviction,
        oldest modification first."""
        self._remove_stale_temps()
        entries = []

        def committed_on_disk() -> int:
            entries.extend(self.layout.records(on_error=self._unreadable_dir))
            return sum(e.accounted_bytes for e in entries) + self.quarantine_box.total_bytes()

        self._ledger.rebuild(committed_on_disk)
        self._last_rebuild_s = time.monotonic()
        entries.sort(key=lambda entry: entry.mtime_ns)
        self.index.load((entry.location, entry.accounted_bytes) for entry in entries)

    def _is_alive(self, token: str) -> bool:
        if self._process is not None:
            return self._process.is_alive(token)
        return token_alive(os.path.join(self.root, PROCS_DIR), token)

    def _remove_stale_temps(self) -> None:
        for entry in self.layout.temp_files(on_error=self._unreadable_dir):
            if temp_is_stale(entry, self._is_alive):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    self.counters.add("stale_temp_removed")

    def _index_records(self) -> None:
        """Adds records other processes wrote since the last scan to the LRU index."""
        entries = sorted(
            self.layout.records(on_error=self._unreadable_dir), key=lambda e: e.mtime_ns
        )
        self.index.load((entry.location, entry.accounted_bytes) for entry in entries)

    def rebuild_ledger(self) -> int:
        """Recounts committed bytes from disk and reclaims reservations of dead processes
        (and their temp files); returns the ledger's new total."""
        if self.read_only:
            return self._ledger.read()
        with self._rebuild_lock:
            self._remove_stale_temps()
            total = self._ledger.rebuild(self.checker.disk_bytes)
            self._last_rebuild_s = time.monotonic()
        self.counters.add("ledger_rebuilds")
        return total

    def _reclaim_dead(self) -> bool:
        """Takes back the reservations of processes that died (at most once a second)."""
        if self.read_only or time.monotonic() - self._last_reclaim_s < RECLAIM_INTERVAL_S:
            return False
        self._last_reclaim_s = time.monotonic()
        freed = self._ledger.reclaim_dead()
        if freed:
            self.counters.add("reclaimed_bytes", freed)
            self._remove_stale_temps()
        return freed > 0

    def _rebuild_if_due(self) -> bool:
        """rebuild_ledger, at most once every LEDGER_REBUILD_INTERVAL_S unless the ledger
        itself was found damaged or replaced."""
        due = time.monotonic() - self._last_rebuild_s >= LEDGER_REBUILD_INTERVAL_S
        if not (due or self._ledger.needs_rebuild):
            return False
        self._warn.warning(
            "ledger-rebuild",
            "galahad: the byte ledger of %s claims more than the records on disk explain "
            "(or was damaged); recounting it from disk",
            self.root,
        )
        self.rebuild_ledger()
        return True

    def _unreadable_dir(self, path: str, error: OSError) -> None:
        self.counters.add("unreadable_dirs")
        self._warn.warning("unreadable-dir", "galahad: skipping %s: %s", path, error)

    # ----------------------------------------------------------------- namespaces

    def register_namespace(self, namespace: Namespace) -> Namespace:
        """Creates the namespace's directory and description (idempotent) and returns it.
        A filesystem that refuses (full, read-only, permissions) is not a reason to stop a
        server: the namespace is still returned, and its reads and writes miss until the
        filesystem accepts them (warned and counted)."""
        with self._ns_lock:
            known = self._namespaces.get(namespace.dirname)
            if known is not None:
                return known
            if not self.read_only:
                self._write_description(namespace)
            self._namespaces[namespace.dirname] = namespace
            return namespace

    def _write_description(self, namespace: Namespace) -> None:
        directory = self.layout.namespace_dir(namespace.dirname)
        if os.path.islink(directory):
            raise ConfigError(
                f"hicache_galahad option 'root': namespace directory {directory!r} is a "
                "symbolic link; expected a real directory"
            )
        try:
            self.layout.remove_stale_description_temps(namespace.dirname)
            self.layout.write_namespace(namespace, durable=self.options.durable)
        except OSError as error:
            self.counters.add("namespace_write_failures")
            self._warn.warning(
                "namespace-write",
                "galahad: cannot write the description of namespace %s (%s): its records miss "
                "until the filesystem accepts writes again",
                namespace.dirname,
                error,
            )
        self._described_s[namespace.dirname] = time.monotonic()

    def _refresh_description(self, namespace: Namespace) -> None:
        """Puts back a namespace.json that was deleted or edited (at most once a minute), so
        that operators' tools can always tell whose records these are."""
        if time.monotonic() - self._described_s.get(namespace.dirname, 0.0) < (
            DESCRIPTION_CHECK_INTERVAL_S
        ):
            return
        self._described_s[namespace.dirname] = time.monotonic()
        if self.layout.load_namespace(namespace.dirname) != namespace:
            with self._ns_lock:
                self._write_description(namespace)

    # ----------------------------------------------------------------- reads

    def get_into(self, namespace: Namespace, key: str, out) -> bool:
        """Fills `out` with the record's verified bytes. `out` is a writable buffer of exactly
        the record's raw size, or a list of buffers filled in order (a scattered page).
        False on a miss of any kind; `out` is then undefined."""
        return self.get_many_into(namespace, [key], [out])[0]

    def get(self, namespace: Namespace, key: str, expected_size: int) -> bytes | None:
        buffer = bytearray(expected_size)
        return bytes(buffer) if self.get_into(namespace, key, buffer) else None

    def get_many_into(self, namespace: Namespace, keys: list, outs: list) -> list[bool]:
        """get_into for many records, spread over the I/O threads."""
        if len(keys) != len(outs) or self._closed:
            return [False] * len(keys)
        filenames = [record_filename(key) for key in keys]
        results = self._parallel(
            lambda i: self._read_guarded(namespace, keys[i], outs[i], filenames[i]), len(keys)
        )
        hits = results.count(True)
        self.counters.add_many(
            gets=len(keys),
            hits=hits,
            get_bytes=sum(_nbytes(out) for out, ok in zip(outs, results, strict=True) if ok),
        )
        self.index.touch_many_head_last(
            [(namespace.dirname, name) for name, ok in zip(filenames, results, strict=True) if ok]
        )
        self._persist_counters()
        return results

    def get_bytes(self, namespace: Namespace, key: str, max_bytes: int) -> bytes | None:
        """A verified record of any raw size up to `max_bytes` (text, manifests); None on a
        miss of any kind, including a record larger than `max_bytes`."""
        try:
            raw_len = self.reader.raw_len(namespace, key)
        except (OSError, fmt.FormatError):
            raw_len = None
        if raw_len is None or raw_len > max_bytes:
            self.counters.add("gets")
            self.counters.add("misses")
            return None
        return self.get(namespace, key, raw_len)

    def verify(self, namespace: Namespace, key: str, expected_size: int) -> bool:
        """Reads and verifies a record completely, without keeping its bytes."""
        ok = self._read_guarded(namespace, key, bytearray(expected_size))
        self.counters.add_many(gets=1, hits=int(ok))
        return ok

    def _read_guarded(self, namespace: Namespace, key: str, out, filename=None) -> bool:
        """One read; False on a miss of any kind (counted here; hits are counted by the
        caller, once per batch)."""
        try:
            self.reader.read_into(namespace, key, out, filename)
        except FileNotFoundError:
            self.counters.add("misses")
            return False
        except fmt.FormatError as error:
            self._on_bad_record(namespace, key, error)
            return False
        except OSError as error:
            self.counters.add("io_errors")
            self.counters.add("misses")
            self._warn.warning("read-io", "galahad: I/O error reading %s: %s", key, error)
            return False
        except Exception as error:  # a bug, not damage: never raised into the caller
            self.counters.add("unexpected_errors")
            self.counters.add("misses")
            self._warn.warning(
                "read-bug", "galahad: unexpected read failure: %r", error, exc_info=True
            )
            return False
        return True

    def _on_bad_record(self, namespace: Namespace, key: str, error: fmt.FormatError) -> None:
        foreign = isinstance(error, fmt.NamespaceMismatchError | fmt.KeyMismatchError)
        self.counters.add("foreign" if foreign else "corrupt")
        self.counters.add(f"failed_{error.rule}")
        self.counters.add("misses")
        keep = self.read_only or reader_may_be_wrong(
            error, self.reader.key_proven(namespace.dirname)
        )
        self._warn.warning(
            f"bad-{error.rule}",
            "galahad: record %s failed %s (%s): treated as a miss%s",
            key,
            error.rule,
            error,
            " (kept: the reader's configuration may be what differs)"
            if keep
            else " and quarantined",
        )
        if not keep:
            self.quarantine(namespace, key, getattr(error, "inode", None))

    def contains(self, namespace: Namespace, key: str) -> bool:
        """Whether a record file exists (cheap; the read still verifies everything)."""
        try:
            fd = open_record(self.layout.record_path(namespace.dirname, key))
        except Exception:
            return False
        os.close(fd)
        return True

    def leading_run(self, namespace: Namespace, keys: list) -> int:
        """How many keys from the start have a record."""
        for index, key in enumerate(keys):
            if not self.contains(namespace, key):
                return index
        return len(keys)

    # ----------------------------------------------------------------- writes

    def put(self, namespace: Namespace, key: str, data) -> bool:
        """Publishes `data` (a buffer, or a list of buffers taken in order) under `key`
        atomically and durably. True if the record is (or already was) stored; False if it
        could not be, with nothing partial left behind."""
        return self.put_many(namespace, [key], [data])[0]

    def put_many(self, namespace: Namespace, keys: list, datas: list) -> list[bool]:
        """put for many records (writer.py: staged, flushed together, then published)."""
        if len(keys) != len(datas) or self._closed or self.read_only:
            return [False] * len(keys)
        self._refresh_description(namespace)
        results = self.writer.put_many(namespace, keys, datas)
        self._persist_counters()
        return results

    # ----------------------------------------------------------------- deletion

    def quarantine(self, namespace: Namespace, key: str, inode: int | None = None) -> None:
        """Moves a damaged record aside (its bytes stay counted until trimmed). With `inode`,
        only if the record is still the file that was found damaged."""
        path = self.layout.record_path(namespace.dirname, key)
        self.quarantine_box.move_and_trim(path, namespace.dirname, inode)

    def _unlink_record(self, dirname: str, filename: str) -> int | None:
        """Deletes one record file and releases its bytes; its size, or None if it was gone."""
        if not is_record_name(filename):
            return None
        freed = self.layout.unlink_record(dirname, filename)
        if freed is None:
            return None
        self.index.discard((dirname, filename))
        self._ledger.release(freed)
        return freed

    def delete(self, namespace: Namespace, key: str) -> bool:
        if self.read_only:
            return False
        return self._unlink_record(namespace.dirname, record_filename(key)) is not None

    def clear_namespace(self, namespace: Namespace) -> int:
        """Deletes every record of one namespace (never a temp file); returns how many."""
        if self.read_only:
            return 0
        removed = 0
        for entry in self.layout.records([namespace.dirname], self._unreadable_dir):
            removed += self._unlink_record(namespace.dirname, entry.name) is not None
        return removed

    # ----------------------------------------------------------------- accounting

    def _free_bytes(self) -> int:
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def usage_bytes(self) -> int:
        return self._ledger.read()

    def stats(self) -> dict:
        return self.counters.snapshot() | {
            "ledger_bytes": self._ledger.read(),
            "indexed_records": len(self.index),
        }

    def check(
        self, fix: bool = False, on_record=None, dirnames=None, threads: int = 1
    ) -> CheckReport:
        """Verifies every record of every namespace under root (or of `dirnames`). With fix:
        quarantines damaged records, removes temp files of dead writers and recounts the
        ledger."""
        return self.checker.check(
            fix=fix and not self.read_only, on_record=on_record, dirnames=dirnames, threads=threads
        )

    def delete_file(self, dirname: str, filename: str) -> int | None:
        """Deletes one record file of a namespace directory through the store (ledger and
        index stay right); the bytes freed, or None if it was not there."""
        if self.read_only:
            return None
        return self._unlink_record(dirname, filename)

    def evict_to(self, max_bytes: int) -> tuple[int, int]:
        """Evicts least recently used records (quarantined files first) until the ledger is
        at most `max_bytes`; returns (files evicted, bytes freed)."""
        evicted = freed = 0
        self._index_records()
        while not self.read_only and self._ledger.read() > max_bytes:
            if self.quarantine_box.trim(keep_files=0, max_files=1):
                evicted += 1
                continue
            victim = self.index.pop_oldest()
            if victim is None:
                break
            size = self._unlink_record(*victim[0])
            if size is not None:
                evicted += 1
                freed += size
                self.counters.add("evictions")
                self.counters.add("evicted_bytes", size)
        return evicted, freed

    # ----------------------------------------------------------------- plumbing

    def _parallel(self, work, count: int) -> list:
        """Runs work(i) for i in range(count) over the I/O threads in contiguous slices."""
        if count == 0:
            return []
        slices = min(self._io_threads, count)
        if slices == 1:
            return [work(index) for index in range(count)]
        bounds = [count * part // slices for part in range(slices + 1)]

        def run_slice(part):
            return [work(index) for index in range(bounds[part], bounds[part + 1])]

        results = []
        for slice_results in self._pool.map(run_slice, range(slices)):
            results.extend(slice_results)
        return results

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        if self.flusher is not None:
            self.flusher.close()
        self._persist_counters(force=True)
        self._ledger.close()
        if self._process is not None:
            self._process.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
