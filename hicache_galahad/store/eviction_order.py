"""The eviction order every process of a root shares: fifo.py's log, walked by its hands.

`EvictionOrder` enters each published batch into the log (enqueue, under the ledger's lock
inside Ledger.publish), puts the runs this process read since its last pass at M's tail
(in the order read, each run's head last: eviction.RecentReads), plans evictions from its
hands (an entry older than such a read of its record is passed over; a record used since
it was enqueued, or pinned, goes to M's tail; a victim is taken with its siblings' records of
the same key), takes the victims' names under the ledger's lock (journaled, renamed to temp
names) and leaves their unlinks to the reaper (reaper.py), holding their bytes in the ledger
until then.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time

from ..telemetry.metrics import count_bug
from .context import StoreContext
from .eviction import RecentReads, SampledLru
from .fifo import MAIN, S_SHARE, SMALL, SharedFifo, SiblingGroups
from .journal import Journal, JournalItem
from .layout import accounted_bytes
from .ledger import Ledger
from .reaper import Reaper
from .record_stat import is_pinned, record_inode, stat_record

PLAN_MAX_ENTRIES = 4096  # entries one locked section of eviction looks at, at most
REAP_WAIT_S = 5.0  # a put waits at most this long for evicted files to be unlinked
UNLINK_BATCH = 64  # deletions journaled together (the ledger's journal holds about 90)


class EvictionOrder:
    def __init__(
        self,
        context: StoreContext,
        ledger: Ledger,
        index: SampledLru,
        *,
        token: str,
        recent_reads: RecentReads,
    ):
        self.layout = context.layout
        self.counters = context.counters
        self._warn = context.warn
        self.ledger = ledger
        self.index = index
        self.token = token
        self.recent_reads = recent_reads
        self.fifo = None if context.read_only else self._open_fifo()
        self.siblings = SiblingGroups(self._describe)
        self.reaper = Reaper(self.layout.namespace_fd, self._hold_ended)
        self._committed_read = (-1e9, 0)
        self._unsettled_hold = 0
        self._record_bytes: dict[str, int] = {}  # a namespace's record size (its pages')

    def _open_fifo(self) -> SharedFifo | None:
        """The root's eviction log (fifo.py); None when evict/ cannot be made or opened
        (eviction then samples, as before it existed)."""
        try:
            root_fd = os.open(self.layout.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return SharedFifo(root_fd)
        except OSError as error:
            self._warn.warning(
                "evict-log",
                "galahad: no eviction log in %s (%s): sampling",
                self.layout.root,
                error,
            )
            return None
        finally:
            os.close(root_fd)

    def _describe(self, dirname: str) -> dict | None:
        namespace = self.layout.load_namespace(dirname)
        return None if namespace is None else namespace.describe()

    def is_pinned(self, dirname: str, filename: str, info: os.stat_result) -> bool:
        return is_pinned(self.layout.root, dirname, filename, info)

    def _stat_record(self, dirname: str, filename: str) -> os.stat_result | None:
        return stat_record(self.layout, dirname, filename)

    def enqueue(self, dirname: str, items: list, kept_bytes: int) -> None:
        """budget.Evictor.enqueue: a published batch enters S (M for a key the ghost holds),
        tail first; under the ledger's lock, inside Ledger.publish."""
        fifo = self.fifo
        if fifo is None:
            return
        try:
            if kept_bytes != sum(item[2] for item in items):  # some were there already
                items = [item for item in items if self._inode_of(dirname, item[0]) == item[1]]
            fifo.load()
            index = fifo.name_index(dirname)
            if index is None:
                return
            if items:
                self._record_bytes[dirname] = items[0][2]
            now_ns = time.time_ns()
            queues: tuple[list, list] = ([], [])
            for filename, _inode, size, *_ in reversed(items):
                queue = MAIN if fifo.ghost_has(filename) else SMALL
                queues[queue].append((index, filename, size, now_ns))
            fifo.append(SMALL, queues[SMALL])
            fifo.append(MAIN, queues[MAIN])
            fifo.save()
        except OSError:
            self.counters.add("io_errors")
        except Exception as error:  # inside a publication: never raised out of it
            count_bug(
                self.counters, self._warn, "enqueue-bug", "galahad: enqueue failed: %r", error
            )

    def evict_in_order(self, want_bytes: int) -> tuple[int, int] | None:
        """budget.Evictor.evict_in_order (_evict_in_order); a bug in it is counted and
        eviction falls back on the sample, never raised into a put."""
        try:
            return self._evict_in_order(want_bytes)
        except Exception as error:
            count_bug(self.counters, self._warn, "evict-bug", "galahad: eviction failed: %r", error)
            return None

    def _evict_in_order(self, want_bytes: int) -> tuple[int, int] | None:
        """budget.Evictor.evict_in_order. One locked section walks the hands, chooses at
        least `want_bytes` of victims (every sibling namespace's record of each key) and
        takes them all, a journal per namespace and per UNLINK_BATCH victims, each done
        before the next is written (Ledger.apply). None when the log has no victim, or names
        less than half the bytes the ledger holds (a root older than the log: sampling
        first); (0, 0) when others freed the bytes first."""
        fifo = self.fifo
        if fifo is None:
            return None
        if want_bytes <= 0:  # others freed the bytes meanwhile
            return 0, 0
        taken: list = []  # (dirname, filename, temp name, size) to unlink after the section
        committed = self._committed_recently()

        def plan(journal):
            fifo.load()
            if 2 * fifo.queued_bytes() < committed:
                return None
            self.siblings.refresh(fifo.dirnames())
            now_ns = time.time_ns()
            # The reads since the last pass go to M's tail first, stamped just before now_ns:
            # the walk may reach them (when all else was read since, the least recent read
            # goes). M's walk ends where this pass's own moves begin (stamped now_ns): a
            # record it just moved to M's tail, as used, is never judged again in the pass.
            self._append_reads(fifo, now_ns - 1)
            walks = (
                fifo.entries(SMALL),
                itertools.takewhile(lambda entry: entry.time_ns < now_ns, fifo.entries(MAIN)),
            )
            planned: dict[str, list] = {}
            planned_names: set = set()
            found = steps = 0
            while found < want_bytes and steps < PLAN_MAX_ENTRIES:
                steps += 1
                small_first = fifo.queued_bytes(SMALL) >= S_SHARE * fifo.queued_bytes()
                order = (SMALL, MAIN) if small_first else (MAIN, SMALL)
                entry = next(walks[order[0]], None) or next(walks[order[1]], None)
                if entry is None:
                    break
                found += self._judge(fifo, entry, planned, planned_names, now_ns)
            fifo.save()
            if not planned:
                return None
            freed = 0
            for dirname, victims in planned.items():
                for start in range(0, len(victims), UNLINK_BATCH):
                    batch = victims[start : start + UNLINK_BATCH]
                    batch_freed = self._take(dirname, batch, journal, taken)
                    if batch_freed is not None:
                        journal.done(batch_freed)
                        freed += batch_freed
            return freed

        try:
            freed = self.ledger.apply(plan)
        except OSError:  # the section is undone (its holds too): the temp names are swept
            self.counters.add("io_errors")
            return None
        if freed is None:
            return None
        for dirname, filename, temp_name, size in taken:
            self.index.discard((dirname, filename))
            self.reaper.unlink(dirname, temp_name, size)
        return len(taken), freed or 0

    def queue_state(self) -> dict:
        """StoreAdmin.eviction_queues: what the log's state says now (read under the
        ledger's lock, as every use of the log)."""
        fifo = self.fifo
        if fifo is None:
            return {}
        found: dict = {}

        def read(journal):
            fifo.load()
            found.update(small_bytes=fifo.queued_bytes(SMALL), main_bytes=fifo.queued_bytes(MAIN))

        try:
            self.ledger.apply(read)
            found["ledger_bytes"] = self.ledger.read()
        except OSError:
            return {}
        return found

    def wait_reaped(self) -> bool:
        """budget.Evictor.wait_reaped: waits (at most REAP_WAIT_S) for the reaper's unlinks."""
        if not self.reaper.pending_bytes:
            return False
        self.reaper.wait_idle(REAP_WAIT_S)
        return True

    def _committed_recently(self) -> int:
        """The ledger's committed bytes, read at most once a second (one more locked read)."""
        read_s, committed = self._committed_read
        if time.monotonic() - read_s > 1.0:
            committed = self.ledger.committed()
            self._committed_read = (time.monotonic(), committed)
        return committed

    def _append_reads(self, fifo: SharedFifo, now_ns: int) -> None:
        """The runs this process read since its last pass, at M's tail stamped `now_ns`, in
        the order they were read, each run's head nearest the tail: a chain that goes cold
        is evicted from its deepest page (SGLang restores only a leading run). An entry's
        size is its namespace's record size (one stat, once per namespace this process
        never wrote)."""
        appended: list = []
        for dirname, filename in self.recent_reads.take_unmarked(now_ns):
            index = fifo.name_index(dirname)
            size = self._record_bytes.get(dirname)
            if size is None:
                info = self._stat_record(dirname, filename)
                if info is None:
                    continue
                size = self._record_bytes[dirname] = accounted_bytes(info)
            if index is not None:
                appended.append((index, filename, size, now_ns))
        fifo.append(MAIN, appended)

    def _judge(
        self, fifo: SharedFifo, entry, planned: dict, planned_names: set, now_ns: int
    ) -> int:
        """One entry at a hand: skipped (gone, or this process put a read of its record at
        M's tail since: that newer entry stands for it), to M's tail (used since it was
        enqueued, or pinned), or planned for eviction with its siblings; the bytes planned."""
        dirname = fifo.dirname_of(entry.name_index)
        if dirname is None or (dirname, entry.filename) in planned_names:
            return 0  # a sibling's entry of a key planned already
        if self.recent_reads.marked_ns(dirname, entry.filename) > entry.time_ns:
            return 0
        info = self._stat_record(dirname, entry.filename)
        if info is None:
            return 0
        used_ns = max(info.st_mtime_ns, self.recent_reads.last_ns(entry.filename))
        if used_ns > entry.time_ns or self.is_pinned(dirname, entry.filename, info):
            fifo.append(MAIN, [(entry.name_index, entry.filename, accounted_bytes(info), now_ns)])
            return 0
        if entry.queue == SMALL:
            fifo.ghost_add(entry.filename)
        found = 0
        for sibling in self.siblings.of(dirname):
            sibling_info = (
                info if sibling == dirname else self._stat_record(sibling, entry.filename)
            )
            if (sibling, entry.filename) in planned_names or sibling_info is None:
                continue
            if self.is_pinned(sibling, entry.filename, sibling_info):
                continue
            planned_names.add((sibling, entry.filename))
            planned.setdefault(sibling, []).append((entry.filename, sibling_info.st_ino))
            found += accounted_bytes(sibling_info)
        return found

    def _take(self, dirname: str, victims: list, journal, taken: list) -> int | None:
        """Under the ledger's lock: the victims of one namespace that are still the file
        planned and pinned by no one leave their names (journaled, then renamed to temp
        names, which no reader opens and a sweep removes if this process dies); the bytes
        freed. The rename is cheap: the files' blocks are freed later, by the reaper's
        unlinks (freeing them under the lock serialized every writer of a full store)."""
        doomed: list = []
        for filename, inode in victims:
            info = self._stat_record(dirname, filename)
            if info is None or info.st_ino != inode:
                continue  # gone, or another record now. A use since is no reason to keep
                # it: the plan decided, for every sibling together
            if self.is_pinned(dirname, filename, info):
                continue
            doomed.append(JournalItem(filename, info.st_ino, accounted_bytes(info)))
        if not doomed:
            return None
        journal(Journal.DELETE, dirname, doomed)
        dir_fd = self.layout.namespace_fd(dirname)
        freed = 0
        for filename, _inode, size, *_ in doomed:
            temp_name = self.layout.new_temp_name(filename, self.token)
            with contextlib.suppress(OSError):
                os.rename(filename, temp_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                freed += size
                taken.append((dirname, filename, temp_name, size))
        self.ledger.hold(freed)  # until the reaper has unlinked them (_hold_ended)
        return freed

    def _hold_ended(self, freed_bytes: int) -> None:
        """The reaper unlinked evicted files: the bytes held for them are released."""
        freed_bytes += self._unsettled_hold
        self._unsettled_hold = 0
        try:
            self.ledger.settle(0, freed_bytes)
        except OSError:  # held meanwhile (the safe side), released with the next
            self._unsettled_hold = freed_bytes

    def _inode_of(self, dirname: str | None, filename: str) -> int | None:
        return record_inode(self.layout, dirname, filename)

    def close(self) -> None:
        """Ends the reaper (its pending unlinks done, their holds settled) and the log."""
        self.reaper.close()
        if self.fifo is not None:
            self.fifo.close()
