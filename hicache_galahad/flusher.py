"""Deferred durability: published records are fsynced in the background, within a window.

A put in the default "deferred" mode returns once its record is published (written to a temp
file, then linked into place, so a crash of the process leaves nothing damaged). A power loss
may still lose what the page cache held: at most the records published in the last
`interval_s`, which come back truncated, zero-filled, torn or missing, fail their digest (every
read is verified) and are misses. The flusher bounds that window.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from .layout import fsync_dir
from .metrics import Counters, RateLimitedLog

log = logging.getLogger("hicache_galahad.store")
FLUSH_THREADS = 4  # fsyncs in flight at once: the filesystem commits them together


class Flusher:
    def __init__(self, interval_s: float, counters: Counters):
        self.interval_s = interval_s
        self._counters = counters
        self._warn = RateLimitedLog(log)
        self._pending: dict[str, set[str]] = {}
        self._in_flight = 0  # taken from _pending by a flush that has not finished
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="galahad-flush")
        self._thread = threading.Thread(target=self._run, name="galahad-flusher", daemon=True)
        self._thread.start()

    def add(self, directory: str, filenames) -> None:
        with self._lock:
            self._pending.setdefault(directory, set()).update(filenames)

    @property
    def pending(self) -> int:
        """Records published and not yet flushed (queued, or in a flush still running)."""
        with self._lock:
            return self._in_flight + sum(len(names) for names in self._pending.values())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> int:
        """fsyncs every record published so far, then their directories; returns how many."""
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
                paths = [os.path.join(d, name) for d, names in pending.items() for name in names]
                self._in_flight = len(paths)
            try:
                flushed = sum(self._pool.map(self._fsync_file, paths))
                for directory in pending:
                    try:
                        fsync_dir(directory)
                    except OSError as error:
                        self._failed(directory, error)
                if paths:
                    self._counters.add("flushes")
                    self._counters.add("flushed_records", flushed)
                return flushed
            finally:
                with self._lock:
                    self._in_flight = 0

    def _fsync_file(self, path: str) -> int:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0  # evicted or purged before it was flushed
        except OSError as error:
            self._failed(path, error)
            return 0
        try:
            os.fsync(fd)
            return 1
        except OSError as error:
            self._failed(path, error)
            return 0
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _failed(self, path: str, error: OSError) -> None:
        self._counters.add("flush_errors")
        self._warn.warning("flush", "galahad: background fsync of %s failed: %s", path, error)

    def close(self) -> None:
        """Flushes what is pending and stops."""
        self._stop.set()
        self._thread.join()
        self.flush()
        self._pool.shutdown(wait=True)
