"""Damaged records, moved aside for inspection and trimmed to the newest few.

A quarantined file stays counted in the ledger until it is trimmed (its bytes are still on
disk). The quarantine directory is reached only through a descriptor opened without following
symlinks, and a record is moved from its namespace directory's held descriptor
(layout.StoreLayout.namespace_fd) by name, never through a path, so no move or deletion here
can reach outside the store root.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

from ..telemetry.metrics import Counters
from .eviction import LruIndex
from .journal import Journal, JournalItem
from .layout import StoreLayout, accounted_bytes, is_record_name
from .ledger import Ledger

QUARANTINE_KEEP_FILES = 32
HAS_FILES_RECHECK_S = 1.0


class Quarantine:
    def __init__(
        self,
        quarantine_dir: str,
        ledger: Ledger,
        index: LruIndex,
        counters: Counters,
        layout: StoreLayout,
        on_moved: Callable[[str, str], None] = lambda dirname, filename: None,
    ):
        self._dir = quarantine_dir
        self._ledger = ledger
        self._index = index
        self._counters = counters
        self._lock = threading.Lock()
        self._known_empty_s: float | None = None
        # Whose held namespace descriptors moves start from (the store's own layout).
        self.layout = layout
        # Told (dirname, filename) of each record moved, outside the ledger's lock: the
        # store drops its pin (store/pins/), so a quarantined record's bytes do not stay held.
        self.on_moved = on_moved

    def _dir_fd(self) -> int:
        return os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def move(
        self, path: str, dirname: str, inode: int | None = None, dir_fd: int | None = None
    ) -> bool:
        """Moves the record named by `path` (only its file name counts) out of namespace
        `dirname`'s directory (`dir_fd`, or the layout's held descriptor of it) into
        quarantine. With `inode`, only if the file there is still the one that was found
        damaged (not a fresh record published since)."""
        filename = os.path.basename(path)
        try:
            source_fd = self.layout.namespace_fd(dirname) if dir_fd is None else dir_fd
            if (
                inode is not None
                and os.stat(filename, dir_fd=source_fd, follow_symlinks=False).st_ino != inode
            ):
                return False
            quarantine_fd = self._dir_fd()
        except OSError:
            return False

        def action(journal):  # under the ledger's lock: a recount sees it in one place only
            if is_record_name(filename):  # the namespace counts follow it (Journal.MOVE)
                info = os.stat(filename, dir_fd=source_fd, follow_symlinks=False)
                item = JournalItem(filename, info.st_ino, accounted_bytes(info))
                journal(Journal.MOVE, dirname, [item])
            os.rename(
                filename,
                f"{time.time_ns()}-{dirname}-{filename}",
                src_dir_fd=source_fd,
                dst_dir_fd=quarantine_fd,
            )
            return 0

        try:
            self._ledger.apply(action)
        except OSError:
            return False
        finally:
            os.close(quarantine_fd)
        self._known_empty_s = None
        self._index.discard((dirname, filename))
        self._counters.add("quarantined")
        self.on_moved(dirname, filename)
        return True

    def move_and_trim(
        self, path: str, dirname: str, inode: int | None = None, dir_fd: int | None = None
    ) -> bool:
        moved = self.move(path, dirname, inode, dir_fd)
        if moved:
            self.trim(QUARANTINE_KEEP_FILES)
        return moved

    def has_files(self) -> bool:
        """Whether anything is quarantined (remembered for a second; this process's own
        moves are seen at once): asked before every eviction, so never a listing each."""
        now_s = time.monotonic()
        known = self._known_empty_s
        if known is not None and now_s - known < HAS_FILES_RECHECK_S:
            return False
        empty = not self.names()
        self._known_empty_s = now_s if empty else None
        return not empty

    def names(self) -> list[str]:
        try:
            dir_fd = self._dir_fd()
        except OSError:
            return []
        try:
            return sorted(os.listdir(dir_fd))
        finally:
            os.close(dir_fd)

    def trim(self, keep_files: int, max_files: int | None = None) -> int:
        """Deletes the oldest quarantined files beyond `keep_files` (at most `max_files`);
        returns how many it deleted."""
        with self._lock:
            try:
                dir_fd = self._dir_fd()
            except OSError:
                return 0
            try:
                names = sorted(os.listdir(dir_fd))
                victims = names[: max(0, len(names) - keep_files)]
                if max_files is not None:
                    victims = victims[:max_files]
                removed = 0
                for name in victims:

                    def action(journal, name=name):
                        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                        size = accounted_bytes(info)
                        if is_record_name(name):  # (anything else cannot be journaled)
                            item = JournalItem(name, info.st_ino, size)
                            journal(Journal.TRIM, Journal.QUARANTINE, [item])
                        os.unlink(name, dir_fd=dir_fd)
                        return size

                    with contextlib.suppress(OSError):
                        self._ledger.apply(action)
                        removed += 1
                return removed
            finally:
                os.close(dir_fd)

    def total_bytes(self) -> int:
        try:
            dir_fd = self._dir_fd()
        except OSError:
            return 0
        try:
            total = 0
            for name in os.listdir(dir_fd):
                with contextlib.suppress(OSError):
                    total += accounted_bytes(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
            return total
        finally:
            os.close(dir_fd)
