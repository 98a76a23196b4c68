"""The ledger file and its locked read-modify-write section: opened as every file of the
store is (safe_files.open_regular: a FIFO or a link is never a hang or a read), replaced when
something else is at its name, reopened when it was deleted or replaced, and updated only under
flock(2) (and a thread lock: flock does not exclude threads sharing a descriptor), where a dead
writer's journal is recovered first and this process's reservation is written back. The state
the last section left is kept (`seen`): what a caller may use where a value as old as this
process's last section is safe, without taking the lock again."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable

from ..errors import NotARegularFileError
from .layout import QUARANTINE_DIR
from .ledger_state import READ_BYTES, LedgerState
from .liveness import ProcessLock
from .safe_files import create_temp, open_dir, open_regular

TEMP_SUFFIX = ".new"  # ledger.<token>.<random>.new: an empty ledger being put in place
ABANDONED_TEMP_AGE_S = 60.0  # renamed within microseconds: older, its maker died


class LedgerFile:
    """One root's ledger file, and the locked section every update of it runs in."""

    def __init__(
        self,
        path: str,
        process: ProcessLock | None = None,
        read_only: bool = False,
        *,
        recount: Callable[[], int | tuple] | None = None,
        inode_of: Callable[[str | None, str], int | None] | None = None,
        logical_of: Callable[[str, str], int] = lambda dirname, filename: 0,
    ):
        self._path = path
        self._process = process
        self._read_only = read_only or process is None
        self._mine = 0  # what this process has reserved (also written into its entry)
        self._thread_lock = threading.Lock()
        self.needs_rebuild = False
        # Counts committed bytes from disk (the store's disk_count.DiskCount). Called under
        # the lock when the ledger is found missing, replaced or damaged, so no update is
        # ever lost on top of it.
        self.recount = recount
        # The inode at a record's name (None when there is none): how a dead writer's journal
        # is checked against the disk (the store's held descriptors; by path otherwise).
        self.inode_of = inode_of or self._inode_by_path
        # The logical (page) bytes a record's header declares (0 when unknown): what a dead
        # writer's publication adds to its namespace's count.
        self.logical_of = logical_of
        self.recovered_bytes = 0
        self.seen: LedgerState | None = None  # the state as this process's last section left it
        self._fd = self._open()

    def _logical_of(self, dirname: str, filename: str) -> int:
        try:
            return max(0, int(self.logical_of(dirname, filename)))
        except (OSError, ValueError, TypeError):
            return 0

    def _inode_by_path(self, dirname: str | None, filename: str) -> int | None:
        root = os.path.dirname(self._path)
        if dirname is None:  # a quarantined file
            path = os.path.join(root, QUARANTINE_DIR, filename)
        else:
            path = os.path.join(root, "ns", dirname, filename)
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        return info.st_ino if stat.S_ISREG(info.st_mode) else None

    def _recover(self, state: LedgerState) -> None:
        """A journal under the lock: its writer died inside a locked section, and the disk
        says what it did (Journal.recover)."""
        journal, state.journal = state.journal, None
        if journal.token == getattr(self._process, "token", None):
            return  # ours, left by an update that failed: that update settled it
        self.recovered_bytes += journal.recover(state, self.inode_of, self._logical_of)

    def _open(self) -> int | None:
        """The ledger, opened as every file of the store is (open_regular): a FIFO, a device
        or a symbolic link at its name is never read (read-only: as if there were no ledger;
        writable: replaced by a new ledger, recounted from disk)."""
        if self._read_only:
            try:
                return open_regular(self._path)
            except OSError:
                return None  # a store nobody has written yet, or no ledger at all there
        try:
            return open_regular(self._path, os.O_RDWR | os.O_CREAT)
        except NotARegularFileError:
            self._replace()
            self.needs_rebuild = True
            return open_regular(self._path, os.O_RDWR | os.O_CREAT)

    def _replace(self) -> None:
        """Puts an empty ledger where something else is: a temp file created exclusively
        under an unpredictable name (never a file someone linked there), renamed over it
        (atomic, and never through a link). A directory there cannot be replaced: OSError."""
        directory, name = os.path.split(self._path)
        dir_fd = open_dir(directory)
        try:
            fd, temp = create_temp(f"{name}.{self._process.token}.", TEMP_SUFFIX, dir_fd=dir_fd)
            os.close(fd)
            try:
                os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)
                raise
        finally:
            os.close(dir_fd)

    def remove_abandoned_temps(self) -> None:
        """Removes the temps of ledgers that a process died putting in place (a minute old):
        a few names in the root, listed at a rebuild only."""
        directory, name = os.path.split(self._path)
        now_s = time.time()
        with contextlib.suppress(OSError), os.scandir(directory) as listing:
            for entry in listing:
                if not (entry.name.startswith(name + ".") and entry.name.endswith(TEMP_SUFFIX)):
                    continue
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if now_s - info.st_mtime >= ABANDONED_TEMP_AGE_S:
                        os.unlink(entry.path)

    def _reopen_if_replaced(self) -> None:
        """A ledger deleted or replaced under us: switch to the file at the path."""
        try:
            if os.fstat(self._fd).st_ino == os.lstat(self._path).st_ino:
                return
        except OSError:
            pass
        fd = self._open()
        os.close(self._fd)
        self._fd = fd
        self.needs_rebuild = True

    @staticmethod
    def _set_from_disk(state: LedgerState, counted) -> None:
        if isinstance(counted, tuple):
            state.committed, counts = counted
            state.set_counts(counts)
        else:
            state.committed = counted
            state.invalidate_counts()

    def _read_state(self) -> LedgerState:
        raw = os.pread(self._fd, READ_BYTES, 0)
        state = LedgerState.parse(raw)
        if state is None:  # new, truncated or damaged: recount from disk
            state = LedgerState()
            if self.recount is not None:
                self._set_from_disk(state, self.recount())
                state.rewrite = True  # written back even by a section that changes nothing
            else:
                self.needs_rebuild = True
        return state

    def _mine_entry(self, state: LedgerState) -> None:
        if self._mine:
            state.entries[self._process.token] = self._mine

    def _write_journal(self, state: LedgerState) -> None:
        """Puts `state` (its journal set) on disk before the change it journals: the same
        length or more than what is there; the locked section's own write clears it."""
        self._mine_entry(state)
        os.pwrite(self._fd, state.pack(), 0)
        state.rewrite = True

    def _locked(self, update: Callable[[LedgerState], object]):
        """Runs `update(state)` on the ledger's content under its lock and writes back what
        changed (read-only: on what is there, writing nothing)."""
        if self._read_only:
            if self._fd is None:
                return update(LedgerState())
            raw = os.pread(self._fd, READ_BYTES, 0)
            self.seen = state = LedgerState.parse(raw) or LedgerState()
            return update(state)
        with self._thread_lock:
            self._reopen_if_replaced()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            mine_before = self._mine
            try:
                state = self._read_state()
                before = state.pack()
                if state.journal is not None:
                    self._recover(state)
                token = self._process.token
                if self._mine or token in state.entries:
                    state.entries[token] = self._mine  # written back if someone dropped it
                result = update(state)
                if self._mine:
                    state.entries[token] = self._mine
                else:
                    state.entries.pop(token, None)
                after = state.pack()
                if after != before or state.rewrite:
                    os.pwrite(self._fd, after, 0)
                    os.ftruncate(self._fd, len(after))
                self.seen = state
                return result
            except BaseException:
                self._mine = mine_before  # the update did not happen: nothing of it is kept
                raise
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            if not self._read_only and self._mine:
                self._mine = 0
                with contextlib.suppress(OSError):
                    self._locked(lambda state: None)
            os.close(self._fd)
            self._fd = None
