"""Keeping the byte ledger true, and deleting records so that it stays true.

`Accounting` owns what the budget (budget.py) relies on: the shared ledger, this process's
liveness lock, the eviction order (eviction.SampledLru: files' own times of last use, sampled
a few at a time; no index of the records) and every deletion of a record or a quarantined
file, each made under the ledger's lock together with the release of exactly the bytes it
freed (Ledger.apply), as every publication is (Ledger.publish). So the ledger never needs a
recount to stay true, and opening a store reads no directory of records: it takes back the
reservations of processes that died (their lock file is free) and counts what a writer that
died mid-publication left linked (the ledger's journal). A recount of the whole root (under
the lock, exact) happens only when the ledger is found missing, damaged or claiming more than
the filesystem holds, or when an operator asks (`galahad verify --fix`, `gc`). Temp files of
dead writers are swept by a background thread, and only when a dead writer is found.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
import time

from ..errors import ConfigError
from ..record import format as fmt
from ..telemetry.metrics import Counters, RateLimitedLog, count_bug
from .eviction import RecentReads, SampledLru
from .fifo import MAIN, S_SHARE, SMALL, SharedFifo, SiblingGroups
from .journal import Journal, JournalItem
from .layout import (
    PROCS_DIR,
    QUARANTINE_DIRNAME,
    StoreLayout,
    accounted_bytes,
    is_namespace_dirname,
    is_record_name,
    temp_is_stale,
)
from .ledger import Ledger
from .ledger_state import NamespaceCount
from .lifetime import retire
from .liveness import ProcessLock, token_alive
from .pins.tree import PINS_DIR, RECORDS_DIR
from .quarantine import Quarantine
from .reaper import Reaper

LEDGER_REBUILD_INTERVAL_S = 10.0
RECLAIM_INTERVAL_S = 1.0
NAMESPACES_RECHECK_S = 5.0
CURSOR_MAX_AGE_S = 60.0
CURSOR_RANDOM_SKIP = 256  # each process starts its walk of a directory somewhere else
LOGICAL_SAMPLE_RECORDS = 1024  # headers a recount reads per namespace (the rest: their ratio)
PLAN_MAX_ENTRIES = 4096  # entries one locked section of eviction looks at, at most
REAP_WAIT_S = 5.0  # a put waits at most this long for evicted files to be unlinked
UNLINK_BATCH = 64  # deletions journaled together (the ledger's journal holds about 90)


class _Cursor:
    """A walk of one namespace directory, a few entries at a time, over a descriptor of its
    own (listing moves a descriptor's offset)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.entries = os.scandir(fd)
        self.opened_s = time.monotonic()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.entries.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Accounting:
    def __init__(
        self,
        layout: StoreLayout,
        *,
        read_only: bool,
        counters: Counters,
        warn: RateLimitedLog,
        recent_reads: RecentReads | None = None,
    ):
        self.layout = layout
        self.recent_reads = recent_reads if recent_reads is not None else RecentReads()
        self.read_only = read_only
        self.counters = counters
        self._warn = warn
        self.index = SampledLru(self._sample, self._evictable_bytes)
        self.process = None
        try:
            self.process = None if read_only else ProcessLock(layout.root)
            self.ledger = Ledger(layout.ledger_path, self.process, read_only=read_only)
        except OSError as error:  # e.g. a directory where the ledger is
            if self.process is not None:
                self.process.close()
            raise ConfigError(
                f"hicache_galahad option 'root': {layout.root!r} cannot hold a store: its "
                f"ledger or process lock cannot be opened ({error}); expected a store root "
                "whose `ledger` is a regular file"
            ) from error
        self.quarantine = Quarantine(layout.quarantine_dir, self.ledger, self.index, counters)
        self.fifo = None if read_only else self._open_fifo()
        self.siblings = SiblingGroups(self._describe)
        self.reaper = Reaper(self.layout.namespace_fd, self._hold_ended)
        self._committed_read = (-1e9, 0)
        self._unsettled_hold = 0
        self.ledger.recount = self.disk_counts
        self.ledger.inode_of = self._inode_of
        self.ledger.logical_of = self._logical_of
        # The oldest record of each namespace as the last recount of this process found it
        # (the ledger cannot keep it under eviction); `galahad stats --recount` shows it.
        self.recounted_oldest_ns: dict[str, int] = {}
        self._last_rebuild_s = -1e9
        self._last_reclaim_s = -1e9
        self._rebuild_lock = threading.Lock()
        self._sample_lock = threading.Lock()
        self._cursors: dict[str, _Cursor] = {}
        self._namespaces: tuple[float, list[str]] = (-1e9, [])
        self._rng = random.Random()
        self._sweeper: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def token(self) -> str:
        return self.process.token if self.process is not None else "readonly"

    # ------------------------------------------------------------- scans (tools, repairs)

    def unreadable_dir(self, path: str, error: OSError) -> None:
        self.counters.add("unreadable_dirs")
        self._warn.warning("unreadable-dir", "galahad: skipping %s: %s", path, error)

    def disk_bytes(self) -> int:
        """Bytes the ledger should count as committed: records plus quarantined files (a
        walk of every record: tools and repairs only)."""
        records = sum(e.accounted_bytes for e in self.layout.records(on_error=self.unreadable_dir))
        return records + self.quarantine.total_bytes()

    def disk_counts(self) -> tuple[int, dict[str, NamespaceCount] | None]:
        """disk_bytes, and the namespace counts the ledger keeps (records, bytes, logical
        bytes, newest and oldest modification): a walk of every record, a stat each (it runs
        under the ledger's lock). Logical bytes are read from the headers of the first
        LOGICAL_SAMPLE_RECORDS records of each namespace (hashed names: an unbiased sample),
        the rest taken at the sample's ratio, so a recount reads a bounded number of headers
        (at 10^7 cold records, reading every one would add minutes of the lock). The counts
        are None when a directory could not be read or records lie in a directory that is no
        namespace's."""
        counts: dict[str, NamespaceCount] = {}
        oldest: dict[str, int] = {}
        sampled: dict[str, list[int]] = {}  # dirname: [disk bytes, logical bytes] read
        complete = True

        def unreadable(path, error):
            nonlocal complete
            complete = False
            self.unreadable_dir(path, error)

        total = 0
        for dirname in self.layout.namespace_dirnames(unreadable):
            for entry in self.layout.records([dirname], unreadable):
                total += entry.accounted_bytes
                if not entry.accounted_bytes:
                    continue  # no regular file, or an empty one: no record to count
                if not is_namespace_dirname(dirname) or dirname == QUARANTINE_DIRNAME:
                    complete = False
                    continue
                count = counts.get(dirname)
                if count is None:
                    count = counts[dirname] = NamespaceCount()
                count.records += 1
                count.disk_bytes += entry.accounted_bytes
                if count.records <= LOGICAL_SAMPLE_RECORDS:
                    sample = sampled.setdefault(dirname, [0, 0])
                    sample[0] += entry.accounted_bytes
                    sample[1] += self._logical_of(dirname, entry.name)
                count.newest_ns = max(count.newest_ns, entry.mtime_ns)
                oldest[dirname] = min(oldest.get(dirname, entry.mtime_ns), entry.mtime_ns)
        for dirname, (sample_disk, sample_logical) in sampled.items():
            count = counts[dirname]
            rest = count.disk_bytes - sample_disk
            count.logical_bytes = sample_logical + (
                rest * sample_logical // sample_disk if sample_disk else 0
            )
        quarantined = self.layout.quarantined()
        quarantine_bytes = sum(entry.accounted_bytes for entry in quarantined)
        total += quarantine_bytes
        if quarantined:
            counts[QUARANTINE_DIRNAME] = NamespaceCount(len(quarantined), quarantine_bytes)
        self.recounted_oldest_ns = oldest
        return total, (counts if complete else None)

    def _logical_of(self, dirname: str, filename: str) -> int:
        """The page bytes a record's header declares (0 when it has no readable header)."""
        try:
            fd = os.open(
                filename,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=self.layout.namespace_fd(dirname),
            )
        except OSError:
            return 0
        try:
            return fmt.declared_raw_len(os.pread(fd, fmt.FIXED_HEADER_BYTES, 0))
        except OSError:
            return 0
        finally:
            os.close(fd)

    def open_scan(self) -> None:
        """What opening a store does: nothing proportional to its records. Takes back the
        reservations of dead processes (a liveness test per ledger entry and lock file) and
        recovers a dead writer's journal (the ledger does, under its lock); a ledger that is
        new, damaged or replaced is recounted (exact: under the lock). Dead writers' temp
        files are swept in the background."""
        if self.read_only:
            return
        dead = self._dead_tokens()
        self.ledger.reclaim_dead()
        if self.ledger.needs_rebuild:
            self.rebuild()
        if dead:
            self.sweep_temps_later()

    def _dead_tokens(self) -> list[str]:
        if self.process is None:
            return []
        return [token for token in self.process.tokens() if not self.process.is_alive(token)]

    def is_alive(self, token: str) -> bool:
        if self.process is not None:
            return self.process.is_alive(token)
        return token_alive(os.path.join(self.layout.root, PROCS_DIR), token)

    def remove_stale_temps(self) -> None:
        for entry in self.layout.temp_files(on_error=self.unreadable_dir):
            if self._closed.is_set():
                return
            if temp_is_stale(entry, self.is_alive):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    self.counters.add("stale_temp_removed")

    def sweep_temps_later(self) -> None:
        """Removes dead writers' temp files in a background thread (it lists every
        namespace directory once: never on a caller's path)."""
        if self.read_only or (self._sweeper is not None and self._sweeper.is_alive()):
            return

        def sweep():
            with contextlib.suppress(Exception):
                self.remove_stale_temps()

        self._sweeper = threading.Thread(target=sweep, name="galahad-sweep", daemon=True)
        self._sweeper.start()

    def wait_for_sweep(self, timeout_s: float | None = None) -> None:
        """Returns once the background sweep of dead writers' temp files (if one runs) ends."""
        sweeper = self._sweeper
        if sweeper is not None:
            sweeper.join(timeout_s)

    # ------------------------------------------------------------- the ledger

    def rebuild(self) -> int:
        """Recounts committed bytes from disk (a walk of every record, under the ledger's
        lock: exact, and writers wait meanwhile) and reclaims reservations of dead processes;
        returns the ledger's new total. For repairs: an operator's command, or the put that
        found the ledger damaged or claiming what nothing explains (rebuild_if_due), never a
        put of a sound ledger."""
        if self.read_only:
            return self.ledger.read()
        with self._rebuild_lock:
            self.remove_stale_temps()
            total = self.ledger.rebuild(self.disk_counts)
            self._last_rebuild_s = time.monotonic()
        self.counters.add("ledger_rebuilds")
        return total

    def rebuild_if_due(self) -> bool:
        """rebuild when the ledger was found damaged or replaced, or (at most once every
        LEDGER_REBUILD_INTERVAL_S) when it claims more than anything could explain: the
        budget found the shortfall larger than the bytes on disk."""
        due = time.monotonic() - self._last_rebuild_s >= LEDGER_REBUILD_INTERVAL_S
        if self.read_only or not (due or self.ledger.needs_rebuild):
            return False
        self._warn.warning(
            "ledger-rebuild",
            "galahad: the byte ledger of %s claims more than the records on disk explain "
            "(or was damaged); recounting it from disk",
            self.layout.root,
        )
        self.rebuild()
        return True

    def reclaim_dead(self) -> bool:
        """Takes back the reservations of processes that died (at most once a second)."""
        if self.read_only or time.monotonic() - self._last_reclaim_s < RECLAIM_INTERVAL_S:
            return False
        self._last_reclaim_s = time.monotonic()
        freed = self.ledger.reclaim_dead()
        if freed:
            self.counters.add("reclaimed_bytes", freed)
            self.sweep_temps_later()
        return freed > 0

    def _evictable_bytes(self) -> int:
        """The most eviction could free: the ledger's committed bytes, but never more than
        its namespace counts hold (Ledger.evictable: committed bytes rewritten to a plausible
        but false figure must fail a put, never over-evict) nor than the filesystem holds (a
        ledger rewritten to a huge number must fail a put, never empty the store)."""
        committed = self.ledger.evictable()
        try:
            stats = os.statvfs(self.layout.root)
            used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
        except OSError:
            return committed
        return min(committed, used)

    def _inode_of(self, dirname: str | None, filename: str) -> int | None:
        """The inode at a record's name (dirname None: a quarantined file), or None."""
        try:
            if dirname is None:
                info = os.stat(
                    os.path.join(self.layout.quarantine_dir, filename), follow_symlinks=False
                )
            else:
                info = os.stat(
                    filename, dir_fd=self.layout.namespace_fd(dirname), follow_symlinks=False
                )
        except OSError:
            return None
        return info.st_ino if accounted_bytes(info) or info.st_size == 0 else None

    # ------------------------------------------------------------- sampling

    def _namespace_names(self) -> list[str]:
        checked_s, names = self._namespaces
        if time.monotonic() - checked_s > NAMESPACES_RECHECK_S:
            names = self.layout.namespace_dirnames(self.unreadable_dir)
            self._namespaces = (time.monotonic(), names)
        return names

    def _cursor(self, dirname: str) -> _Cursor | None:
        cursor = self._cursors.get(dirname)
        if cursor is not None and time.monotonic() - cursor.opened_s > CURSOR_MAX_AGE_S:
            cursor.close()
            del self._cursors[dirname]
            cursor = None
        if cursor is None:
            cursor = self._open_cursor(dirname, self._rng.randrange(CURSOR_RANDOM_SKIP))
            if cursor is None:
                return None
            self._cursors[dirname] = cursor
        return cursor

    def _open_cursor(self, dirname: str, skip: int) -> _Cursor | None:
        """A new walk of the directory, `skip` entries in (from the start if it has fewer)."""
        for attempt_skip in (skip, 0) if skip else (0,):
            try:
                ns_fd = self.layout.namespace_fd(dirname)
                fd = os.open(".", self.layout.DIR_OPEN_FLAGS, dir_fd=ns_fd)
            except OSError:
                return None
            try:
                cursor = _Cursor(fd)
            except OSError:
                os.close(fd)
                return None
            skipped = 0
            while skipped < attempt_skip and next(cursor.entries, None) is not None:
                skipped += 1
            if skipped == attempt_skip:
                return cursor
            cursor.close()  # fewer entries than that: from the start instead
        return None

    def _sample(self, want: int) -> list:
        """Up to `want` records (location, size, mtime_ns, inode), a few from each of
        randomly chosen namespace directories, each walked on from where this process last
        left it: work proportional to `want`, never to the records."""
        found: list = []
        with self._sample_lock:
            names = self._namespace_names()
            if not names:
                return found
            for _ in range(2 * len(names) if len(names) < 8 else 16):
                if len(found) >= want:
                    break
                dirname = self._rng.choice(names)
                cursor = self._cursor(dirname)
                if cursor is None:
                    continue
                ns_fd = cursor.fd
                taken = 0
                limit = max(4, want // 2)
                for looked, entry in enumerate(cursor.entries, 1):
                    if is_record_name(entry.name):
                        with contextlib.suppress(OSError):
                            info = os.stat(entry.name, dir_fd=ns_fd, follow_symlinks=False)
                            size = accounted_bytes(info)
                            # pinned (store/pins/), never a candidate; another
                            # link (a `cp -al` backup) is no pin
                            if (size or info.st_size == 0) and not self.is_pinned(
                                dirname, entry.name, info
                            ):
                                found.append(
                                    ((dirname, entry.name), size, info.st_mtime_ns, info.st_ino)
                                )
                                taken += 1
                    if taken >= limit or looked >= 8 * limit:
                        break
                else:  # the end of the directory: the next walk starts again
                    cursor.close()
                    del self._cursors[dirname]
        return found

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
            if (expected is not None or keep_pinned) and self.is_pinned(dirname, filename, info):
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

    # ------------------------------------------------------------- the shared order

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
        """Whether pins/ pins this record file: its link under pins/records (one stat, only
        for a file with a second link). A link made elsewhere (a `cp -al` backup, a
        writer's temp name) is no pin."""
        if info.st_nlink < 2:
            return False
        path = os.path.join(self.layout.root, PINS_DIR, RECORDS_DIR, dirname, filename)
        try:
            pin = os.stat(path, follow_symlinks=False)
        except OSError:
            return False
        return pin.st_ino == info.st_ino and pin.st_dev == info.st_dev

    def _stat_record(self, dirname: str, filename: str) -> os.stat_result | None:
        try:
            info = os.stat(
                filename, dir_fd=self.layout.namespace_fd(dirname), follow_symlinks=False
            )
        except OSError:
            return None
        return info if accounted_bytes(info) or info.st_size == 0 else None

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
        takes the first namespace's; each other namespace's victims are taken in one more
        locked section. None when the log has no victim, or names less than half the bytes
        the ledger holds (a root older than the log: sampling first); (0, 0) when others
        freed the bytes first."""
        fifo = self.fifo
        if fifo is None:
            return None
        if want_bytes <= 0:  # others freed the bytes meanwhile
            return 0, 0
        planned: dict[str, list] = {}
        taken: list = []  # (dirname, temp names) to unlink once the lock is released
        committed = self._committed_recently()

        def plan(journal):
            fifo.load()
            if 2 * fifo.queued_bytes() < committed:
                return None
            self.siblings.refresh(fifo.dirnames())
            now_ns = time.time_ns()
            # M's walk ends where this pass's own appends begin (stamped now_ns): a record
            # it just moved to M's tail, as used, is never judged again in the same pass.
            walks = (
                fifo.entries(SMALL),
                itertools.takewhile(lambda entry: entry.time_ns < now_ns, fifo.entries(MAIN)),
            )
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
            dirname = next(iter(planned))
            return self._take(dirname, planned.pop(dirname)[:UNLINK_BATCH], journal, taken)

        evicted = freed = 0
        try:
            freed = self.ledger.apply(plan) or 0
        except OSError:
            self.counters.add("io_errors")
            return None
        if not (taken or planned):
            return None
        for dirname, victims in planned.items():
            for start in range(0, len(victims), UNLINK_BATCH):
                batch = victims[start : start + UNLINK_BATCH]
                try:
                    freed += (
                        self.ledger.apply(
                            lambda journal, d=dirname, b=batch: self._take(d, b, journal, taken)
                        )
                        or 0
                    )
                except OSError:
                    self.counters.add("io_errors")
        for dirname, filename, temp_name, size in taken:
            evicted += 1
            self.index.discard((dirname, filename))
            self.reaper.unlink(dirname, temp_name, size)
        return evicted, freed

    def queue_state(self) -> dict:
        """RecordStore.eviction_queues: what the log's state says now (read under the
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

    def _judge(
        self, fifo: SharedFifo, entry, planned: dict, planned_names: set, now_ns: int
    ) -> int:
        """One entry at a hand: skipped (gone), to M's tail (used since it was enqueued, or
        pinned), or planned for eviction with its siblings; the bytes planned."""
        dirname = fifo.dirname_of(entry.name_index)
        if dirname is None or (dirname, entry.filename) in planned_names:
            return 0  # a sibling's entry of a key planned already
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

    def close(self) -> None:
        self._closed.set()
        self.reaper.close()
        with self._sample_lock:
            for cursor in self._cursors.values():
                cursor.close()
            self._cursors.clear()
        self.ledger.close()
        if self.fifo is not None:
            self.fifo.close()
        if self.process is not None:
            with contextlib.suppress(OSError):  # this process's counters: no live server's now
                retire(self.layout.root, self.process.token)
            self.process.close()
