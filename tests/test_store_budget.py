"""Byte budget (max_bytes), LRU eviction and the free-space floor (min_free_bytes)."""

from __future__ import annotations

import json
import os
import random
import threading
import time

from support.records import record_files, record_path, store_disk_bytes, temp_files
from support.store_helpers import NS_A, checked_get, children, content, read_line, spawn

from hicache_galahad.record import format as fmt
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin


def record_bytes(key: str, raw: int) -> int:
    """On-disk size of an uncompressed, unencrypted record."""
    return fmt.FIXED_HEADER_BYTES + len(key.encode()) + raw


def present(store: RecordStore, keys) -> set:
    return {key for key in keys if store.contains(NS_A, key)}


def test_disk_never_exceeds_max_bytes(tmp_path, store_factory):
    root = str(tmp_path / "store")
    max_bytes = 200_000
    rng = random.Random(7)
    store = store_factory(root, max_bytes=max_bytes, compression="zstd", durability="none")
    store.register_namespace(NS_A)
    written = {}
    for round_index in range(30):
        keys = [f"b{round_index}-{i}" for i in range(rng.randint(1, 4))]
        datas = [content(k, rng.randint(1_000, 40_000), rng.random() < 0.5) for k in keys]
        if len(keys) == 1:
            results = [store.put(NS_A, keys[0], datas[0])]
        else:
            results = store.put_many(NS_A, keys, datas)
        assert all(results)
        written.update(zip(keys, datas, strict=True))
        # evicted files leave their names at once, their bytes held in the ledger until
        # the reaper has unlinked them (reaper.py): the cap holds meanwhile
        assert store_disk_bytes(root) <= max_bytes
        assert store.accounting.order.reaper.wait_idle(10)
        on_disk = store_disk_bytes(root)
        assert on_disk <= max_bytes
        assert store.usage_bytes() == on_disk
    assert store.counters.snapshot()["evictions"] > 0
    assert sum(len(d) for d in written.values()) > 2 * max_bytes  # really overfilled
    # What survived is intact.
    survivors = present(store, written)
    assert survivors and len(survivors) < len(written)
    for key in survivors:
        assert checked_get(store, NS_A, key, written[key])


def test_least_recently_used_are_evicted_first(tmp_path, store_factory):
    raw = 10_000
    old = [f"lru-{i:03d}" for i in range(10)]
    new = [f"new-{i:03d}" for i in range(5)]
    size = record_bytes(old[0], raw)
    store = store_factory(str(tmp_path / "store"), max_bytes=10 * size, durability="none")
    store.register_namespace(NS_A)
    for key in old:
        assert store.put(NS_A, key, content(key, raw))
    assert store.usage_bytes() == 10 * size  # exactly full
    # Touch the three oldest: one through get_into, two through get_many_into.
    assert checked_get(store, NS_A, old[0], content(old[0], raw))
    outs = [bytearray(raw), bytearray(raw)]
    assert store.get_many_into(NS_A, old[1:3], outs) == [True, True]
    for key in new:
        assert store.put(NS_A, key, content(key, raw))
    assert store.counters.snapshot()["evictions"] == len(new)
    # The five least recently used (old[3..7]) went; the touched ones stayed.
    assert present(store, old) == set(old[:3]) | set(old[8:])
    assert present(store, new) == set(new)


def test_recency_survives_a_restart(store_factory, tmp_path):
    """Reads refresh a record's mtime, which orders eviction after a restart."""
    raw = 10_000
    root = str(tmp_path / "store")
    keys = [f"lru-{i:03d}" for i in range(6)]
    size = record_bytes(keys[0], raw)
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        for key in keys:
            assert store.put(NS_A, key, content(key, raw))
    now = time.time()
    for index, key in enumerate(keys):  # written long ago, oldest first
        stamp = now - 10_000 + index * 100
        os.utime(record_path(root, NS_A, key), (stamp, stamp))
    with store_factory(root, durability="none") as store:
        assert checked_get(store, NS_A, keys[0], content(keys[0], raw))
    with store_factory(root, max_bytes=6 * size, durability="none") as store:
        store.register_namespace(NS_A)
        for extra in ("new-000", "new-001"):
            assert store.put(NS_A, extra, content(extra, raw))
        assert present(store, keys) == {keys[0]} | set(keys[3:])


def test_record_larger_than_the_budget_is_refused_without_evicting(tmp_path, store_factory):
    raw = 10_000
    keys = [f"small-{i}" for i in range(4)]
    max_bytes = 8 * record_bytes(keys[0], raw)
    store = store_factory(str(tmp_path / "store"), max_bytes=max_bytes, durability="none")
    store.register_namespace(NS_A)
    for key in keys:
        assert store.put(NS_A, key, content(key, raw))
    usage = store.usage_bytes()
    before = store.counters.snapshot()
    too_big = max_bytes - record_bytes("huge", 0) + 1  # one byte over the whole budget
    assert store.put(NS_A, "huge", b"h" * too_big) is False
    after = store.counters.snapshot()
    assert after["no_space"] - before["no_space"] == 1
    # Nothing was sacrificed for a record that could never fit.
    assert after["evictions"] == before["evictions"]
    assert present(store, keys) == set(keys)
    assert store.usage_bytes() == usage == store_disk_bytes(store.root)
    assert temp_files(store.root) == []
    # A record of exactly the budget fits, by evicting everything else.
    exact = max_bytes - record_bytes("huge", 0)
    assert store.put(NS_A, "huge", b"h" * exact)
    assert store.usage_bytes() == max_bytes == store_disk_bytes(store.root)
    assert present(store, keys) == set()


def test_min_free_bytes_evicts_then_fails(store_factory, tmp_path, monkeypatch):
    """A simulated filesystem of `capacity` bytes holding only the store's files."""
    root = str(tmp_path / "store")
    raw = 20_000
    capacity = 400_000
    floor = 150_000
    with store_factory(root, min_free_bytes=floor, durability="none") as store:
        store.register_namespace(NS_A)
        monkeypatch.setattr(store.parts, "_free_bytes", lambda: capacity - store_disk_bytes(root))
        keys = [f"floor-{i:03d}" for i in range(30)]
        for key in keys:
            assert store.put(NS_A, key, content(key, raw))
            assert capacity - store_disk_bytes(root) >= floor
        evictions = store.counters.snapshot()["evictions"]
        assert evictions > 0
        survivors = present(store, keys)
        assert survivors == set(keys[-len(survivors) :])  # the oldest went first
        for key in survivors:
            assert checked_get(store, NS_A, key, content(key, raw))

        # Someone else fills the disk: below the floor whatever the store frees.
        monkeypatch.setattr(store.parts, "_free_bytes", lambda: floor - 1)
        before = store.counters.snapshot()
        assert store.put(NS_A, "late", content("late", raw)) is False
        after = store.counters.snapshot()
        assert after["no_space"] - before["no_space"] == 1
        assert after["evictions"] > before["evictions"]  # it tried to make room first
        assert not store.contains(NS_A, "late")
        assert temp_files(root) == []
        assert store.usage_bytes() == store_disk_bytes(root)
        monkeypatch.undo()
        assert StoreAdmin(store).check().clean


def test_budget_shared_by_two_processes(store_factory, tmp_path):
    root = str(tmp_path / "store")
    size = 20_000
    per_round = 15
    rounds = 20
    max_bytes = 30 * record_bytes("p0-r0-00", size)
    highest_disk = 0
    with children() as procs, store_factory(root, max_bytes=max_bytes, durability="none") as store:
        store.register_namespace(NS_A)
        child = spawn(
            "budget-writer",
            root,
            "--prefix",
            "p1",
            "--max-bytes",
            max_bytes,
            "--size",
            size,
            "--per-round",
            per_round,
            stdin=-1,
        )
        procs.append(child)
        assert read_line(child, 60) == "ready"
        for round_index in range(rounds):
            child.stdin.write(f"go {round_index}\n")
            child.stdin.flush()
            for index in range(per_round):
                key = f"p0-r{round_index}-{index}"
                assert store.put(NS_A, key, content(key, size))
                highest_disk = max(highest_disk, store_disk_bytes(root))
                assert store.usage_bytes() <= max_bytes
            done = json.loads(read_line(child, 60))
            assert done == {"round": round_index, "ok": per_round}
            assert store_disk_bytes(root) <= max_bytes  # both quiet: exact on-disk total
        child.stdin.write("quit\n")
        child.stdin.flush()
        child_stats = json.loads(read_line(child, 60))
        child.wait(timeout=30)
        assert child.returncode == 0
        assert highest_disk <= max_bytes
        assert child_stats["highest_disk"] <= max_bytes
        assert child_stats["highest_ledger"] <= max_bytes
        assert child_stats["evictions"] > 0 and store.counters.snapshot()["evictions"] > 0
        assert 2 * rounds * per_round * size > 3 * max_bytes  # really overfilled, together
        # Both processes' records are among the survivors, and they are intact.
        names = [os.path.basename(path) for path in record_files(root)]
        assert len(names) <= 30
        report = StoreAdmin(store).check()
        assert report.clean, report.as_dict()
        assert report.record_bytes <= max_bytes
        survivors = 0
        for prefix in ("p0", "p1"):
            for round_index in range(rounds):
                for index in range(per_round):
                    key = f"{prefix}-r{round_index}-{index}"
                    survivors += checked_get(store, NS_A, key, content(key, size))
        assert survivors == report.records


def test_a_prefix_chain_is_evicted_tail_first(tmp_path, store_factory):
    """Pages of a chain arrive head first; evicting the head would orphan the rest, so a
    put_many enters them tail first in the shared order (fifo.py) and the tail goes first.
    A chain read again is kept over pages never read (S3-FIFO: they leave through S)."""
    raw = 8_000
    chain = [f"chain-{i:02d}" for i in range(10)]
    size = record_bytes(chain[0], raw)
    store = store_factory(str(tmp_path / "store"), max_bytes=10 * size, durability="none")
    store.register_namespace(NS_A)
    assert store.put_many(NS_A, chain, [content(k, raw) for k in chain]) == [True] * 10
    for extra in ("extra-01", "extra-02", "extra-03"):
        assert store.put(NS_A, extra, content(extra, raw))
    assert present(store, chain) == set(chain[:7])
    # Read the surviving chain back: again the head ends up most recent.
    outs = [bytearray(raw) for _ in chain[:7]]
    assert store.get_many_into(NS_A, chain[:7], outs) == [True] * 7
    for extra in ("extra-04", "extra-05", "extra-06", "extra-07", "extra-08"):
        assert store.put(NS_A, extra, content(extra, raw))
    # The extras were never read: they leave before the chain that was.
    assert present(store, chain) == set(chain[:7])
    assert store.counters.snapshot()["evictions"] == 3 + 5


def test_check_fix_during_a_write_keeps_the_budget(tmp_path, monkeypatch, store_factory):
    """A write is held inside os.writev (a pause, not a fault) while check(fix=True) runs."""
    raw = 10_000
    size = record_bytes("k-00", raw)
    max_bytes = 10 * size
    root = str(tmp_path / "store")
    store = store_factory(root, max_bytes=max_bytes, durability="none")
    store.register_namespace(NS_A)
    for index in range(5):
        assert store.put(NS_A, f"k-{index:02d}", content(str(index), raw))
    real_writev = os.writev
    inside, release = threading.Event(), threading.Event()

    def held_writev(fd, buffers):
        if threading.current_thread().name == "held-writer":
            inside.set()
            release.wait(30)
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", held_writev)
    writer = threading.Thread(
        target=store.put, args=(NS_A, "k-99", content("x", raw)), name="held-writer"
    )
    writer.start()
    assert inside.wait(30)
    StoreAdmin(store).check(fix=True)
    release.set()
    writer.join(30)
    monkeypatch.undo()
    for index in range(5, 20):
        assert store.put(NS_A, f"k-{index:02d}", content(str(index), raw))
        assert store_disk_bytes(root) <= max_bytes


def test_a_batch_larger_than_the_room_stores_what_fits_in_order(tmp_path, store_factory):
    """The batch's bytes are reserved together when they fit; when they do not, record by
    record in order: the head of the chain is stored, the rest fails, nothing is evicted
    that could not make room, and the ledger matches the disk."""
    raw = 10_000
    keys = [f"chain-{index:02d}" for index in range(8)]
    size = record_bytes(keys[0], raw)
    root = str(tmp_path / "store")
    store = store_factory(root, max_bytes=5 * size, durability="none")
    store.register_namespace(NS_A)
    datas = [content(key, raw) for key in keys]
    assert store.put_many(NS_A, keys, datas) == [True] * 5 + [False] * 3
    assert store.accounting.order.reaper.wait_idle(10)
    assert present(store, keys) == set(keys[:5])
    assert store.usage_bytes() == store_disk_bytes(root) == 5 * size
    assert store.counters.snapshot()["no_space"] == 3
    # The next batch fits by evicting (a chain's tail goes first): reserved as a whole.
    more = [f"more-{index:02d}" for index in range(3)]
    assert store.put_many(NS_A, more, [content(k, raw) for k in more]) == [True] * 3
    assert store.accounting.order.reaper.wait_idle(10)
    assert present(store, keys + more) == set(keys[:2] + more)
    assert store.usage_bytes() == store_disk_bytes(root) <= 5 * size
    assert temp_files(root) == []


def test_records_removed_behind_the_stores_back_do_not_block_puts(store_factory, tmp_path):
    """An operator's `rm` of the records (test_e2e_galahad's eviction test does it) leaves the
    ledger claiming bytes no file holds. The open no longer recounts, so the full budget
    found nothing to evict and refused every put from then on. Now the first put that finds
    no record to evict recounts the ledger (rate-limited), and stores."""
    root = str(tmp_path / "store")
    page_bytes = record_bytes("k0", 4096)
    max_bytes = 4 * page_bytes
    with store_factory(root, max_bytes=max_bytes, durability="none") as store:
        store.register_namespace(NS_A)
        keys = [f"k{index}" for index in range(4)]
        assert store.put_many(NS_A, keys, [bytes(4096)] * 4) == [True] * 4
    for path in record_files(root):
        os.unlink(path)
    with store_factory(root, max_bytes=max_bytes, durability="none") as store:
        store.register_namespace(NS_A)
        assert store.usage_bytes() == 4 * page_bytes  # the ledger still claims them
        assert store.put(NS_A, "k9", bytes(4096))
        assert store.get(NS_A, "k9", 4096) == bytes(4096)
        assert store.usage_bytes() == store_disk_bytes(root) == page_bytes
        assert StoreAdmin(store).check().clean
