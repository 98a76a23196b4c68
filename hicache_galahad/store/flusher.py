"""Deferred durability: published records are fsynced in the background, within a window.

A put in the default "deferred" mode returns once its record is published (written to a temp
file, then linked into place, so a crash of the process leaves nothing damaged). A power loss
may still lose what the page cache held: at most the records published in the last
`interval_s`, which come back truncated, zero-filled, torn or missing, fail their digest (every
read is verified) and are misses. The flusher bounds that window.

Like the writer, it never goes through a path: the writer hands it each namespace directory's
descriptor with the names it published there, and the flusher holds a duplicate of it until
the window's flush has fsynced those records (each opened relative to it, never through a
link) and the directory itself. A record evicted or replaced before then is not ours any more:
skipped, or fsynced as found.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from ..errors import NotARegularFileError
from ..telemetry.metrics import Counters, RateLimitedLog
from .safe_files import open_regular

log = logging.getLogger("hicache_galahad.store")
FLUSH_THREADS = 4  # fsyncs in flight at once: the filesystem commits them together
CLOSE_TIMEOUT_S = 10.0  # the most close() waits for a flush still running

# Flushers not closed yet: a process that exits without closing its store still flushes the
# records of its last window (at exit the thread pool refuses work, so that flush is serial).
_open_flushers: weakref.WeakSet[Flusher] = weakref.WeakSet()
_exit_hook_lock = threading.Lock()
_exit_hook_registered = False


def _flush_at_exit() -> None:
    for flusher in list(_open_flushers):
        with contextlib.suppress(Exception):
            flusher.close()


def _register(flusher: Flusher) -> None:
    global _exit_hook_registered
    with _exit_hook_lock:
        _open_flushers.add(flusher)
        if not _exit_hook_registered:
            atexit.register(_flush_at_exit)
            _exit_hook_registered = True


class Flusher:
    def __init__(self, interval_s: float, counters: Counters):
        self.interval_s = interval_s
        self._counters = counters
        self._warn = RateLimitedLog(log)
        # directory path (for messages) -> [a descriptor of it, the names published there]
        self._pending: dict[str, tuple[int, set[str]]] = {}
        self._in_flight = 0  # taken from _pending by a flush that has not finished
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._pool = ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="galahad-flush")
        self._thread = threading.Thread(target=self._run, name="galahad-flusher", daemon=True)
        self._thread.start()
        _register(self)

    def add(self, dir_fd: int, directory: str, filenames) -> None:
        """Records published as `filenames` in the directory open at `dir_fd` (the
        writer's; duplicated here when this window has none of it yet), whose path is
        `directory` (for messages)."""
        with self._lock:
            pending = self._pending.get(directory)
            if pending is None:
                pending = self._pending[directory] = (os.dup(dir_fd), set())
            pending[1].update(filenames)

    @property
    def pending(self) -> int:
        """Records published and not yet flushed (queued, or in a flush still running)."""
        with self._lock:
            return self._in_flight + sum(len(names) for _, names in self._pending.values())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception as error:  # never let the thread die: the next window retries
                self._warn.warning("flush-bug", "galahad: background flush failed: %r", error)

    def flush(self, timeout_s: float | None = None) -> int:
        """fsyncs every record published so far, then their directories; returns how many.
        With `timeout_s`, gives up (returning 0) if another flush holds on that long."""
        if not self._flush_lock.acquire(timeout=-1 if timeout_s is None else max(0, timeout_s)):
            return 0
        try:
            return self._flush_locked()
        finally:
            self._flush_lock.release()

    def _flush_locked(self) -> int:
        with self._lock:
            pending, self._pending = self._pending, {}
            files = [
                (dir_fd, directory, name)
                for directory, (dir_fd, names) in pending.items()
                for name in names
            ]
            self._in_flight = len(files)
        try:
            flushed = self._fsync_all(files)
            for directory, (dir_fd, _) in pending.items():
                try:
                    os.fsync(dir_fd)
                except OSError as error:
                    self._failed(directory, error)
            if files:
                self._counters.add("flushes")
                self._counters.add("flushed_records", flushed)
            return flushed
        finally:
            for dir_fd, _ in pending.values():
                with contextlib.suppress(OSError):
                    os.close(dir_fd)
            with self._lock:
                self._in_flight = 0

    def _fsync_all(self, files: list) -> int:
        if len(files) > 1:
            try:
                return sum(self._pool.map(self._fsync_file, files))
            except RuntimeError:  # the pool is shut down (interpreter exit): one at a time
                pass
        return sum(self._fsync_file(file) for file in files)

    def _fsync_file(self, file: tuple[int, str, str]) -> int:
        dir_fd, directory, name = file
        try:  # a FIFO or a link put at a record's name: never a hang, never followed
            fd = open_regular(name, dir_fd=dir_fd)
        except (FileNotFoundError, NotARegularFileError):
            return 0  # evicted, purged or replaced before it was flushed: not ours any more
        except OSError as error:
            self._failed(os.path.join(directory, name), error)
            return 0
        try:
            os.fsync(fd)
            return 1
        except OSError as error:
            self._failed(os.path.join(directory, name), error)
            return 0
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _failed(self, path: str, error: OSError) -> None:
        self._counters.add("flush_errors")
        self._warn.warning("flush", "galahad: background fsync of %s failed: %s", path, error)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Flushes what is pending and stops, within `timeout_s` even if a flush in progress
        is stuck in the kernel (then with a warning; the records stay published)."""
        if self._closed:
            return
        self._closed = True
        _open_flushers.discard(self)
        deadline_s = time.monotonic() + timeout_s
        self._stop.set()
        self._thread.join(timeout_s)
        stuck = not self._flush_lock.acquire(timeout=max(0.0, deadline_s - time.monotonic()))
        if stuck:
            self._warn.warning(
                "flush-close",
                "galahad: a background fsync did not finish within %.0f s; closing without it",
                timeout_s,
            )
        else:
            try:
                self._flush_locked()
            finally:
                self._flush_lock.release()
        self._pool.shutdown(wait=not stuck)
