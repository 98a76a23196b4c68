"""Records sampled a few at a time for the fallback eviction order (eviction.SampledLru).

`RecordSampler` walks namespace directories from where this process last left each one (a
cursor per directory, restarted now and then at a random offset), so a sample costs work
proportional to what it asks for, never to the records.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time

from .context import StoreContext
from .layout import accounted_bytes, is_record_name
from .record_stat import is_pinned

NAMESPACES_RECHECK_S = 5.0
CURSOR_MAX_AGE_S = 60.0
CURSOR_RANDOM_SKIP = 256  # each process starts its walk of a directory somewhere else


class _Cursor:
    """A walk of one namespace directory, a few entries at a time, over a descriptor of its
    own (listing moves a descriptor's offset)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.entries = os.scandir(fd)
        self.opened_s = time.monotonic()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.entries.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class RecordSampler:
    def __init__(self, context: StoreContext):
        self.layout = context.layout
        self.unreadable_dir = context.unreadable_dir
        self._sample_lock = threading.Lock()
        self._cursors: dict[str, _Cursor] = {}
        self._namespaces: tuple[float, list[str]] = (-1e9, [])
        self._rng = random.Random()

    def _namespace_names(self) -> list[str]:
        checked_s, names = self._namespaces
        if time.monotonic() - checked_s > NAMESPACES_RECHECK_S:
            names = self.layout.namespace_dirnames(self.unreadable_dir)
            self._namespaces = (time.monotonic(), names)
        return names

    def _cursor(self, dirname: str) -> _Cursor | None:
        cursor = self._cursors.get(dirname)
        if cursor is not None and time.monotonic() - cursor.opened_s > CURSOR_MAX_AGE_S:
            cursor.close()
            del self._cursors[dirname]
            cursor = None
        if cursor is None:
            cursor = self._open_cursor(dirname, self._rng.randrange(CURSOR_RANDOM_SKIP))
            if cursor is None:
                return None
            self._cursors[dirname] = cursor
        return cursor

    def _open_cursor(self, dirname: str, skip: int) -> _Cursor | None:
        """A new walk of the directory, `skip` entries in (from the start if it has fewer)."""
        for attempt_skip in (skip, 0) if skip else (0,):
            try:
                ns_fd = self.layout.namespace_fd(dirname)
                fd = os.open(".", self.layout.DIR_OPEN_FLAGS, dir_fd=ns_fd)
            except OSError:
                return None
            try:
                cursor = _Cursor(fd)
            except OSError:
                os.close(fd)
                return None
            skipped = 0
            while skipped < attempt_skip and next(cursor.entries, None) is not None:
                skipped += 1
            if skipped == attempt_skip:
                return cursor
            cursor.close()  # fewer entries than that: from the start instead
        return None

    def sample(self, want: int) -> list:
        """Up to `want` records (location, size, mtime_ns, inode), a few from each of
        randomly chosen namespace directories, each walked on from where this process last
        left it: work proportional to `want`, never to the records."""
        found: list = []
        with self._sample_lock:
            names = self._namespace_names()
            if not names:
                return found
            for _ in range(2 * len(names) if len(names) < 8 else 16):
                if len(found) >= want:
                    break
                dirname = self._rng.choice(names)
                cursor = self._cursor(dirname)
                if cursor is None:
                    continue
                ns_fd = cursor.fd
                taken = 0
                limit = max(4, want // 2)
                for looked, entry in enumerate(cursor.entries, 1):
                    if is_record_name(entry.name):
                        with contextlib.suppress(OSError):
                            info = os.stat(entry.name, dir_fd=ns_fd, follow_symlinks=False)
                            size = accounted_bytes(info)
                            # pinned (store/pins/), never a candidate; another
                            # link (a `cp -al` backup) is no pin
                            if (size or info.st_size == 0) and not is_pinned(
                                self.layout.root, dirname, entry.name, info
                            ):
                                found.append(
                                    ((dirname, entry.name), size, info.st_mtime_ns, info.st_ino)
                                )
                                taken += 1
                    if taken >= limit or looked >= 8 * limit:
                        break
                else:  # the end of the directory: the next walk starts again
                    cursor.close()
                    del self._cursors[dirname]
        return found

    def close(self) -> None:
        with self._sample_lock:
            for cursor in self._cursors.values():
                cursor.close()
            self._cursors.clear()
