"""The ledger's binary encoding: committed bytes, each open process's reservation, the
journal of a change in progress and the namespace counts, as one small file.

    <root>/ledger       magic "GLEDGER2", committed bytes (u64), entry count (u32), 0 (u32),
                        then per open process: token (16 ASCII bytes), reserved bytes (u64);
                        ("GLEDGER3" with a journal: its length in place of the 0, the journal
                        after the entries); then, optionally, the namespace counts: "GNS1",
                        count (u32), flags (u32, bit 0: the counts are complete), then per
                        namespace directory: its name (16 bytes: the 32 hex digits), records,
                        bytes on disk, logical page bytes, newest publication (ns) (u64 each)

Quarantined files count under the pseudo-namespace layout.QUARANTINE_DIRNAME, so when the
counts are complete their bytes sum to committed bytes exactly. A ledger without counts
(written before they existed) is read as ever, with the counts incomplete until the next
rebuild fills them; a count that would go negative, or a change that cannot be attributed to a
namespace, also marks them incomplete (never a wrong figure shown as exact). Anything that is
not an intact ledger parses as None (recounted from disk).
"""

from __future__ import annotations

import struct

from .journal import Journal
from .layout import is_namespace_dirname, is_token

MAGIC = b"GLEDGER2"
MAGIC_JOURNAL = b"GLEDGER3"  # a ledger holding a publication journal (see Journal)
JOURNAL_MAX_BYTES = 8 * 1024  # a batch is at most 32 records (writer.py)
HEAD = struct.Struct("<8sQII")
ENTRY = struct.Struct("<16sQ")
TOKEN_BYTES = 16
MAX_ENTRIES = 4096
NS_MAGIC = b"GNS1"
NS_HEAD = struct.Struct("<4sII")
NS_ENTRY = struct.Struct("<16sQQQQ")
NS_COMPLETE = 1
MAX_NAMESPACES = 4096
READ_BYTES = (  # the most an intact ledger holds, plus one
    HEAD.size
    + MAX_ENTRIES * ENTRY.size
    + JOURNAL_MAX_BYTES
    + NS_HEAD.size
    + MAX_NAMESPACES * NS_ENTRY.size
    + 1
)


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


class LedgerState:
    """The ledger's content, decoded (the namespace table kept as on disk)."""

    def __init__(self, committed: int = 0, entries: dict[str, int] | None = None):
        self.committed = committed
        self.entries = entries if entries is not None else {}
        self.journal: Journal | None = None
        self.rewrite = False  # written even if unchanged (a journal written meanwhile)
        self.counts_complete = False
        # The namespace table as on disk (NS_ENTRY each), changed in place: an update
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
            for name, *values in NS_ENTRY.iter_unpack(self._table)
        }

    def set_counts(self, counts: dict[str, NamespaceCount] | None) -> None:
        """Replaces the namespace counts (None: unknown until the next recount)."""
        self._table = bytearray()
        self.counts_complete = counts is not None
        for dirname, count in (counts or {}).items():
            if len(self._table) >= MAX_NAMESPACES * NS_ENTRY.size:
                self.invalidate_counts()
                return
            self._table += NS_ENTRY.pack(bytes.fromhex(dirname), *count.as_tuple())

    def invalidate_counts(self) -> None:
        self.set_counts(None)

    def _offset(self, dirname: str) -> int:
        """Where the entry of a namespace directory is in the table, or -1 (-2: a name that
        is no namespace directory's, which the table cannot hold)."""
        if not is_namespace_dirname(dirname):
            return -2
        table, start, name = self._table, 0, bytes.fromhex(dirname)
        while (offset := table.find(name, start)) >= 0:
            if offset % NS_ENTRY.size == 0:
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
                del self._table[offset : offset + NS_ENTRY.size]
        elif offset >= 0:
            NS_ENTRY.pack_into(self._table, offset, name, *count.as_tuple())
        elif len(self._table) >= MAX_NAMESPACES * NS_ENTRY.size:
            self.invalidate_counts()
        else:
            self._table += NS_ENTRY.pack(name, *count.as_tuple())

    def count_added(self, dirname, records, disk_bytes, logical_bytes, newest_ns=0) -> None:
        if not self.counts_complete:
            return
        offset = self._offset(dirname)
        if offset >= 0:
            count = NamespaceCount(*NS_ENTRY.unpack_from(self._table, offset)[1:])
        else:
            count = NamespaceCount()
        count.records += records
        count.disk_bytes += disk_bytes
        count.logical_bytes += logical_bytes
        count.newest_ns = max(count.newest_ns, newest_ns)
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
        count = NamespaceCount(*NS_ENTRY.unpack_from(self._table, offset)[1:])
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
        return sum(values[2] for values in NS_ENTRY.iter_unpack(self._table))

    @classmethod
    def parse(cls, raw: bytes):
        """The state in `raw`, or None when it is not an intact ledger."""
        if len(raw) < HEAD.size:
            return None
        magic, committed, count, journal_len = HEAD.unpack_from(raw, 0)
        if magic not in (MAGIC, MAGIC_JOURNAL) or count > MAX_ENTRIES:
            return None
        if (magic == MAGIC) != (journal_len == 0) or journal_len > JOURNAL_MAX_BYTES:
            return None
        end = HEAD.size + count * ENTRY.size + journal_len
        counts_raw, complete = b"", False
        if len(raw) != end:  # the namespace counts follow (a ledger written since they exist)
            if len(raw) < end + NS_HEAD.size:
                return None
            ns_magic, ns_count, flags = NS_HEAD.unpack_from(raw, end)
            counts_start = end + NS_HEAD.size
            if ns_magic != NS_MAGIC or ns_count > MAX_NAMESPACES or flags & ~NS_COMPLETE:
                return None
            if len(raw) != counts_start + ns_count * NS_ENTRY.size:
                return None
            counts_raw, complete = raw[counts_start:], bool(flags & NS_COMPLETE)
        entries = {}
        for index in range(count):
            token, reserved = ENTRY.unpack_from(raw, HEAD.size + index * ENTRY.size)
            name = token.decode("ascii", "replace")
            if not is_token(name):
                return None  # a flipped bit, a forged entry: damaged, recounted
            entries[name] = reserved
        state = cls(committed, entries)
        state._table = bytearray(counts_raw if complete else b"")
        state.counts_complete = complete
        if journal_len:
            state.journal = Journal.parse(raw[HEAD.size + count * ENTRY.size : end])
            if state.journal is None:
                return None
        return state

    def _pack_counts(self) -> bytes:
        if not self.counts_complete:
            return NS_HEAD.pack(NS_MAGIC, 0, 0)
        table = self._table
        return NS_HEAD.pack(NS_MAGIC, len(table) // NS_ENTRY.size, NS_COMPLETE) + table

    def pack(self) -> bytes:
        entries = list(self.entries.items())[:MAX_ENTRIES]
        journal = self.journal.pack() if self.journal is not None else b""
        magic = MAGIC_JOURNAL if journal else MAGIC
        return (
            HEAD.pack(magic, self.committed, len(entries), len(journal))
            + b"".join(
                ENTRY.pack(token.encode("ascii")[:TOKEN_BYTES], reserved)
                for token, reserved in entries
            )
            + journal
            + self._pack_counts()
        )
