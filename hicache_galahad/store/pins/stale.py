"""Stale pins: the pins of records that left their namespace (deleted, purged, quarantined)
dropped, so no bytes stay held by the link and counted for a record no one can read.

A drop asked for on SGLang's read path (a damaged pinned record quarantined) never waits for
the pins lock, which a pin holds for its whole call (a suspended `galahad warm --pin` holds it
indefinitely): when the lock is busy the drop is deferred to a background thread that tries
the lock without waiting, every RETRY_S at first and backing off. A drop needs no memory of
its own to be exact: a pin is stale when its record link is no longer the file at the
record's name, which the disk shows to whoever looks (`galahad verify --fix` drops every one).
"""

from __future__ import annotations

import contextlib
import os
import threading

from ..layout import is_record_name
from .state import LockBusy, count, journal, locked, settle
from .tree import BATCH, RECORDS_DIR, REFS_DIR, PinsRoot, plain, read_pin, stat_at, unlink_at

RETRY_S = 0.05
RETRY_MAX_S = 1.0
CLOSE_WAIT_S = 1.0


def drop_stale(root: PinsRoot, dirname: str, filenames=None, *, wait: bool = True) -> int:
    """Drops the pins of records that left namespace `dirname`: those of `filenames`, or
    every pin of the namespace when None. Returns the bytes no longer pinned. O(1) per name
    when there is no pin (one stat). Without `wait`, LockBusy when the pins lock is held."""
    if root.read_only or not plain(dirname):
        return 0
    if filenames is not None:
        probe = os.path.join(root.path, RECORDS_DIR, dirname)
        filenames = [f for f in filenames if os.path.lexists(os.path.join(probe, f))]
        if not filenames:
            return 0
    elif not os.path.isdir(os.path.join(root.path, RECORDS_DIR, dirname)):
        return 0
    released = 0
    with locked(root, create=False, wait=wait) as (dirs, state):
        if dirs is None:
            return 0
        records_fd = dirs.get(RECORDS_DIR, dirname)
        refs_fd = dirs.get(REFS_DIR, dirname)
        if records_fd is None:
            return 0
        names = sorted(os.listdir(records_fd)) if filenames is None else list(filenames)
        try:
            ns_fd = root.layout.namespace_fd(dirname)
        except OSError:
            ns_fd = None
        for start in range(0, len(names), BATCH):
            stale = []
            for filename in names[start : start + BATCH]:
                if not is_record_name(filename):
                    continue
                link = stat_at(filename, records_fd)
                if link is None:
                    continue
                there = stat_at(filename, ns_fd)
                if there is not None and there.st_ino == link.st_ino:
                    continue  # still the record: the pin stays
                stale.append((filename, read_pin(filename, refs_fd, link)))
            if not stale:
                continue
            items = [[dirname, f, "drop", pin.nbytes, pin.tenant] for f, pin in stale]
            journal(root, dirs, state, {"op": "drop", "items": items})
            for filename, pin in stale:
                unlink_at(filename, records_fd)
                unlink_at(filename, refs_fd)
                count(state, pin.tenant, -pin.nbytes, -1)
                released += pin.nbytes
            settle(root, dirs, state, [(RECORDS_DIR, dirname), (REFS_DIR, dirname)])
    if released:
        root.counters.add("pins_dropped_bytes", released)
    return released


class DeferredDrops:
    """Pin drops that never wait for the pins lock: made at once when it is free, else by a
    background thread (started on demand, gone when nothing is left)."""

    def __init__(self, root: PinsRoot):
        self._root = root
        self._pending: dict[str, set | None] = {}  # dirname -> filenames (None: all)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def drop(self, dirname: str, filenames=None) -> int:
        """drop_stale without waiting: the bytes dropped now (0 when deferred)."""
        try:
            return drop_stale(self._root, dirname, filenames, wait=False)
        except LockBusy:
            self._defer(dirname, filenames)
            return 0

    def pending(self) -> int:
        """Namespaces with a drop still to make."""
        with self._lock:
            return len(self._pending)

    def _defer(self, dirname: str, filenames) -> None:
        with self._lock:
            if self._closed:
                return
            self._merge(dirname, filenames)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="galahad-pin-drops", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        delay_s = RETRY_S
        while True:
            self._wake.wait(delay_s)
            done = self.flush()
            with self._lock:
                if self._closed or (done and not self._pending):
                    self._thread = None
                    return
            delay_s = min(delay_s * 2, RETRY_MAX_S)

    def flush(self) -> bool:
        """Tries every pending drop once without waiting; True when none is left."""
        with self._lock:
            pending, self._pending = self._pending, {}
        busy = {}
        for dirname, filenames in pending.items():
            names = None if filenames is None else sorted(filenames)
            try:
                drop_stale(self._root, dirname, names, wait=False)
            except LockBusy:
                busy[dirname] = filenames
            except Exception:  # the pin stays stale until the next drop or verify --fix
                self._root.counters.add("io_errors")
        if busy:
            with self._lock:
                for dirname, filenames in busy.items():
                    self._merge(dirname, filenames)
        return not busy

    def _merge(self, dirname: str, filenames) -> None:
        """Adds to the pending drops (under self._lock); None (every pin) absorbs names."""
        if filenames is None or self._pending.get(dirname, set()) is None:
            self._pending[dirname] = None
        else:
            self._pending.setdefault(dirname, set()).update(filenames)

    def close(self) -> None:
        """Stops the thread after one last try (what stays is stale on disk, see above)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(CLOSE_WAIT_S)
        with contextlib.suppress(Exception):
            self.flush()
