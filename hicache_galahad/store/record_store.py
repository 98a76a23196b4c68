"""RecordStore: verified, crash-safe, budgeted records on a local filesystem.

The public verbs of the store over its parts, each a module of this package (README.md's
Layout and docs/ARCHITECTURE.md's Modules table name every one): the layout of the root, the
verified reader, the staged writer, the budget and its shared eviction order, the ledger and
its accounting, the quarantine, the checker, the flusher, the pins and the persisted counters.

Every public method is safe to call from many threads and from several processes on one
root. Data errors never raise: a read that fails any check is a miss (counted, quarantined,
warned about at a limited rate); a write that cannot be completed returns False and leaves
no partial record behind.
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
from ..record.namespace import Namespace
from ..telemetry.metrics import Counters, RateLimitedLog, count_bug, failed
from .accounting import Accounting
from .budget import Budget
from .checker import Checker, CheckReport
from .eviction import RecentReads
from .flusher import Flusher
from .kvstore import StoreStats
from .layout import QUARANTINE_DIRNAME, StoreLayout, record_filename
from .lifetime import CounterFile, lifetime_totals, live_settings
from .namespaces import NamespaceRegistry
from .pins import PinResult, Pins
from .reader import RecordReader, open_record, reader_may_be_wrong
from .writer import RecordWriter

log = logging.getLogger("hicache_galahad.store")

__all__ = ["CheckReport", "RecordStore", "record_filename"]


def _nbytes(out) -> int:
    if isinstance(out, list | tuple):
        return sum(memoryview(segment).nbytes for segment in out)
    return memoryview(out).nbytes


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
        self.layout.prepare(read_only=self.read_only, min_free_bytes=options.min_free_bytes)
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
        recent_reads = RecentReads()  # every read, for the shared eviction order
        self.accounting = Accounting(
            self.layout,
            read_only=self.read_only,
            counters=self.counters,
            warn=self._warn,
            recent_reads=recent_reads,
        )
        self.index = self.accounting.index
        self.quarantine_box = self.accounting.quarantine
        self.quarantine_box.layout = self.layout  # moves start from the held descriptors
        self.pins = Pins(  # store/pins/: records eviction keeps
            self.layout,
            self.accounting.ledger,
            token=self.accounting.token,
            max_pinned_bytes=options.pin_limit_bytes,
            durable=options.durable,
            read_only=self.read_only,
            counters=self.counters,
            live_limits=lambda: [s.get("max_pinned_bytes") for s in self.live_settings()],
        )
        self.index.pinned_bytes = self.pins.total_bytes
        # A read that quarantines a pinned record never waits for the pins lock.
        self.quarantine_box.on_moved = lambda d, f: self._drop_pin(d, f, wait=False)
        self.budget = Budget(
            self.accounting.ledger,
            self.index,
            self.accounting,
            max_bytes=options.max_bytes,
            min_free_bytes=options.min_free_bytes,
            free_bytes=lambda: self._free_bytes(),  # looked up per call (tests replace it)
            rebuild=self.accounting.repair.rebuild_if_due,
            reclaim=self.accounting.repair.reclaim_dead,
            on_event=self.counters.add,
            pinned_bytes=self.pins.total_bytes,
        )
        self.reader = RecordReader(
            self.layout, self.codec, read_only=self.read_only, recent_reads=recent_reads
        )
        deferred = options.durability == "deferred" and not self.read_only
        self.flusher = Flusher(options.flush_interval_s, self.counters) if deferred else None
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
            writer_token=self.accounting.token,
            durability=options.durability,
            flusher=self.flusher,
        )
        self.checker = Checker(
            self.layout,
            self.reader,
            self.quarantine_box,
            rebuild_ledger=self.accounting.repair.rebuild,
            read_ledger=self.accounting.ledger.committed,
            disk_bytes=self.accounting.repair.disk_bytes,
            is_alive=self.accounting.repair.is_alive,
        )
        self.namespaces = NamespaceRegistry(
            self.layout,
            durable=options.durable,
            read_only=self.read_only,
            counters=self.counters,
            warn=self._warn,
        )
        self._counter_file = None
        self._closed = False
        if not self.read_only:
            self._counter_file = CounterFile(
                self.root,
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

    def register_namespace(self, namespace: Namespace) -> Namespace:
        """Creates the namespace's directory and description (idempotent) and returns it; a
        filesystem that refuses makes its reads and writes miss, never stops the caller."""
        return self.namespaces.register(namespace)

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
        # Pages in the page cache are served here at once; only the others go to the I/O
        # threads (for small warm pages the hand-off to threads cost more than the read).
        # Each of the others goes on from what the page-cache attempt opened (read_into
        # closes it): a record is opened once.
        results = [
            self._read_cached(namespace, key, out, filename)
            for key, out, filename in zip(keys, outs, filenames, strict=True)
        ]
        rest = [index for index, result in enumerate(results) if result is not True]
        rest_results = self._parallel(
            lambda j: self._read_guarded(
                namespace, keys[rest[j]], outs[rest[j]], filenames[rest[j]], results[rest[j]]
            ),
            len(rest),
        )
        for index, ok in zip(rest, rest_results, strict=True):
            results[index] = ok
        hits = results.count(True)
        self.counters.add_many(
            gets=len(keys),
            hits=hits,
            get_bytes=sum(_nbytes(out) for out, ok in zip(outs, results, strict=True) if ok),
        )
        read = [
            (namespace.dirname, name) for name, ok in zip(filenames, results, strict=True) if ok
        ]
        self.index.touch_many_head_last(read)
        self.accounting.recent_reads.note_run(read)  # for the shared order's main queue
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
        """Reads and verifies a record completely, without keeping its bytes. Silent: it
        counts no get, hit or miss and leaves the record's recency (LRU order, time of last
        use) as it was; damage it finds is counted and quarantined as on any read."""
        return self._read_guarded(namespace, key, bytearray(expected_size), silent=True)

    def _read_cached(self, namespace: Namespace, key: str, out, filename: str):
        """The page-cache path: True, or what it declined (None, or the record as it opened
        it: reader.OpenedRecord), which the full path (_read_guarded) decides. A destination
        it cannot use (TypeError, ValueError) is left for the full path to report; any other
        exception is a bug of this path: counted and reported, and the record still goes to
        the full path."""
        try:
            return self.reader.read_cached_into(namespace, key, out, filename)
        except (TypeError, ValueError):  # a destination it cannot use: the full path says so
            return None
        except Exception as error:
            self._bug("read-cached-bug", "page-cache read", error)
            return None

    def _read_guarded(
        self, namespace: Namespace, key: str, out, filename=None, opened=None, silent=False
    ) -> bool:
        """One read (going on from `opened`, when the page-cache path opened the record);
        False on a miss of any kind (counted here unless `silent`; hits are counted by the
        caller, once per batch). A `silent` read (verify) counts only damage and errors, and
        does not set the record's time of last use."""
        miss = 0 if silent else 1
        try:
            self.reader.read_into(namespace, key, out, filename, not silent, opened)
        except FileNotFoundError:
            self.counters.add("misses", miss)
            return False
        except fmt.FormatError as error:
            self._on_bad_record(namespace, key, error, miss)
            return False
        except OSError as error:
            self.counters.add("io_errors")
            self.counters.add("misses", miss)
            self._warn.warning("read-io", "galahad: I/O error reading %s: %s", key, error)
            return False
        except Exception as error:  # a bug, not damage: never raised into the caller
            self.counters.add("misses", miss)
            self._bug("read-bug", "read", error)
            return False
        return True

    def _bug(self, topic: str, what: str, error: Exception) -> None:
        """The store's one way to swallow an exception that is a bug (never damage or an
        I/O error): counted in unexpected_errors and logged with its traceback."""
        count_bug(
            self.counters, self._warn, topic, "galahad: unexpected %s failure: %r", what, error
        )

    def _on_bad_record(
        self, namespace: Namespace, key: str, error: fmt.FormatError, miss: int = 1
    ) -> None:
        foreign = isinstance(error, fmt.NamespaceMismatchError | fmt.KeyMismatchError)
        self.counters.add("foreign" if foreign else "corrupt")
        self.counters.add(failed(error.rule))
        self.counters.add("misses", miss)
        keep = self.read_only or self.config_may_explain(namespace, error)
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

    def config_may_explain(self, namespace: Namespace, error: fmt.FormatError) -> bool:
        """Whether this reader's configuration, not the record, may be why a record failed
        with `error` (reader.reader_may_be_wrong): such a record is kept, never quarantined."""
        return reader_may_be_wrong(error, self.reader.key_proven(namespace.dirname))

    @property
    def encrypted(self) -> bool:
        """Whether this store seals its records with the tenants' key (AES-GCM)."""
        return self.codec.encrypted

    def decode_value(self, namespace: Namespace, key: str, value, expected_size: int):
        """The raw page (a memoryview) of a whole record held in memory, such as a shared
        tier's value, after every rule a record file obeys (V1-V16); raises FormatError."""
        return self.reader.decode_value(namespace, key, value, expected_size)

    def contains(self, namespace: Namespace, key: str) -> bool:
        """Whether a record file exists (cheap; the read still verifies everything)."""
        try:
            fd = self.reader.open_record(namespace.dirname, record_filename(key))
        except (OSError, fmt.FormatError):  # absent, unreadable, not a regular file
            return False
        except Exception as error:
            self._bug("contains-bug", "existence check", error)
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
        return self.publish_many(namespace, keys, datas)

    def publish_many(
        self, namespace: Namespace, keys: list, datas: list, on_published=None
    ) -> list[bool]:
        """put_many, telling `on_published(namespace, [(key, record pieces)])` (a tier's
        writer.PublishHook) the exact bytes of each record this call linked into place: not
        of those found already stored. Any exception it raises is counted as a bug."""
        if len(keys) != len(datas) or self._closed or self.read_only:
            return [False] * len(keys)
        self.namespaces.refresh(namespace)
        results = self.writer.put_many(namespace, keys, datas, on_published)
        return results

    # ----------------------------------------------------------------- deletion

    def quarantine(self, namespace: Namespace, key: str, inode: int | None = None) -> None:
        """Moves a damaged record aside (its bytes stay counted until trimmed). With `inode`,
        only if the record is still the file that was found damaged."""
        path = self.layout.record_path(namespace.dirname, key)
        self.quarantine_box.move_and_trim(path, namespace.dirname, inode)

    def delete(self, namespace: Namespace, key: str) -> bool:
        filename = record_filename(key)
        deleted = self.accounting.unlink_record(namespace.dirname, filename) is not None
        self._drop_pin(namespace.dirname, filename)
        return deleted

    def clear_namespace(self, namespace: Namespace) -> int:
        """Deletes every record of one namespace (never a temp file); returns how many."""
        removed = 0
        for entry in self.layout.records([namespace.dirname], self.accounting.unreadable_dir):
            removed += self.accounting.unlink_record(namespace.dirname, entry.name) is not None
        self._drop_pin(namespace.dirname, None)  # the namespace's pins went with its records
        return removed

    # ----------------------------------------------------------------- accounting

    def _free_bytes(self) -> int:
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def usage_bytes(self) -> int:
        return self.accounting.ledger.read()

    def rebuild_ledger(self) -> int:
        """Recounts the ledger from disk now (and reclaims dead writers' reservations)."""
        return self.accounting.repair.rebuild()

    def namespace_counts(self) -> dict | None:
        """Per namespace directory, what the ledger keeps (ledger.NamespaceCount: records,
        disk_bytes, logical_bytes, newest_ns), read without reading any record; the
        quarantine is not among them. None while the counts are not complete."""
        counts = self.accounting.ledger.namespace_counts()
        if counts is not None:
            counts.pop(QUARANTINE_DIRNAME, None)
        return counts

    def stats(self) -> StoreStats:
        return StoreStats(
            counters=self.counters.snapshot(),
            ledger_bytes=self.accounting.ledger.read(),
            indexed_records=len(self.index),
        )

    def eviction_queues(self) -> dict:
        """The shared eviction order's state (fifo.py), for the operator: bytes named by the
        small queue (records not used since they were written) and the main queue (used at
        least once), and the ledger's bytes; `main_bytes / ledger_bytes` is the share of the
        store that was read again. {} without a log (a read-only store)."""
        return self.accounting.order.queue_state()

    def check(
        self, fix: bool = False, on_record=None, dirnames=None, threads: int = 1
    ) -> CheckReport:
        """Verifies every record of every namespace under root (or of `dirnames`). With fix:
        quarantines damaged records, removes temp files of dead writers and recounts the
        ledger, and drops the pins of records removed behind the store's back."""
        report = self.checker.check(
            fix=fix and not self.read_only, on_record=on_record, dirnames=dirnames, threads=threads
        )
        if fix and not self.read_only:
            for dirname in self.pins.pinned_dirnames():
                if dirnames is None or dirname in dirnames:
                    self._drop_pin(dirname, None)
        return report

    # ----------------------------------------------------------------- the operator's view

    def namespaces_on_disk(self, on_error=None) -> list[tuple[str, Namespace | None]]:
        """(directory name, its namespace.json or None) of every namespace directory under
        the root; `on_error(path, error)` is told of a directory that cannot be read."""
        return [
            (dirname, self.layout.load_namespace(dirname))
            for dirname in self.layout.namespace_dirnames(on_error)
        ]

    def record_files(self, dirnames=None, on_error=None):
        """The record files on disk (layout.FileEntry), of the given namespace directories
        (all when None): a scan that follows no link."""
        return self.layout.records(dirnames, on_error)

    def record_file_path(self, dirname: str, key: str) -> str:
        """Where the record of `key` lives in a namespace directory."""
        return os.path.join(self.layout.namespace_dir(dirname), record_filename(key))

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
        self.reader.files.verify(entry, namespace)

    def live_settings(self) -> list[dict]:
        """The settings of the processes alive on this root (lifetime.live_settings)."""
        return live_settings(self.root, self.accounting.repair.is_alive)

    def quarantined_files(self) -> int:
        return len(self.quarantine_box.names())

    def lifetime_counters(self) -> dict:
        """The counters of every process that used this root, summed (lifetime.py)."""
        return lifetime_totals(self.root)

    def delete_file(
        self, dirname: str, filename: str, *, drop_pin: bool = True, keep_pinned: bool = False
    ) -> int | None:
        """Deletes one record file of a namespace directory through the store (ledger and
        index stay right); the bytes freed, or None if it was not there (its pin, if any,
        is dropped: purge removes pins with the records; without `drop_pin`, the caller
        drops them in batches with drop_pins). With `keep_pinned`, a record pinned by then
        is kept (checked under the ledger's lock, where pins are made)."""
        freed = self.accounting.unlink_record(dirname, filename, keep_pinned=keep_pinned)
        if freed is None and keep_pinned:
            return None
        if drop_pin:
            self._drop_pin(dirname, filename)
        return freed

    def evict_to(self, max_bytes: int) -> tuple[int, int]:
        """Evicts least recently used records (quarantined files first) until the ledger is
        at most `max_bytes`; returns (files evicted, bytes freed)."""
        return self.accounting.evict_to(max_bytes)

    # ----------------------------------------------------------------- pins (store/pins/)

    def pin(self, namespace: Namespace, keys: list[str], document: str) -> PinResult:
        """Pins the records of `keys` for `document` (any label): eviction keeps them until
        they are unpinned, across processes, restarts and SIGKILL. Pinning more than
        max_pinned_bytes is refused (refused_keys), never evicting. Raises OSError when the
        store is read-only or pins/ cannot be written (a linked directory there included)."""
        return self.pins.pin(namespace, list(keys), document)

    def unpin(
        self, *, document: str | None = None, tenant: str | None = None, everything: bool = False
    ) -> int:
        """Unpins a document's records (its label), a tenant's, or all; the bytes no longer
        pinned (a record another document pins stays pinned)."""
        return self.pins.unpin(document=document, tenant=tenant, everything=everything)

    def pinned_bytes_by_tenant(self, *, cached: bool = False) -> dict[str, int]:
        """Pinned bytes per tenant (a small file under pins/: O(tenants)); `cached`: as last
        written, without the pins' lock (one stat; for metrics)."""
        return self.pins.cached_by_tenant() if cached else self.pins.by_tenant()

    def _drop_pin(self, dirname: str, filename: str | None, *, wait: bool = True) -> None:
        """A record left its namespace (deleted, purged, quarantined): its pin goes too,
        so no bytes stay held and counted for it (filename None: every record of dirname).
        Without `wait`, deferred when the pins lock is busy (pins.stale.DeferredDrops)."""
        self.drop_pins(dirname, None if filename is None else [filename], wait=wait)

    def drop_pins(self, dirname: str, filenames: list[str] | None, *, wait: bool = True) -> None:
        """Drops the pins of records of `filenames` (None: any) that left namespace
        `dirname`, in one locked change per batch (after delete_file(..., drop_pin=False))."""
        try:
            self.pins.drop_stale(dirname, filenames, wait=wait)
        except OSError as error:  # the pin stays until unpinned (or dropped next time)
            self.counters.add("io_errors")
            self._warn.warning("pin-drop", "galahad: a pin of %s stays: %s", dirname, error)
        except Exception as error:  # never raised into a caller
            self._bug("pin-drop-bug", "pin drop", error)

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
        self.pins.close()
        with contextlib.suppress(OSError):
            self.budget.settle(0, 0)  # what the ledger refused earlier, if anything
        self.accounting.close()
        self.layout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
