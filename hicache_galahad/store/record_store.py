"""RecordStore: verified, crash-safe, budgeted records on a local filesystem: the data path.

The verbs SGLang's path and the tier over the store use (the `KVStore` protocol: register,
read, verify, contains, write, delete, pin), over the parts of the store (parts.StoreParts;
README.md's Layout and docs/ARCHITECTURE.md's Modules table name every module). The
operator's verbs (check, recounts, scans, purges, eviction to a cap) are admin.StoreAdmin's,
over the same parts.

Every public method is safe to call from many threads and from several processes on one
root. Data errors never raise: a read that fails any check is a miss (counted, quarantined,
warned about at a limited rate); a write that cannot be completed returns False and leaves
no partial record behind.
"""

from __future__ import annotations

import os

from ..config.options import StoreOptions
from ..record import format as fmt
from ..record.namespace import Namespace
from ..telemetry.metrics import failed
from .kvstore import StoreStats
from .layout import record_filename
from .parts import StoreParts
from .pins import PinResult
from .reader import reader_may_be_wrong

__all__ = ["RecordStore", "record_filename"]


def _nbytes(out) -> int:
    if isinstance(out, list | tuple):
        return sum(memoryview(segment).nbytes for segment in out)
    return memoryview(out).nbytes


class RecordStore:
    """Records of many namespaces under one root directory (see config.StoreOptions)."""

    def __init__(self, root: str | StoreOptions, **options):
        self.options = root if isinstance(root, StoreOptions) else StoreOptions(root, **options)
        self.root = self.options.root
        self.max_bytes = self.options.max_bytes
        self.read_only = self.options.read_only
        self.parts = parts = StoreParts(self.options)
        self.context = parts.context
        self.counters = parts.counters
        self.layout = parts.layout
        self.codec = parts.codec
        self.accounting = parts.accounting
        self.index = parts.accounting.index
        self.quarantine_box = parts.accounting.quarantine
        self.pins = parts.pins
        self.budget = parts.budget
        self.reader = parts.reader
        self.flusher = parts.flusher
        self.writer = parts.writer
        self.namespaces = parts.namespaces
        self._closed = False

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
        rest_results = self.parts.parallel(
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
        self.parts.recent_reads.note_run(read)  # for the shared order's main queue
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
            self.context.bug("read-cached-bug", "page-cache read", error)
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
            self.context.warn.warning("read-io", "galahad: I/O error reading %s: %s", key, error)
            return False
        except Exception as error:  # a bug, not damage: never raised into the caller
            self.counters.add("misses", miss)
            self.context.bug("read-bug", "read", error)
            return False
        return True

    def _on_bad_record(
        self, namespace: Namespace, key: str, error: fmt.FormatError, miss: int = 1
    ) -> None:
        foreign = isinstance(error, fmt.NamespaceMismatchError | fmt.KeyMismatchError)
        self.counters.add("foreign" if foreign else "corrupt")
        self.counters.add(failed(error.rule))
        self.counters.add("misses", miss)
        keep = self.read_only or self.config_may_explain(namespace, error)
        self.context.warn.warning(
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
            self.context.bug("contains-bug", "existence check", error)
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
        for entry in self.layout.records([namespace.dirname], self.context.unreadable_dir):
            removed += self.accounting.unlink_record(namespace.dirname, entry.name) is not None
        self._drop_pin(namespace.dirname, None)  # the namespace's pins went with its records
        return removed

    # ----------------------------------------------------------------- sizes

    def usage_bytes(self) -> int:
        return self.accounting.ledger.read()

    def stats(self) -> StoreStats:
        return StoreStats(
            counters=self.counters.snapshot(),
            ledger_bytes=self.accounting.ledger.read(),
            indexed_records=len(self.index),
        )

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

    def _drop_pin(self, dirname: str, filename: str | None) -> None:
        """A record left its namespace (deleted, cleared): its pin goes too, so no bytes
        stay held and counted for it (filename None: every record of dirname)."""
        self.parts.drop_pins(dirname, None if filename is None else [filename])

    # ----------------------------------------------------------------- plumbing

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.parts.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
