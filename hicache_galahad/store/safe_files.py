"""Opening the store's files safely: never through a symbolic link, never blocking on a FIFO,
never anything but a regular file, never more than a bounded read, and temp files created
exclusively under unpredictable names (so a planted hard link is never written through)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ..errors import NotARegularFileError

# Records are opened without following a symlink and without blocking on a FIFO.
RECORD_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Every other file of the store (ledger, locks, counters) is opened the same way.
OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
METADATA_MAX_BYTES = 1 << 20  # the most any metadata file is read (counters, settings)
# What os.open answers for a symbolic link (O_NOFOLLOW), a directory opened to write, or a
# FIFO or socket opened to write with nobody reading.
_NOT_REGULAR_ERRNOS = frozenset({errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENODEV})


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o644, *, dir_fd=None) -> int:
    """A descriptor of the regular file at `path`, opened as record files are: never through
    a symbolic link, never blocking on a FIFO, closed on exec. Raises NotARegularFileError for
    anything else there (after closing it), other OSErrors as os.open does."""
    try:
        fd = os.open(path, flags | OPEN_FLAGS, mode, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in _NOT_REGULAR_ERRNOS:
            raise NotARegularFileError(error.errno, "not a regular file", path) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFileError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_temp(prefix: str, suffix: str, *, dir_fd: int, mode: int = 0o644) -> tuple[int, str]:
    """A new temp file in the directory `dir_fd`, created exclusively under an unpredictable
    name: (descriptor, name). O_EXCL refuses any name that exists, so a planted hard link or
    symbolic link is never opened, truncated or written through (O_NOFOLLOW alone stops only
    a symbolic link). The caller renames or links it into place, or unlinks it."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS
    while True:
        name = f"{prefix}{os.urandom(8).hex()}{suffix}"
        try:
            return os.open(name, flags, mode, dir_fd=dir_fd), name
        except FileExistsError:
            continue  # 64 random bits taken: planted, or a one-in-2^64 collision


def replace_file(
    name: str, data: bytes, *, dir_fd: int, temp_suffix: str, durable: bool, mode: int = 0o644
) -> None:
    """Replaces the file `name` in `dir_fd` with `data` atomically: written to a temp file
    made by create_temp (`name.<random><temp_suffix>`), fsynced when `durable`, renamed over
    `name`; the temp is unlinked if anything fails. The caller fsyncs the directory."""
    fd, temp = create_temp(f"{name}.", temp_suffix, dir_fd=dir_fd, mode=mode)
    try:
        try:
            os.write(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def read_small_file(path: str, max_bytes: int = METADATA_MAX_BYTES, *, dir_fd=None) -> bytes:
    """The whole content of a small regular file (opened by open_regular), at most
    `max_bytes`: a larger file (a sparse giant, a file still growing) is OSError EFBIG
    before or instead of reading it whole."""
    fd = open_regular(path, dir_fd=dir_fd)
    try:
        if os.fstat(fd).st_size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", path)
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_dir(path: str, *, dir_fd=None) -> int:
    """A descriptor of the directory at `path`, never through a symbolic link."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)
