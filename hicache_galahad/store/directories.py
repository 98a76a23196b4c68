"""The held directory descriptors of a store root: `ns` and each namespace directory opened
without following a link, held, rechecked against their names, and let go when replaced.

Reads, writes, deletions and quarantine moves never reach a namespace's records by a path
string: the root is resolved once (at first use), `ns` in it and each namespace directory in
`ns` are opened with O_NOFOLLOW and held (`namespace_fd`), and records are opened, created,
linked, renamed and unlinked relative to those descriptors, so a directory replaced by a
symbolic link is never followed. A held descriptor is checked against the name at most every
DIR_RECHECK_S: when the name no longer names that directory (removed, renamed, replaced), the
descriptor is let go and the name opened again, so a real directory put there is served and a
link is refused (its reads miss and its writes fail until a real directory is there again).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from typing import NamedTuple


class _Held(NamedTuple):
    """A descriptor held, and when it is next checked against its name (monotonic)."""

    fd: int
    recheck_s: float


class _Retired(NamedTuple):
    """A descriptor let go, and when (monotonic): closed RETIRED_FD_GRACE_S later."""

    fd: int
    since_s: float


class HeldDirectories:
    """The descriptors of `<root>/ns` and of the namespace directories in it (see the
    module's docstring)."""

    DIR_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    DIR_RECHECK_S = 1.0
    # Descriptors let go stay open this long (a thread may be using one right now; every use
    # is one system call, and writers hold their own duplicate for a whole batch).
    RETIRED_FD_GRACE_S = 60.0
    NAMESPACE_FDS_MAX = 256  # held at once; beyond it the longest held is let go

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.ns_root = os.path.join(self.root, "ns")
        self._dirs: dict[str, str] = {}
        self._root_fd: int | None = None  # the root as resolved once, at first use
        self._ns_fd: _Held | None = None
        self._dir_fds: dict[str, _Held] = {}
        self._retired_fds: list[_Retired] = []
        self._fd_lock = threading.Lock()

    def namespace_dir(self, dirname: str) -> str:
        """The namespace directory's path: for messages, scans and tools; reads, writes and
        deletions go through `namespace_fd`."""
        directory = self._dirs.get(dirname)
        if directory is None:
            directory = self._dirs[dirname] = os.path.join(self.ns_root, dirname)
        return directory

    def namespace_fd(self, dirname: str, recheck: bool = False) -> int:
        """The held descriptor of `<root>/ns/<dirname>`, opened without following links (see
        the module's docstring). Never close it. Raises FileNotFoundError when there is no such
        directory and NotADirectoryError when the name is a link or not a directory."""
        held = self._dir_fds.get(dirname)
        if held is not None and not recheck and time.monotonic() < held.recheck_s:
            return held.fd
        with self._fd_lock:
            return self._namespace_fd_locked(dirname, recheck)

    def namespace_fd_dup(self, dirname: str) -> int:
        """A duplicate of namespace_fd, for work that spans many calls (a batch of writes):
        the caller closes it."""
        dir_fd = self.namespace_fd(dirname)
        return os.dup(dir_fd)  # (non-inheritable, as Python makes every dup)

    def ns_fd(self) -> int:
        """The held descriptor of `<root>/ns` (see namespace_fd)."""
        held = self._ns_fd
        if held is not None and time.monotonic() < held.recheck_s:
            return held.fd
        with self._fd_lock:
            return self._ns_fd_locked()

    def _ns_fd_locked(self) -> int:
        now_s = time.monotonic()
        held = self._ns_fd
        if held is not None and now_s < held.recheck_s:
            return held.fd
        self._close_retired(now_s)
        if self._root_fd is None:
            self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if held is not None:
            if _names_same_directory(held.fd, "ns", self._root_fd):
                self._ns_fd = _Held(held.fd, now_s + self.DIR_RECHECK_S)
                return held.fd
            self._ns_fd = None
            self._retire(held.fd, now_s)
            for name in list(self._dir_fds):  # they hang under the old `ns`
                self._retire(self._dir_fds.pop(name).fd, now_s)
        fd = self._open_dir("ns", self._root_fd, self.ns_root)
        self._ns_fd = _Held(fd, now_s + self.DIR_RECHECK_S)
        return fd

    def _namespace_fd_locked(self, dirname: str, recheck: bool) -> int:
        ns_fd = self._ns_fd_locked()
        now_s = time.monotonic()
        held = self._dir_fds.get(dirname)
        if held is not None and not recheck and now_s < held.recheck_s:
            return held.fd
        if held is not None:
            if _names_same_directory(held.fd, dirname, ns_fd):
                self._dir_fds[dirname] = _Held(held.fd, now_s + self.DIR_RECHECK_S)
                return held.fd
            del self._dir_fds[dirname]  # removed, renamed or replaced since it was opened
            self._retire(held.fd, now_s)
        if not is_plain_name(dirname):
            raise FileNotFoundError(errno.ENOENT, "not a namespace directory name", dirname)
        fd = self._open_dir(dirname, ns_fd, self.namespace_dir(dirname))
        if len(self._dir_fds) >= self.NAMESPACE_FDS_MAX:
            oldest = min(self._dir_fds, key=lambda name: self._dir_fds[name].recheck_s)
            self._retire(self._dir_fds.pop(oldest).fd, now_s)
        self._dir_fds[dirname] = _Held(fd, now_s + self.DIR_RECHECK_S)
        return fd

    def _open_dir(self, name: str, dir_fd: int, path: str) -> int:
        try:
            return os.open(name, self.DIR_OPEN_FLAGS, dir_fd=dir_fd)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise NotADirectoryError(
                    error.errno, "a symbolic link or not a directory (never followed)", path
                ) from None
            raise

    def _retire(self, fd: int, now_s: float) -> None:
        self._retired_fds.append(_Retired(fd, now_s))

    def _close_retired(self, now_s: float) -> None:
        while self._retired_fds and now_s - self._retired_fds[0].since_s > self.RETIRED_FD_GRACE_S:
            with contextlib.suppress(OSError):
                os.close(self._retired_fds.pop(0).fd)

    def close(self) -> None:
        """Closes every held descriptor (the store is closed: nothing uses them any more)."""
        with self._fd_lock:
            fds = [retired.fd for retired in self._retired_fds]
            fds += [held.fd for held in self._dir_fds.values()]
            if self._ns_fd is not None:
                fds.append(self._ns_fd.fd)
            if self._root_fd is not None:
                fds.append(self._root_fd)
            self._retired_fds, self._dir_fds, self._ns_fd, self._root_fd = [], {}, None, None
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    @contextlib.contextmanager
    def _namespace_dir_fd(self, dirname: str, create: bool = False):
        """The held descriptor when there is one; else a descriptor opened for this use only
        (tools that look at every namespace once do not hold one each)."""
        if dirname in self._dir_fds or create:
            yield self.namespace_fd(dirname, recheck=create)
            return
        if is_plain_name(dirname):
            fd = self._open_dir(dirname, self.ns_fd(), self.namespace_dir(dirname))
        else:
            fd = None
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "not a namespace directory name", dirname)
        try:
            yield fd
        finally:
            os.close(fd)


def is_plain_name(name: str) -> bool:
    """A single path component (a namespace's directory name never holds a separator)."""
    return bool(name) and name not in (".", "..") and os.sep not in name and "\0" not in name


def _names_same_directory(fd: int, name: str, dir_fd: int | None) -> bool:
    """Whether `name` (relative to dir_fd) is still, without following a link, the directory
    open at fd."""
    try:
        held = os.fstat(fd)
        current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return (
        stat.S_ISDIR(current.st_mode)
        and held.st_nlink > 0
        and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)
    )
