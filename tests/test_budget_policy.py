"""The budget policy (budget.py) on its own: a fake ledger, a fake disk, the real LRU index."""

from __future__ import annotations

import errno

import pytest

from hicache_galahad.store.budget import Budget
from hicache_galahad.store.eviction import LruIndex


class FakeLedger:
    """The ledger's arithmetic without a file; `fail_next` makes the next update raise."""

    def __init__(self, committed: int = 0):
        self.committed = committed
        self.reserved = 0
        self.needs_rebuild = False
        self.fail_next = 0
        self.updates = 0

    def _update(self) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise OSError(errno.EIO, "injected")
        self.updates += 1

    def read(self) -> int:
        return self.committed + self.reserved

    seen_total = read  # (no lock to spare: always the current figure)

    def reserve(self, amount: int, limit: int | None) -> bool:
        if limit is not None and self.read() + amount > limit:
            return False
        self._update()
        self.reserved += amount
        return True

    def settle(self, committed_bytes: int, released_bytes: int) -> None:
        self._update()
        self.reserved -= committed_bytes + released_bytes
        self.committed += committed_bytes


class FakeDisk:
    """Records as sizes; the Evictor the budget deletes through."""

    def __init__(self, ledger: FakeLedger, index: LruIndex):
        self.ledger = ledger
        self.index = index
        self.files: dict[str, int] = {}
        self.removed: list[str] = []

    def publish(self, name: str, size: int) -> None:
        self.files[name] = size
        self.index.add(name, size)

    def evict_quarantined(self) -> bool:
        return False

    def quarantined_bytes(self) -> int:
        return 0

    def evict_in_order(self, want_bytes: int) -> None:
        return None  # no shared order: the index decides (the policy's fallback)

    def enqueue(self, dirname, items, kept_bytes) -> None:
        pass

    def wait_reaped(self) -> bool:
        return False

    def remove(self, victim) -> int | None:
        location = victim[0]
        size = self.files.pop(location, None)
        if size is not None:
            self.removed.append(location)
            self.ledger.committed -= size
        return size

    def load_unindexed(self) -> None:
        pass


def make(max_bytes=None, min_free_bytes=0, free_bytes=lambda: 1 << 40, committed=0):
    ledger, index = FakeLedger(committed), LruIndex()
    disk = FakeDisk(ledger, index)
    events: dict[str, int] = {}
    budget = Budget(
        ledger,
        index,
        disk,
        max_bytes=max_bytes,
        min_free_bytes=min_free_bytes,
        free_bytes=free_bytes,
        on_event=lambda name, amount: events.__setitem__(name, events.get(name, 0) + amount),
    )
    return budget, ledger, disk, events


def put(budget: Budget, disk: FakeDisk, name: str, size: int) -> bool:
    if not budget.reserve(size):
        return False
    disk.publish(name, size)
    budget.settle(size, 0)
    return True


def test_reserve_then_settle_keeps_published_and_returns_the_rest():
    budget, ledger, _, _ = make(max_bytes=1000)
    assert budget.reserve(600)
    assert budget.pending_bytes == 600 and ledger.read() == 600
    budget.settle(400, 200)  # a batch: 400 bytes published, 200 not
    assert budget.pending_bytes == 0
    assert (ledger.committed, ledger.reserved) == (400, 0)


def test_eviction_takes_the_least_recently_used_first():
    budget, ledger, disk, events = make(max_bytes=300)
    for name in ("a", "b", "c"):
        assert put(budget, disk, name, 100)
    budget.index.touch("a")
    assert put(budget, disk, "d", 100)
    assert disk.removed == ["b"]
    assert events == {"evictions": 1, "evicted_bytes": 100}
    assert ledger.read() == 300


def test_a_record_larger_than_the_cap_evicts_nothing():
    budget, _, disk, _ = make(max_bytes=300)
    assert put(budget, disk, "a", 100)
    assert not budget.reserve(301)
    assert disk.removed == [] and budget.pending_bytes == 0


def test_an_over_counting_ledger_fails_the_put_without_emptying_the_store():
    """Bytes nothing on disk explains (a damaged ledger, leaked reservations): deleting every
    record could not make room, so nothing is deleted."""
    budget, ledger, disk, events = make(max_bytes=1000)
    for name in ("a", "b"):
        assert put(budget, disk, name, 100)
    ledger.committed += 10_000
    assert not budget.reserve(100)
    assert disk.removed == []
    assert events == {"budget_unreconciled": 1}


def test_the_free_space_floor_evicts_and_then_refuses():
    free = {"bytes": 1000}
    budget, _, disk, _ = make(min_free_bytes=800, free_bytes=lambda: free["bytes"])
    for name in ("a", "b"):
        assert put(budget, disk, name, 100)

    def remove(victim, real=disk.remove):
        size = real(victim)
        free["bytes"] += size or 0
        return size

    disk.remove = remove
    assert budget.reserve(250)  # 1000 - 250 < 800: "a" goes, then there is room
    assert disk.removed == ["a"] and budget.pending_bytes == 250
    budget.settle(0, 250)
    assert not budget.reserve(10_000)  # nothing could make room: refused, reservation ended
    assert budget.pending_bytes == 0


def test_a_settle_the_ledger_refuses_is_carried_to_the_next():
    budget, ledger, _, _ = make(max_bytes=1000)
    assert budget.reserve(500)
    ledger.fail_next = 1
    with pytest.raises(OSError):
        budget.settle(300, 200)
    assert budget.pending_bytes == 0
    assert ledger.read() == 500  # still reserved: over-counts, never under-counts
    assert budget.reserve(100)
    budget.settle(100, 0)
    assert (ledger.committed, ledger.reserved) == (400, 0)


def test_one_ledger_update_per_settled_batch():
    budget, ledger, _, _ = make(max_bytes=None)
    assert budget.reserve(32 * 100)
    budget.settle(31 * 100, 100)
    assert ledger.updates == 2  # one reservation, one settle, for the whole batch


def test_pinned_bytes_are_never_evicted_for_and_refuse_without_a_recount():
    """Pinned records (store/pins/) are in the ledger but not in the eviction order: the
    loose records go first, and a put that only evicting a pin could fit fails, counted in
    no_space_pinned, with nothing deleted and no recount of the ledger."""
    ledger, index = FakeLedger(committed=700), LruIndex()  # 700 pinned bytes, not indexed
    disk = FakeDisk(ledger, index)
    events: dict[str, int] = {}
    rebuilds = []
    budget = Budget(
        ledger,
        index,
        disk,
        max_bytes=1000,
        min_free_bytes=0,
        free_bytes=lambda: 1 << 40,
        rebuild=lambda: rebuilds.append(1) or False,
        on_event=lambda name, amount: events.__setitem__(name, events.get(name, 0) + amount),
        pinned_bytes=lambda: 700,
    )
    for name in ("a", "b"):
        assert put(budget, disk, name, 100)
    assert put(budget, disk, "c", 200)  # evicts a, the oldest loose record
    assert disk.removed == ["a"]
    assert not budget.reserve(400)  # b and c (300) could not cover it; only the pins could
    assert disk.removed == ["a"] and budget.pending_bytes == 0
    assert events["no_space_pinned"] == 1 and "budget_unreconciled" not in events
    assert rebuilds == []
    ledger.committed += 5_000  # bytes not even the pins explain: unreconciled, as before
    assert not budget.reserve(400)
    assert events["budget_unreconciled"] == 1 and rebuilds == [1]


def test_a_sample_of_pinned_records_only_refuses_instead_of_recounting():
    """SampledLru's pool stays empty when every sampled record is pinned: the put fails
    (no_space_pinned) after a few more samples, never with a recount per put."""
    from hicache_galahad.store.eviction import SampledLru

    samples = []
    index = SampledLru(lambda want: samples.append(want) or [], lambda: 1000)
    index.pinned_bytes = lambda: 600
    assert index.total_bytes == 400
    ledger = FakeLedger(committed=1000)
    events: dict[str, int] = {}
    rebuilds = []
    budget = Budget(
        ledger,
        index,
        FakeDisk(ledger, LruIndex()),
        max_bytes=1000,
        min_free_bytes=0,
        free_bytes=lambda: 1 << 40,
        rebuild=lambda: rebuilds.append(1) or True,
        on_event=lambda name, amount: events.__setitem__(name, events.get(name, 0) + amount),
        pinned_bytes=index.pinned_bytes,
    )
    assert not budget.reserve(100)
    assert events == {"no_space_pinned": 1} and rebuilds == []
    assert 2 <= len(samples) <= 20
