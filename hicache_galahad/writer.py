"""The staged write: temp files, then one flush, then publication with link(2).

A batch of records is written in three phases: every record goes to its own temp file (its
bytes reserved in the budget first), then the temp files are fsynced concurrently (the
filesystem commits them together), then each is published with link(2), which never replaces
a record, and the directory is fsynced once. A SIGKILL at any point leaves at most temp files,
which are never read as records. A put that cannot complete returns False and leaves nothing
partial behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass

from . import format as fmt
from .budget import Budget
from .codec import RecordCodec
from .eviction import LruIndex
from .layout import StoreLayout, fsync_dir, record_filename
from .metrics import Counters, RateLimitedLog
from .namespace import Namespace
from .quarantine import Quarantine
from .reader import RecordReader, open_record

IOV_MAX = 1024
STAGE_BATCH = 32  # records written, then fsynced together (temp files open at once)


@dataclass
class _Staged:
    """A record written to its temp file, its bytes reserved, not yet published."""

    key: str
    path: str
    temp_path: str
    location: tuple
    total_bytes: int
    fd: int | None = None
    error: OSError | None = None
    done: bool = False

    def sync(self) -> None:
        """Phase 2 (run concurrently for a whole batch)."""
        try:
            os.fsync(self.fd)
        except OSError as error:
            self.error = error

    def abandon(self, budget: Budget, keep: bool = False) -> None:
        """Closes and removes the temp file and ends the reservation (kept if published)."""
        if self.done:
            return
        self.done = True
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        with contextlib.suppress(OSError):
            os.unlink(self.temp_path)
        budget.end_reservation(self.total_bytes, keep=keep)


def _write_all(fd, buffers) -> None:
    views = [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)]
    while views:
        written = os.writev(fd, views[:IOV_MAX])
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


class RecordWriter:
    def __init__(
        self,
        layout: StoreLayout,
        codec: RecordCodec,
        reader: RecordReader,
        budget: Budget,
        quarantine: Quarantine,
        index: LruIndex,
        counters: Counters,
        warn: RateLimitedLog,
        parallel,
        *,
        writer_token: str,
        durability: str,
        flusher=None,
    ):
        self.layout = layout
        self.codec = codec
        self.reader = reader
        self.budget = budget
        self.quarantine = quarantine
        self.index = index
        self.counters = counters
        self.warn = warn
        self.parallel = parallel
        self.writer_token = writer_token
        self.sync_each_batch = durability == "fsync"
        self.flusher = flusher  # deferred durability: published records are flushed later

    def put_many(self, namespace: Namespace, keys: list, datas: list) -> list[bool]:
        results: list[bool] = []
        for start in range(0, len(keys), STAGE_BATCH):
            batch_keys = keys[start : start + STAGE_BATCH]
            batch_datas = datas[start : start + STAGE_BATCH]
            staged = self.parallel(
                lambda index, ks=batch_keys, ds=batch_datas: self._guarded(
                    self._stage, namespace, ks[index], ds[index]
                ),
                len(batch_keys),
            )
            pending = [item for item in staged if isinstance(item, _Staged)]
            if self.sync_each_batch:
                self.parallel(lambda index, items=pending: items[index].sync(), len(pending))
            published = [
                self._guarded(self._publish, item) if isinstance(item, _Staged) else item
                for item in staged
            ]
            if self.flusher is not None:
                self.flusher.add(
                    self.layout.namespace_dir(namespace.dirname),
                    [
                        record_filename(key)
                        for key, ok in zip(batch_keys, published, strict=True)
                        if ok
                    ],
                )
            results += published
        if self.sync_each_batch and any(results) and not self._sync_dir(namespace):
            results = [False] * len(keys)
        self.counters.add("puts_failed", results.count(False))
        self.index.touch_many_head_last(
            [
                (namespace.dirname, record_filename(key))
                for key, ok in zip(keys, results, strict=True)
                if ok
            ]
        )
        return results

    def _sync_dir(self, namespace: Namespace) -> bool:
        try:
            fsync_dir(self.layout.namespace_dir(namespace.dirname))
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
                args[0].abandon(self.budget)
            self.counters.add("unexpected_errors")
            self.warn.warning(
                "write-bug", "galahad: unexpected write failure: %r", error, exc_info=True
            )
            return False

    def _existing_is_sound(self, namespace: Namespace, key_bytes: bytes, path: str, raw_len):
        """None if no record is there; True if the one there passes the header checks and
        holds a page of this size; False otherwise (it is then replaced)."""
        try:
            fd = open_record(path)
        except FileNotFoundError:
            return None
        except (OSError, fmt.FormatError):
            return False
        try:
            header, _ = self.reader.read_header(fd, os.fstat(fd).st_size, namespace, key_bytes)
            return header.raw_len == raw_len
        except fmt.FormatError:
            return False
        finally:
            os.close(fd)

    def _stage(self, namespace: Namespace, key: str, data):
        """Phase 1: True if a sound record already exists, False on failure, else the
        reserved, written (not yet fsynced) temp file as a _Staged."""
        key_bytes = fmt.encode_key(key)
        filename = record_filename(key)
        path = os.path.join(self.layout.namespace_dir(namespace.dirname), filename)
        raw_len = sum(len(segment) for segment in fmt.as_segments(data))
        sound = self._existing_is_sound(namespace, key_bytes, path, raw_len)
        if sound:
            self.counters.add("puts_existing")
            self.index.touch((namespace.dirname, filename))
            return True
        if sound is False:  # a damaged or wrong record: a correct put replaces it
            self.quarantine.move_and_trim(path, namespace.dirname)

        header, payload_chunks = self.codec.encode(namespace, key_bytes, data)
        total_bytes = len(header) + sum(len(chunk) for chunk in payload_chunks)
        if not self.budget.reserve(total_bytes):
            self.counters.add("no_space")
            return False
        staged = _Staged(
            key=key,
            path=path,
            temp_path=self.layout.new_temp_path(namespace.dirname, filename, self.writer_token),
            location=(namespace.dirname, filename),
            total_bytes=total_bytes,
        )
        try:
            staged.fd = os.open(
                staged.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
            )
            _write_all(staged.fd, [header, *payload_chunks])
        except OSError as error:
            self._write_failed(key, error)
            staged.abandon(self.budget)
            return False
        return staged

    def _publish(self, staged: _Staged) -> bool:
        """Phase 3: link the flushed temp file into place (never replacing a record)."""
        published = False
        try:
            if staged.error is not None:
                raise staged.error
            os.close(staged.fd)
            staged.fd = None
            try:
                os.link(staged.temp_path, staged.path)
                published = True
            except FileExistsError:
                self.counters.add("puts_existing")
        except OSError as error:
            self._write_failed(staged.key, error)
            return False
        finally:
            staged.abandon(self.budget, keep=published)
        if published:  # else another writer published the same record first
            self.index.add(staged.location, staged.total_bytes)
            self.counters.add("puts")
            self.counters.add("put_bytes", staged.total_bytes)
        return True

    def _write_failed(self, key: str, error: OSError) -> None:
        self.counters.add("no_space" if error.errno == errno.ENOSPC else "io_errors")
        self.warn.warning("write-io", "galahad: write of %s failed: %s", key, error)
