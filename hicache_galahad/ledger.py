"""The byte ledger of a store root, shared by every process that has the root open.

One little-endian u64 in a file, read and updated under flock(2) (and a thread lock, since
flock does not exclude threads sharing a descriptor). Reservations are taken before a record is
written and released when a write fails or a record is deleted, so the bytes on disk never
exceed what the ledger says; a crash can only leave it over-counting (the safe direction).
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading

_LEDGER = struct.Struct("<Q")


class Ledger:
    """Total bytes of a root's records, shared by every process through a locked file."""

    def __init__(self, path: str, read_only: bool = False):
        self._read_only = read_only
        self._fd = None
        if read_only:
            try:
                self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                self._fd = None  # a store nobody has written yet
        else:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        self._thread_lock = threading.Lock()

    def _locked(self, update):
        if self._fd is None:
            return update(0)[1]
        if self._read_only:
            raw = os.pread(self._fd, _LEDGER.size, 0)
            return update(_LEDGER.unpack(raw)[0] if len(raw) == _LEDGER.size else 0)[1]
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                raw = os.pread(self._fd, _LEDGER.size, 0)
                current = _LEDGER.unpack(raw)[0] if len(raw) == _LEDGER.size else 0
                new_value, result = update(current)
                if new_value != current:
                    os.pwrite(self._fd, _LEDGER.pack(new_value), 0)
                return result
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def read(self) -> int:
        return self._locked(lambda current: (current, current))

    def reserve(self, amount: int, limit: int | None) -> bool:
        def update(current):
            if limit is not None and current + amount > limit:
                return current, False
            return current + amount, True

        return self._locked(update)

    def release(self, amount: int) -> None:
        self._locked(lambda current: (max(0, current - amount), None))

    def set(self, value: int) -> None:
        self._locked(lambda current: (value, None))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
