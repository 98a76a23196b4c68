"""What the eviction order holds, for an operator (`galahad stats`, a metric), read-only.

The queues' bytes come from <root>/evict/state and their entries from the segments' sizes
(a stat per segment, 4 MiB of entries each); the ghost's size is a count of its occupied
slots (one read of its 512 KiB). Nothing here writes, locks or lists a record directory: a
store opened read-only has no SharedFifo (fifo.py creates its files), so the logs are read
with fifo.py's parsers over descriptors of our own. The state may be read while a writer
changes it: a torn read fails its CRC and the figure says the log is unreadable.

The restorable share is estimated from a uniform sample of the queues' entries (at most
SAMPLE_ENTRIES, so the same cost at any size): a sampled record counts as restorable when its
file is there in every sibling namespace of its pool (every rank) and, in the small queue, no
page before it in its own batch is missing on any rank (a batch is appended tail first: the
entries after it with the same namespace and time are the shallower pages of its chain; the
main queue's entries were moved one by one, so their batches are not known). A state record
counts when its KV page of the same key is there on every rank too. The sample cannot see a
hole in an earlier batch of the same chain (the log names no predecessor across batches), nor
one before a main-queue entry, and it counts a hybrid's KV pages past the chain's deepest
state, which a hybrid restore does not use: the estimate is an upper bound of the share a
request can reach. Its 95% sampling error, at most 0.98/sqrt(sample), is reported with it.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import random
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .fifo import (
    ENTRY_BYTES,
    EVICT_DIR,
    GHOST_FILE,
    GHOST_SLOTS,
    MAIN,
    MAX_NAMES,
    NAME_BYTES,
    NAMES_FILE,
    SMALL,
    STATE_BYTES,
    STATE_FILE,
    SiblingGroups,
    parse_entry,
    parse_state,
    segment_name,
)
from .layout import StoreLayout, is_namespace_dirname
from .safe_files import OPEN_FLAGS

SAMPLE_ENTRIES = 1024  # the estimate's sample: a 95% error of at most about 3 points
METRIC_SAMPLE_ENTRIES = 256  # a metric's sample (at most about 6 points), every
METRIC_INTERVAL_S = 30.0  # this often at most, on a thread of its own
BATCH_WINDOW = 32  # entries read after a sampled one to find the rest of its batch


@dataclass
class OrderFigures:
    log: bool = False  # whether the root has a readable eviction log
    small_bytes: int = 0  # records not used since they were written
    main_bytes: int = 0  # records used at least once
    small_entries: int = 0
    main_entries: int = 0
    ghost_keys: int = 0  # keys evicted from the small queue lately (a lossy table)
    ghost_slots: int = GHOST_SLOTS
    sampled: int = 0  # entries sampled
    stale: int = 0  # of those, naming a record that is gone (evicted since, or replaced)
    on_every_rank: int = 0  # of the rest, records every rank of their pool holds
    restorable: int = 0  # of those, with no page missing before them in their batch
    restorable_share: float | None = None  # restorable / (sampled - stale)
    restorable_error: float | None = None  # its 95% sampling error

    def as_dict(self) -> dict:
        return asdict(self)


def _read_file(dir_fd: int, name: str, max_bytes: int, offset: int = 0) -> bytes | None:
    """Up to `max_bytes` of one of the log's regular files (never a link), None if absent."""
    try:
        fd = os.open(name, os.O_RDONLY | OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.pread(fd, max_bytes, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


class _Log:
    """The logs of one root, read once."""

    def __init__(self, dir_fd: int):
        self.dir_fd = dir_fd
        self.state = parse_state(_read_file(dir_fd, STATE_FILE, STATE_BYTES) or b"")
        try:
            self.listing = os.listdir(dir_fd)  # the log's files only: a few per 4 MiB of it
        except OSError:
            self.listing = []
        raw = _read_file(dir_fd, NAMES_FILE, MAX_NAMES * NAME_BYTES) or b""
        self.names = [
            raw[i : i + 32].decode("ascii", "replace")
            for i in range(0, len(raw) - len(raw) % NAME_BYTES, NAME_BYTES)
        ]

    def dirname(self, index: int) -> str | None:
        name = self.names[index] if index < len(self.names) else None
        return name if name is not None and is_namespace_dirname(name) else None

    def spans(self, queue: int) -> list[tuple[int, int, int]]:
        """(segment number, first offset, end offset) of the queue's entries, hand first:
        a stat per segment on disk between the state's hand and tail."""
        if self.state is None:
            return []
        head, offset, tail = self.state[4 * queue : 4 * queue + 3]
        prefix = segment_name(queue, 0)[:-16]
        numbers = sorted(
            int(name[len(prefix) :])
            for name in self.listing
            if name.startswith(prefix) and name[len(prefix) :].isdigit()
        )
        found = []
        # The segments on disk between hand and tail: a forged tail of 2^40 costs nothing.
        for number in (n for n in numbers if head <= n <= tail):
            try:
                size = os.stat(
                    segment_name(queue, number), dir_fd=self.dir_fd, follow_symlinks=False
                ).st_size
            except OSError:
                continue
            start, end = (offset if number == head else 0), size - size % ENTRY_BYTES
            if end > start:
                found.append((number, start, end))
        return found

    def entries(self, queue: int, number: int, offset: int, count: int) -> list:
        raw = _read_file(self.dir_fd, segment_name(queue, number), count * ENTRY_BYTES, offset)
        raw = raw or b""
        return [
            parse_entry(raw[start : start + ENTRY_BYTES], queue)
            for start in range(0, len(raw) - len(raw) % ENTRY_BYTES, ENTRY_BYTES)
        ]

    def ghost_keys(self) -> int:
        raw = _read_file(self.dir_fd, GHOST_FILE, GHOST_SLOTS * 8) or b""
        slots = memoryview(raw[: len(raw) - len(raw) % 8]).cast("Q")
        return len(slots) - list(slots).count(0)


class _Records:
    """Whether a namespace holds a record, and which namespaces are a record's siblings."""

    def __init__(self, layout: StoreLayout):
        self.layout = layout
        self.descriptions: dict[str, dict | None] = {}
        self.groups = SiblingGroups(self.describe)

    def describe(self, dirname: str) -> dict | None:
        if dirname not in self.descriptions:
            namespace = self.layout.load_namespace_cached(dirname)
            self.descriptions[dirname] = None if namespace is None else namespace.describe()
        return self.descriptions[dirname]

    def is_state(self, dirname: str) -> bool:
        geometry = (self.describe(dirname) or {}).get("geometry")
        return isinstance(geometry, dict) and isinstance(geometry.get("kv_namespace"), str)

    def holds(self, dirname: str, filename: str) -> bool:
        try:
            info = os.stat(
                filename, dir_fd=self.layout.namespace_fd(dirname), follow_symlinks=False
            )
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_size > 0

    def ranks(self, dirname: str, state: bool) -> list[str]:
        """The siblings of `dirname` (itself included) of the same kind: its KV namespaces'
        ranks, or its state pool's."""
        pool = (self.describe(dirname) or {}).get("pool")
        return [
            sibling
            for sibling in self.groups.of(dirname)
            if self.is_state(sibling) == state
            and (self.describe(sibling) or {}).get("pool") == pool
        ]

    def on_every_rank(self, dirname: str, filename: str) -> bool:
        return all(
            self.holds(rank, filename) for rank in self.ranks(dirname, self.is_state(dirname))
        )

    def restorable(self, log: _Log, entry, batch: list) -> bool:
        """Whether a present record on every rank has every page before it in its batch on
        every rank (a state: its KV page of the same key on every rank)."""
        dirname = log.dirname(entry.name_index)
        if self.is_state(dirname):
            kv = [d for d in self.groups.of(dirname) if not self.is_state(d)]
            return bool(kv) and all(self.holds(d, entry.filename) for d in kv)
        return all(self.on_every_rank(dirname, mate.filename) for mate in batch)


def order_figures(layout: StoreLayout, sample: int = SAMPLE_ENTRIES, seed: int | None = None):
    """The figures of the root's eviction order (OrderFigures), from a read-only look at its
    logs (see the module docstring); `log` False when the root has none or it is unreadable."""
    figures = OrderFigures()
    try:
        dir_fd = os.open(
            os.path.join(layout.root, EVICT_DIR),
            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
        )
    except OSError:
        return figures
    try:
        log = _Log(dir_fd)
        if log.state is None:
            return figures
        figures.log = True
        figures.small_bytes, figures.main_bytes = log.state[3], log.state[7]
        spans = {queue: log.spans(queue) for queue in (SMALL, MAIN)}
        counts = {
            q: sum((end - start) // ENTRY_BYTES for _, start, end in s) for q, s in spans.items()
        }
        figures.small_entries, figures.main_entries = counts[SMALL], counts[MAIN]
        figures.ghost_keys = log.ghost_keys()
        _estimate(figures, log, spans, _Records(layout), sample, random.Random(seed))
    finally:
        os.close(dir_fd)
    return figures


def _estimate(
    figures: OrderFigures, log: _Log, spans: dict, records: _Records, sample: int, rng
) -> None:
    """The restorable share from `sample` entries drawn uniformly from both queues."""
    records.groups.refresh([name for name in log.names if is_namespace_dirname(name)])
    flat = [
        (queue, number, start, end)
        for queue, found in spans.items()
        for number, start, end in found
    ]
    total = figures.small_entries + figures.main_entries
    if not total:
        return
    ends = list(itertools.accumulate((end - start) // ENTRY_BYTES for _, _, start, end in flat))
    for position in rng.sample(range(total), min(sample, total)):
        at = bisect.bisect_right(ends, position)
        queue, number, start, _ = flat[at]
        offset = start + (position - (ends[at - 1] if at else 0)) * ENTRY_BYTES
        window = log.entries(queue, number, offset, BATCH_WINDOW)
        if not window or window[0] is None:
            continue
        entry = window[0]
        figures.sampled += 1
        dirname = log.dirname(entry.name_index)
        if dirname is None or not records.holds(dirname, entry.filename):
            figures.stale += 1
            continue
        if not records.on_every_rank(dirname, entry.filename):
            continue
        figures.on_every_rank += 1
        batch = []
        for mate in window[1:] if queue == SMALL else ():
            if mate is None or (mate.name_index, mate.time_ns) != (entry.name_index, entry.time_ns):
                break
            batch.append(mate)
        if records.restorable(log, entry, batch):
            figures.restorable += 1
    present = figures.sampled - figures.stale
    if present:
        figures.restorable_share = figures.restorable / present
        # The widest 95% interval of a sampled share (p = 1/2), less the part of the log the
        # sample covered (0 when it read every entry).
        covered = (total - figures.sampled) / max(1, total - 1)
        figures.restorable_error = 0.98 / math.sqrt(present) * math.sqrt(max(0.0, covered))


class OrderFigureCache:
    """order_figures of one root for a metric: refreshed on a thread of its own at most
    every `interval_s`, so that `latest()` (asked on SGLang's scheduler thread) never waits
    for a read of the logs. A failed refresh keeps the last figures and tells `on_error`."""

    def __init__(
        self,
        layout: StoreLayout,
        on_error: Callable[[Exception], None],
        *,
        interval_s: float = METRIC_INTERVAL_S,
        sample: int = METRIC_SAMPLE_ENTRIES,
    ):
        self._layout = layout
        self._on_error = on_error
        self._interval_s = interval_s
        self._sample = sample
        self._lock = threading.Lock()
        self._figures: OrderFigures | None = None
        self._started_s = -math.inf
        self._thread: threading.Thread | None = None

    def latest(self) -> OrderFigures | None:
        """The last figures (None before the first refresh ends); starts a refresh if due."""
        with self._lock:
            idle = self._thread is None or not self._thread.is_alive()
            if idle and time.monotonic() - self._started_s >= self._interval_s:
                self._started_s = time.monotonic()
                self._thread = threading.Thread(
                    target=self._refresh, name="galahad-order-figures", daemon=True
                )
                self._thread.start()
            return self._figures

    def wait(self, timeout_s: float | None = None) -> None:
        """Returns once a refresh in progress (if any) ends."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _refresh(self) -> None:
        try:
            figures = order_figures(self._layout, self._sample)
        except Exception as error:  # a thread of ours: never an uncaught exception
            self._on_error(error)
            return
        with self._lock:
            self._figures = figures
