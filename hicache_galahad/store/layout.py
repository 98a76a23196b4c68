"""Where everything lives under a store root, and how the root is scanned.

    <root>/ledger                          byte ledger shared by every process (ledger.py)
    <root>/procs/<token>.lock              held by each process that has the store open
    <root>/ns/<namespace>/namespace.json   what the namespace is (tenant, model, pool, geometry)
    <root>/ns/<namespace>/<key>.rec        one record per key (docs/FORMAT.md)
    <root>/ns/<namespace>/.tmp-<token>-<random>-<name>.part   a write in progress
    <root>/quarantine/<time>-<namespace>-<name>             damaged records, newest few kept

Nothing under the root is ever followed through a symbolic link: directories are listed with
`follow_symlinks=False`, and record files are opened with O_NOFOLLOW.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ConfigError
from ..record.namespace import Namespace

RECORD_SUFFIX = ".rec"
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".part"
NAMESPACE_FILE = "namespace.json"
NAMESPACE_TEMP_SUFFIX = ".tmp"
NAMESPACE_TEMP_STALE_S = 60.0
STALE_TEMP_AGE_S = 24 * 3600.0
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

# Records are opened without following a symlink and without blocking on a FIFO.
RECORD_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Every other file of the store (ledger, locks, counters) is opened the same way.
OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
METADATA_MAX_BYTES = 1 << 20  # the most any metadata file is read (counters, settings)
TOKEN_CHARS = 16
_TOKEN = re.compile(r"^[0-9a-f]{16}$")
_PID_MAX = 2**31 - 1  # the largest pid_t
# What os.open answers for a symbolic link (O_NOFOLLOW), a directory opened to write, or a
# FIFO or socket opened to write with nobody reading.
_NOT_REGULAR_ERRNOS = frozenset({errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENODEV})


def record_filename(key: str) -> str:
    """SGLang's 64-hex page hashes name their file directly; other keys are hashed."""
    if _HEX64.match(key):
        return key + RECORD_SUFFIX
    return "k" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest() + RECORD_SUFFIX


def is_record_name(name: str) -> bool:
    return name.endswith(RECORD_SUFFIX) and not name.startswith(".")


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def temp_writer(name: str) -> str:
    """The token of a temp file's writer."""
    return name[len(TEMP_PREFIX) :].split("-", 1)[0]


def is_token(name: str) -> bool:
    """Whether `name` is a store token (16 lowercase hex digits: ledger.py)."""
    return len(name) == TOKEN_CHARS and _TOKEN.match(name) is not None


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


class NotRegularFileError(OSError):
    """Something other than a regular file (a FIFO, a device, a directory, a socket, a
    symbolic link) where the store expects one of its files."""


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o644, *, dir_fd=None) -> int:
    """A descriptor of the regular file at `path`, opened as record files are: never through
    a symbolic link, never blocking on a FIFO, closed on exec. Raises NotRegularFileError for
    anything else there (after closing it), other OSErrors as os.open does."""
    try:
        fd = os.open(path, flags | OPEN_FLAGS, mode, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in _NOT_REGULAR_ERRNOS:
            raise NotRegularFileError(error.errno, "not a regular file", path) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", path)
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


def fsync_dir(path: str) -> None:
    fd = open_dir(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def accounted_bytes(info: os.stat_result) -> int:
    """The bytes a file costs the budget: its size, or what it really occupies if that is
    less (a sparse file claiming a terabyte must not make the store evict everything).
    Anything but a regular file (a FIFO, a directory, a symbolic link, a device) costs 0:
    it is no record, and no reader takes it for one."""
    if not stat.S_ISREG(info.st_mode):
        return 0
    return min(info.st_size, info.st_blocks * 512)


def is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


@dataclass(frozen=True)
class FileEntry:
    """A file found by a scan: a record, a temp file or a quarantined record."""

    dirname: str
    name: str
    path: str
    size_bytes: int
    accounted_bytes: int
    mtime_ns: int
    inode: int
    links: int = 1  # more than one: pinned (store/pins.py), or a writer's temp link for a moment

    @property
    def location(self) -> tuple[str, str]:
        return (self.dirname, self.name)


class StoreLayout:
    """Paths under a store root and the scans of its directories.

    Reads, writes, deletions and quarantine moves never reach a namespace's records by a path
    string: the root is resolved once (at first use), `ns` in it and each namespace directory
    in `ns` are opened with O_NOFOLLOW and held (`namespace_fd`), and records are opened,
    created, linked, renamed and unlinked relative to those descriptors, so a directory
    replaced by a symbolic link is never followed. A held descriptor is checked against the
    name at most every DIR_RECHECK_S: when the name no longer names that directory (removed,
    renamed, replaced), the descriptor is let go and the name opened again, so a real
    directory put there is served and a link is refused (its reads miss and its writes fail
    until a real directory is there again).
    """

    DIR_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    DIR_RECHECK_S = 1.0
    # Descriptors let go stay open this long (a thread may be using one right now; every use
    # is one system call, and writers hold their own duplicate for a whole batch).
    RETIRED_FD_GRACE_S = 60.0
    NAMESPACE_FDS_MAX = 256  # held at once; beyond it the longest held is let go

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.ns_root = os.path.join(self.root, "ns")
        self.quarantine_dir = os.path.join(self.root, "quarantine")
        self.ledger_path = os.path.join(self.root, "ledger")
        self._dirs: dict[str, str] = {}
        self._prefixes: dict[str, str] = {}
        self._descriptions: dict[str, tuple[float, Namespace | None]] = {}
        self._root_fd: int | None = None  # the root as resolved once, at first use
        self._ns_fd: tuple[int, float] | None = None  # (descriptor, when to check it again)
        self._dir_fds: dict[str, tuple[int, float]] = {}
        self._retired_fds: list[tuple[int, float]] = []
        self._fd_lock = threading.Lock()

    def prepare(self, *, read_only: bool, min_free_bytes: int) -> None:
        """Checks (and, unless read-only, creates) the root: a real directory whose `ns`,
        `quarantine`, `procs` and `stats` are real directories too, never a file or a symbolic
        link (a linked `stats` or `procs` would let the store delete and write files outside
        the root), on a filesystem larger than the free-space floor. ConfigError naming the
        option otherwise."""
        if read_only:
            if not os.path.isdir(self.ns_root):
                raise ConfigError(f"root {self.root!r}: not a hicache-galahad store")
            return
        directories = [self.root, self.ns_root, self.quarantine_dir]
        directories += [os.path.join(self.root, name) for name in ("procs", "stats")]
        for path in directories:
            if os.path.islink(path):
                raise ConfigError(
                    f"hicache_galahad option 'root': {path!r} is a symbolic link; expected a "
                    "real directory"
                )
            try:
                os.makedirs(path, exist_ok=True)
            except (OSError, ValueError) as error:
                raise ConfigError(
                    f"hicache_galahad option 'root': {self.root!r} cannot hold a store "
                    f"({error}); expected a directory (or a path where one can be created)"
                ) from error
            if os.path.islink(path) or not os.path.isdir(path):
                raise ConfigError(
                    f"hicache_galahad option 'root': {path!r} is a symbolic link or not a "
                    "directory; expected a real directory"
                )
        stats = os.statvfs(self.root)
        capacity_bytes = stats.f_blocks * stats.f_frsize
        if min_free_bytes >= capacity_bytes:
            raise ConfigError(
                f"hicache_galahad option 'min_free_bytes': got {min_free_bytes}, expected less "
                f"than the size of the filesystem holding {self.root!r} ({capacity_bytes} bytes)"
            )

    def namespace_dir(self, dirname: str) -> str:
        """The namespace directory's path: for messages, scans and tools; reads, writes and
        deletions go through `namespace_fd`."""
        directory = self._dirs.get(dirname)
        if directory is None:
            directory = self._dirs[dirname] = os.path.join(self.ns_root, dirname)
        return directory

    def namespace_prefix(self, dirname: str) -> str:
        """The namespace's directory with a trailing separator (for messages)."""
        prefix = self._prefixes.get(dirname)
        if prefix is None:
            prefix = self._prefixes[dirname] = self.namespace_dir(dirname) + os.sep
        return prefix

    def record_path(self, dirname: str, key: str) -> str:
        return os.path.join(self.namespace_dir(dirname), record_filename(key))

    def new_temp_name(self, filename: str, writer_token: str) -> str:
        stem = filename[: -len(RECORD_SUFFIX)]
        return f"{TEMP_PREFIX}{writer_token}-{os.urandom(4).hex()}-{stem}{TEMP_SUFFIX}"

    def new_temp_path(self, dirname: str, filename: str, writer_token: str) -> str:
        return os.path.join(self.namespace_dir(dirname), self.new_temp_name(filename, writer_token))

    def unlink_record(self, dirname: str, filename: str) -> int | None:
        """Deletes a record through its held directory descriptor (never through a link); the
        bytes it was accounted for, or None if it was not there."""
        try:
            dir_fd = self.namespace_fd(dirname)
            info = os.stat(filename, dir_fd=dir_fd, follow_symlinks=False)
            os.unlink(filename, dir_fd=dir_fd)
        except OSError:
            return None
        return accounted_bytes(info)

    # ------------------------------------------------------------- directory descriptors

    def namespace_fd(self, dirname: str, recheck: bool = False) -> int:
        """The held descriptor of `<root>/ns/<dirname>`, opened without following links (see
        the class's docstring). Never close it. Raises FileNotFoundError when there is no such
        directory and NotADirectoryError when the name is a link or not a directory."""
        held = self._dir_fds.get(dirname)
        if held is not None and not recheck and time.monotonic() < held[1]:
            return held[0]
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
        if held is not None and time.monotonic() < held[1]:
            return held[0]
        with self._fd_lock:
            return self._ns_fd_locked()

    def _ns_fd_locked(self) -> int:
        now_s = time.monotonic()
        held = self._ns_fd
        if held is not None and now_s < held[1]:
            return held[0]
        self._close_retired(now_s)
        if self._root_fd is None:
            self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if held is not None:
            if _names_same_directory(held[0], "ns", self._root_fd):
                self._ns_fd = (held[0], now_s + self.DIR_RECHECK_S)
                return held[0]
            self._ns_fd = None
            self._retire(held[0], now_s)
            for name in list(self._dir_fds):  # they hang under the old `ns`
                self._retire(self._dir_fds.pop(name)[0], now_s)
        fd = self._open_dir("ns", self._root_fd, self.ns_root)
        self._ns_fd = (fd, now_s + self.DIR_RECHECK_S)
        return fd

    def _namespace_fd_locked(self, dirname: str, recheck: bool) -> int:
        ns_fd = self._ns_fd_locked()
        now_s = time.monotonic()
        held = self._dir_fds.get(dirname)
        if held is not None and not recheck and now_s < held[1]:
            return held[0]
        if held is not None:
            if _names_same_directory(held[0], dirname, ns_fd):
                self._dir_fds[dirname] = (held[0], now_s + self.DIR_RECHECK_S)
                return held[0]
            del self._dir_fds[dirname]  # removed, renamed or replaced since it was opened
            self._retire(held[0], now_s)
        if not _is_plain_name(dirname):
            raise FileNotFoundError(errno.ENOENT, "not a namespace directory name", dirname)
        fd = self._open_dir(dirname, ns_fd, self.namespace_dir(dirname))
        if len(self._dir_fds) >= self.NAMESPACE_FDS_MAX:
            oldest = min(self._dir_fds, key=lambda name: self._dir_fds[name][1])
            self._retire(self._dir_fds.pop(oldest)[0], now_s)
        self._dir_fds[dirname] = (fd, now_s + self.DIR_RECHECK_S)
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
        self._retired_fds.append((fd, now_s))

    def _close_retired(self, now_s: float) -> None:
        while self._retired_fds and now_s - self._retired_fds[0][1] > self.RETIRED_FD_GRACE_S:
            with contextlib.suppress(OSError):
                os.close(self._retired_fds.pop(0)[0])

    def close(self) -> None:
        """Closes every held descriptor (the store is closed: nothing uses them any more)."""
        with self._fd_lock:
            fds = [fd for fd, _ in self._retired_fds] + [fd for fd, _ in self._dir_fds.values()]
            if self._ns_fd is not None:
                fds.append(self._ns_fd[0])
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
        if _is_plain_name(dirname):
            fd = self._open_dir(dirname, self.ns_fd(), self.namespace_dir(dirname))
        else:
            fd = None
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "not a namespace directory name", dirname)
        try:
            yield fd
        finally:
            os.close(fd)

    # ------------------------------------------------------------- scans

    def namespace_dirnames(self, on_error=None) -> list[str]:
        """Names of the namespace directories (listed through the held `ns`, never through a
        symlink; a link where a namespace directory should be is not one)."""
        try:
            list_fd = os.open(".", self.DIR_OPEN_FLAGS, dir_fd=self.ns_fd())
            try:
                names = [e.name for e in os.scandir(list_fd) if e.is_dir(follow_symlinks=False)]
            finally:
                os.close(list_fd)
        except OSError as error:
            if on_error is not None:
                on_error(self.ns_root, error)
            return []
        return sorted(names)

    def _entries(self, directory: str, dirname: str, wanted, on_error) -> Iterator[FileEntry]:
        try:  # listed through a descriptor of its own, opened without following a link
            if dirname:  # a namespace's: in the held `ns`
                if not _is_plain_name(dirname):
                    return
                dir_fd = self._open_dir(dirname, self.ns_fd(), directory)
            else:
                dir_fd = os.open(directory, self.DIR_OPEN_FLAGS)
        except FileNotFoundError:
            return
        except OSError as error:  # e.g. a namespace directory this user cannot read, a link
            if on_error is not None:
                on_error(directory, error)
            return
        try:  # streamed: each entry's stat is relative to dir_fd, closed when the walk ends
            with os.scandir(dir_fd) as listing:
                for entry in listing:
                    if not wanted(entry.name):
                        continue
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    yield FileEntry(
                        dirname,
                        entry.name,
                        os.path.join(directory, entry.name),
                        info.st_size,
                        accounted_bytes(info),
                        info.st_mtime_ns,
                        info.st_ino,
                        info.st_nlink,
                    )
        except OSError as error:
            if on_error is not None:
                on_error(directory, error)
            return
        finally:
            os.close(dir_fd)

    def records(self, dirnames=None, on_error=None) -> Iterator[FileEntry]:
        for dirname in self.namespace_dirnames(on_error) if dirnames is None else dirnames:
            yield from self._entries(self.namespace_dir(dirname), dirname, is_record_name, on_error)

    def temp_files(self, dirnames=None, on_error=None) -> Iterator[FileEntry]:
        for dirname in self.namespace_dirnames(on_error) if dirnames is None else dirnames:
            yield from self._entries(self.namespace_dir(dirname), dirname, is_temp_name, on_error)

    def quarantined(self) -> list[FileEntry]:
        return sorted(
            self._entries(self.quarantine_dir, "", lambda name: True, None),
            key=lambda entry: entry.name,
        )

    # ------------------------------------------------------------- namespace descriptions

    def load_namespace(self, dirname: str) -> Namespace | None:
        """The namespace a directory's namespace.json describes, if it is intact and matches
        the directory's name; None otherwise."""
        try:
            with self._namespace_dir_fd(dirname) as dir_fd:
                fd = os.open(NAMESPACE_FILE, RECORD_OPEN_FLAGS, dir_fd=dir_fd)
            with os.fdopen(fd, "rb") as description:
                if not stat.S_ISREG(os.fstat(description.fileno()).st_mode):
                    return None
                data = json.loads(description.read(1 << 20))
            namespace = Namespace(
                data["tenant"], data["model_fingerprint"], data["pool"], data.get("geometry", {})
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return namespace if namespace.dirname == dirname else None

    def load_namespace_cached(self, dirname: str) -> Namespace | None:
        """load_namespace, remembered for a few seconds (scans ask once per record)."""
        now_s = time.monotonic()
        cached = self._descriptions.get(dirname)
        if cached is None or now_s - cached[0] > 5.0:
            cached = self._descriptions[dirname] = (now_s, self.load_namespace(dirname))
        return cached[1]

    def write_namespace(self, namespace: Namespace, durable: bool) -> None:
        """Creates the namespace's directory (and `ns`, if it went) and (re)writes its
        namespace.json atomically when it is missing or does not describe this namespace,
        all through descriptors opened without following links (NotADirectoryError when
        `ns` or the namespace's directory is a link)."""
        dirname = namespace.dirname
        try:
            ns_fd = self.ns_fd()
        except FileNotFoundError:  # `ns` was removed: made again in the root opened at first
            with contextlib.suppress(FileExistsError):
                os.mkdir("ns", dir_fd=self._root_fd)
            ns_fd = self.ns_fd()
        with contextlib.suppress(FileExistsError):
            os.mkdir(dirname, dir_fd=ns_fd)
        dir_fd = self.namespace_fd(dirname, recheck=True)  # a directory made again is taken
        if self.load_namespace(dirname) == namespace:
            return
        fd, temp_name = create_temp(
            NAMESPACE_FILE + ".", NAMESPACE_TEMP_SUFFIX, dir_fd=dir_fd, mode=0o666
        )
        try:
            with os.fdopen(fd, "w") as description:
                json.dump(namespace.describe() | {"digest": namespace.digest.hex()}, description)
                description.flush()
                if durable:
                    os.fsync(description.fileno())
            os.replace(temp_name, NAMESPACE_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp_name, dir_fd=dir_fd)
        if durable:
            os.fsync(dir_fd)
            os.fsync(ns_fd)

    def remove_stale_description_temps(self, dirname: str) -> int:
        """Removes namespace.json temp files left by writers that are gone (e.g. a full disk).
        Writing one takes milliseconds, so one older than NAMESPACE_TEMP_STALE_S is abandoned;
        its name says nothing of its writer (a pid would not name a process of another pid
        namespace)."""
        removed = 0
        try:
            with self._namespace_dir_fd(dirname) as dir_fd:
                # a descriptor of its own: listing moves a directory descriptor's offset
                list_fd = os.open(".", self.DIR_OPEN_FLAGS, dir_fd=dir_fd)
                try:
                    names = os.listdir(list_fd)
                finally:
                    os.close(list_fd)
                for name in names:
                    if not (
                        name.startswith(NAMESPACE_FILE + ".")
                        and name.endswith(NAMESPACE_TEMP_SUFFIX)
                    ):
                        continue
                    with contextlib.suppress(OSError):
                        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                        if time.time() - info.st_mtime < NAMESPACE_TEMP_STALE_S:
                            continue
                        os.unlink(name, dir_fd=dir_fd)
                        removed += 1
        except OSError:
            return removed
        return removed


def _is_plain_name(name: str) -> bool:
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


def temp_is_stale(entry: FileEntry, is_alive, now_s: float | None = None) -> bool:
    """A temp file is stale when its writer is gone (or it is a day old). `is_alive(token)`
    tells whether the process holding a store token is alive (its lock, never its pid alone);
    a temp file not named by a token has no writer."""
    writer = temp_writer(entry.name)
    if not (is_token(writer) and is_alive(writer)):
        return True
    return (now_s or time.time()) - entry.mtime_ns / 1e9 > STALE_TEMP_AGE_S
