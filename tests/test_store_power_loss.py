"""Deferred durability and a simulated power loss.

In the default "deferred" mode a put returns once its record is published, and a background
flusher fsyncs it within flush_interval_s. A power loss before that may leave the record as a
filesystem does: truncated, zero-filled, torn or gone. Every such record must be a miss (never
a wrong byte), and `galahad verify --fix` must clean them up."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.store_helpers import NS_A, content

from hicache_galahad.store import RecordStore
from hicache_galahad.store.layout import record_filename

REPO_ROOT = Path(__file__).resolve().parent.parent
SIZE = 48 * 1024


def keys(count: int) -> list[str]:
    return [f"power-{index}" for index in range(count)]


def truncated(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(0, len(data))]


def zero_filled(data: bytes, rng: random.Random) -> bytes:
    return bytes(len(data))  # the size was committed, the data blocks were not


def torn(data: bytes, rng: random.Random) -> bytes:
    cut = rng.randrange(1, len(data) // 4096 + 1) * 4096  # pages after `cut` never written
    return data[:cut] + bytes(len(data) - cut)


def stale_blocks(data: bytes, rng: random.Random) -> bytes:
    cut = rng.randrange(1, len(data) // 4096 + 1) * 4096
    return data[:cut] + rng.randbytes(len(data) - cut)  # blocks of an older file


LOSSES = (truncated, zero_filled, torn, stale_blocks)


def test_unflushed_records_lost_in_a_power_failure_are_misses_and_verify_fix_cleans_them(
    tmp_path, store_factory
):
    root = tmp_path / "store"
    rng = random.Random(7)
    # Not the fixture's: this store loses its power and is never closed.
    store = RecordStore(str(root), durability="deferred", flush_interval_s=3600)
    store.register_namespace(NS_A)
    flushed, unflushed = keys(40)[:20], keys(40)[20:]
    assert all(store.put_many(NS_A, flushed, [content(k, SIZE) for k in flushed]))
    assert store.flusher.flush() == 20 and store.flusher.pending == 0
    assert all(store.put_many(NS_A, unflushed, [content(k, SIZE) for k in unflushed]))
    assert store.flusher.pending == 20
    # The power fails: the process is gone without closing, and the page cache held the
    # unflushed records' data. A filesystem may bring each back in any of these states.
    directory = root / "ns" / NS_A.dirname
    lost = {}
    for index, key in enumerate(unflushed):
        path = directory / record_filename(key)
        if index % 5 == 4:
            path.unlink()
            lost[key] = "gone"
            continue
        damage = LOSSES[index % len(LOSSES)]
        path.write_bytes(damage(path.read_bytes(), rng))
        lost[key] = damage.__name__
    store.flusher._stop.set()  # no close: nothing more is written

    found = _galahad("verify", "--root", root, "--json")
    report = json.loads(found.stdout)
    assert found.returncode == 1
    assert len(report["damaged"]) == sum(1 for damage in lost.values() if damage != "gone")
    assert _galahad("verify", "--root", root, "--fix").returncode == 1
    clean = _galahad("verify", "--root", root, "--json")
    assert clean.returncode == 0 and json.loads(clean.stdout)["clean"], clean.stdout

    with store_factory(root, durability="deferred") as after_reboot:
        for key in flushed:
            assert after_reboot.get(NS_A, key, SIZE) == content(key, SIZE)
        for key in unflushed:
            assert after_reboot.get(NS_A, key, SIZE) is None, f"{lost[key]} {key} served"
        assert all(after_reboot.put_many(NS_A, unflushed, [content(k, SIZE) for k in unflushed]))
        for key in unflushed:  # and the keys are usable again
            assert after_reboot.get(NS_A, key, SIZE) == content(key, SIZE)


def test_reads_of_records_damaged_by_a_power_loss_are_misses(tmp_path, store_factory):
    root = tmp_path / "store"
    rng = random.Random(11)
    with store_factory(root, check=False, flush_interval_s=3600) as store:  # damaged on purpose
        store.register_namespace(NS_A)
        assert all(store.put_many(NS_A, keys(12), [content(k, SIZE) for k in keys(12)]))
        directory = root / "ns" / NS_A.dirname
        for index, key in enumerate(keys(12)):
            path = directory / record_filename(key)
            path.write_bytes(LOSSES[index % len(LOSSES)](path.read_bytes(), rng))
        for key in keys(12):
            out = bytearray(SIZE)
            assert not store.get_into(NS_A, key, out)
        counters = store.counters.snapshot()
        assert counters["hits"] == 0 and counters["corrupt"] == 12


def test_the_flusher_makes_records_durable_within_its_window(store_factory):
    with store_factory(flush_interval_s=0.2) as store:
        store.register_namespace(NS_A)
        assert all(store.put_many(NS_A, keys(10), [content(k, 4096) for k in keys(10)]))
        deadline = time.monotonic() + 10
        while store.flusher.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.flusher.pending == 0
        assert store.counters.snapshot()["flushed_records"] == 10


def test_close_flushes_what_is_pending(store_factory):
    store = store_factory(flush_interval_s=3600)
    store.register_namespace(NS_A)
    assert store.put(NS_A, "k", content("k", 4096))
    assert store.flusher.pending == 1
    store.close()
    assert store.counters.snapshot()["flushed_records"] == 1


@pytest.mark.parametrize("durability", ["deferred", "fsync"])
def test_a_put_is_readable_as_soon_as_it_returns(store_factory, durability):
    with store_factory(durability=durability) as store:
        store.register_namespace(NS_A)
        assert store.put(NS_A, "k", content("k", SIZE))
        with store_factory(durability=durability) as other:
            assert other.get(NS_A, "k", SIZE) == content("k", SIZE)


def _galahad(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hicache_galahad", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
