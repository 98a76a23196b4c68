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
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import ConfigError
from .namespace import Namespace

RECORD_SUFFIX = ".rec"
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".part"
NAMESPACE_FILE = "namespace.json"
NAMESPACE_TEMP_SUFFIX = ".tmp"
STALE_TEMP_AGE_S = 24 * 3600.0
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

# Records are opened without following a symlink and without blocking on a FIFO.
RECORD_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
    """The token (or, for files of older versions, the pid) of a temp file's writer."""
    return name[len(TEMP_PREFIX) :].split("-", 1)[0]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def accounted_bytes(info: os.stat_result) -> int:
    """The bytes a file costs the budget: its size, or what it really occupies if that is
    less (a sparse file claiming a terabyte must not make the store evict everything)."""
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

    @property
    def location(self) -> tuple[str, str]:
        return (self.dirname, self.name)


class StoreLayout:
    """Paths under a store root and the scans of its directories."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.ns_root = os.path.join(self.root, "ns")
        self.quarantine_dir = os.path.join(self.root, "quarantine")
        self.ledger_path = os.path.join(self.root, "ledger")
        self._dirs: dict[str, str] = {}
        self._prefixes: dict[str, str] = {}
        self._descriptions: dict[str, tuple[float, Namespace | None]] = {}

    def prepare(self, *, read_only: bool, min_free_bytes: int) -> None:
        """Checks (and, unless read-only, creates) the root: a real directory whose `ns` and
        `quarantine` are real directories too, never a file or a symbolic link, on a
        filesystem larger than the free-space floor. ConfigError naming the option otherwise."""
        if read_only:
            if not os.path.isdir(self.ns_root):
                raise ConfigError(f"root {self.root!r}: not a hicache-galahad store")
            return
        try:
            for directory in (self.root, self.ns_root, self.quarantine_dir):
                os.makedirs(directory, exist_ok=True)
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"hicache_galahad option 'root': {self.root!r} cannot hold a store ({error}); "
                "expected a directory (or a path where one can be created)"
            ) from error
        for path in (self.root, self.ns_root, self.quarantine_dir):
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
        directory = self._dirs.get(dirname)
        if directory is None:
            directory = self._dirs[dirname] = os.path.join(self.ns_root, dirname)
        return directory

    def namespace_prefix(self, dirname: str) -> str:
        """The namespace's directory with a trailing separator (record paths are built by
        concatenation on the read path)."""
        prefix = self._prefixes.get(dirname)
        if prefix is None:
            prefix = self._prefixes[dirname] = self.namespace_dir(dirname) + os.sep
        return prefix

    def record_path(self, dirname: str, key: str) -> str:
        return os.path.join(self.namespace_dir(dirname), record_filename(key))

    def new_temp_path(self, dirname: str, filename: str, writer_token: str) -> str:
        stem = filename[: -len(RECORD_SUFFIX)]
        name = f"{TEMP_PREFIX}{writer_token}-{os.urandom(4).hex()}-{stem}{TEMP_SUFFIX}"
        return os.path.join(self.namespace_dir(dirname), name)

    def unlink_record(self, dirname: str, filename: str) -> int | None:
        """Deletes a record through its directory opened without following symlinks; the
        bytes it was accounted for, or None if it was not there."""
        try:
            dir_fd = os.open(
                self.namespace_dir(dirname), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            )
        except OSError:
            return None
        try:
            info = os.stat(filename, dir_fd=dir_fd, follow_symlinks=False)
            os.unlink(filename, dir_fd=dir_fd)
        except OSError:
            return None
        finally:
            os.close(dir_fd)
        return accounted_bytes(info)

    # ------------------------------------------------------------- scans

    def namespace_dirnames(self, on_error=None) -> list[str]:
        """Names of the namespace directories (never through a symlink)."""
        try:
            entries = list(os.scandir(self.ns_root))
        except OSError as error:
            if on_error is not None:
                on_error(self.ns_root, error)
            return []
        return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))

    def _entries(self, directory: str, dirname: str, wanted, on_error) -> Iterator[FileEntry]:
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return
        except OSError as error:  # e.g. a namespace directory this user cannot read
            if on_error is not None:
                on_error(directory, error)
            return
        for entry in entries:
            if not wanted(entry.name):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield FileEntry(
                dirname,
                entry.name,
                entry.path,
                info.st_size,
                accounted_bytes(info),
                info.st_mtime_ns,
                info.st_ino,
            )

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
        path = os.path.join(self.namespace_dir(dirname), NAMESPACE_FILE)
        try:
            fd = os.open(path, RECORD_OPEN_FLAGS)
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
        """Creates the namespace's directory and (re)writes its namespace.json atomically
        when it is missing or does not describe this namespace."""
        directory = self.namespace_dir(namespace.dirname)
        os.makedirs(directory, exist_ok=True)
        if os.path.islink(directory):
            raise NotADirectoryError(f"{directory} is a symbolic link")
        if self.load_namespace(namespace.dirname) == namespace:
            return
        path = os.path.join(directory, NAMESPACE_FILE)
        temp_path = f"{path}.{os.getpid()}.{threading.get_ident()}{NAMESPACE_TEMP_SUFFIX}"
        try:
            with open(temp_path, "w") as description:
                json.dump(namespace.describe() | {"digest": namespace.digest.hex()}, description)
                description.flush()
                if durable:
                    os.fsync(description.fileno())
            os.replace(temp_path, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp_path)
        if durable:
            fsync_dir(directory)
            fsync_dir(self.ns_root)

    def remove_stale_description_temps(self, dirname: str) -> int:
        """Removes namespace.json temp files of writers that are gone (e.g. a full disk)."""
        directory = self.namespace_dir(dirname)
        removed = 0
        try:
            names = os.listdir(directory)
        except OSError:
            return 0
        for name in names:
            if not (name.startswith(NAMESPACE_FILE + ".") and name.endswith(NAMESPACE_TEMP_SUFFIX)):
                continue
            parts = name.split(".")
            pid = int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else None
            if pid is None or not pid_alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
                    removed += 1
        return removed


def temp_is_stale(entry: FileEntry, is_alive, now_s: float | None = None) -> bool:
    """A temp file is stale when its writer is gone (or it is a day old). `is_alive(token)`
    tells whether the process holding a store token is alive."""
    writer = temp_writer(entry.name)
    if writer.isdigit():  # a temp file of an older version, named by pid
        alive = int(writer) == os.getpid() or pid_alive(int(writer))
    else:
        alive = is_alive(writer)
    if not alive:
        return True
    return (now_s or time.time()) - entry.mtime_ns / 1e9 > STALE_TEMP_AGE_S
