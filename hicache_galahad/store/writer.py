"""The staged write: temp files, then one flush, then publication with link(2).

A batch of records is written in phases: every record is encoded, then the batch's bytes are
reserved in the budget with one ledger update (record by record, in order, when the batch does
not fit as a whole), then every record goes to its own temp file, then (in "fsync" durability)
the temp files are fsynced concurrently (the filesystem commits them together), then each is
published with link(2), which never replaces a record, and the reservations end with one
ledger update. Every file operation is relative to one descriptor of the namespace directory
(opened without following links, duplicated for the whole put), never through a path. A
SIGKILL at any point leaves at most temp files, which are never read as records, and a
reservation that the next rebuild takes back. A put that cannot complete returns False and
leaves nothing partial behind.

A caller may pass a publish hook (`on_published`, the shared tier's): after each batch it is
handed, for the records this put linked into place (never those found already stored, by this
put or by another writer), the exact bytes written to their files, so that nothing is encoded
twice. The bytes are held from encoding until the hook returns, within the batch bounds below.
The hook runs once the batch is linked; in "fsync" durability that is before the directory's
fsync at the end of the put, so a record whose put then fails (returns False) may already be
shared: a sound record of its key, which every reader verifies.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..record import format as fmt
from ..record.codec import RecordCodec
from ..record.namespace import Namespace
from ..telemetry.metrics import count_bug
from .budget import Budget
from .context import StoreContext
from .eviction import LruIndex
from .journal import JournalItem
from .layout import record_filename
from .payload import IOV_MAX
from .quarantine import Quarantine
from .reader import RecordReader

STAGE_BATCH = 32  # records written, then fsynced together (temp files open at once)
# A batch's encoded records are all held before any is written (their bytes are reserved
# together): this bounds that memory for encrypted or compressed large pages.
STAGE_BATCH_MAX_BYTES = 64 * 1024 * 1024
# Records smaller than this are encoded and written on the calling thread: for them the
# threads' hand-offs cost more than they overlap (measured on 2 cores: 256 KiB records ran
# 15% faster serially, 1 MiB records 20% faster over the I/O threads).
PARALLEL_MIN_RECORD_BYTES = 512 * 1024

# on_published(namespace, [(key, record pieces: header and payload chunks, in order)]): the
# records one batch of a put published, with the bytes of their files.
PublishHook = Callable[[Namespace, list], None]


@dataclass
class _Staged:
    """A record on its way: encoded, then reserved, written to its temp file, published."""

    key: str
    dir_fd: int  # the namespace directory, for the whole put
    filename: str
    temp_name: str
    location: tuple
    total_bytes: int
    page_bytes: int  # the page's own (logical) bytes, counted in the ledger's namespace counts
    chunks: list | None  # header and payload, until written
    record: list | None = None  # the same pieces, kept after writing for the publish hook
    fd: int | None = None
    error: OSError | None = None
    done: bool = False
    published: bool = False  # linked into place by this put (its bytes are kept)
    stored: bool = False  # published, or the same record was published by another writer

    def sync(self) -> None:
        """Phase 3 (run concurrently for a whole batch, in "fsync" durability)."""
        try:
            os.fsync(self.fd)
        except OSError as error:
            self.error = error

    def abandon(self) -> None:
        """Closes and removes the temp file (a published record keeps its link)."""
        if self.done:
            return
        self.done = True
        self.chunks = None
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        with contextlib.suppress(OSError):
            os.unlink(self.temp_name, dir_fd=self.dir_fd)


def _write_all(fd, buffers) -> None:
    views = [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)]
    while views:
        written = os.writev(fd, views[:IOV_MAX])
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _record_bytes(data) -> int:
    try:
        return sum(len(segment) for segment in fmt.as_segments(data))
    except Exception:
        return 0  # not a buffer: _prepare reports it


def _filename(key) -> str | None:
    """record_filename(key), computed once per put; None for a key that has none (not a
    string: _prepare reports it as that record's failure)."""
    try:
        return record_filename(key)
    except Exception:
        return None


def _batches(record_bytes: list[int]):
    """(start, end) of consecutive batches of at most STAGE_BATCH records and, unless one
    record alone is larger, STAGE_BATCH_MAX_BYTES."""
    start = 0
    while start < len(record_bytes):
        end, total = start, 0
        while end < len(record_bytes) and end - start < STAGE_BATCH:
            total += record_bytes[end]
            if total > STAGE_BATCH_MAX_BYTES and end > start:
                break
            end += 1
        yield start, end
        start = end


def _serial(work, count: int) -> list:
    return [work(index) for index in range(count)]


class RecordWriter:
    def __init__(
        self,
        context: StoreContext,
        codec: RecordCodec,
        reader: RecordReader,
        budget: Budget,
        quarantine: Quarantine,
        index: LruIndex,
        parallel,
        *,
        writer_token: str,
        flusher=None,
    ):
        """`parallel(work, count)` runs work(i) over the store's I/O threads; `writer_token`
        names this process in temp files; `flusher` (deferred durability) makes published
        records durable later."""
        self.layout = context.layout
        self.codec = codec
        self.reader = reader
        self.budget = budget
        self.quarantine = quarantine
        self.index = index
        self.counters = context.counters
        self.warn = context.warn
        self.parallel = parallel
        self.writer_token = writer_token
        self.sync_each_batch = context.options.durability == "fsync"
        self.flusher = flusher  # deferred durability: published records are flushed later

    def put_many(
        self, namespace: Namespace, keys: list, datas: list, on_published: PublishHook | None = None
    ) -> list[bool]:
        try:
            dir_fd = self.layout.namespace_fd_dup(namespace.dirname)
        except OSError as error:  # no directory (or a link where it was): nothing is written
            self._write_failed(f"{len(keys)} record(s) of {namespace.dirname}", error)
            self.counters.add("puts_failed", len(keys))
            return [False] * len(keys)
        filenames = [_filename(key) for key in keys]
        try:
            results: list[bool] = []
            sizes = [_record_bytes(data) for data in datas]
            for start, end in _batches(sizes):
                results += self._put_batch(
                    namespace,
                    dir_fd,
                    list(zip(keys[start:end], filenames[start:end], strict=True)),
                    datas[start:end],
                    max(sizes[start:end]),
                    on_published,
                )
            if self.sync_each_batch and any(results) and not self._sync_dir(dir_fd):
                results = [False] * len(keys)
        finally:
            os.close(dir_fd)
        self.counters.add("puts_failed", results.count(False))
        self.index.touch_many_head_last(
            [(namespace.dirname, name) for name, ok in zip(filenames, results, strict=True) if ok]
        )
        return results

    def _put_batch(
        self, namespace, dir_fd, names, datas, largest_bytes: int, on_published=None
    ) -> list[bool]:
        """One batch of (key, file name) pairs and their pages."""
        run = self.parallel if largest_bytes >= PARALLEL_MIN_RECORD_BYTES else _serial
        prepared = run(
            lambda index: self._guarded(
                self._prepare, namespace, dir_fd, *names[index], datas[index]
            ),
            len(names),
        )
        reserved = self._reserve([item for item in prepared if isinstance(item, _Staged)])
        ledger_failed = False
        keep = on_published is not None
        try:
            written = run(
                lambda index: self._guarded(self._write_temp, reserved[index], keep),
                len(reserved),
            )
            pending = [item for item, ok in zip(reserved, written, strict=True) if ok]
            if self.sync_each_batch:
                self.parallel(lambda index: pending[index].sync(), len(pending))
            ledger_failed = not self._publish_all(namespace.dirname, pending)
        finally:
            for item in reserved:
                item.abandon()
            kept_bytes = sum(item.total_bytes for item in reserved if item.published)
            try:  # what publish counted is settled; the rest of the reservation ends here
                self.budget.settle(0, sum(item.total_bytes for item in reserved) - kept_bytes)
            except OSError as error:  # published records stay sound; retried next batch
                if not ledger_failed:  # (reported once per batch)
                    self._write_failed("the batch (ledger)", error)
        published = [item for item in reserved if item.published]
        if published:
            for item in published:
                self.index.add(item.location, item.total_bytes)
            self.counters.add("puts", len(published))
            self.counters.add("put_bytes", kept_bytes)
            if self.flusher is not None:
                self.flusher.add(
                    dir_fd,
                    self.layout.namespace_dir(namespace.dirname),
                    [item.filename for item in published],
                )
        if keep:
            records = [(item.key, item.record) for item in published]
            for item in reserved:
                item.record = None
            if records:
                self._guarded(on_published, namespace, records)
        return [item.stored if isinstance(item, _Staged) else item for item in prepared]

    def _reserve(self, encoded: list) -> list:
        """Reserves the batch's bytes in one ledger update when they fit together; else
        record by record, in order. Returns the records whose bytes are reserved (none when
        the ledger cannot be written)."""
        reserved: list = []
        try:
            if encoded and self.budget.reserve(sum(item.total_bytes for item in encoded)):
                return encoded
            for item in encoded:
                if self.budget.reserve(item.total_bytes):
                    reserved.append(item)
        except OSError as error:
            self._write_failed("the batch (ledger)", error)
            return reserved
        self.counters.add("no_space", len(encoded) - len(reserved))
        return reserved

    def _sync_dir(self, dir_fd: int) -> bool:
        try:
            os.fsync(dir_fd)
            return True
        except OSError as error:
            self.counters.add("io_errors")
            self.warn.warning("dir-fsync", "galahad: directory fsync failed: %s", error)
            return False

    def _guarded(self, step, *args):
        """Runs one write step; any unexpected exception is a failed write, never raised."""
        try:
            return step(*args)
        except Exception as error:
            if isinstance(args[0], _Staged):
                args[0].abandon()
            count_bug(
                self.counters,
                self.warn,
                "write-bug",
                "galahad: unexpected write failure: %r",
                error,
            )
            return False

    def _existing_is_sound(self, namespace, dir_fd: int, key_bytes: bytes, filename, raw_len):
        """None if no record is there; True if the one there passes the header checks and
        holds a page of this size; False otherwise (it is then replaced)."""
        try:
            header, _ = self.reader.stored_header(dir_fd, filename, namespace, key_bytes)
        except FileNotFoundError:
            return None
        except (OSError, fmt.FormatError):
            return False
        return header.raw_len == raw_len

    def _prepare(self, namespace: Namespace, dir_fd: int, key: str, filename: str, data):
        """Phase 1: True if a sound record already exists, else the encoded record as a
        _Staged (nothing reserved or written yet)."""
        key_bytes = fmt.encode_key(key)
        raw_len = sum(len(segment) for segment in fmt.as_segments(data))
        sound = self._existing_is_sound(namespace, dir_fd, key_bytes, filename, raw_len)
        if sound:
            self.counters.add("puts_existing")
            self.index.touch((namespace.dirname, filename))
            return True
        if sound is False:  # a damaged or wrong record: a correct put replaces it
            self.quarantine.move_and_trim(filename, namespace.dirname, dir_fd=dir_fd)
        header, payload_chunks = self.codec.encode(namespace, key_bytes, data)
        return _Staged(
            key=key,
            dir_fd=dir_fd,
            filename=filename,
            temp_name=self.layout.new_temp_name(filename, self.writer_token),
            location=(namespace.dirname, filename),
            total_bytes=len(header) + sum(len(chunk) for chunk in payload_chunks),
            page_bytes=raw_len,
            chunks=[header, *payload_chunks],
        )

    def _write_temp(self, staged: _Staged, keep: bool = False) -> bool:
        """Phase 2 (its bytes reserved): the record into its temp file, not yet fsynced; with
        `keep`, its pieces stay held (staged.record) for the publish hook."""
        try:
            staged.fd = os.open(
                staged.temp_name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=staged.dir_fd,
            )
            _write_all(staged.fd, staged.chunks)
        except OSError as error:
            self._write_failed(staged.key, error)
            staged.abandon()
            return False
        staged.record = staged.chunks if keep else None
        staged.chunks = None
        return True

    def _publish_all(self, dirname: str, pending: list) -> bool:
        """Phase 4 for the batch: linked and counted in one ledger update (budget.publish),
        so that the ledger and the disk never disagree, even for a recount running then."""
        items = []
        for item in pending:
            with contextlib.suppress(OSError, TypeError):
                inode = os.fstat(item.fd).st_ino
                items.append(JournalItem(item.filename, inode, item.total_bytes, item.page_bytes))

        def link_all() -> int:
            for item in pending:
                self._guarded(self._publish, item)
            return sum(item.total_bytes for item in pending if item.published)

        try:
            self.budget.publish(dirname, items, link_all)
        except OSError as error:  # published records stay sound; counted with the next batch
            self._write_failed("the batch (ledger)", error)
            return False
        return True

    def _publish(self, staged: _Staged) -> None:
        """Phase 4: link the written temp file into place (never replacing a record)."""
        try:
            if staged.error is not None:
                raise staged.error
            os.close(staged.fd)
            staged.fd = None
            try:
                os.link(
                    staged.temp_name,
                    staged.filename,
                    src_dir_fd=staged.dir_fd,
                    dst_dir_fd=staged.dir_fd,
                    follow_symlinks=False,
                )
                staged.published = True
            except FileExistsError:  # another writer published the same record first
                self.counters.add("puts_existing")
            staged.stored = True
        except OSError as error:
            self._write_failed(staged.key, error)
        finally:
            staged.abandon()

    def _write_failed(self, key: str, error: OSError) -> None:
        self.counters.add("no_space" if error.errno == errno.ENOSPC else "io_errors")
        self.warn.warning("write-io", "galahad: write of %s failed: %s", key, error)
