"""Evicted files unlinked on a background thread, so that a put never waits for them.

Eviction takes a record's name under the ledger's lock (a rename to a temp name of this
process, journaled, its bytes held: eviction_order.py); what is left is the unlink that frees
its blocks, which for a record long written costs a filesystem far more than a put (about
0.7 ms for a 32 KiB file on ext4, against 10 us for one whose data was never written). Done on
the put's thread it made a put into a full store several times slower than one with room.
Here up to REAP_THREADS threads do them (a filesystem frees several files' blocks at once
faster than one by one: 4 threads took a third of one's time here), each batch then telling
`on_freed` the bytes it held:
eviction keeps those bytes reserved in the ledger (Ledger.hold) until then, so the ledger
never counts less than the disk holds and the budget stays a hard cap. The backlog is bounded
(REAP_BACKLOG_MAX files, REAP_BACKLOG_MAX_BYTES): past it the caller unlinks itself. No reader
opens a temp name; if this process dies first, its reservation is taken back with its other
ones and the sweep of a dead writer's temp files removes what is left.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque

REAP_BACKLOG_MAX = 4096  # files waiting, per process
REAP_BACKLOG_MAX_BYTES = 64 << 20  # and their bytes
REAP_BATCH = 16  # unlinks per report to on_freed (one ledger update)
REAP_THREADS = 4  # a filesystem frees several files' blocks at once faster than one by one


class Reaper:
    def __init__(self, dir_fd_of, on_freed):
        self._dir_fd_of = dir_fd_of  # namespace dirname -> its held directory descriptor
        self._on_freed = on_freed  # bytes whose files are gone (their hold ends)
        self._pending: deque = deque()
        self._pending_bytes = 0
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._taken = 0  # files a thread is unlinking now
        self._closed = False

    def _unlink(self, dirname: str, name: str) -> None:
        with contextlib.suppress(OSError):  # else swept with this process's temp files
            os.unlink(name, dir_fd=self._dir_fd_of(dirname))

    def unlink(self, dirname: str, name: str, size: int) -> None:
        """Unlinks `name` in the namespace directory soon (now, when the backlog is full)."""
        with self._changed:
            inline = (
                self._closed
                or len(self._pending) + self._taken >= REAP_BACKLOG_MAX
                or self._pending_bytes + size > REAP_BACKLOG_MAX_BYTES
            )
            if not inline:
                self._pending.append((dirname, name, size))
                self._pending_bytes += size
                if len(self._threads) < min(REAP_THREADS, len(self._pending)):
                    thread = threading.Thread(target=self._run, name="galahad-reap", daemon=True)
                    self._threads.append(thread)
                    thread.start()
                self._changed.notify_all()
        if inline:
            self._unlink(dirname, name)
            self._on_freed(size)

    @property
    def pending_bytes(self) -> int:
        """Bytes of evicted files not unlinked yet (on disk past the ledger's count)."""
        with self._changed:
            return self._pending_bytes

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                if not self._pending:
                    return
                batch = [
                    self._pending.popleft() for _ in range(min(REAP_BATCH, len(self._pending)))
                ]
                self._taken += len(batch)
            for dirname, name, _size in batch:
                self._unlink(dirname, name)
            freed = sum(size for _dirname, _name, size in batch)
            self._on_freed(freed)
            with self._changed:
                self._taken -= len(batch)
                self._pending_bytes -= freed
                self._changed.notify_all()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Waits until every pending file is unlinked; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending and not self._taken, timeout_s)

    def close(self) -> None:
        """Unlinks what is pending, then stops the threads."""
        with self._changed:
            self._closed = True
            threads = list(self._threads)
            self._changed.notify_all()
        for thread in threads:
            thread.join()
