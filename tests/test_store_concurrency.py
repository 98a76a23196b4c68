"""Concurrency: many threads on one store, and several processes on one root."""

from __future__ import annotations

import json
import os
import random
import threading

import pytest
from support.records import store_disk_bytes, temp_files
from support.store_helpers import NS_A, checked_get, children, content, read_line, spawn

from hicache_galahad.store.admin import StoreAdmin

THREADS = 8


def overlapping_items(count: int = 64) -> dict:
    return {f"conc-{i}": content(f"conc-{i}", 1024 + (i * 3_001) % 65_536) for i in range(count)}


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_eight_threads_mixed_operations(tmp_path, compression, store_factory):
    root = str(tmp_path / "store")
    items = overlapping_items()
    keys = list(items)
    errors: list = []
    stats = {"hits": 0, "misses": 0, "puts_ok": 0}
    stats_lock = threading.Lock()
    start = threading.Barrier(THREADS)
    with store_factory(root, compression=compression, durability="none", io_threads=8) as store:
        store.register_namespace(NS_A)

        def worker(index: int) -> None:
            rng = random.Random(index)
            hits = misses = puts_ok = 0
            try:
                start.wait()
                # Every key is put at least once, by the thread it is dealt to, amid the rest.
                mine = keys[index::THREADS]
                for step in range(150):
                    roll = rng.random()
                    if step % 6 == 0 and mine:
                        batch = [mine.pop() for _ in range(min(len(mine), 2))]
                        batch += rng.sample(keys, 3)
                    else:
                        batch = rng.sample(keys, rng.randint(1, 8))
                    if roll < 0.35 or step % 6 == 0:
                        results = store.put_many(NS_A, batch, [items[k] for k in batch])
                        assert all(results), results
                        puts_ok += len(batch)
                    elif roll < 0.85:
                        outs = [bytearray(b"\x5a" * len(items[k])) for k in batch]
                        results = store.get_many_into(NS_A, batch, outs)
                        for key, out, ok in zip(batch, outs, results, strict=True):
                            if ok:
                                assert bytes(out) == items[key], f"torn read of {key}"
                                hits += 1
                            else:
                                misses += 1
                    else:
                        for key in batch:
                            if store.contains(NS_A, key):
                                # A record that exists is complete: it reads back exactly.
                                assert checked_get(store, NS_A, key, items[key])
                                hits += 1
                assert not mine
            except BaseException as error:  # reported by the main thread
                errors.append(error)
            with stats_lock:
                stats["hits"] += hits
                stats["misses"] += misses
                stats["puts_ok"] += puts_ok

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        if errors:
            raise errors[0]
        counters = store.counters.snapshot()
        assert counters["corrupt"] == counters["foreign"] == counters["io_errors"] == 0
        assert counters["puts_failed"] == 0
        assert counters["puts"] == len(keys)  # each record published exactly once
        assert stats["hits"] > 0
        # Nothing lost: every key is there and exact.
        outs = [bytearray(len(items[k])) for k in keys]
        assert store.get_many_into(NS_A, keys, outs) == [True] * len(keys)
        assert all(bytes(out) == items[k] for k, out in zip(keys, outs, strict=True))
        assert temp_files(root) == []
        assert store.usage_bytes() == store_disk_bytes(root)
        report = StoreAdmin(store).check()
        assert report.clean and report.records == len(keys), report.as_dict()


def test_two_store_instances_in_one_process_share_the_ledger(tmp_path, store_factory):
    """Two instances on one root (as two SGLang ranks in one process would be) racing on
    the same keys: each record published once, the shared ledger exact."""
    root = str(tmp_path / "store")
    items = overlapping_items(48)
    keys = list(items)
    first = store_factory(root, durability="none")
    second = store_factory(root, durability="none", compression="zstd")
    try:
        for store in (first, second):
            store.register_namespace(NS_A)
        errors = []

        def write(store, order):
            try:
                results = store.put_many(NS_A, order, [items[k] for k in order])
                assert all(results)
            except BaseException as error:
                errors.append(error)

        threads = [
            threading.Thread(target=write, args=(first, keys)),
            threading.Thread(target=write, args=(second, keys[::-1])),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        published = first.counters.snapshot()["puts"] + second.counters.snapshot()["puts"]
        assert published == len(keys)
        assert first.usage_bytes() == second.usage_bytes() == store_disk_bytes(root)
        for key, data in items.items():
            assert checked_get(first, NS_A, key, data)
            assert checked_get(second, NS_A, key, data)
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("durable", [1, 0], ids=["durable", "not-durable"])
def test_two_processes_write_same_and_different_keys(tmp_path, durable, store_factory):
    root = str(tmp_path / "store")
    go_file = str(tmp_path / "go")
    shared, own, size = 60, 40, 20_000
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)  # the namespace exists before the writers race
    with children() as procs:
        for prefix in ("w1", "w2"):
            procs.append(
                spawn(
                    "mixed-writer",
                    root,
                    "--prefix",
                    prefix,
                    "--shared",
                    shared,
                    "--own",
                    own,
                    "--size",
                    size,
                    "--go-file",
                    go_file,
                    "--durable",
                    durable,
                )
            )
        for process in procs:
            assert read_line(process, 60) == "ready"
        with open(go_file, "w"):
            pass
        results = []
        for process in procs:
            results.append(json.loads(read_line(process, 120)))
            process.wait(timeout=60)
            assert process.returncode == 0, process.stderr.read()
    for result in results:
        assert result["failed"] == []
        assert result["puts_failed"] == 0
    # Each shared key was published by exactly one of the two writers.
    assert sum(result["puts"] for result in results) == shared + 2 * own
    assert sum(result["puts_existing"] for result in results) == shared

    expected = {f"shared-{i}": size + i for i in range(shared)}
    for prefix in ("w1", "w2"):
        expected |= {f"{prefix}-{i}": size + i for i in range(own)}
    with store_factory(root) as reader:  # a fresh reader, alone on the root
        for key, key_size in expected.items():
            assert checked_get(reader, NS_A, key, content(key, key_size)), key
        report = StoreAdmin(reader).check()
        assert report.clean and report.records == len(expected), report.as_dict()
        assert os.listdir(os.path.join(root, "quarantine")) == []
