"""The ledger's journal: what a process is changing on disk right now, inside one locked
section of the ledger, and how the next process to take the lock counts what a writer that
died there left (the disk says what happened)."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import NamedTuple

from .layout import QUARANTINE_DIRNAME, is_namespace_dirname, is_record_name, is_token


class JournalItem(NamedTuple):
    """One file of a journaled change. `logical_bytes` (the page bytes its header declares)
    is known to a publication, never kept on disk: 0 in a journal read back."""

    filename: str
    inode: int
    size_bytes: int  # accounted bytes (layout.accounted_bytes)
    logical_bytes: int = 0


class Journal:
    """What a process is changing on disk right now, inside one locked section: the kind
    (PUBLISH: records being linked into place; DELETE: a record being unlinked; TRIM: a
    quarantined file being unlinked; MOVE: a record being moved into quarantine, which
    changes no committed bytes, only the namespace counts), the namespace directory, then
    (inode, accounted bytes, file name) of each file. Written before the first irreversible
    step and cleared with the update that counts it, both under the lock; one found by another
    process means its writer died between the two (the lock is free), and the disk says what
    happened: a record linked (same name, same inode) is counted, a file gone is released."""

    PUBLISH, DELETE, TRIM, MOVE = b"P", b"D", b"Q", b"M"
    QUARANTINE = QUARANTINE_DIRNAME  # the directory field of a TRIM (the quarantine directory)
    _ITEM = struct.Struct("<QQB")

    def __init__(self, token: str, dirname: str, items: list[JournalItem], kind: bytes = PUBLISH):
        self.token, self.dirname, self.items, self.kind = token, dirname, items, kind

    @property
    def size_bytes(self) -> int:
        return sum(item.size_bytes for item in self.items)

    def pack(self) -> bytes:
        out = [
            self.token.encode("ascii"),
            self.kind,
            self.dirname.encode("ascii"),
            struct.pack("<H", len(self.items)),
        ]
        for item in self.items:
            name = item.filename.encode("ascii")
            out.append(self._ITEM.pack(item.inode, item.size_bytes, len(name)) + name)
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
                items.append(JournalItem(name, inode, size))
        except (UnicodeDecodeError, struct.error):
            return None
        if kind not in (cls.PUBLISH, cls.DELETE, cls.TRIM, cls.MOVE):
            return None
        if offset != len(raw) or not is_token(token) or not is_namespace_dirname(dirname):
            return None
        return cls(token, dirname, items, kind)

    def recover(
        self,
        state,
        inode_of: Callable[[str | None, str], int | None],
        logical_of: Callable[[str, str], int],
    ) -> int:
        """Counts in `state` (a ledger_state.LedgerState) what this journal's dead writer
        left on disk: records of a publication that are there (the rest was never published;
        its reservation goes with the dead writer's entry), files of a deletion that are gone,
        records of a move that left their namespace. `inode_of(dirname, filename)` is the
        inode at a name (dirname None: the quarantine). Returns the committed bytes it added
        or released."""
        dirname = None if self.kind == Journal.TRIM else self.dirname
        recovered_bytes = 0
        for item in self.items:
            there = inode_of(dirname, item.filename) == item.inode
            size = item.size_bytes
            if self.kind == Journal.PUBLISH and there:
                state.committed += size
                recovered_bytes += size
                logical = logical_of(self.dirname, item.filename)
                state.count_added(self.dirname, 1, size, logical)
            elif self.kind == Journal.MOVE and not there:  # moved: counted in quarantine
                state.count_removed(self.dirname, 1, size)
                state.count_added(QUARANTINE_DIRNAME, 1, size, 0)
            elif self.kind in (Journal.DELETE, Journal.TRIM) and not there:
                state.committed = max(0, state.committed - size)
                recovered_bytes += size
                state.count_removed(self.dirname, 1, size)
        return recovered_bytes
