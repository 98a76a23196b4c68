"""The eviction order every process on a root shares: FIFO queues kept on disk (issue 30).

    <root>/evict/state        where each queue's hand and tail are, and its bytes
    <root>/evict/names        the namespace directories the entries name (33 bytes each)
    <root>/evict/s.<segment>  the small queue S: records not used since they were written
    <root>/evict/m.<segment>  the main queue M: records used at least once
    <root>/evict/ghost        fingerprints of keys S evicted lately (a lossy fixed table)

S3-FIFO (SOSP 2023) over append-only logs: a published record is appended to S (to M when
its key is in the ghost: it was evicted from S lately and asked for again). Eviction takes
from S while S holds at least S_SHARE of the queued bytes, else from M. At S's hand, a record
used since it was enqueued (its file's modification time, which every reader sets, is newer
than the entry's time) moves to M's tail, else it is evicted and its key goes to the ghost; at
M's hand, a record used since goes to M's tail again, else it is evicted. The runs a process
read are appended to M's tail at its next eviction pass, each run's head last
(eviction_order.py), so M is ordered by last use, leaves first. So one-shot prompts
leave through S without flushing what was used twice, and the order is exact and the same
for every process and every rank: no sample, no index in memory, O(1) work per entry.

A batch is appended tail first (its pages in reverse order), so a chain's deeper pages reach
the hand before its head. The decision for a key is taken once for its siblings
(`SiblingGroups`: the namespaces that differ only in rank, and the state pools tied to them),
so every rank keeps the same pages.

Every method runs with the ledger's lock held (inside Ledger.publish or Ledger.apply), which
is what orders the appends and the hands of every process. The log is a hint: a record not in
it (written before it existed, or its log lost) is still found by the sampler (eviction.py),
an entry whose file is gone or was replaced is skipped, and a damaged state or entry starts
the queues over from what the segments hold (entries carry a CRC). Losing it never loses data.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import stat
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from .layout import RECORD_SUFFIX
from .safe_files import OPEN_FLAGS

EVICT_DIR = "evict"
STATE_FILE = "state"
NAMES_FILE = "names"
GHOST_FILE = "ghost"
QUEUE_PREFIXES = ("s.", "m.")  # S, M
SMALL, MAIN = 0, 1
S_SHARE = 0.1  # S3-FIFO's small queue: evict from it while it holds this share of the bytes
SEGMENT_BYTES = 4 << 20  # a segment is closed past this size; segments behind a hand deleted
GHOST_SLOTS = 1 << 16  # 512 KiB of 8-byte fingerprints
READ_ENTRIES = 256  # entries read at a hand per pread
NAME_BYTES = 33  # 32 hex digits and a newline
MAX_NAMES = 65535

_ENTRY = struct.Struct("<IHBBQ32sq")  # crc32, name index, name kind, 0, size, digest, time_ns
_STATE = struct.Struct("<8s8q")  # magic; per queue: head segment, head offset, tail, bytes
_CRC = struct.Struct("<I")
STATE_MAGIC = b"GEVICT01"
_HEX = frozenset("0123456789abcdef")


def _name_digest(filename: str) -> tuple[int, bytes] | None:
    """(kind, 32-byte digest) of a record file name (layout.record_filename's two forms)."""
    if not filename.endswith(RECORD_SUFFIX):
        return None
    stem = filename[: -len(RECORD_SUFFIX)]
    kind = 0
    if len(stem) == 65 and stem[0] == "k":
        kind, stem = 1, stem[1:]
    if len(stem) != 64 or not set(stem) <= _HEX:
        return None
    return kind, bytes.fromhex(stem)


def _is_dirname(name: str) -> bool:
    return len(name) == 32 and set(name) <= _HEX


def _filename(kind: int, digest: bytes) -> str:
    return ("k" if kind else "") + digest.hex() + RECORD_SUFFIX


def fingerprint(filename: str) -> int:
    """A key's 8-byte fingerprint (the same in every namespace: page keys are shared)."""
    found = _name_digest(filename)
    raw = found[1][:8] if found else zlib.crc32(filename.encode()).to_bytes(8, "little")
    return int.from_bytes(raw, "little") or 1


@dataclass
class Entry:
    queue: int
    name_index: int
    filename: str
    size: int
    time_ns: int


ENTRY_BYTES = _ENTRY.size
STATE_BYTES = _STATE.size + _CRC.size


def parse_state(raw: bytes) -> list[int] | None:
    """The state file's fields (per queue: head segment, head offset, tail segment, bytes),
    or None when it is missing, damaged or implausible."""
    if len(raw) != STATE_BYTES:
        return None
    body, (crc,) = raw[: _STATE.size], _CRC.unpack(raw[_STATE.size :])
    magic, *fields = _STATE.unpack(body)
    if magic != STATE_MAGIC or crc != zlib.crc32(body):
        return None
    plausible = all(value >= 0 for value in fields) and all(
        fields[4 * q] <= fields[4 * q + 2] for q in (SMALL, MAIN)
    )
    return fields if plausible else None


def parse_entry(chunk: bytes, queue: int) -> Entry | None:
    """One entry of a queue's segment (ENTRY_BYTES), None when its CRC says it is damaged."""
    crc, name_index, kind, _, size, digest, time_ns = _ENTRY.unpack(chunk)
    if crc != zlib.crc32(chunk[4:]):
        return None
    return Entry(queue, name_index, _filename(kind, digest), size, time_ns)


def segment_name(queue: int, number: int) -> str:
    return f"{QUEUE_PREFIXES[queue]}{number:016d}"


def open_own(name: str, dir_fd: int, flags: int = os.O_RDWR) -> int:
    """A regular file of the store's own in `dir_fd`, created if missing. A name that is a
    link of any kind (a planted hard link to a file elsewhere included) or no regular file is
    removed and created again, exclusively: nothing outside the root is ever written."""
    for _ in range(4):
        try:
            return os.open(name, flags | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, flags | OPEN_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        except OSError:  # a symbolic link (ELOOP) or worse: removed, made again
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            continue
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            return fd
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
    raise OSError(f"cannot create {name} of the eviction log")


class SharedFifo:
    """The queues of one root, as this process reaches them (descriptors cached)."""

    def __init__(self, root_fd: int):
        with contextlib.suppress(FileExistsError):
            os.mkdir(EVICT_DIR, 0o700, dir_fd=root_fd)
        self.dir_fd = os.open(
            EVICT_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd
        )
        self._state_fd = open_own(STATE_FILE, self.dir_fd)
        self._names_fd = open_own(NAMES_FILE, self.dir_fd, os.O_RDWR | os.O_APPEND)
        ghost_fd = open_own(GHOST_FILE, self.dir_fd)
        try:
            if os.fstat(ghost_fd).st_size != GHOST_SLOTS * 8:
                os.ftruncate(ghost_fd, GHOST_SLOTS * 8)
            self._ghost = mmap.mmap(ghost_fd, GHOST_SLOTS * 8)
        finally:
            os.close(ghost_fd)
        self._segments: dict[tuple[int, int], int] = {}
        self._names: list[str | None] = []
        self._name_index: dict[str, int] = {}
        self.state = [0] * 8

    # ------------------------------------------------------------------ state

    def load(self) -> None:
        """Reads the hands (under the ledger's lock); a damaged or missing state starts the
        queues over from the segments on disk (a listing of evict/, never of records)."""
        fields = parse_state(os.pread(self._state_fd, STATE_BYTES, 0))
        self.state = fields if fields is not None else self._from_segments()

    def _from_segments(self) -> list[int]:
        state = [0] * 8
        numbers: dict[int, list[int]] = {SMALL: [], MAIN: []}
        for name in os.listdir(self.dir_fd):
            for queue, prefix in enumerate(QUEUE_PREFIXES):
                if name.startswith(prefix) and name[len(prefix) :].isdigit():
                    numbers[queue].append(int(name[len(prefix) :]))
        for queue, found in numbers.items():
            if found:
                state[4 * queue] = min(found)
                state[4 * queue + 2] = max(found)
        return state

    def save(self) -> None:
        body = _STATE.pack(STATE_MAGIC, *self.state)
        os.pwrite(self._state_fd, body + _CRC.pack(zlib.crc32(body)), 0)

    def queued_bytes(self, queue: int | None = None) -> int:
        if queue is None:
            return self.state[3] + self.state[7]
        return self.state[4 * queue + 3]

    def _add_bytes(self, queue: int, amount: int) -> None:
        self.state[4 * queue + 3] = max(0, self.state[4 * queue + 3] + amount)

    # ------------------------------------------------------------------ names

    def _reload_names(self) -> None:
        size = os.fstat(self._names_fd).st_size
        raw = os.pread(self._names_fd, size - size % NAME_BYTES, 0)
        names = [raw[i : i + 32].decode("ascii", "replace") for i in range(0, len(raw), 33)]
        # Only a namespace directory's name (32 hex digits) is ever used: a forged entry
        # ("../..", a path) names nothing, so no file outside ns/ is ever judged or removed.
        self._names = [name if _is_dirname(name) else None for name in names]
        self._name_index = {name: index for index, name in enumerate(self._names) if name}

    def name_index(self, dirname: str) -> int | None:
        if not _is_dirname(dirname):
            return None
        index = self._name_index.get(dirname)
        if index is None:
            self._reload_names()
            index = self._name_index.get(dirname)
        if index is None and len(self._names) < MAX_NAMES:
            size = os.fstat(self._names_fd).st_size
            if size % NAME_BYTES:  # a torn append: cut back to whole names
                os.ftruncate(self._names_fd, size - size % NAME_BYTES)
            os.write(self._names_fd, dirname.encode("ascii") + b"\n")
            self._reload_names()
            index = self._name_index.get(dirname)
        return index

    def dirname_of(self, index: int) -> str | None:
        if index >= len(self._names):
            self._reload_names()
        return self._names[index] if index < len(self._names) else None

    def dirnames(self) -> list[str]:
        self._reload_names()
        return [name for name in self._names if name]

    # ------------------------------------------------------------------ segments

    def _segment(self, queue: int, number: int, create: bool) -> int | None:
        fd = self._segments.get((queue, number))
        if fd is not None:
            return fd
        name = segment_name(queue, number)
        try:
            if create:
                fd = open_own(name, self.dir_fd, os.O_RDWR | os.O_APPEND)
            else:
                fd = os.open(name, os.O_RDONLY | OPEN_FLAGS, dir_fd=self.dir_fd)
        except OSError:
            return None
        self._segments[(queue, number)] = fd
        return fd

    def _next_segment(self, queue: int, after: int) -> int:
        """The first segment of a queue on disk past `after`, or its tail: one read of evict/
        (a few segments), never a step per number of a range the state may claim."""
        tail = self.state[4 * queue + 2]
        prefix = QUEUE_PREFIXES[queue]
        numbers = []
        with contextlib.suppress(OSError):
            for name in os.listdir(self.dir_fd):
                digits = name[len(prefix) :]
                if name.startswith(prefix) and len(digits) == 16 and digits.isdigit():
                    numbers.append(int(digits))
        return min([number for number in numbers if after < number < tail] + [tail])

    def _drop_segment(self, queue: int, number: int) -> None:
        fd = self._segments.pop((queue, number), None)
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(segment_name(queue, number), dir_fd=self.dir_fd)

    def append(self, queue: int, entries: list[tuple[int, str, int, int]]) -> None:
        """Appends (name index, file name, size, time_ns) entries to a queue's tail, in
        order, with one write."""
        packed = []
        added = 0
        for name_index, filename, size, time_ns in entries:
            found = _name_digest(filename)
            if found is None:
                continue
            body = _ENTRY.pack(0, name_index, found[0], 0, size, found[1], time_ns)[4:]
            packed.append(_CRC.pack(zlib.crc32(body)) + body)
            added += size
        if not packed:
            return
        tail = self.state[4 * queue + 2]
        fd = self._segment(queue, tail, create=True)
        if fd is None:
            return
        size = os.fstat(fd).st_size
        if size >= SEGMENT_BYTES:
            tail += 1
            self.state[4 * queue + 2] = tail
            fd = self._segment(queue, tail, create=True)
            if fd is None:
                return
            size = os.fstat(fd).st_size
        if size % _ENTRY.size:  # a torn append (power loss): cut back to whole entries
            os.ftruncate(fd, size - size % _ENTRY.size)
        os.write(fd, b"".join(packed))
        self._add_bytes(queue, added)

    def entries(self, queue: int):
        """The entries at a queue's hand, oldest first, each consumed as it is yielded (the
        hand moves past it; its bytes leave the queue's count). Segments the hand leaves
        are deleted."""
        base = 4 * queue
        while True:
            head, offset, tail = self.state[base], self.state[base + 1], self.state[base + 2]
            fd = self._segment(queue, head, create=False)
            raw = b""
            if fd is not None:
                with contextlib.suppress(OSError):
                    raw = os.pread(fd, READ_ENTRIES * _ENTRY.size, offset)
            whole = len(raw) - len(raw) % _ENTRY.size
            if whole == 0:
                if head >= tail:
                    return  # the queue is empty
                if fd is None:  # a crash between unlink and state, or a forged tail
                    self.state[base], self.state[base + 1] = self._next_segment(queue, head), 0
                    continue
                self._drop_segment(queue, head)
                self.state[base], self.state[base + 1] = head + 1, 0
                continue
            for start in range(0, whole, _ENTRY.size):
                self.state[base + 1] = offset + start + _ENTRY.size
                entry = parse_entry(raw[start : start + _ENTRY.size], queue)
                if entry is None:
                    continue  # damaged: skipped
                self._add_bytes(queue, -entry.size)
                yield entry

    # ------------------------------------------------------------------ ghost

    def ghost_add(self, filename: str) -> None:
        fp = fingerprint(filename)
        slot = fp % GHOST_SLOTS
        self._ghost[8 * slot : 8 * slot + 8] = fp.to_bytes(8, "little")

    def ghost_has(self, filename: str) -> bool:
        fp = fingerprint(filename)
        slot = fp % GHOST_SLOTS
        return int.from_bytes(self._ghost[8 * slot : 8 * slot + 8], "little") == fp

    def close(self) -> None:
        for fd in self._segments.values():
            os.close(fd)
        self._segments.clear()
        with contextlib.suppress(BufferError, ValueError):
            self._ghost.close()
        for fd in (self._state_fd, self._names_fd, self.dir_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


RANK_SUFFIX = "_rank"


def sibling_key(description: dict | None, resolve: Callable[[str], dict | None]) -> str | None:
    """What a namespace's siblings share: its description less its rank coordinates (a
    `geometry.parallel` key ending in `_rank`); a state pool tied to a KV namespace
    (`geometry.kv_namespace`) shares its KV namespace's key, so a state never outlives the
    KV page of its key. None for a namespace that cannot be described (no siblings)."""
    if not isinstance(description, dict):
        return None
    geometry = description.get("geometry")
    if isinstance(geometry, dict) and isinstance(geometry.get("kv_namespace"), str):
        return sibling_key(resolve(geometry["kv_namespace"]), lambda _: None)
    if isinstance(geometry, dict) and isinstance(geometry.get("parallel"), dict):
        parallel = {
            name: value
            for name, value in geometry["parallel"].items()
            if not name.endswith(RANK_SUFFIX)
        }
        geometry = {**geometry, "parallel": parallel}
    return json.dumps({**description, "geometry": geometry}, sort_keys=True, default=str)


class SiblingGroups:
    """Which namespace directories take every eviction of a key together (the ranks of one
    server, and their tied state pools), from their namespace.json (read once per process).
    Groups are formed among the namespaces the log names."""

    def __init__(self, describe: Callable[[str], dict | None]):
        self._describe = describe
        self._keys: dict[str, str | None] = {}
        self._members: dict[str, list[str]] = {}
        self._known: tuple = ()
        self.checked_s = -1e9

    def _key(self, dirname: str) -> str | None:
        if dirname not in self._keys:
            self._keys[dirname] = sibling_key(self._describe(dirname), self._describe)
        return self._keys[dirname]

    def refresh(self, dirnames: list[str]) -> None:
        if tuple(dirnames) == self._known:
            return
        groups: dict[str, list[str]] = {}
        for dirname in dirnames:
            key = self._key(dirname)
            if key is not None:
                groups.setdefault(key, []).append(dirname)
        self._members = {dirname: members for members in groups.values() for dirname in members}
        self._known = tuple(dirnames)
        self.checked_s = time.monotonic()

    def of(self, dirname: str) -> list[str]:
        return self._members.get(dirname) or [dirname]
