"""The tree of `<root>/pins/`: its names, the directories opened without following links, and
the context (`PinsRoot`) every pins module works on.

    <root>/pins/lock                         flock(2): every change to the pins holds it
    <root>/pins/state                        JSON: pinned bytes and records per tenant, and
                                             the journal of the change in progress (state.py)
    <root>/pins/records/<ns>/<file>.rec      a hard link of the pinned record
    <root>/pins/refs/<ns>/<file>.rec         the record's pin: a small file of its own (its
                                             bytes, its tenant); its link count less one is
                                             the number of documents that pin the record
    <root>/pins/docs/<doc>/manifest.json     the document: its label, its namespaces (with
                                             their tenants), when it was pinned
    <root>/pins/docs/<doc>/<ns>/<file>.rec   a hard link of the record's pin file

Every directory below `pins/` is opened from its parent's descriptor with O_NOFOLLOW: a link
there is PinsDirError, never followed. Every file read here is read at most
STATE_MAX_BYTES through layout.open_regular (never a FIFO, a device or a link).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import threading
from dataclasses import dataclass, field
from typing import NamedTuple

from ...errors import NotARegularFileError, PinsDirError
from ...telemetry.metrics import Counters
from ..context import StoreContext
from ..layout import StoreLayout, accounted_bytes
from ..safe_files import open_regular

PINS_DIR = "pins"
LOCK_FILE = "lock"
STATE_FILE = "state"
RECORDS_DIR = "records"
REFS_DIR = "refs"
DOCS_DIR = "docs"
MANIFEST = "manifest.json"
TEMP_SUFFIX = ".tmp"  # state.<random>.tmp, manifest.json.<random>.tmp (layout.create_temp)
BATCH = 256  # records per journaled step (bounds the journal)
STATE_MAX_BYTES = 1 << 20
MAX_COUNT = 1 << 62  # above any honest byte or record count
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def document_id(label: str) -> str:
    """The directory name of a document: a digest of its label (any string)."""
    return "d" + hashlib.sha256(label.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def is_doc_id(name: str) -> bool:
    return len(name) == 33 and name[0] == "d" and all(c in "0123456789abcdef" for c in name[1:])


def plain(name) -> bool:
    """A single directory entry's name (never a path, '.' or '..')."""
    return (
        isinstance(name, str)
        and bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\0" not in name
    )


def is_count(value) -> bool:
    """A byte or record count as this package writes them (an int, never a bool or a float)."""
    return type(value) is int and 0 <= value <= MAX_COUNT


def open_dir(name: str, parent_fd: int, shown_path: str) -> int | None:
    """A directory below `parent_fd`, never through a link (PinsDirError naming
    `shown_path`); None when it is not there."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PinsDirError(
                error.errno, "a symbolic link or not a directory (never followed)", shown_path
            ) from None
        raise


def stat_at(name: str, dir_fd: int | None):
    """lstat of `name` in `dir_fd`; None when either is not there."""
    if dir_fd is None:
        return None
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def unlink_at(name: str, dir_fd: int | None) -> bool:
    if dir_fd is None:
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


def read_json(name: str, dir_fd: int):
    """The JSON value of a small regular file; None when it is missing, not a regular file
    (a FIFO, a link), too large, not JSON, or nested too deep to parse."""
    try:
        fd = open_regular(name, dir_fd=dir_fd)
    except (FileNotFoundError, NotARegularFileError):
        return None
    try:
        raw = os.read(fd, STATE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > STATE_MAX_BYTES:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


class PinEntry(NamedTuple):
    """What one pin file says: the record's bytes and its tenant."""

    nbytes: int
    tenant: str


def read_pin(name: str, refs_fd: int | None, link) -> PinEntry:
    """The pin file `name`, bounded by the disk: its bytes are the record link's (`link`, a
    stat of pins/records/<ns>/<name>) when it has one, never more than the file says."""
    content = read_json(name, refs_fd) if refs_fd is not None else None
    content = content if isinstance(content, dict) else {}
    said, tenant = content.get("b"), content.get("t")
    on_disk = accounted_bytes(link) if link is not None else None
    if not is_count(said):
        said = on_disk or 0
    nbytes = said if on_disk is None else min(said, on_disk)
    if not isinstance(tenant, str):
        tenant = "None" if tenant is None else "?"  # (a pin file this package did not write)
    return PinEntry(nbytes, tenant)


class Dirs:
    """Descriptors of the directories under `pins/` used by one locked section (opened
    without following links, created on demand), closed together."""

    def __init__(self, pins_fd: int):
        self.pins_fd = pins_fd
        self._fds: dict[tuple, int] = {}
        self.touched: set[tuple] = set()

    def get(self, *parts: str, create: bool = False) -> int | None:
        """The directory pins/<parts...>; None when it is not there (and not created)."""
        parts = tuple(parts)
        if not parts:
            return self.pins_fd
        fd = self._fds.get(parts)
        if fd is not None:
            return fd
        parent = self.get(*parts[:-1], create=create)
        if parent is None:
            return None
        name = parts[-1]
        if not plain(name):
            raise PinsDirError(errno.EINVAL, "not a plain name", str(name))
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=parent)
                self.touched.add(parts[:-1])
        fd = open_dir(name, parent, os.path.join(PINS_DIR, *parts))
        if fd is not None:
            self._fds[parts] = fd
        return fd

    def forget(self, *parts: str) -> None:
        fd = self._fds.pop(tuple(parts), None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def fsync(self, parts_list) -> None:
        for parts in sorted(parts_list):
            fd = self.get(*parts)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(fd)

    def fsync_touched(self) -> None:
        self.fsync(self.touched)

    def remove_tree(self, parts: tuple) -> None:
        """Removes everything below pins/<parts...> (never following a link)."""
        fd = self.get(*parts)
        if fd is None:
            return
        for name in os.listdir(fd):
            info = stat_at(name, fd)
            if info is None:
                continue
            if stat.S_ISDIR(info.st_mode):
                self.remove_tree((*parts, name))
                self.forget(*parts, name)
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=fd)
            else:
                unlink_at(name, fd)

    def remove_everything(self) -> None:
        """Every pin, record link and document (unpin --all, or its journal replayed)."""
        for top in (DOCS_DIR, RECORDS_DIR, REFS_DIR):
            if self.get(top) is None:
                continue
            self.remove_tree((top,))
            self.forget(top)
            with contextlib.suppress(OSError):
                os.rmdir(top, dir_fd=self.pins_fd)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def remove_temps(prefix: str, dir_fd: int, names=None) -> None:
    """Removes the temp files `<prefix><random>.tmp` in `dir_fd`: every one is made under
    the pins lock and renamed before it is released, so one found by the lock's holder was
    left by a process that died (or failed) between the two."""
    for name in os.listdir(dir_fd) if names is None else names:
        if name.startswith(prefix) and name.endswith(TEMP_SUFFIX):
            unlink_at(name, dir_fd)


@dataclass
class PinsRoot:
    """What every pins module works on: the store's context (its layout, counters, and how
    it writes: durable, fsync; read_only, never), its ledger and this process's token."""

    context: StoreContext
    ledger: object
    token: str
    thread_lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def layout(self) -> StoreLayout:
        return self.context.layout

    @property
    def counters(self) -> Counters:
        return self.context.counters

    @property
    def durable(self) -> bool:
        return self.context.options.durable

    @property
    def read_only(self) -> bool:
        return self.context.read_only

    @property
    def path(self) -> str:
        return os.path.join(self.layout.root, PINS_DIR)

    def pins_fd(self, create: bool) -> int | None:
        return open_pins_dir(self.layout.root, create)


def open_pins_dir(root: str, create: bool) -> int | None:
    """A descriptor of `root`'s pins/ (made when `create`), never through a link; None when
    it is not there."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(PINS_DIR, 0o755, dir_fd=root_fd)
        return open_dir(PINS_DIR, root_fd, os.path.join(root, PINS_DIR))
    finally:
        os.close(root_fd)
