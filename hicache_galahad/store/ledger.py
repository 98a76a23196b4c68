"""The byte ledger of a store root, shared by every process that has the root open: what
each update does (reserve, settle, publish, apply a deletion or a move, release, reclaim what
dead processes reserved, rebuild from disk). The file's encoding is ledger_state.py, its locked
section ledger_file.py, the journal journal.py, process liveness liveness.py.

Committed bytes are the records and quarantined files on disk; each process's entry is what it
has reserved for writes in flight. A put reserves first (failing if the total would pass the
cap), then commits what it published or releases what it did not. Every update happens in the
ledger's locked section.

The namespace counts (what `galahad stats` prints without walking a record) change in the same
locked section, and under the same journal, as committed bytes: publish, apply (deletions,
quarantine moves and trims), rebuild. Logical bytes are an estimate: a publication's are the
writer's (its records' page bytes; a dead writer's are read from the headers of what it left
linked); a deletion takes away the namespace's mean logical/disk share of what it freed (no
read of a victim's header); a recount reads the headers of a bounded sample per namespace
(disk_count.LOGICAL_SAMPLE_RECORDS).

Nothing here trusts the file to stay intact: a process whose entry is missing writes it back;
a ledger that was deleted, replaced or truncated is recreated and flagged `needs_rebuild`, so
the store recounts committed bytes from disk (`rebuild`); entries of processes that died
(their lock file is free, whatever pid namespace they ran in) are dropped by the next rebuild,
so their reservations are reclaimed while other processes keep running. A failure can only
leave the ledger over-counting, the safe direction. An entry whose token is not a token (a
flipped bit) makes the ledger damaged: recounted, and live processes write their entries back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import LedgerWriteError
from .journal import Journal, JournalItem
from .layout import QUARANTINE_DIRNAME
from .ledger_file import LedgerFile
from .ledger_state import JOURNAL_MAX_BYTES, LedgerState, NamespaceCount


def _evictable_of(state: LedgerState) -> int:
    """Ledger.evictable of a state."""
    counted = state.counted_bytes()
    return state.committed if counted in (None, state.committed) else 0


class Ledger(LedgerFile):
    """Total bytes of a root's records plus every process's reservations."""

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

        def read(state: LedgerState):
            return state.counts if state.counts_complete else None

        return self._locked(read)

    def evictable(self) -> int:
        """The bytes eviction may count on: committed bytes, or 0 when the namespace counts
        are complete and disagree with them. Both change in the same locked sections, so
        they differ only in a ledger someone rewrote (or a bug): committed bytes set to a
        plausible but false figure (below what the filesystem holds) would make every put
        evict real records to pay for bytes that exist only in the ledger. Then eviction
        does not start, the put is refused, and the rate-limited recount sets it right."""
        return self._locked(_evictable_of)

    def seen_total(self) -> int:
        """`read()` as this process's last locked section saw it (no lock: one locked read
        if there was none). Safe where the caller only sizes work that a later locked
        section checks again: the budget sizes an eviction by it right after a failed
        reserve (the section it was read in), and the next reserve decides."""
        seen = self.seen
        return self.read() if seen is None else seen.total

    def seen_evictable(self) -> int:
        """`evictable()` as this process's last locked section saw it (no lock: one locked
        read if there was none). Safe for the budget's guard against a false ledger: it is
        read from the same section as the shortfall it is compared with (the failed
        reserve), so both come from one ledger, and a rewrite after it is seen by the next
        reserve, which runs before any further eviction."""
        seen = self.seen
        return self.evictable() if seen is None else _evictable_of(seen)

    def reservations(self) -> dict[str, int]:
        """Bytes reserved by each open process (by token)."""
        return self._locked(lambda state: dict(state.entries))

    def reserve(self, amount: int, limit: int | None) -> bool:
        def update(state: LedgerState) -> bool:
            if limit is not None and state.total + amount > limit:
                return False
            self._mine += amount
            return True

        return self._locked(update)

    def settle(self, committed_bytes: int, released_bytes: int) -> None:
        """Ends reservations in one update: `committed_bytes` of them became records on disk,
        `released_bytes` were not published."""

        def update(state: LedgerState) -> None:
            self._mine = max(0, self._mine - committed_bytes - released_bytes)
            state.committed += committed_bytes
            if committed_bytes:  # published earlier, counted now: no namespace to add it to
                state.invalidate_counts()

        self._locked(update)

    def publish(self, dirname: str, items: list[JournalItem], link_all) -> int:
        """Links a batch into place and counts it in one locked section, so that a recount
        (which holds the lock) sees every record either linked and counted or neither.
        `items` are the records to link (their logical bytes too); `link_all()` links them
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

        def update(state: LedgerState) -> int:
            nonlocal kept
            if journal is not None:
                state.journal = journal
                self._write_journal(state)
            kept = link_all()
            state.journal = None
            self._mine = max(0, self._mine - kept)
            state.committed += kept
            if kept:
                self._count_published(state, dirname, items, kept)
            return kept

        try:
            return self._locked(update)
        except OSError as error:
            if kept:
                raise LedgerWriteError(error, kept) from error
            raise

    def _count_published(
        self, state: LedgerState, dirname: str, items: list[JournalItem], kept: int
    ) -> None:
        """The namespace counts of a publication: every item when the bytes kept are all of
        them (no system call), else those whose inode is at their name; their logical bytes
        are the writer's (no header is read)."""
        if not state.counts_complete:
            return
        if kept != sum(item.size_bytes for item in items):
            items = [item for item in items if self.inode_of(dirname, item.filename) == item.inode]
            if sum(item.size_bytes for item in items) != kept:
                state.invalidate_counts()  # bytes kept that no item explains
                return
        logical = sum(item.logical_bytes for item in items)
        state.count_added(dirname, len(items), kept, logical, time.time_ns())

    def apply(self, action) -> int | None:
        """Runs `action(journal)` (a deletion or a move of records or quarantined files)
        under the ledger's lock and releases the bytes it returns (None: nothing was freed).
        Under the lock, no recount can see the file gone but the bytes still counted, or the
        reverse. An action that deletes calls `journal(kind, dirname, items)` first (items:
        JournalItem), so that if this process dies between the unlink and the ledger's write,
        the next process releases what is gone. A journal holds one namespace: an action that
        deletes in several calls `journal.done(freed)` when one namespace's deletions are over
        (their bytes released, their counts changed) before it journals the next, so the
        next journal is written over a state that already holds what the last one did (one
        locked section for every namespace); the last journal is done with what the action
        returns, less what earlier `done` calls released."""
        if self._read_only:
            return None

        def update(state: LedgerState):
            open_journals: list[Journal] = []
            done_bytes = 0
            journaled = False

            def journal(kind: bytes, dirname: str, items: list[JournalItem]) -> None:
                nonlocal journaled
                if open_journals:
                    raise RuntimeError("a journal was written over one not done")
                state.journal = Journal(self._process.token, dirname, items, kind)
                open_journals.append(state.journal)
                journaled = True
                self._write_journal(state)

            def done(freed: int | None) -> None:
                nonlocal done_bytes
                self._journal_done(state, open_journals.pop(), freed)
                done_bytes += freed or 0

            journal.done = done
            freed = action(journal)
            if open_journals:
                self._journal_done(
                    state, open_journals.pop(), None if freed is None else freed - done_bytes
                )
            elif freed and not journaled:
                # a deletion no journal names (a quarantined file that is no record)
                state.committed = max(0, state.committed - freed)
                state.count_removed(QUARANTINE_DIRNAME, 1, freed)
            return freed

        return self._locked(update)

    @staticmethod
    def _journal_done(state: LedgerState, done: Journal, freed: int | None) -> None:
        """The journaled action is over: `freed` bytes left committed bytes (None: nothing
        was freed), moved to the quarantine's count or gone from the namespace's."""
        state.journal = None
        if freed:
            state.committed = max(0, state.committed - freed)
        if freed is None:
            return
        size = done.size_bytes
        state.count_removed(done.dirname, len(done.items), size)
        if done.kind == Journal.MOVE:
            state.count_added(QUARANTINE_DIRNAME, len(done.items), size, 0)

    def hold(self, amount: int) -> None:
        """Only inside a locked section (an action of apply): `amount` bytes stay reserved by
        this process, written with the section (eviction holds what it freed until the
        files' blocks are: store/reaper.py); settle ends the hold."""
        self._mine += amount

    def release(self, amount: int) -> None:
        """Committed bytes left the disk (eviction, deletion, quarantine trim)."""

        def update(state: LedgerState) -> None:
            state.committed = max(0, state.committed - amount)
            state.invalidate_counts()  # bytes of no namespace

        self._locked(update)

    def reclaim_dead(self) -> int:
        """Drops the entries of processes that died (no scan: a liveness test per entry);
        returns the reserved bytes that came back."""
        process = self._process

        def update(state: LedgerState) -> int:
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

        def update(state: LedgerState) -> int:
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
        self.remove_abandoned_temps()
        return self._locked(update)
