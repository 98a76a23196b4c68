"""The eviction policy on the real store (issue 30, issue 32 items 2 and 8): what a full store
keeps is what SGLang can restore (leading runs, the same pages on every rank), pins stay,
and links that are not pins neither block eviction nor cause recounts."""

from __future__ import annotations

import hashlib
import os
import struct
import time
import zlib

from support.store_helpers import NS_A, count_directory_entries

from hicache_galahad.ops import reports
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.eviction import SampledLru
from hicache_galahad.store.fifo import EVICT_DIR, STATE_FILE, STATE_MAGIC, parse_state
from hicache_galahad.store.layout import record_filename

PAGE = 1024


def rank_namespace(rank: int, ranks: int, pool: str = "kv", tied: str | None = None):
    geometry = {"page_size": 16, "parallel": {"tp_rank": rank, "tp_size": ranks}}
    if tied is not None:
        geometry["kv_namespace"] = tied
    return Namespace("tenant", "fp", pool, geometry)


def document_keys(document: int, pages: int) -> list[str]:
    """Page keys chained as SGLang's: each hashes the one before."""
    keys, previous = [], b""
    for page in range(pages):
        previous = hashlib.sha256(previous + f"{document}/{page}".encode()).hexdigest().encode()
        keys.append(previous.decode())
    return keys


def record_bytes(root) -> int:
    with RecordStore(str(root), durability="none") as store:
        store.register_namespace(NS_A)
        store.put(NS_A, "0" * 64, bytes(PAGE))
        return store.usage_bytes()


def run_workload(store, namespaces, documents: int, pages: int) -> list[list[int]]:
    """The issue's workload, every rank in lockstep: documents written in batches of 8
    pages, every third one read again six documents later; the leading run of each document
    per rank at the end."""
    outs = [bytearray(PAGE) for _ in range(pages)]
    for document in range(documents):
        keys = document_keys(document, pages)
        for start in range(0, pages, 8):
            for namespace in namespaces:
                assert all(store.put_many(namespace, keys[start : start + 8], [bytes(PAGE)] * 8))
        again = document - 6
        if again >= 0 and again % 3 == 0:
            keys = document_keys(again, pages)
            for namespace in namespaces:
                run = store.leading_run(namespace, keys)
                store.get_many_into(namespace, keys[:run], outs[:run])
    return [
        [store.leading_run(namespace, document_keys(d, pages)) for d in range(documents)]
        for namespace in namespaces
    ]


def test_a_full_store_keeps_whole_leading_runs(tmp_path):
    """Sampled eviction kept 0.49 of the budget in leading runs here (60 x 32 at 985bc5c)."""
    documents, pages = 40, 16
    size = record_bytes(tmp_path / "probe")
    max_bytes = documents * pages * size // 4
    with RecordStore(str(tmp_path / "store"), max_bytes=max_bytes, durability="none") as store:
        namespace = store.register_namespace(NS_A)
        (runs,) = run_workload(store, [namespace], documents, pages)
    assert sum(runs) / (max_bytes // size) >= 0.95


def test_every_rank_keeps_the_same_pages(tmp_path):
    """Four rank namespaces and a state pool tied to rank 0's KV on one root and budget: a
    key is evicted from all of them at once, so what one rank restores every rank does
    (restorable, min over ranks, was 0.27 of a rank's share at 985bc5c)."""
    documents, pages, ranks = 24, 16, 4
    size = record_bytes(tmp_path / "probe")
    max_bytes = ranks * documents * pages * size // 4
    with RecordStore(str(tmp_path / "store"), max_bytes=max_bytes, durability="none") as store:
        kv = [store.register_namespace(rank_namespace(r, ranks)) for r in range(ranks)]
        state = store.register_namespace(rank_namespace(0, ranks, "mamba", kv[0].dirname))
        runs = run_workload(store, kv, documents, pages)
        for document in range(documents):  # states of the last page of every 8
            keys = document_keys(document, pages)
            held = [key for index, key in enumerate(keys) if store.contains(kv[0], key)]
            checkpoints = [key for key in keys[7::8] if key in held]
            if checkpoints:
                assert all(store.put_many(state, checkpoints, [bytes(PAGE)] * len(checkpoints)))
        # More documents push the old ones out: the states go with their KV pages.
        more = run_workload(store, kv, documents + 8, pages)
        for document in range(documents + 8):
            keys = document_keys(document, pages)
            present = [[store.contains(namespace, key) for key in keys] for namespace in kv]
            assert all(row == present[0] for row in present), document
            for index in range(7, pages, 8):
                if store.contains(state, keys[index]):
                    assert present[0][index], (document, index)
    share = documents * pages / 4
    restorable = sum(min(column) for column in zip(*runs, strict=True))
    assert restorable / share >= 0.9
    assert more  # (the second pass ran)


def test_pages_read_again_outlive_pages_never_read(tmp_path):
    """S3-FIFO: a scan of one-shot pages leaves through the small queue; a document read
    again (moved to the main queue) is kept whole."""
    size = record_bytes(tmp_path / "probe")
    with RecordStore(str(tmp_path / "store"), max_bytes=64 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)
        hot = document_keys(0, 16)
        assert all(store.put_many(namespace, hot, [bytes(PAGE)] * 16))
        assert store.get_many_into(namespace, hot, [bytearray(PAGE) for _ in hot]) == [True] * 16
        for document in range(1, 40):  # 10 budgets of pages nobody asks for again
            keys = document_keys(document, 16)
            assert all(store.put_many(namespace, keys, [bytes(PAGE)] * 16))
        assert store.leading_run(namespace, hot) == 16
        queues = StoreAdmin(store).eviction_queues()
        assert queues["main_bytes"] >= 16 * PAGE and queues["small_bytes"] > 0
        assert queues["ledger_bytes"] <= 64 * size


def test_a_page_read_again_and_again_within_the_touch_interval_stays(tmp_path):
    """A reader sets a record's modification time at most every RECENCY_INTERVAL_S (2 s), so
    a hot page read on every request, fast, had its use seen once: in the main queue it then
    looked unused at the hand and went as in a plain FIFO (bench_cache zipf_chat: 19 points
    below LRU). Every read is noted for the order (eviction.RecentReads). Here every document
    is read once after it is written (so the main queue fills and its hand turns), and the
    hot pages on every request: they all stay."""
    size = record_bytes(tmp_path / "probe")
    with RecordStore(str(tmp_path / "store"), max_bytes=64 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)

        def read(keys):
            return store.get_many_into(namespace, keys, [bytearray(PAGE) for _ in keys])

        hot = document_keys(0, 8)
        assert all(store.put_many(namespace, hot, [bytes(PAGE)] * 8))
        started_s = time.monotonic()
        previous = None
        for document in range(1, 61):  # 7.5 budgets
            keys = document_keys(document, 8)
            assert all(store.put_many(namespace, keys, [bytes(PAGE)] * 8))
            assert read(hot) == [True] * 8
            if previous is not None:
                read(previous)
            previous = keys
        assert time.monotonic() - started_s < 2.0, "slower than the touch interval: no test"
        assert store.leading_run(namespace, hot) == 8


def test_a_cold_chain_is_evicted_from_its_deepest_page(tmp_path):
    """The main queue is ordered by last read, a run's head nearest the tail: the document
    read longest ago goes first, from its deepest page, so what is left of it is a leading
    run. The hand used to move the pages it met used to M's tail in the order it met them
    (a batch is written tail first, the batches head first): a cold document lost its first
    pages and kept a tail no one can restore (bench_cache's zipf_chat: 5 points below LRU).
    And reads appended at a pass's own time were out of its walk, so a pass whose every
    entry was read since found no victim and the sampler chose (here: a hole in the
    document)."""
    size = record_bytes(tmp_path / "probe")
    with RecordStore(str(tmp_path / "store"), max_bytes=192 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)

        def write(keys):
            for start in range(0, len(keys), 8):
                assert all(store.put_many(namespace, keys[start : start + 8], [bytes(PAGE)] * 8))

        documents = [document_keys(document, 16) for document in range(12)]
        for keys in documents:
            write(keys)
        for keys in documents:  # the first is the least recently read
            outs = [bytearray(PAGE) for _ in keys]
            assert store.get_many_into(namespace, keys, outs) == [True] * 16
        write(document_keys(30, 8))
        held = [sum(store.contains(namespace, key) for key in keys) for keys in documents]
        runs = [store.leading_run(namespace, keys) for keys in documents]
        assert (held, runs) == ([8] + [16] * 11, [8] + [16] * 11), (held, runs)


def test_a_purge_by_age_keeps_a_record_pinned_after_its_scan(tmp_path, monkeypatch):
    """Issue 32 item 2: purge decided from its scan's link count and deleted with no check
    under the ledger's lock, so a record pinned between the scan and the deletion was lost."""
    with RecordStore(str(tmp_path / "store"), durability="none") as store:
        namespace = store.register_namespace(NS_A)
        keys = [f"k{index}" for index in range(6)]
        assert all(store.put_many(namespace, keys, [bytes(PAGE)] * 6))
        admin = StoreAdmin(store)
        scan = admin.record_files

        def scan_then_pin(dirnames=None, on_error=None):
            entries = list(scan(dirnames, on_error))  # every link count is 1 here
            result = store.pin(namespace, keys[:3], "doc")
            assert result.pinned_records == 3
            return entries

        monkeypatch.setattr(admin, "record_files", scan_then_pin)
        report = reports.purge(admin, older_than_s=-10)
        assert report.removed_records == 3
        assert [store.contains(namespace, key) for key in keys] == [True] * 3 + [False] * 3
        assert store.pinned_bytes_by_tenant()[NS_A.tenant] > 0


def test_a_sampled_victim_carries_what_it_was_when_sampled():
    """Issue 32 item 2: the expectation of a victim was one attribute shared by every thread
    (`_last_popped`); another thread's pop could replace it, and the deletion then skipped
    both checks. Now each victim carries its own."""
    samples = [
        [(("ns", f"r{i}.rec"), 10, 1_000 + i, 50 + i) for i in range(32)],
    ]
    index = SampledLru(lambda want: samples.pop() if samples else [], lambda: 10**6)
    first, second = index.pop_oldest(), index.pop_oldest()
    assert first[0] == ("ns", "r0.rec") and first[2] == (50, 1_000)
    assert second[0] == ("ns", "r1.rec") and second[2] == (51, 1_001)
    assert not hasattr(index, "popped_expectation")


def test_records_with_a_backup_link_stay_evictable_without_recounts(tmp_path):
    """Issue 32 item 8: a `cp -al` backup gives every record a second link. They counted as
    pinned: no record could be evicted (0 of 230 puts stored) and every put recounted the
    whole root every 10 s. A pin is what pins/ says it is."""
    root = tmp_path / "store"
    size = record_bytes(tmp_path / "probe")
    with RecordStore(str(root), max_bytes=32 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)
        old = [f"old{index}" for index in range(32)]
        assert all(store.put_many(namespace, old, [bytes(PAGE)] * 32))
    backup = tmp_path / "backup"
    backup.mkdir()
    directory = root / "ns" / NS_A.dirname
    for key in old:
        name = record_filename(key)
        os.link(directory / name, backup / name)
    with RecordStore(str(root), max_bytes=32 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)
        new = [f"new{index}" for index in range(40)]
        stored = [store.put(namespace, key, bytes(PAGE)) for key in new]
        assert all(stored)
        counters = store.counters.snapshot()
        assert counters.get("ledger_rebuilds", 0) == 0
        assert counters["evictions"] >= 32
        assert not any(store.contains(namespace, key) for key in old)  # the oldest went first
        assert store.accounting.order.reaper.wait_idle(10)
        assert store.usage_bytes() <= 32 * size
    assert len(os.listdir(backup)) == 32  # the backup's own links are untouched


def test_eviction_in_order_reads_no_directory(tmp_path, monkeypatch):
    """A put into a full budget evicts from the log: not one directory entry is read (the
    sampler it replaced read a few per victim; a scan reads every record)."""
    size = record_bytes(tmp_path / "probe")
    root = str(tmp_path / "store")
    with RecordStore(root, durability="none") as builder:
        namespace = builder.register_namespace(NS_A)
        keys = [f"{index:064x}" for index in range(2_000)]
        for start in range(0, len(keys), 500):
            assert all(builder.put_many(namespace, keys[start : start + 500], [bytes(PAGE)] * 500))
        full = builder.usage_bytes()
    entries_read = count_directory_entries(monkeypatch)
    with RecordStore(root, durability="none", max_bytes=full) as store:
        namespace = store.register_namespace(NS_A)
        entries_read[0] = 0
        for index in range(64):
            assert store.put_many(namespace, [f"{10**6 + index:064x}"], [bytes(PAGE)]) == [True]
        assert entries_read[0] == 0
        assert store.counters.snapshot()["evictions"] >= 64
        assert store.leading_run(namespace, keys[:64]) == 0  # the oldest went first
    assert full // size >= 2_000


def test_a_forged_eviction_log_removes_nothing_outside_the_namespaces(tmp_path):
    """The log names namespace directories by index into evict/names: a forged name there
    (a path out of ns/) is no namespace, so no file it reaches is judged or removed."""
    size = record_bytes(tmp_path / "probe")
    root = tmp_path / "store"
    outside = tmp_path / "outside"
    outside.mkdir()
    keys = [f"{index:064x}" for index in range(8)]
    with RecordStore(str(root), max_bytes=8 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)
        assert all(store.put_many(namespace, keys, [bytes(PAGE)] * 8))
    for key in keys:  # the same names, outside the root
        (outside / record_filename(key)).write_bytes(b"x")
    forged = os.path.relpath(outside, root / "ns").ljust(32, "/")[:32]
    assert len(forged) == 32 and forged.startswith("..")
    (root / "evict" / "names").write_bytes(forged.encode() + b"\n")
    with RecordStore(str(root), max_bytes=8 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)
        more = [f"{100 + index:064x}" for index in range(8)]
        assert all(store.put_many(namespace, more, [bytes(PAGE)] * 8))
    assert sorted(os.listdir(outside)) == sorted(record_filename(key) for key in keys)


def test_a_forged_far_tail_costs_a_put_nothing(tmp_path):
    """evict/state claiming the small queue's tail at segment 2^40 (its CRC right): the hand
    stepped one segment number at a time toward it, an unlink per step, under the ledger's
    lock, and the put into a full budget never returned. The hand now jumps to the next
    segment on disk."""
    size = record_bytes(tmp_path / "probe")
    root = tmp_path / "store"
    with RecordStore(str(root), max_bytes=16 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)
        assert all(store.put_many(namespace, document_keys(0, 16), [bytes(PAGE)] * 16))
    state = root / EVICT_DIR / STATE_FILE
    fields = parse_state(state.read_bytes())
    fields[2] = 1 << 40  # the small queue's tail segment
    body = struct.pack("<8s8q", STATE_MAGIC, *fields)
    state.write_bytes(body + struct.pack("<I", zlib.crc32(body)))
    with RecordStore(str(root), max_bytes=16 * size, durability="none") as store:
        namespace = store.register_namespace(NS_A)
        started = time.monotonic()
        for document in range(1, 5):  # past every entry the small queue holds on disk
            keys = document_keys(document, 16)
            assert all(store.put_many(namespace, keys, [bytes(PAGE)] * 16))
        assert time.monotonic() - started < 10
        assert store.leading_run(namespace, keys) == 16
        assert store.usage_bytes() <= 16 * size
