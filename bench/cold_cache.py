"""Cold reads for the benchmarks: drop files from the page cache; read them plainly."""

from __future__ import annotations

import os


def drop_cache(directory: str) -> None:
    """Flushes, then drops from the page cache every file under `directory` (a cold read)."""
    os.sync()
    for folder, _, names in os.walk(directory):
        for name in names:
            try:
                fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def plain_read(directory: str) -> int:
    """Reads every file under `directory` once, sequentially, into one buffer: the disk's
    rate for these bytes, with no checks and no copies into host memory."""
    total = 0
    buffer = bytearray(16 << 20)
    for folder, _, names in sorted(os.walk(directory)):
        for name in sorted(names):
            with open(os.path.join(folder, name), "rb", buffering=0) as handle:
                while read := handle.readinto(buffer):
                    total += read
    return total
