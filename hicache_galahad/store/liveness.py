"""Which store processes are alive: each open store holds an exclusive flock on its lock
file under <root>/procs for as long as it lives (ProcessLock), and every other process tests
that lock (token_alive), never a pid alone: a test that changes nothing on disk and works
across pid namespaces. A lock file someone deleted is answered by the identity the process
recorded in its counter file (pid namespace, pid, start time: process_identity), so a pid
reused, or alive in another pid namespace, is never taken for it.

    <root>/procs/<token>.lock                  held (flock, exclusive) while its process lives
    <root>/procs/<token>.<random>.lock.new     a lock being made: locked, then renamed
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from ..errors import NotARegularFileError
from .layout import PROCS_DIR, STATS_DIR, is_token
from .safe_files import create_temp, open_dir, open_regular, read_small_file

LOCK_SUFFIX = ".lock"
NEW_LOCK_SUFFIX = ".lock.new"  # a lock being made: locked first, then renamed into place
ABANDONED_LOCK_AGE_S = 60.0
IDENTITY_FIELD = "process"  # where a counter file (lifetime.py) holds process_identity()
_PID_MAX = 2**31 - 1  # the largest pid_t


def new_token() -> str:
    """8 hex digits of the pid (for people reading the directory), then 8 random ones. The
    pid says nothing about liveness: that is the lock (token_alive)."""
    return f"{os.getpid() & 0xFFFFFFFF:08x}{os.urandom(4).hex()}"


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists in this pid namespace. A pid the platform
    cannot hold (or 0 and negatives, which name process groups) is no process."""
    if not isinstance(pid, int) or not 0 < pid <= _PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat, field 22)."""
    try:
        text = read_small_file(f"/proc/{pid}/stat", 4096)
        return int(text.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_identity() -> dict | None:
    """What names this process beyond its pid: its pid namespace and its start time. None
    where /proc cannot tell."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    pid = os.getpid()
    ticks = _start_ticks(pid)
    if ticks is None:
        return None
    return {"pid": pid, "pid_namespace": namespace, "start_ticks": ticks}


def identity_alive(identity) -> bool:
    """Whether the process `identity` (process_identity's answer, as another process
    recorded it) still runs: same pid namespace as ours, and that pid started at that time.
    A process of another pid namespace (a container) is never taken for one of ours."""
    if not isinstance(identity, dict):
        return False
    mine = process_identity()
    pid, ticks = identity.get("pid"), identity.get("start_ticks")
    if mine is None or identity.get("pid_namespace") != mine["pid_namespace"]:
        return False
    if not isinstance(pid, int) or not isinstance(ticks, int) or not pid_alive(pid):
        return False
    return _start_ticks(pid) == ticks


def recorded_identity(stats_dir: str, token: str) -> dict | None:
    """The identity the process holding `token` recorded in its counter file when it opened
    the store, if any (a file that is missing, too large or no JSON object: None)."""
    if not is_token(token):
        return None
    try:
        dir_fd = open_dir(stats_dir)
        try:
            document = json.loads(read_small_file(token + ".json", dir_fd=dir_fd))
        finally:
            os.close(dir_fd)
    except (OSError, ValueError):
        return None
    identity = document.get(IDENTITY_FIELD) if isinstance(document, dict) else None
    return identity if isinstance(identity, dict) else None


def token_alive(procs_dir: str, token: str) -> bool:
    """Whether the process holding store token `token` is alive: its lock file under
    `procs_dir` is locked (a test that changes nothing on disk and works across pid
    namespaces). A lock file someone deleted while its process runs: the identity that
    process recorded in its counter file (pid namespace, pid, start time) decides, so a pid
    reused, or alive in another pid namespace, is never taken for it. Anything that is not a
    token, or a lock that is not a regular file, is no live process."""
    if not is_token(token):
        return False
    try:
        fd = open_regular(os.path.join(procs_dir, token + LOCK_SUFFIX))
    except FileNotFoundError:
        stats_dir = os.path.join(os.path.dirname(procs_dir), STATS_DIR)
        return identity_alive(recorded_identity(stats_dir, token))
    except NotARegularFileError:
        return False
    except OSError:
        return True  # cannot tell: assume alive (over-counting is the safe side)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True  # held (or cannot tell): alive
    finally:
        os.close(fd)
    return False


class ProcessLock:
    """This process's liveness lock under <root>/procs, and the liveness test of others.

    The lock file is created under a temporary name, locked, and only then renamed into
    place: no other process ever sees it unlocked (and takes this process for dead)."""

    def __init__(self, root: str):
        self.directory = os.path.join(root, PROCS_DIR)
        os.makedirs(self.directory, exist_ok=True)
        if os.path.islink(self.directory):
            raise NotADirectoryError(f"{self.directory} is a symbolic link")
        self.token = new_token()
        self._fd = self._create()

    def _path(self, token: str) -> str:
        return os.path.join(self.directory, token + LOCK_SUFFIX)

    def _create(self) -> int:
        dir_fd = open_dir(self.directory)
        try:
            fd, temp = create_temp(self.token + ".", NEW_LOCK_SUFFIX, dir_fd=dir_fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.rename(temp, self.token + LOCK_SUFFIX, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)
                raise
            return fd
        finally:
            os.close(dir_fd)

    def is_alive(self, token: str) -> bool:
        """True while the process that owns `token` holds its lock."""
        return token == self.token or token_alive(self.directory, token)

    def forget(self, token: str) -> None:
        """Removes a dead process's lock file (or whatever else is at its name)."""
        if token != self.token:
            with contextlib.suppress(OSError):
                os.unlink(self._path(token))

    def tokens(self) -> list[str]:
        """The names of the lock files here (tokens, or junk that is no live process)."""
        with contextlib.suppress(OSError):
            names = os.listdir(self.directory)
            return [n[: -len(LOCK_SUFFIX)] for n in names if n.endswith(LOCK_SUFFIX)]
        return []

    def remove_abandoned(self) -> None:
        """Removes locks that a process died making (never renamed into place): a minute old
        and unlocked (one being made is renamed within microseconds, but may be unlocked for
        one of them)."""
        now_s = time.time()
        with contextlib.suppress(OSError):
            for name in os.listdir(self.directory):
                if not name.endswith(NEW_LOCK_SUFFIX) or name.startswith(self.token):
                    continue
                path = os.path.join(self.directory, name)
                with contextlib.suppress(OSError):
                    if now_s - os.lstat(path).st_mtime < ABANDONED_LOCK_AGE_S:
                        continue
                    fd = open_regular(path)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        continue  # being made right now
                    finally:
                        os.close(fd)
                    os.unlink(path)

    def ensure(self) -> None:
        """Recreates this process's lock file if someone deleted it."""
        try:
            if os.fstat(self._fd).st_ino == os.lstat(self._path(self.token)).st_ino:
                return
        except OSError:
            pass
        with contextlib.suppress(OSError):
            fd = self._create()
            os.close(self._fd)
            self._fd = fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._path(self.token))
        with contextlib.suppress(OSError):
            os.close(self._fd)
