"""Least-recently-used orders without the shared log: the sampler the store falls back on,
and an exact index for tests of the policy (pure, thread-safe)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class LruIndex:
    """Maps a record's location to its size on disk, oldest access first.

    A location is any hashable (the store uses (namespace dirname, file name)). `touch` moves
    an entry to the most-recent end; `pop_oldest` hands out eviction victims.
    """

    def __init__(self):
        self._entries: OrderedDict[object, int] = OrderedDict()
        self._lock = threading.Lock()
        self._total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, location) -> bool:
        return location in self._entries

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of the indexed entries."""
        return self._total_bytes

    def load(self, entries_oldest_first) -> None:
        """Adds (location, size) pairs, oldest first, behind nothing already indexed."""
        with self._lock:
            fresh = OrderedDict()
            for location, size in entries_oldest_first:
                if location not in self._entries and location not in fresh:
                    fresh[location] = size
                    self._total_bytes += size
            fresh.update(self._entries)
            self._entries = fresh

    def add(self, location, size: int) -> None:
        with self._lock:
            self._total_bytes += size - self._entries.pop(location, 0)
            self._entries[location] = size

    def touch(self, location) -> None:
        with self._lock:
            if location in self._entries:
                self._entries.move_to_end(location)

    def touch_many_head_last(self, locations) -> None:
        """Marks a chain of pages as used so that its head ends up most recent.

        Pages of a prefix chain arrive head first; evicting the head would make every deeper
        page useless, so eviction must take the tail first.
        """
        with self._lock:
            for location in reversed(locations):
                if location in self._entries:
                    self._entries.move_to_end(location)

    def discard(self, location) -> int | None:
        with self._lock:
            size = self._entries.pop(location, None)
            if size is not None:
                self._total_bytes -= size
            return size

    def pop_oldest(self):
        """(location, size) of the least recently used entry, or None when empty."""
        with self._lock:
            if not self._entries:
                return None
            location, size = self._entries.popitem(last=False)
            self._total_bytes -= size
            return location, size


RECENT_USES_MAX = 65536  # this process's own recent uses kept exactly (bounded memory)
READ_MARKS_MAX = 4096  # reads waiting to enter the shared order (the newest kept)
POOL_MAX = 32  # eviction candidates kept between evictions


class RecentReads:
    """This process's reads, for the shared order (fifo.py).

    When it last read each key (by record file name, so every rank's namespace of a key
    shares it), at every read: what the order asks besides the file's modification time,
    which a reader sets at most every RECENCY_INTERVAL_S (a futimens per read would cost each
    read a system call). Without it, a key read again and again within that interval looked
    unused at the hand, and the main queue behaved as a plain FIFO (bench_cache's zipf_chat:
    19 points below LRU).

    And the runs it read since its last eviction pass (`note_run`, `take_unmarked`): the
    pass puts them at the main queue's tail in the order they were read, each run's deepest
    page first, so the main queue is ordered by last use, as LRU's, and a chain that goes
    cold leaves from its tail, never leaving pages SGLang cannot restore (bench_cache's
    zipf_chat: 5 points below LRU without them). A record so put (`marked_ns`) has a newer
    entry than any the hand meets from before.

    Bounded: the times are cleared when full (which forgets at most RECENT_USES_MAX keys'
    uses for the rest of their interval); of the runs not yet put in the order, the newest
    READ_MARKS_MAX pages are kept (an older one is still seen as a use at the hand).
    Thread-safe: reads note from I/O threads while a writer takes."""

    def __init__(self):
        self._read_ns: dict[str, int] = {}
        self._marked_ns: dict[tuple[str, str], int] = {}
        self._unmarked: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, filename: str) -> None:
        if len(self._read_ns) >= RECENT_USES_MAX:
            self._read_ns.clear()
        self._read_ns[filename] = time.time_ns()

    def last_ns(self, filename: str) -> int:
        return self._read_ns.get(filename, 0)

    def note_run(self, locations: list[tuple[str, str]]) -> None:
        """A run of pages read, head first, as (namespace dirname, record file name)."""
        with self._lock:
            for location in reversed(locations):
                self._unmarked[location] = None
                self._unmarked.move_to_end(location)
            while len(self._unmarked) > READ_MARKS_MAX:
                self._unmarked.popitem(last=False)

    def take_unmarked(self, marked_ns: int) -> list[tuple[str, str]]:
        """The pages of the runs read since the last take, in the order to append them
        (oldest use first); from now on they count as put in the order at `marked_ns`."""
        with self._lock:
            taken = list(self._unmarked)
            self._unmarked.clear()
            if len(self._marked_ns) + len(taken) > RECENT_USES_MAX:
                self._marked_ns.clear()
            for location in taken:
                self._marked_ns[location] = marked_ns
        return taken

    def marked_ns(self, dirname: str, filename: str) -> int:
        """When this process last put a read of the record at the main queue's tail (0: not
        lately)."""
        return self._marked_ns.get((dirname, filename), 0)


class SampledLru:
    """Least-recently-used eviction without an index of the records (issues 19 and 24).

    A record's time of last use is its file's modification time, which every process sees
    (the writer sets it, the reader sets it again at most every 2 s): what one server read
    recently is not what another evicts first. Victims come from a small pool of candidates
    refilled by `sample(n)` (a few files of a directory at a time, from a cursor that walks
    the namespace directories: constant work per eviction, whatever the number of records);
    the oldest of the pool goes first, as Redis's approximated LRU does. This process's own
    uses since its start are also remembered (a bounded map), so a record it just read or
    wrote is never the first to go even within the reader's 2 s. Same interface as
    LruIndex, so that budget.Budget works with either.

    Pinned records (store/pins/: a link of the file under pins/records) are never
    candidates: the sample leaves out a file with a second link when pins/ has it (one more
    stat, only for such a file: a `cp -al` backup's link is no pin), and `total_bytes` leaves
    out the pinned bytes (`pinned_bytes`, set by the store). This is the fallback of the
    shared order (fifo.py), for records its log does not name.
    """

    def __init__(self, sample: Callable[[int], list], evictable_bytes: Callable[[], int]):
        self._sample = sample  # n -> [(location, size, mtime_ns, inode)]
        self._evictable_bytes = evictable_bytes
        self._pool: dict = {}  # location -> (size, mtime_ns, inode)
        self._recent: OrderedDict = OrderedDict()  # location -> time_ns of this process's use
        self._lock = threading.Lock()
        self.pinned_bytes: Callable[[], int] = lambda: 0  # kept by pins, never evicted

    def __len__(self) -> int:
        return len(self._pool)

    def __contains__(self, location) -> bool:
        return location in self._pool or location in self._recent

    @property
    def total_bytes(self) -> int:
        """What eviction could free at most: the bytes on disk (evictable_bytes) less the
        pinned ones."""
        return max(0, self._evictable_bytes() - self.pinned_bytes())

    def _used(self, location, when_ns: int) -> None:
        self._recent[location] = when_ns
        self._recent.move_to_end(location)
        if len(self._recent) > RECENT_USES_MAX:
            self._recent.popitem(last=False)

    def load(self, entries_oldest_first) -> None:
        """Records another part of the store knows of (their sizes): candidates."""
        with self._lock:
            for location, size in entries_oldest_first:
                if len(self._pool) < POOL_MAX:
                    self._pool.setdefault(location, (size, 0, None))

    def add(self, location, size: int) -> None:
        with self._lock:
            self._used(location, time.time_ns())
            self._pool.pop(location, None)

    def touch(self, location) -> None:
        with self._lock:
            self._used(location, time.time_ns())
            self._pool.pop(location, None)

    def touch_many_head_last(self, locations) -> None:
        """A chain of pages used, its head the most recent (the tail goes first)."""
        with self._lock:
            now_ns = time.time_ns()
            for offset, location in enumerate(reversed(locations)):
                self._used(location, now_ns + offset)
                self._pool.pop(location, None)

    def discard(self, location) -> int | None:
        with self._lock:
            self._recent.pop(location, None)
            found = self._pool.pop(location, None)
            return None if found is None else found[0]

    def refill(self) -> None:
        fresh = self._sample(POOL_MAX)
        with self._lock:
            for location, size, mtime_ns, inode in fresh:
                self._pool[location] = (size, mtime_ns, inode)
            while len(self._pool) > 2 * POOL_MAX:  # the youngest go
                youngest = max(self._pool, key=self._recency)
                del self._pool[youngest]

    def _recency(self, location) -> int:
        return max(self._pool[location][1], self._recent.get(location, 0))

    def pop_oldest(self):
        """(location, size, (inode, mtime_ns)) of the least recently used candidate, or None
        when the sample finds no record at all. The caller re-checks the file against the
        third item (what it was when sampled) before deleting: the victim carries it, so no
        other thread's pop can change what this one checks (issue 32)."""
        if len(self._pool) < POOL_MAX // 2:
            self.refill()
        with self._lock:
            if not self._pool:
                return None
            location = min(self._pool, key=self._recency)
            size, mtime_ns, inode = self._pool.pop(location)
            return location, size, (inode, mtime_ns)
