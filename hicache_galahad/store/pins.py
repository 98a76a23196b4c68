"""Pins: records that eviction keeps, shared by every process on a root (issue 23).

    <root>/pins/lock                         flock(2): every change to the pins holds it
    <root>/pins/state                        JSON: pinned bytes and records per tenant, and
                                             the journal of the change in progress
    <root>/pins/records/<ns>/<file>.rec      a hard link of the pinned record
    <root>/pins/refs/<ns>/<file>.rec         the record's pin: a small file of its own (its
                                             bytes, its tenant); its link count less one is
                                             the number of documents that pin the record
    <root>/pins/docs/<doc>/manifest.json     the document: its label, its namespaces (with
                                             their tenants), when it was pinned
    <root>/pins/docs/<doc>/<ns>/<file>.rec   a hard link of the record's pin file

A record is pinned when its file has a second link (the one under `records/`): eviction's
sample reads `st_nlink` from the stat it already makes, so a pin costs eviction no system
call, and no process reads a list of pins. The pin file's link count, not the record's, is
the reference count across documents: the record's own count also holds a writer's temp
file for the instant between its link(2) and its unlink (writer.py), or for longer when that
writer was killed, so it cannot count documents; the pin file is linked by this module only,
under the lock. A transient second link of the record only keeps it from eviction for that
instant (the safe side).

Every change is journaled in `state` first (an atomic replace), done, then counted with the
same replace that clears the journal. A process killed in between leaves the journal, and the
next one to take the lock finishes or undoes what it names from what the disk shows, so the
counts stay exact across SIGKILL. Pinning links the records under the ledger's lock, which
eviction holds from the check of a victim to its unlink: a record is either evicted before
it is linked (then it is missing) or seen pinned. Directories are opened without following a
link (a linked `pins` is refused at open, and any linked directory below it refuses the
operation). A pin whose record left its namespace (deleted, purged, quarantined) is dropped
by the store (`drop_stale`), so no bytes stay held and counted for a record no one can read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import threading
import time
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..record.namespace import Namespace
from .layout import accounted_bytes, is_record_name, record_filename
from .safe_files import OPEN_FLAGS, open_regular

PINS_DIR = "pins"
LOCK_FILE = "lock"
STATE_FILE = "state"
RECORDS_DIR = "records"
REFS_DIR = "refs"
DOCS_DIR = "docs"
MANIFEST = "manifest.json"
BATCH = 256  # records per journaled step (bounds the journal)
STATE_MAX_BYTES = 1 << 20
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PinsDirError(NotADirectoryError):
    """A directory under `pins/` is a symbolic link or not a directory: refused."""


@dataclass
class PinResult:
    """What `RecordStore.pin` did for one document.

    pinned_records: keys this call pinned for the document (a record another document
        already pinned counts here too; its bytes were counted already).
    already_pinned_records: keys the document had pinned already.
    missing_keys: keys with no record in the namespace (never stored, or evicted before).
    refused_keys: keys not pinned because `max_pinned_bytes` would have been passed.
    pinned_bytes: bytes newly counted as pinned (records no document pinned before).
    """

    pinned_records: int = 0
    already_pinned_records: int = 0
    missing_keys: list[str] = field(default_factory=list)
    refused_keys: list[str] = field(default_factory=list)
    pinned_bytes: int = 0

    @property
    def complete(self) -> bool:
        return not self.missing_keys and not self.refused_keys

    def as_dict(self) -> dict:
        return {
            "pinned_records": self.pinned_records,
            "already_pinned_records": self.already_pinned_records,
            "missing_keys": list(self.missing_keys),
            "refused_keys": list(self.refused_keys),
            "pinned_bytes": self.pinned_bytes,
        }


def document_id(label: str) -> str:
    """The directory name of a document: a digest of its label (any string)."""
    return "d" + hashlib.sha256(label.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _is_doc_id(name: str) -> bool:
    return len(name) == 33 and name[0] == "d" and all(c in "0123456789abcdef" for c in name[1:])


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _open_dir(name: str, parent_fd: int, shown_path: str) -> int | None:
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


class _Dirs:
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
        if not _plain(name):
            raise PinsDirError(errno.EINVAL, "not a plain name", name)
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=parent)
                self.touched.add(parts[:-1])
        fd = _open_dir(name, parent, os.path.join(PINS_DIR, *parts))
        if fd is not None:
            self._fds[parts] = fd
        return fd

    def forget(self, *parts: str) -> None:
        fd = self._fds.pop(tuple(parts), None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def fsync_touched(self) -> None:
        for parts in sorted(self.touched):
            fd = self.get(*parts)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def _stat(name: str, dir_fd: int | None):
    if dir_fd is None:
        return None
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _unlink(name: str, dir_fd: int | None) -> bool:
    if dir_fd is None:
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


def _read_json(name: str, dir_fd: int):
    try:
        fd = open_regular(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        raw = os.read(fd, STATE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return json.loads(raw) if len(raw) <= STATE_MAX_BYTES else None
    except ValueError:
        return None


class Pins:
    """The pins of one store root (see the module's docstring)."""

    def __init__(
        self,
        layout,
        ledger,
        *,
        token: str,
        max_pinned_bytes: int | None,
        durable: bool,
        read_only: bool,
        counters=None,
    ):
        self.layout = layout
        self.ledger = ledger
        self.token = token
        self.max_pinned_bytes = max_pinned_bytes
        self.durable = durable
        self.read_only = read_only
        self.counters = counters
        self._thread_lock = threading.RLock()
        self._cached: tuple[tuple, dict] = ((), {})  # (state file's identity, bytes)
        self.path = os.path.join(layout.root, PINS_DIR)
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as error:
            raise ConfigError(
                f"hicache_galahad option 'root': {self.path!r} cannot be read ({error}); "
                "expected a real directory"
            ) from error
        if not stat.S_ISDIR(info.st_mode):
            raise ConfigError(
                f"hicache_galahad option 'root': {self.path!r} is a symbolic link or not a "
                "directory; expected a real directory"
            )

    # ------------------------------------------------------------- opening, locking

    def _root_fd(self) -> int:
        return os.open(self.layout.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _pins_fd(self, create: bool) -> int | None:
        root_fd = self._root_fd()
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(PINS_DIR, 0o755, dir_fd=root_fd)
            return _open_dir(PINS_DIR, root_fd, self.path)
        finally:
            os.close(root_fd)

    @contextlib.contextmanager
    def _locked(self, create: bool = True):
        """(dirs, state) under the pins lock, after finishing a dead process's change."""
        if self.read_only:
            raise OSError(errno.EROFS, "the store is open read-only", self.path)
        with self._thread_lock:
            pins_fd = self._pins_fd(create)
            if pins_fd is None:
                yield None, None
                return
            dirs = _Dirs(pins_fd)
            lock_fd = None
            try:
                lock_fd = open_regular(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644, dir_fd=pins_fd)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                state = self._read_state(pins_fd, repair=True)
                if state.get("journal"):
                    self._recover(dirs, state)
                    self._write_state(dirs, state)
                elif state.pop("recounted", False) and state["tenants"]:
                    self._write_state(dirs, state)
                try:
                    yield dirs, state
                finally:
                    if state.get("journal"):  # an exception in the middle: undone or done now
                        with contextlib.suppress(OSError):
                            self._recover(dirs, state)
                            self._write_state(dirs, state)
            finally:
                if lock_fd is not None:
                    with contextlib.suppress(OSError):
                        fcntl.flock(lock_fd, fcntl.LOCK_UN)
                    os.close(lock_fd)
                dirs.close()
                os.close(pins_fd)

    def _read_state(self, pins_fd: int, repair: bool = False) -> dict:
        """The state file; when it is missing or damaged, counted again from the pin files
        (see _recount_state), so the counts are never lost with it."""
        data = _read_json(STATE_FILE, pins_fd)
        valid = isinstance(data, dict) and isinstance(data.get("tenants"), dict)
        if valid:
            try:
                for tenant, entry in data["tenants"].items():
                    if not (isinstance(tenant, str) and int(entry["bytes"]) >= 0):
                        valid = False
                    entry["bytes"], entry["records"] = int(entry["bytes"]), int(entry["records"])
            except (TypeError, KeyError, ValueError, AttributeError):
                valid = False
        if not valid:
            data = self._recount_state(pins_fd, repair)
            data["recounted"] = True
        data.setdefault("journal", None)
        return data

    def _recount_state(self, pins_fd: int, repair: bool) -> dict:
        """The counts from the pin files themselves: a walk of pins/refs, only when the
        state file is missing or damaged (never on a put, an eviction or at open). A pin file
        that no document links, or that has no record link, is a change killed midway: with
        `repair` (under the lock) it is finished as the journal would have (removed, with its
        record link); it is never counted."""
        tenants: dict = {}
        dirs = _Dirs(pins_fd)
        try:
            for top in (REFS_DIR, RECORDS_DIR):
                top_fd = dirs.get(top)
                for dirname in os.listdir(top_fd) if top_fd is not None else []:
                    if not _plain(dirname):
                        continue
                    refs_fd, records_fd = (
                        dirs.get(REFS_DIR, dirname),
                        dirs.get(RECORDS_DIR, dirname),
                    )
                    own_fd = refs_fd if top == REFS_DIR else records_fd
                    for name in os.listdir(own_fd) if own_fd is not None else []:
                        ref, link = _stat(name, refs_fd), _stat(name, records_fd)
                        whole = ref is not None and ref.st_nlink >= 2 and link is not None
                        if not whole:
                            if repair:
                                _unlink(name, records_fd)
                                _unlink(name, refs_fd)
                            continue
                        if top == RECORDS_DIR:
                            continue  # counted from refs
                        content = _read_json(name, refs_fd)
                        if isinstance(content, dict):
                            entry = tenants.setdefault(
                                str(content.get("t")), {"bytes": 0, "records": 0}
                            )
                            entry["bytes"] += int(content.get("b", 0))
                            entry["records"] += 1
        finally:
            dirs.close()
        return {"tenants": tenants}

    def _write_state(self, dirs: _Dirs, state: dict) -> None:
        pins_fd = dirs.pins_fd
        temp = f"{STATE_FILE}.{self.token}.tmp"
        raw = json.dumps(state, sort_keys=True).encode()
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS, 0o644, dir_fd=pins_fd
        )
        try:
            os.write(fd, raw)
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, STATE_FILE, src_dir_fd=pins_fd, dst_dir_fd=pins_fd)
        if self.durable:
            os.fsync(pins_fd)

    @staticmethod
    def _count(state: dict, tenant: str, nbytes: int, records: int) -> None:
        entry = state["tenants"].setdefault(tenant, {"bytes": 0, "records": 0})
        entry["bytes"] = max(0, entry["bytes"] + nbytes)
        entry["records"] = max(0, entry["records"] + records)
        if not entry["records"]:
            del state["tenants"][tenant]

    @staticmethod
    def _state_total(state: dict) -> int:
        return sum(entry["bytes"] for entry in state["tenants"].values())

    # ------------------------------------------------------------- the journal

    def _recover(self, dirs: _Dirs, state: dict) -> None:
        """Finishes (or undoes) the journaled change from what the disk shows."""
        journal, state["journal"] = state.get("journal"), None
        if not isinstance(journal, dict):
            return
        if journal.get("op") == "all":
            self._remove_everything(dirs)
            state["tenants"] = {}
            return
        doc = journal.get("doc")
        for item in journal.get("items", []):
            try:
                dirname, filename, kind, nbytes, tenant = item
            except (TypeError, ValueError):
                continue
            if not (_plain(dirname) and is_record_name(filename)):
                continue
            refs_fd = dirs.get(REFS_DIR, dirname)
            records_fd = dirs.get(RECORDS_DIR, dirname)
            doc_fd = dirs.get(DOCS_DIR, doc, dirname) if doc and _plain(doc) else None
            if kind == "new":
                ref = _stat(filename, refs_fd)
                link = _stat(filename, doc_fd)
                if ref is not None and link is not None and link.st_ino == ref.st_ino:
                    self._count(state, tenant, nbytes, 1)  # it was pinned: count it
                else:  # never pinned: undo
                    _unlink(filename, records_fd)
                    _unlink(filename, refs_fd)
            elif kind in ("last", "drop"):
                if kind == "last":
                    _unlink(filename, doc_fd)
                _unlink(filename, records_fd)
                _unlink(filename, refs_fd)
                self._count(state, tenant, -nbytes, -1)

    def _journal(self, dirs: _Dirs, state: dict, journal: dict) -> None:
        state["journal"] = journal
        self._write_state(dirs, state)

    def _settle(self, dirs: _Dirs, state: dict, changed: list[tuple]) -> None:
        """Clears the journal with the new counts, once the links of `changed` directories
        are durable (a power loss then finds the journal, or links and counts that agree)."""
        if self.durable:
            for parts in changed:
                fd = dirs.get(*parts)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.fsync(fd)
        state["journal"] = None
        self._write_state(dirs, state)

    # ------------------------------------------------------------- pinning

    def pin(self, namespace: Namespace, keys: list[str], document: str) -> PinResult:
        result = PinResult()
        doc = document_id(document)
        dirname = namespace.dirname
        with self._locked() as (dirs, state):
            self._write_manifest(dirs, doc, document, dirname, namespace.tenant)
            for start in range(0, len(keys), BATCH):
                self._pin_batch(dirs, state, namespace, keys[start : start + BATCH], doc, result)
            if self.durable:
                dirs.fsync_touched()
        if result.refused_keys and self.counters is not None:
            self.counters.add("pins_refused", len(result.refused_keys))
        return result

    def _write_manifest(self, dirs: _Dirs, doc: str, label: str, dirname: str, tenant: str):
        doc_fd = dirs.get(DOCS_DIR, doc, create=True)
        manifest = _read_json(MANIFEST, doc_fd)
        now_s = time.time()
        if not isinstance(manifest, dict) or not isinstance(manifest.get("namespaces"), dict):
            manifest = {"label": label, "namespaces": {}, "pinned_s": now_s}
        if manifest["namespaces"].get(dirname) == tenant:
            return
        manifest["namespaces"][dirname] = tenant
        manifest["updated_s"] = now_s
        temp = f"{MANIFEST}.{self.token}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS, 0o644, dir_fd=doc_fd)
        try:
            os.write(fd, json.dumps(manifest, sort_keys=True).encode())
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, MANIFEST, src_dir_fd=doc_fd, dst_dir_fd=doc_fd)
        dirs.touched.add((DOCS_DIR, doc))

    def _pin_batch(self, dirs, state, namespace, keys, doc, result: PinResult) -> None:
        dirname, tenant = namespace.dirname, namespace.tenant
        refs_fd = dirs.get(REFS_DIR, dirname, create=True)
        records_fd = dirs.get(RECORDS_DIR, dirname, create=True)
        doc_fd = dirs.get(DOCS_DIR, doc, dirname, create=True)
        try:
            ns_fd = self.layout.namespace_fd(dirname)
        except OSError:
            result.missing_keys.extend(keys)
            return
        total = self._state_total(state)
        limit = self.max_pinned_bytes
        new, add, seen = [], [], set()
        for key in keys:
            filename = record_filename(key)
            if filename in seen:
                result.already_pinned_records += 1
                continue
            seen.add(filename)
            ref = _stat(filename, refs_fd)
            link = _stat(filename, doc_fd)
            if ref is not None and link is not None and link.st_ino == ref.st_ino:
                result.already_pinned_records += 1
                continue
            if ref is not None:  # pinned by another document: one more reference
                there, pinned = _stat(filename, ns_fd), _stat(filename, records_fd)
                if there is None or pinned is None or there.st_ino != pinned.st_ino:
                    result.missing_keys.append(key)  # its record left (dropped soon)
                    continue
                add.append((key, filename, link is not None))
                continue
            info = _stat(filename, ns_fd)
            if info is None or not stat.S_ISREG(info.st_mode):
                result.missing_keys.append(key)
                continue
            size = accounted_bytes(info)
            if limit is not None and total + size > limit:
                result.refused_keys.append(key)
                continue
            total += size
            new.append((key, filename, info.st_ino, size, link is not None))
        if new:
            self._journal(
                dirs,
                state,
                {
                    "op": "pin",
                    "doc": doc,
                    "items": [[dirname, f, "new", size, tenant] for _, f, _, size, _ in new],
                },
            )
        made = []
        for item in new:  # the pin files first (nothing protects the record yet)
            key, filename, inode, size, _ = item
            try:
                fd = os.open(
                    filename,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS,
                    0o644,
                    dir_fd=refs_fd,
                )
            except FileExistsError:  # left by an undo that could not finish: made again
                _unlink(filename, refs_fd)
                fd = os.open(
                    filename,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS,
                    0o644,
                    dir_fd=refs_fd,
                )
            try:
                os.write(fd, json.dumps({"b": size, "t": tenant}).encode())
            finally:
                os.close(fd)
            made.append(item)

        linked: list = []

        def link_records(journal) -> int:  # under the ledger's lock: eviction waits
            for item in made:
                key, filename, inode, size, _ = item
                info = _stat(filename, ns_fd)
                if info is None or info.st_ino != inode or not stat.S_ISREG(info.st_mode):
                    continue  # evicted or replaced since: missing
                _unlink(filename, records_fd)  # a stale link of an older record
                try:
                    os.link(
                        filename,
                        filename,
                        src_dir_fd=ns_fd,
                        dst_dir_fd=records_fd,
                        follow_symlinks=False,
                    )
                except OSError:
                    continue
                linked.append(item)
            return 0

        if made:
            self.ledger.apply(link_records)
        done = {id(item) for item in linked}
        for item in made:
            if id(item) not in done:
                result.missing_keys.append(item[0])
                _unlink(item[1], refs_fd)
        for _key, filename, stale_link in add:
            if stale_link:
                _unlink(filename, doc_fd)  # a document's link to a pin since dropped
            os.link(filename, filename, src_dir_fd=refs_fd, dst_dir_fd=doc_fd)
            result.pinned_records += 1
        for _key, filename, _inode, size, stale_link in linked:
            if stale_link:
                _unlink(filename, doc_fd)
            os.link(filename, filename, src_dir_fd=refs_fd, dst_dir_fd=doc_fd)
            result.pinned_records += 1
            result.pinned_bytes += size
            self._count(state, tenant, size, 1)
        if new:
            self._settle(
                dirs, state, [(REFS_DIR, dirname), (RECORDS_DIR, dirname), (DOCS_DIR, doc, dirname)]
            )
        dirs.touched.add((DOCS_DIR, doc, dirname))

    # ------------------------------------------------------------- unpinning

    def unpin(
        self, *, document: str | None = None, tenant: str | None = None, everything: bool = False
    ) -> int:
        """Bytes no longer pinned. By document (its label), by tenant (every document's
        namespaces of that tenant), or everything; document and tenant together: that
        document's namespaces of that tenant."""
        if not everything and document is None and tenant is None:
            raise ValueError("unpin needs a document, a tenant or everything")
        with self._locked(create=False) as (dirs, state):
            if dirs is None:
                return 0
            if everything:
                released = self._state_total(state)
                self._journal(dirs, state, {"op": "all"})
                self._remove_everything(dirs)
                state["tenants"] = {}
                self._settle(dirs, state, [()])
                return released
            docs_fd = dirs.get(DOCS_DIR)
            if docs_fd is None:
                return 0
            docs = [document_id(document)] if document is not None else sorted(os.listdir(docs_fd))
            released = 0
            for doc in docs:
                if _is_doc_id(doc):
                    released += self._unpin_document(dirs, state, doc, tenant)
            return released

    def _unpin_document(self, dirs: _Dirs, state: dict, doc: str, tenant: str | None) -> int:
        doc_fd = dirs.get(DOCS_DIR, doc)
        if doc_fd is None:
            return 0
        manifest = _read_json(MANIFEST, doc_fd)
        namespaces = manifest.get("namespaces", {}) if isinstance(manifest, dict) else {}
        released = 0
        for dirname in sorted(os.listdir(doc_fd)):
            if dirname == MANIFEST or dirname.startswith(MANIFEST + "."):
                continue
            if tenant is not None and namespaces.get(dirname) != tenant:
                continue
            released += self._unpin_namespace(dirs, state, doc, dirname)
            with contextlib.suppress(OSError):
                os.rmdir(dirname, dir_fd=doc_fd)
            namespaces.pop(dirname, None)
        left = [name for name in os.listdir(doc_fd) if name != MANIFEST]
        if not left:
            _unlink(MANIFEST, doc_fd)
            dirs.forget(DOCS_DIR, doc)
            with contextlib.suppress(OSError):
                os.rmdir(doc, dir_fd=dirs.get(DOCS_DIR))
        elif isinstance(manifest, dict):
            manifest["namespaces"] = namespaces
            temp = f"{MANIFEST}.{self.token}.tmp"
            fd = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS, 0o644, dir_fd=doc_fd
            )
            try:
                os.write(fd, json.dumps(manifest, sort_keys=True).encode())
            finally:
                os.close(fd)
            os.rename(temp, MANIFEST, src_dir_fd=doc_fd, dst_dir_fd=doc_fd)
        if self.durable:
            dirs.touched.add((DOCS_DIR,))
            dirs.fsync_touched()
        return released

    def _unpin_namespace(self, dirs: _Dirs, state: dict, doc: str, dirname: str) -> int:
        if not _plain(dirname):
            return 0
        links_fd = dirs.get(DOCS_DIR, doc, dirname)
        if links_fd is None:
            return 0
        refs_fd = dirs.get(REFS_DIR, dirname)
        records_fd = dirs.get(RECORDS_DIR, dirname)
        names = sorted(os.listdir(links_fd))
        released = 0
        for start in range(0, len(names), BATCH):
            last, other = [], []
            for filename in names[start : start + BATCH]:
                link = _stat(filename, links_fd)
                ref = _stat(filename, refs_fd)
                if link is None:
                    continue
                if ref is None or ref.st_ino != link.st_ino or ref.st_nlink > 2:
                    other.append(filename)  # another document keeps it, or a dropped pin
                    continue
                content = _read_json(filename, refs_fd) or {}
                last.append((filename, int(content.get("b", 0)), str(content.get("t"))))
            if last:
                self._journal(
                    dirs,
                    state,
                    {
                        "op": "unpin",
                        "doc": doc,
                        "items": [[dirname, f, "last", b, t] for f, b, t in last],
                    },
                )
            for filename in other:
                _unlink(filename, links_fd)
            for filename, nbytes, tenant in last:
                _unlink(filename, links_fd)
                _unlink(filename, records_fd)
                _unlink(filename, refs_fd)
                self._count(state, tenant, -nbytes, -1)
                released += nbytes
            if last:
                changed = [(DOCS_DIR, doc, dirname), (RECORDS_DIR, dirname), (REFS_DIR, dirname)]
                self._settle(dirs, state, changed)
        return released

    def _remove_everything(self, dirs: _Dirs) -> None:
        for top in (DOCS_DIR, RECORDS_DIR, REFS_DIR):
            top_fd = dirs.get(top)
            if top_fd is None:
                continue
            self._remove_tree(dirs, (top,))
            dirs.forget(top)
            with contextlib.suppress(OSError):
                os.rmdir(top, dir_fd=dirs.pins_fd)

    def _remove_tree(self, dirs: _Dirs, parts: tuple) -> None:
        fd = dirs.get(*parts)
        if fd is None:
            return
        for name in os.listdir(fd):
            info = _stat(name, fd)
            if info is None:
                continue
            if stat.S_ISDIR(info.st_mode):
                self._remove_tree(dirs, (*parts, name))
                dirs.forget(*parts, name)
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=fd)
            else:
                _unlink(name, fd)

    # ------------------------------------------------------------- records that left

    def drop_stale(self, dirname: str, filenames=None) -> int:
        """Drops the pins of records that left namespace `dirname` (deleted, purged,
        quarantined): those of `filenames`, or every pin of the namespace when None. A pin
        is stale when its link is no longer the file at the record's name. Returns the
        bytes no longer pinned. O(1) per name when there is no pin (one stat)."""
        if self.read_only or not _plain(dirname):
            return 0
        if filenames is not None:
            probe = os.path.join(self.path, RECORDS_DIR, dirname)
            filenames = [f for f in filenames if os.path.lexists(os.path.join(probe, f))]
            if not filenames:
                return 0
        elif not os.path.isdir(os.path.join(self.path, RECORDS_DIR, dirname)):
            return 0
        released = 0
        with self._locked(create=False) as (dirs, state):
            if dirs is None:
                return 0
            records_fd = dirs.get(RECORDS_DIR, dirname)
            refs_fd = dirs.get(REFS_DIR, dirname)
            if records_fd is None:
                return 0
            names = sorted(os.listdir(records_fd)) if filenames is None else list(filenames)
            try:
                ns_fd = self.layout.namespace_fd(dirname)
            except OSError:
                ns_fd = None
            for start in range(0, len(names), BATCH):
                stale = []
                for filename in names[start : start + BATCH]:
                    if not is_record_name(filename):
                        continue
                    link = _stat(filename, records_fd)
                    if link is None:
                        continue
                    there = _stat(filename, ns_fd)
                    if there is not None and there.st_ino == link.st_ino:
                        continue  # still the record: the pin stays
                    content = _read_json(filename, refs_fd) if refs_fd is not None else None
                    content = content if isinstance(content, dict) else {}
                    stale.append((filename, int(content.get("b", 0)), str(content.get("t"))))
                if not stale:
                    continue
                self._journal(
                    dirs,
                    state,
                    {"op": "drop", "items": [[dirname, f, "drop", b, t] for f, b, t in stale]},
                )
                for filename, nbytes, tenant in stale:
                    _unlink(filename, records_fd)
                    _unlink(filename, refs_fd)
                    self._count(state, tenant, -nbytes, -1)
                    released += nbytes
                self._settle(dirs, state, [(RECORDS_DIR, dirname), (REFS_DIR, dirname)])
        if released and self.counters is not None:
            self.counters.add("pins_dropped_bytes", released)
        return released

    # ------------------------------------------------------------- what is pinned

    def pinned_dirnames(self) -> list[str]:
        """The namespace directories that hold pins (a listing of pins/records)."""
        try:
            pins_fd = self._pins_fd(False)
        except OSError:
            return []
        if pins_fd is None:
            return []
        dirs = _Dirs(pins_fd)
        try:
            records_fd = dirs.get(RECORDS_DIR)
            return sorted(n for n in os.listdir(records_fd) if _plain(n)) if records_fd else []
        except OSError:
            return []
        finally:
            dirs.close()
            os.close(pins_fd)

    def by_tenant(self) -> dict[str, int]:
        """Pinned bytes per tenant (the state file: O(tenants), never a walk of records)."""
        if self.read_only:
            fd = self._pins_fd(False) if os.path.isdir(self.path) else None
            if fd is None:
                return {}
            try:
                state = self._read_state(fd)
            finally:
                os.close(fd)
        else:
            with self._locked(create=False) as (dirs, state):
                if dirs is None:
                    return {}
        return {tenant: entry["bytes"] for tenant, entry in sorted(state["tenants"].items())}

    def cached_by_tenant(self) -> dict[str, int]:
        """Pinned bytes per tenant as last written (no lock: one stat, and a read of the
        small state file only when it changed): for eviction and metrics."""
        path = os.path.join(self.path, STATE_FILE)
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            self._cached = ((), {})
            return {}
        identity = (info.st_ino, info.st_mtime_ns, info.st_size)
        if identity == self._cached[0]:
            return self._cached[1]
        try:
            pins_fd = self._pins_fd(False)  # never through a link
            if pins_fd is None:
                return {}
            try:
                data = _read_json(STATE_FILE, pins_fd)
            finally:
                os.close(pins_fd)
            tenants = {str(t): int(e["bytes"]) for t, e in data["tenants"].items()}
        except (OSError, TypeError, KeyError, ValueError, AttributeError):
            return self._cached[1]
        self._cached = (identity, tenants)
        return tenants

    def total_bytes(self) -> int:
        """Pinned bytes of every tenant (cached_by_tenant): what eviction may not take."""
        return sum(self.cached_by_tenant().values())
