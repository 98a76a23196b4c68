"""Keeping the byte ledger true, and deleting records so that it stays true.

`Accounting` owns what the budget (budget.py) relies on: the shared ledger, this process's
liveness lock, the eviction orders (eviction_order.py: the log every process shares;
eviction.SampledLru over sampling.py: files' own times of last use, sampled a few at a time,
the fallback) and every deletion of a record or a quarantined file, each made under the
ledger's lock together with the release of exactly the bytes it freed (Ledger.apply), as every
publication is (Ledger.publish). So the ledger never needs a recount to stay true
(ledger_repair.py: recounts, dead processes' reservations and temp files, only when needed).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable

from ..errors import ConfigError
from .context import StoreContext
from .disk_count import DiskCount
from .eviction import RecentReads, SampledLru
from .eviction_order import EvictionOrder
from .journal import Journal, JournalItem
from .layout import accounted_bytes, is_record_name
from .ledger import Ledger
from .ledger_repair import LedgerRepair
from .lifetime import retire
from .liveness import ProcessLock
from .quarantine import Quarantine
from .record_stat import is_pinned, record_inode
from .sampling import RecordSampler


class Accounting:
    def __init__(
        self,
        context: StoreContext,
        *,
        recent_reads: RecentReads,
        pinned_bytes: Callable[[], int],
        on_quarantined: Callable[[str, str], None],
    ):
        """`pinned_bytes`: the bytes pins hold (never evictable); `on_quarantined(dirname,
        filename)`: a record was moved to quarantine (its pin goes)."""
        layout = context.layout
        self.layout = layout
        self.read_only = context.read_only
        self.counters = context.counters
        self._pinned_bytes = pinned_bytes
        self.process = None
        disk_count = DiskCount(context)
        try:
            self.process = None if self.read_only else ProcessLock(layout.root)
            self.ledger = Ledger(
                layout.ledger_path,
                self.process,
                read_only=self.read_only,
                recount=disk_count.counts,
                inode_of=functools.partial(record_inode, layout),
                logical_of=disk_count.logical_of,
            )
        except OSError as error:  # e.g. a directory where the ledger is
            if self.process is not None:
                self.process.close()
            raise ConfigError(
                f"hicache_galahad option 'root': {layout.root!r} cannot hold a store: its "
                f"ledger or process lock cannot be opened ({error}); expected a store root "
                "whose `ledger` is a regular file"
            ) from error
        self.sampler = RecordSampler(context)
        self.index = SampledLru(self.sampler.sample, self._unpinned_bytes)
        self.quarantine = Quarantine(
            layout.quarantine_dir,
            self.ledger,
            self.index,
            context.counters,
            layout,
            on_moved=on_quarantined,
        )
        self.repair = LedgerRepair(context, self.ledger, self.process, self.quarantine, disk_count)
        self.order = EvictionOrder(
            context, self.ledger, self.index, token=self.token, recent_reads=recent_reads
        )

    @property
    def token(self) -> str:
        return self.process.token if self.process is not None else "readonly"

    def _unpinned_bytes(self) -> int:
        """What eviction could free at most (SampledLru.total_bytes): the evictable bytes
        less those pins hold."""
        return self._evictable_bytes() - self._pinned_bytes()

    def _evictable_bytes(self) -> int:
        """The most eviction could free: the ledger's committed bytes, but never more than
        its namespace counts hold (Ledger.evictable: committed bytes rewritten to a plausible
        but false figure must fail a put, never over-evict) nor than the filesystem holds (a
        ledger rewritten to a huge number must fail a put, never empty the store). As this
        process's last locked section saw it (Ledger.seen_evictable: the budget asks right
        after a failed reserve, the section its shortfall comes from)."""
        committed = self.ledger.seen_evictable()
        try:
            stats = os.statvfs(self.layout.root)
            used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
        except OSError:
            return committed
        return min(committed, used)

    # ------------------------------------------------------------- deletions

    def unlink_record(
        self, dirname: str, filename: str, expected=None, *, keep_pinned: bool = False
    ) -> int | None:
        """Deletes one record file and releases its bytes, both under the ledger's lock; its
        size, or None if it was gone. With `expected` (inode, mtime_ns), only if the file is
        still that one and was not used since (another process read it: it stays). With
        `expected` or `keep_pinned`, never a pinned record (checked under the lock, where
        pins are linked: a purge by age keeps what a concurrent pin reported pinned)."""
        if self.read_only or not is_record_name(filename):
            return None

        def action(journal):
            try:
                dir_fd = self.layout.namespace_fd(dirname)
                info = os.stat(filename, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                return None
            if (
                expected is not None
                and expected[0] is not None
                and (info.st_ino != expected[0] or info.st_mtime_ns > expected[1])
            ):
                return None  # replaced, or used since it was sampled: it stays
            if (expected is not None or keep_pinned) and is_pinned(
                self.layout.root, dirname, filename, info
            ):
                return None  # pinned since it was sampled (store/pins/): it stays
            size = accounted_bytes(info)
            journal(Journal.DELETE, dirname, [JournalItem(filename, info.st_ino, size)])
            try:
                os.unlink(filename, dir_fd=dir_fd)
            except OSError:
                return None
            return size

        try:
            freed = self.ledger.apply(action)
        except OSError:
            return None
        self.index.discard((dirname, filename))
        return freed

    def evict_to(self, max_bytes: int) -> tuple[int, int]:
        """Evicts least recently used records (quarantined files first) until the ledger is
        at most `max_bytes`; returns (files evicted, bytes freed)."""
        evicted = freed = 0
        misses = 0
        while not self.read_only and self.ledger.read() > max_bytes:
            if self.evict_quarantined():
                evicted += 1
                continue
            in_order = self.evict_in_order(self.ledger.read() - max_bytes)
            if in_order is not None:
                evicted += in_order[0]
                freed += in_order[1]
                self.counters.add_many(evictions=in_order[0], evicted_bytes=in_order[1])
                continue
            victim = self.index.pop_oldest()
            if victim is None:
                break
            size = self.remove(victim)
            if size is not None:
                evicted += 1
                freed += size
                self.counters.add_many(evictions=1, evicted_bytes=size)
            else:
                misses += 1
                if misses > 10_000:
                    break
        return evicted, freed

    # ------------------------------------------------------------- budget.Evictor

    def evict_quarantined(self) -> bool:
        if not self.quarantine.has_files():
            return False
        return self.quarantine.trim(keep_files=0, max_files=1) > 0

    def quarantined_bytes(self) -> int:
        """0: the evictable bytes (SampledLru.total_bytes, the ledger's committed bytes)
        already hold the quarantined files."""
        return 0

    def remove(self, victim) -> int | None:
        freed = self.unlink_record(*victim[0], expected=victim[2] if len(victim) > 2 else None)
        if freed is None:
            self.counters.add("eviction_misses")
        return freed

    def load_unindexed(self) -> None:
        """Samples more records as eviction candidates (a few files: no scan)."""
        self.index.refill()

    def enqueue(self, dirname: str, items: list, kept_bytes: int) -> None:
        self.order.enqueue(dirname, items, kept_bytes)

    def evict_in_order(self, want_bytes: int) -> tuple[int, int] | None:
        return self.order.evict_in_order(want_bytes)

    def wait_reaped(self) -> bool:
        return self.order.wait_reaped()

    def close(self) -> None:
        self.repair.close()
        self.order.close()  # (its reaper's last unlinks settle in the ledger first)
        self.sampler.close()
        self.ledger.close()
        if self.process is not None:
            with contextlib.suppress(OSError):  # this process's counters: no live server's now
                retire(self.layout.root, self.process.token)
            self.process.close()
