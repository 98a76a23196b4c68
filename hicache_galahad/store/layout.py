"""Where everything lives under a store root (the name of each file and directory, what a
store token and a namespace directory's name look like) and the scans that list it.

    <root>/ledger                          byte ledger shared by every process (ledger.py)
    <root>/procs/<token>.lock              held by each process that has the store open
                                           (liveness.py)
    <root>/stats/<token>.json              each process's counters (lifetime.py)
    <root>/ns/<namespace>/namespace.json   what the namespace is (namespace_files.py)
    <root>/ns/<namespace>/<key>.rec        one record per key (docs/FORMAT.md)
    <root>/ns/<namespace>/.tmp-<token>-<random>-<name>.part   a write in progress
    <root>/quarantine/<time>-<namespace>-<name>             damaged records, newest few kept

Nothing under the root is ever followed through a symbolic link: directories are listed with
`follow_symlinks=False` through descriptors opened with O_NOFOLLOW (directories.py), and
files are opened with O_NOFOLLOW (safe_files.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ConfigError
from .directories import is_plain_name
from .namespace_files import NamespaceFiles

LEDGER_FILE = "ledger"
PROCS_DIR = "procs"
STATS_DIR = "stats"
QUARANTINE_DIR = "quarantine"
RECORD_SUFFIX = ".rec"
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".part"
STALE_TEMP_AGE_S = 24 * 3600.0
# The name the ledger counts quarantined files under: no namespace's (theirs are digests).
QUARANTINE_DIRNAME = "0" * 32
TOKEN_CHARS = 16
_TOKEN = re.compile(r"^[0-9a-f]{16}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAMESPACE_DIRNAME = re.compile(r"^[0-9a-f]{32}$")


def record_filename(key: str) -> str:
    """SGLang's 64-hex page hashes name their file directly; other keys are hashed."""
    if _HEX64.match(key):
        return key + RECORD_SUFFIX
    return "k" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest() + RECORD_SUFFIX


def is_record_name(name: str) -> bool:
    return name.endswith(RECORD_SUFFIX) and not name.startswith(".")


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def is_namespace_dirname(name: str) -> bool:
    """Whether `name` can be a namespace directory's (32 lowercase hex digits)."""
    return _NAMESPACE_DIRNAME.match(name) is not None


def temp_writer(name: str) -> str:
    """The token of a temp file's writer."""
    return name[len(TEMP_PREFIX) :].split("-", 1)[0]


def is_token(name: str) -> bool:
    """Whether `name` is a store token (16 lowercase hex digits: liveness.new_token)."""
    return len(name) == TOKEN_CHARS and _TOKEN.match(name) is not None


def accounted_bytes(info: os.stat_result) -> int:
    """The bytes a file costs the budget: its size, or what it really occupies if that is
    less (a sparse file claiming a terabyte must not make the store evict everything).
    Anything but a regular file (a FIFO, a directory, a symbolic link, a device) costs 0:
    it is no record, and no reader takes it for one."""
    if not stat.S_ISREG(info.st_mode):
        return 0
    return min(info.st_size, info.st_blocks * 512)


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
    links: int = 1  # more than one: pinned (store/pins/), or a writer's temp link for a moment

    @property
    def location(self) -> tuple[str, str]:
        return (self.dirname, self.name)


class StoreLayout(NamespaceFiles):
    """Paths under a store root, its checks at open, and the scans of its directories. Its
    bases hold the directories (directories.HeldDirectories: reads, writes and deletions go
    through those descriptors, never a path) and their namespace.json files
    (namespace_files.NamespaceFiles)."""

    def __init__(self, root: str):
        super().__init__(root)
        self.quarantine_dir = os.path.join(self.root, QUARANTINE_DIR)
        self.ledger_path = os.path.join(self.root, LEDGER_FILE)
        self._prefixes: dict[str, str] = {}

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
        directories += [os.path.join(self.root, name) for name in (PROCS_DIR, STATS_DIR)]
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
                if not is_plain_name(dirname):
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
                        dirname=dirname,
                        name=entry.name,
                        path=os.path.join(directory, entry.name),
                        size_bytes=info.st_size,
                        accounted_bytes=accounted_bytes(info),
                        mtime_ns=info.st_mtime_ns,
                        inode=info.st_ino,
                        links=info.st_nlink,
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


def temp_is_stale(entry: FileEntry, is_alive, now_s: float | None = None) -> bool:
    """A temp file is stale when its writer is gone (or it is a day old). `is_alive(token)`
    tells whether the process holding a store token is alive (its lock, never its pid alone);
    a temp file not named by a token has no writer."""
    writer = temp_writer(entry.name)
    if not (is_token(writer) and is_alive(writer)):
        return True
    return (now_s or time.time()) - entry.mtime_ns / 1e9 > STALE_TEMP_AGE_S
