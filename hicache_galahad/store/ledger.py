"""The byte ledger of a store root, shared by every process that has the root open.

    <root>/ledger       magic "GLEDGER2", committed bytes (u64), entry count (u32), 0 (u32),
                        then per open process: token (16 ASCII bytes), reserved bytes (u64);
                        ("GLEDGER3" with a journal: its length in place of the 0, the journal
                        after the entries); then, optionally, the namespace counts: "GNS1",
                        count (u32), flags (u32, bit 0: the counts are complete), then per
                        namespace directory: its name (16 bytes: the 32 hex digits), records,
                        bytes on disk, logical page bytes, newest publication (ns) (u64 each)
    <root>/procs/<token>.lock   held (flock, exclusive) by that process while it lives

The namespace counts (what `galahad stats` prints without walking a record) change in the same
locked section, and under the same journal, as committed bytes: publish, apply (deletions,
quarantine moves and trims), rebuild. Quarantined files count under the pseudo-namespace
QUARANTINE_DIRNAME, so when the counts are complete their bytes sum to committed bytes exactly.
Logical bytes are an estimate: a publication's are read from the records' headers just
after its locked section (never a read under the lock) and added in that process's next one
(a process killed in between leaves them out); a deletion takes away the namespace's mean
logical/disk share of what it freed (no read of a victim's header); a recount reads the
headers of a bounded sample per namespace (accounting.LOGICAL_SAMPLE_RECORDS). A ledger
without counts (written before they existed) is read as ever, with the counts incomplete until
the next rebuild fills them; a count that would go negative, or a change that cannot be
attributed to a namespace, also marks them incomplete (never a wrong figure shown as exact).

Committed bytes are the records and quarantined files on disk; each process's entry is what it
has reserved for writes in flight. A put reserves first (failing if the total would pass the
cap), then commits what it published or releases what it did not. Every update happens under
flock(2) on the ledger (and a thread lock: flock does not exclude threads sharing a descriptor).

Nothing here trusts the file to stay intact: a process whose entry is missing writes it back;
a ledger that was deleted, replaced or truncated is recreated and flagged `needs_rebuild`, so
the store recounts committed bytes from disk (`rebuild`); entries of processes that died
(their lock file is free, whatever pid namespace they ran in) are dropped by the next rebuild,
so their reservations are reclaimed while other processes keep running. A failure can only
leave the ledger over-counting, the safe direction. An entry whose token is not a token (a
flipped bit) makes the ledger damaged: recounted, and live processes write their entries back.
Every file here is opened with layout.open_regular: a FIFO or a link is never a hang or a read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Callable

from .layout import (
    NotRegularFileError,
    create_temp,
    identity_alive,
    is_record_name,
    is_token,
    open_dir,
    open_regular,
)
from .lifetime import STATS_DIR, recorded_identity

MAGIC = b"GLEDGER2"
MAGIC_JOURNAL = b"GLEDGER3"  # a ledger holding a publication journal (see Journal)
JOURNAL_MAX_BYTES = 8 * 1024  # a batch is at most 32 records (writer.py)
_DIRNAME = re.compile(r"^[0-9a-f]{32}$")
_HEAD = struct.Struct("<8sQII")
_ENTRY = struct.Struct("<16sQ")
TOKEN_BYTES = 16
MAX_ENTRIES = 4096
PROCS_DIR = "procs"
QUARANTINE_DIR = "quarantine"
LOCK_SUFFIX = ".lock"
NEW_LOCK_SUFFIX = ".lock.new"  # a lock being made: locked first, then renamed into place
ABANDONED_LOCK_AGE_S = 60.0
NS_MAGIC = b"GNS1"
_NS_HEAD = struct.Struct("<4sII")
_NS_ENTRY = struct.Struct("<16sQQQQ")
NS_COMPLETE = 1
MAX_NAMESPACES = 4096
QUARANTINE_DIRNAME = "0" * 32  # the pseudo-namespace of quarantined files (Journal.QUARANTINE)
_READ_BYTES = (
    _HEAD.size
    + MAX_ENTRIES * _ENTRY.size
    + JOURNAL_MAX_BYTES
    + _NS_HEAD.size
    + MAX_NAMESPACES * _NS_ENTRY.size
    + 1
)


def _new_token() -> str:
    """8 hex digits of the pid (for people reading the directory), then 8 random ones. The
    pid says nothing about liveness: that is the lock (token_alive)."""
    return f"{os.getpid() & 0xFFFFFFFF:08x}{os.urandom(4).hex()}"


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
    except NotRegularFileError:
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
        self.token = _new_token()
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


class NamespaceCount:
    """What the ledger keeps of one namespace directory."""

    __slots__ = ("records", "disk_bytes", "logical_bytes", "newest_ns")

    def __init__(self, records=0, disk_bytes=0, logical_bytes=0, newest_ns=0):
        self.records = records
        self.disk_bytes = disk_bytes
        self.logical_bytes = logical_bytes
        self.newest_ns = newest_ns

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.records, self.disk_bytes, self.logical_bytes, self.newest_ns)

    def __eq__(self, other) -> bool:
        return isinstance(other, NamespaceCount) and self.as_tuple() == other.as_tuple()

    def __repr__(self) -> str:
        return f"NamespaceCount{self.as_tuple()}"


class _State:
    def __init__(self, committed: int = 0, entries: dict[str, int] | None = None):
        self.committed = committed
        self.entries = entries if entries is not None else {}
        self.journal: Journal | None = None
        self.counts_complete = False
        # The namespace table as on disk (_NS_ENTRY each), changed in place: an update
        # touches one entry, never decodes the others (hundreds of namespaces cost a find).
        self._table = bytearray()

    @property
    def total(self) -> int:
        return self.committed + sum(self.entries.values())

    @property
    def counts(self) -> dict[str, NamespaceCount]:
        """Every namespace's counts, decoded (readers: stats, verify's progress)."""
        return {
            name.hex(): NamespaceCount(*values)
            for name, *values in _NS_ENTRY.iter_unpack(self._table)
        }

    def set_counts(self, counts: dict[str, NamespaceCount] | None) -> None:
        """Replaces the namespace counts (None: unknown until the next recount)."""
        self._table = bytearray()
        self.counts_complete = counts is not None
        for dirname, count in (counts or {}).items():
            if len(self._table) >= MAX_NAMESPACES * _NS_ENTRY.size:
                self.invalidate_counts()
                return
            self._table += _NS_ENTRY.pack(bytes.fromhex(dirname), *count.as_tuple())

    def invalidate_counts(self) -> None:
        self.set_counts(None)

    def _offset(self, dirname: str) -> int:
        """Where the entry of a namespace directory is in the table, or -1 (-2: a name that
        is no namespace directory's, which the table cannot hold)."""
        if not _DIRNAME.match(dirname):
            return -2
        table, start, name = self._table, 0, bytes.fromhex(dirname)
        while (offset := table.find(name, start)) >= 0:
            if offset % _NS_ENTRY.size == 0:
                return offset
            start = offset + 1
        return -1

    def _store(self, dirname: str, count: NamespaceCount, offset: int) -> None:
        if offset == -2:  # records in a directory that is no namespace's: cannot be kept
            self.invalidate_counts()
            return
        name = bytes.fromhex(dirname)
        if not count.records:
            if offset >= 0:
                del self._table[offset : offset + _NS_ENTRY.size]
        elif offset >= 0:
            _NS_ENTRY.pack_into(self._table, offset, name, *count.as_tuple())
        elif len(self._table) >= MAX_NAMESPACES * _NS_ENTRY.size:
            self.invalidate_counts()
        else:
            self._table += _NS_ENTRY.pack(name, *count.as_tuple())

    def count_added(self, dirname, records, disk_bytes, logical_bytes, newest_ns=0) -> None:
        if not self.counts_complete:
            return
        offset = self._offset(dirname)
        if offset >= 0:
            count = NamespaceCount(*_NS_ENTRY.unpack_from(self._table, offset)[1:])
        else:
            count = NamespaceCount()
        count.records += records
        count.disk_bytes += disk_bytes
        count.logical_bytes += logical_bytes
        count.newest_ns = max(count.newest_ns, newest_ns)
        self._store(dirname, count, offset)

    def logical_added(self, dirname: str, logical_bytes: int) -> None:
        """Logical bytes read after a publication (nothing when the namespace is gone)."""
        offset = self._offset(dirname) if self.counts_complete else -1
        if offset >= 0:
            count = NamespaceCount(*_NS_ENTRY.unpack_from(self._table, offset)[1:])
            count.logical_bytes += logical_bytes
            self._store(dirname, count, offset)

    def count_removed(self, dirname, records, disk_bytes) -> int:
        """Takes `records` files of `disk_bytes` out of a namespace's counts, with the
        namespace's mean share of logical bytes; returns those logical bytes. A count that
        would go negative: the counts are wrong, and become unknown."""
        if not self.counts_complete or not records:
            return 0
        offset = self._offset(dirname)
        if offset < 0:  # not counted (or no namespace's): the counts were not the disk's
            self.invalidate_counts()
            return 0
        count = NamespaceCount(*_NS_ENTRY.unpack_from(self._table, offset)[1:])
        if count.records < records or count.disk_bytes < disk_bytes:
            self.invalidate_counts()
            return 0
        logical = 0
        if count.records == records:
            logical = count.logical_bytes
        elif count.disk_bytes:
            logical = min(count.logical_bytes, count.logical_bytes * disk_bytes // count.disk_bytes)
        count.records -= records
        count.disk_bytes -= disk_bytes
        count.logical_bytes -= logical
        self._store(dirname, count, offset)
        return logical

    def counted_bytes(self) -> int | None:
        """Bytes of every namespace and of the quarantine (None when the counts are not
        complete): equal to committed bytes in a true ledger."""
        if not self.counts_complete:
            return None
        return sum(values[2] for values in _NS_ENTRY.iter_unpack(self._table))

    @classmethod
    def parse(cls, raw: bytes):
        """The state in `raw`, or None when it is not an intact ledger."""
        if len(raw) < _HEAD.size:
            return None
        magic, committed, count, journal_len = _HEAD.unpack_from(raw, 0)
        if magic not in (MAGIC, MAGIC_JOURNAL) or count > MAX_ENTRIES:
            return None
        if (magic == MAGIC) != (journal_len == 0) or journal_len > JOURNAL_MAX_BYTES:
            return None
        end = _HEAD.size + count * _ENTRY.size + journal_len
        counts_raw, complete = b"", False
        if len(raw) != end:  # the namespace counts follow (a ledger written since they exist)
            if len(raw) < end + _NS_HEAD.size:
                return None
            ns_magic, ns_count, flags = _NS_HEAD.unpack_from(raw, end)
            counts_start = end + _NS_HEAD.size
            if ns_magic != NS_MAGIC or ns_count > MAX_NAMESPACES or flags & ~NS_COMPLETE:
                return None
            if len(raw) != counts_start + ns_count * _NS_ENTRY.size:
                return None
            counts_raw, complete = raw[counts_start:], bool(flags & NS_COMPLETE)
        entries = {}
        for index in range(count):
            token, reserved = _ENTRY.unpack_from(raw, _HEAD.size + index * _ENTRY.size)
            name = token.decode("ascii", "replace")
            if not is_token(name):
                return None  # a flipped bit, a forged entry: damaged, recounted
            entries[name] = reserved
        state = cls(committed, entries)
        state._table = bytearray(counts_raw if complete else b"")
        state.counts_complete = complete
        if journal_len:
            state.journal = Journal.parse(raw[_HEAD.size + count * _ENTRY.size : end])
            if state.journal is None:
                return None
        return state

    def _pack_counts(self) -> bytes:
        if not self.counts_complete:
            return _NS_HEAD.pack(NS_MAGIC, 0, 0)
        table = self._table
        return _NS_HEAD.pack(NS_MAGIC, len(table) // _NS_ENTRY.size, NS_COMPLETE) + table

    def pack(self) -> bytes:
        entries = list(self.entries.items())[:MAX_ENTRIES]
        journal = self.journal.pack() if self.journal is not None else b""
        magic = MAGIC_JOURNAL if journal else MAGIC
        return (
            _HEAD.pack(magic, self.committed, len(entries), len(journal))
            + b"".join(
                _ENTRY.pack(token.encode("ascii")[:TOKEN_BYTES], reserved)
                for token, reserved in entries
            )
            + journal
            + self._pack_counts()
        )


class Journal:
    """What a process is changing on disk right now, inside one locked section: the kind
    (PUBLISH: records being linked into place; DELETE: a record being unlinked; TRIM: a
    quarantined file being unlinked; MOVE: a record being moved into quarantine, which
    changes no committed bytes, only the namespace counts), the namespace directory, then (inode, accounted bytes,
    file name) of each file. Written before the first irreversible step and cleared with the
    update that counts it, both under the lock; one found by another process means its writer
    died between the two (the lock is free), and the disk says what happened: a record linked
    (same name, same inode) is counted, a file gone is released."""

    PUBLISH, DELETE, TRIM, MOVE = b"P", b"D", b"Q", b"M"
    QUARANTINE = QUARANTINE_DIRNAME  # the directory field of a TRIM (the quarantine directory)
    _ITEM = struct.Struct("<QQB")

    def __init__(self, token: str, dirname: str, items: list, kind: bytes = PUBLISH):
        self.token, self.dirname, self.items, self.kind = token, dirname, items, kind

    def pack(self) -> bytes:
        out = [
            self.token.encode("ascii"),
            self.kind,
            self.dirname.encode("ascii"),
            struct.pack("<H", len(self.items)),
        ]
        for filename, inode, size, *_ in self.items:
            name = filename.encode("ascii")
            out.append(self._ITEM.pack(inode, size, len(name)) + name)
        return b"".join(out)

    @classmethod
    def parse(cls, raw: bytes):
        try:
            token, kind = raw[:16].decode("ascii"), raw[16:17]
            dirname = raw[17:49].decode("ascii")
            (count,) = struct.unpack_from("<H", raw, 49)
            offset, items = 51, []
            for _ in range(count):
                inode, size, length = cls._ITEM.unpack_from(raw, offset)
                offset += cls._ITEM.size
                name = raw[offset : offset + length].decode("ascii")
                offset += length
                if not is_record_name(name) or os.sep in name or len(name) != length:
                    return None
                items.append((name, inode, size))
        except (UnicodeDecodeError, struct.error):
            return None
        if kind not in (cls.PUBLISH, cls.DELETE, cls.TRIM, cls.MOVE):
            return None
        if offset != len(raw) or not is_token(token) or not _DIRNAME.match(dirname):
            return None
        return cls(token, dirname, items, kind)


class LedgerWriteError(OSError):
    """The ledger could not be written after records were linked: `kept` bytes of them are
    on disk but not yet counted (the caller carries them into its next update)."""

    def __init__(self, error: OSError, kept: int):
        super().__init__(error.errno, str(error))
        self.kept = kept


class Ledger:
    """Total bytes of a root's records plus every process's reservations."""

    def __init__(self, path: str, process: ProcessLock | None = None, read_only: bool = False):
        self._path = path
        self._process = process
        self._read_only = read_only or process is None
        self._mine = 0  # what this process has reserved (also written into its entry)
        self._thread_lock = threading.Lock()
        self.needs_rebuild = False
        # Counts committed bytes from disk; the store sets it. Called under the lock when the
        # ledger is found missing, replaced or damaged, so no update is ever lost on top of it.
        self.recount: Callable[[], int] | None = None
        # The inode at a record's name (None when there is none): how a dead writer's journal
        # is checked against the disk (the store sets it; by path otherwise).
        self.inode_of: Callable[[str, str], int | None] = self._inode_by_path
        # The logical (page) bytes a published record's header declares (0 when unknown);
        # the store sets it.
        self.logical_of: Callable[[str, str], int] = lambda dirname, filename: 0
        self.recovered_bytes = 0
        # Logical bytes of records this process published, read from their headers after
        # the locked section (never a read under the lock), folded into the next one.
        self._pending_logical: dict[str, int] = {}
        self._pending_lock = threading.Lock()
        self._fd = self._open()

    def _logical_of(self, dirname: str, filename: str) -> int:
        try:
            return max(0, int(self.logical_of(dirname, filename)))
        except (OSError, ValueError, TypeError):
            return 0

    def _inode_by_path(self, dirname: str | None, filename: str) -> int | None:
        root = os.path.dirname(self._path)
        if dirname is None:  # a quarantined file
            path = os.path.join(root, QUARANTINE_DIR, filename)
        else:
            path = os.path.join(root, "ns", dirname, filename)
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        return info.st_ino if stat.S_ISREG(info.st_mode) else None

    def _recover(self, state: _State) -> None:
        """A journal under the lock: its writer died inside a locked section. What the disk
        shows is counted: records of a publication that are there (the rest was never
        published; its reservation goes with the dead writer's entry), files of a deletion
        that are gone."""
        journal, state.journal = state.journal, None
        if journal.token == getattr(self._process, "token", None):
            return  # ours, left by an update that failed: that update settled it
        dirname = None if journal.kind == Journal.TRIM else journal.dirname
        for filename, inode, size, *_ in journal.items:
            there = self.inode_of(dirname, filename) == inode
            if journal.kind == Journal.PUBLISH and there:
                state.committed += size
                self.recovered_bytes += size
                state.count_added(
                    journal.dirname, 1, size, self._logical_of(journal.dirname, filename)
                )
            elif journal.kind == Journal.MOVE and not there:  # moved: counted in quarantine
                state.count_removed(journal.dirname, 1, size)
                state.count_added(QUARANTINE_DIRNAME, 1, size, 0)
            elif journal.kind in (Journal.DELETE, Journal.TRIM) and not there:
                state.committed = max(0, state.committed - size)
                self.recovered_bytes += size
                state.count_removed(journal.dirname, 1, size)

    def _open(self) -> int | None:
        """The ledger, opened as every file of the store is (open_regular): a FIFO, a device
        or a symbolic link at its name is never read (read-only: as if there were no ledger;
        writable: replaced by a new ledger, recounted from disk)."""
        if self._read_only:
            try:
                return open_regular(self._path)
            except OSError:
                return None  # a store nobody has written yet, or no ledger at all there
        try:
            return open_regular(self._path, os.O_RDWR | os.O_CREAT)
        except NotRegularFileError:
            self._replace()
            self.needs_rebuild = True
            return open_regular(self._path, os.O_RDWR | os.O_CREAT)

    def _replace(self) -> None:
        """Puts an empty ledger where something else is (renamed over it: atomic, and never
        through a link). A directory there cannot be replaced: OSError."""
        directory, name = os.path.split(self._path)
        dir_fd = open_dir(directory)
        try:
            fd, temp = create_temp(f"{name}.{self._process.token}.", ".new", dir_fd=dir_fd)
            os.close(fd)
            try:
                os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)
                raise
        finally:
            os.close(dir_fd)

    def _reopen_if_replaced(self) -> None:
        """A ledger deleted or replaced under us: switch to the file at the path."""
        try:
            if os.fstat(self._fd).st_ino == os.lstat(self._path).st_ino:
                return
        except OSError:
            pass
        fd = self._open()
        os.close(self._fd)
        self._fd = fd
        self.needs_rebuild = True

    @staticmethod
    def _set_from_disk(state: _State, counted) -> None:
        if isinstance(counted, tuple):
            state.committed, counts = counted
            state.set_counts(counts)
        else:
            state.committed = counted
            state.invalidate_counts()

    def _read_state(self) -> _State:
        raw = os.pread(self._fd, _READ_BYTES, 0)
        state = _State.parse(raw)
        if state is None:  # new, truncated or damaged: recount from disk
            state = _State()
            if self.recount is not None:
                self._set_from_disk(state, self.recount())
            else:
                self.needs_rebuild = True
        return state

    def _locked(self, update: Callable[[_State], object]):
        if self._read_only:
            if self._fd is None:
                return update(_State())
            raw = os.pread(self._fd, _READ_BYTES, 0)
            return update(_State.parse(raw) or _State())
        with self._thread_lock:
            self._reopen_if_replaced()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            mine_before = self._mine
            with self._pending_lock:
                pending, self._pending_logical = self._pending_logical, {}
            try:
                state = self._read_state()
                before = state.pack()
                if state.journal is not None:
                    self._recover(state)
                for dirname, logical in pending.items():
                    state.logical_added(dirname, logical)
                token = self._process.token
                if self._mine or token in state.entries:
                    state.entries[token] = self._mine  # written back if someone dropped it
                result = update(state)
                if self._mine:
                    state.entries[token] = self._mine
                else:
                    state.entries.pop(token, None)
                after = state.pack()
                if after != before or getattr(state, "rewrite", False):
                    os.pwrite(self._fd, after, 0)
                    os.ftruncate(self._fd, len(after))
                return result
            except BaseException:
                self._mine = mine_before  # the update did not happen: nothing of it is kept
                self._add_pending(pending)
                raise
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    # ------------------------------------------------------------- operations

    def read(self) -> int:
        """Committed bytes plus every live reservation."""
        return self._locked(lambda state: state.total)

    def committed(self) -> int:
        """Bytes of records and quarantined files, without reservations in flight."""
        return self._locked(lambda state: state.committed)

    def namespace_counts(self) -> dict[str, NamespaceCount] | None:
        """Records, bytes on disk, logical bytes and newest publication of each namespace
        directory (QUARANTINE_DIRNAME: the quarantined files), as kept by every update: no
        record is read. None when the counts are not complete (a ledger written before they
        existed, or found wrong): the next rebuild fills them."""

        def read(state: _State):
            return state.counts if state.counts_complete else None

        return self._locked(read)

    def evictable(self) -> int:
        """The bytes eviction may count on: committed bytes, or 0 when the namespace counts
        are complete and disagree with them. Both change in the same locked sections, so
        they differ only in a ledger someone rewrote (or a bug): committed bytes set to a
        plausible but false figure (below what the filesystem holds) would make every put
        evict real records to pay for bytes that exist only in the ledger. Then eviction
        does not start, the put is refused, and the rate-limited recount sets it right."""

        def read(state: _State) -> int:
            counted = state.counted_bytes()
            return state.committed if counted in (None, state.committed) else 0

        return self._locked(read)

    def reservations(self) -> dict[str, int]:
        """Bytes reserved by each open process (by token)."""
        return self._locked(lambda state: dict(state.entries))

    def reserve(self, amount: int, limit: int | None) -> bool:
        def update(state: _State) -> bool:
            if limit is not None and state.total + amount > limit:
                return False
            self._mine += amount
            return True

        return self._locked(update)

    def settle(self, committed_bytes: int, released_bytes: int) -> None:
        """Ends reservations in one update: `committed_bytes` of them became records on disk,
        `released_bytes` were not published."""

        def update(state: _State) -> None:
            self._mine = max(0, self._mine - committed_bytes - released_bytes)
            state.committed += committed_bytes
            if committed_bytes:  # published earlier, counted now: no namespace to add it to
                state.invalidate_counts()

        self._locked(update)

    def publish(self, dirname: str, items: list[tuple[str, int, int]], link_all) -> int:
        """Links a batch into place and counts it in one locked section, so that a recount
        (which holds the lock) sees every record either linked and counted or neither.
        `items` are (file name, inode, bytes) of the records to link; `link_all()` links them
        and returns the bytes of those it published, which move from this process's
        reservation to committed bytes. A journal of `items` is on disk while the links are
        made: if this process dies among them, the next process to take the lock counts
        what was linked. Raises LedgerWriteError (with the bytes kept) when the ledger cannot
        be written after the links."""
        if self._read_only:
            return link_all()
        journal = Journal(self._process.token, dirname, items, Journal.PUBLISH)
        if len(journal.pack()) > JOURNAL_MAX_BYTES:
            journal = None
        kept = 0
        unread: list = []  # published records whose logical bytes are read after the lock

        def update(state: _State) -> int:
            nonlocal kept
            if journal is not None:
                state.journal = journal
                self._mine_entry(state)
                os.pwrite(self._fd, state.pack(), 0)  # the journal first (same length or more)
                state.rewrite = True  # cleared on disk by the locked section's write
            kept = link_all()
            state.journal = None
            self._mine = max(0, self._mine - kept)
            state.committed += kept
            if kept:
                unread.extend(self._count_published(state, dirname, items, kept))
            return kept

        try:
            result = self._locked(update)
        except OSError as error:
            if kept:
                raise LedgerWriteError(error, kept) from error
            raise
        if unread:
            self._add_pending({dirname: sum(self._logical_of(dirname, name) for name in unread)})
        return result

    def _count_published(self, state: _State, dirname: str, items: list, kept: int) -> list:
        """The namespace counts of a publication: every item when the bytes kept are all of
        them (no system call), else those whose inode is at their name. Items may carry
        their logical bytes (a 4th element); the names of those that do not are returned,
        to be read after the lock."""
        if not state.counts_complete:
            return []
        if kept != sum(item[2] for item in items):
            items = [item for item in items if self.inode_of(dirname, item[0]) == item[1]]
            if sum(item[2] for item in items) != kept:
                state.invalidate_counts()  # bytes kept that no item explains
                return []
        logical = sum(item[3] for item in items if len(item) > 3)
        state.count_added(dirname, len(items), kept, logical, time.time_ns())
        return [item[0] for item in items if len(item) <= 3]

    def _add_pending(self, logical_by_dirname: dict[str, int]) -> None:
        with self._pending_lock:
            for dirname, logical in logical_by_dirname.items():
                self._pending_logical[dirname] = self._pending_logical.get(dirname, 0) + logical

    def _mine_entry(self, state: _State) -> None:
        if self._mine:
            state.entries[self._process.token] = self._mine

    def apply(self, action) -> int | None:
        """Runs `action(journal)` (a deletion or a move of a record or quarantined file)
        under the ledger's lock and releases the bytes it returns (None: nothing was freed).
        Under the lock, no recount can see the file gone but the bytes still counted, or the
        reverse. An action that deletes calls `journal(kind, dirname, items)` first (items:
        (file name, inode, bytes)), so that if this process dies between the unlink and the
        ledger's write, the next process releases what is gone."""
        if self._read_only:
            return None

        def update(state: _State):
            written = []

            def journal(kind: bytes, dirname: str, items: list) -> None:
                state.journal = Journal(self._process.token, dirname, items, kind)
                written.append(state.journal)
                self._mine_entry(state)
                os.pwrite(self._fd, state.pack(), 0)
                state.rewrite = True

            freed = action(journal)
            state.journal = None
            if freed:
                state.committed = max(0, state.committed - freed)
            if written and freed is not None:
                done = written[-1]
                size = sum(item[2] for item in done.items)
                if done.kind == Journal.MOVE:
                    state.count_removed(done.dirname, len(done.items), size)
                    state.count_added(QUARANTINE_DIRNAME, len(done.items), size, 0)
                else:  # unlinked (a DELETE or TRIM that returned what it freed)
                    state.count_removed(done.dirname, len(done.items), size)
            elif freed:  # a deletion no journal names (a quarantined file that is no record)
                state.count_removed(QUARANTINE_DIRNAME, 1, freed)
            return freed

        return self._locked(update)

    def release(self, amount: int) -> None:
        """Committed bytes left the disk (eviction, deletion, quarantine trim)."""

        def update(state: _State) -> None:
            state.committed = max(0, state.committed - amount)
            state.invalidate_counts()  # bytes of no namespace

        self._locked(update)

    def reclaim_dead(self) -> int:
        """Drops the entries of processes that died (no scan: a liveness test per entry);
        returns the reserved bytes that came back."""
        process = self._process

        def update(state: _State) -> int:
            freed = 0
            for token in list(state.entries):
                if not process.is_alive(token):
                    freed += state.entries.pop(token)
                    process.forget(token)
            return freed

        return self._locked(update)

    def rebuild(self, committed_on_disk: Callable[[], int | tuple]) -> int:
        """Sets committed bytes to what is on disk and drops the entries of dead processes
        (their reservations come back). `committed_on_disk` scans the store while the ledger
        is locked, so no other process commits meanwhile; it returns the bytes, or (bytes,
        namespace counts or None) to set the counts too. Returns the new total."""
        process = self._process

        def update(state: _State) -> int:
            for token in list(state.entries):
                if not process.is_alive(token):
                    del state.entries[token]
                    process.forget(token)
            for token in process.tokens():  # dead processes that held no reservation
                if token not in state.entries and not process.is_alive(token):
                    process.forget(token)
            self._set_from_disk(state, committed_on_disk())
            self.needs_rebuild = False
            return state.total

        process.ensure()
        process.remove_abandoned()
        return self._locked(update)

    def close(self) -> None:
        if self._fd is not None:
            if not self._read_only and (self._mine or self._pending_logical):
                self._mine = 0
                with contextlib.suppress(OSError):
                    self._locked(lambda state: None)
            os.close(self._fd)
            self._fd = None
