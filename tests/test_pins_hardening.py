"""Pins under attack (issue 32): planted hard links at temp names (item 1), a read that must
not wait for the pins lock (item 4), a hostile `pins/state` (item 6), the pin limit of a root
whoever pins (item 9, the store's side), and a purge of pinned records in batches (item 10).

Each test fails on the code before the fix (run against fd5324f: 985bc5c with only
layout.create_temp added) and passes after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from support.records import flip_byte, record_path, store_disk_bytes
from support.store_helpers import NS_A, content, helper_env, read_line
from test_pins import NS_B, RAW, fill, pins_truth, record_bytes

from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.pins import document_id

READ_BOUND_S = 10.0  # a read of a damaged pinned record returns within this (the lock: 600 s)


def galahad(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hicache_galahad", *args],
        capture_output=True,
        text=True,
        env=helper_env(),
        timeout=120,
    )


def temp_names(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


# ----------------------------------------------------------------------------- item 1


def test_planted_hard_links_at_the_pins_temp_names_are_never_written(store_factory, tmp_path):
    """A hard link to a file outside the root, planted at the temp name the state file and a
    manifest were written through (state.<token>.tmp, manifest.json.<token>.tmp, the token
    being readable in procs/), is never truncated or written: every temp file is created
    exclusively under a random name."""
    root = str(tmp_path / "store")
    outside = tmp_path / "precious"
    outside.write_bytes(b"outside the root\n")
    with store_factory(root, durability="none") as store:
        for namespace in (NS_A, NS_B):
            store.register_namespace(namespace)
            fill(store, namespace, ["h-00", "h-01"])
        store.pin(NS_A, ["h-00"], "doc")
        token = store.accounting.token
        pins = os.path.join(root, "pins")
        doc = os.path.join(pins, "docs", document_id("doc"))
        os.link(outside, os.path.join(pins, f"state.{token}.tmp"))
        os.link(outside, os.path.join(doc, f"manifest.json.{token}.tmp"))
        store.pin(NS_B, ["h-00", "h-01"], "doc")  # the state and the manifest replaced
        assert outside.read_bytes() == b"outside the root\n"
        assert store.unpin(document="doc", tenant="tenant-b") == 2 * record_bytes("h-00")
        assert store.pinned_bytes_by_tenant() == {"tenant-a": record_bytes("h-00")}
        assert outside.read_bytes() == b"outside the root\n"
        assert os.stat(outside).st_nlink == 1  # the planted links were removed (never used)
        assert temp_names(pins) == [] and temp_names(doc) == []
        assert store.unpin(everything=True) == record_bytes("h-00")
    assert outside.read_bytes() == b"outside the root\n"


def test_temp_files_left_by_a_killed_writer_are_removed(store_factory, tmp_path):
    """A process killed between creating a temp file and renaming it leaves one under a
    random name: the next holder of the pins lock removes it."""
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        fill(store, NS_A, ["s-00", "s-01"])
        store.pin(NS_A, ["s-00"], "doc")
        pins = os.path.join(root, "pins")
        doc = os.path.join(pins, "docs", document_id("doc"))
        for directory, prefix in ((pins, "state."), (doc, "manifest.json.")):
            with open(os.path.join(directory, f"{prefix}0123456789abcdef.tmp"), "w") as left:
                left.write("{half")
        store.pin(NS_A, ["s-01"], "doc")
        assert temp_names(pins) == [] and temp_names(doc) == []
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 2 * record_bytes("s-00")}


# ----------------------------------------------------------------------------- item 4

LOCK_HOLDER = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


def test_a_read_of_a_damaged_pinned_record_never_waits_for_the_pins_lock(store_factory, tmp_path):
    """Another process holds pins/lock (as a suspended `warm --pin` does): a read of a
    damaged pinned record quarantines it and returns a miss at once; its pin is dropped
    once the lock is free, and the counts are exact."""
    root = str(tmp_path / "store")
    size = record_bytes("r-00")
    with store_factory(root, max_bytes=20 * size, durability="none") as store:
        store.register_namespace(NS_A)
        fill(store, NS_A, ["r-00", "r-01"])
        store.pin(NS_A, ["r-00", "r-01"], "doc")
        flip_byte(record_path(root, NS_A, "r-00"))
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, os.path.join(root, "pins", "lock")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert read_line(holder, 30) == "locked"
            answer: list = []
            reader = threading.Thread(target=lambda: answer.append(store.get(NS_A, "r-00", RAW)))
            started = time.monotonic()
            reader.start()
            reader.join(READ_BOUND_S)
            assert not reader.is_alive(), "the read waited for the pins lock"
            assert answer == [None] and time.monotonic() - started < READ_BOUND_S
            assert store.counters.snapshot()["quarantined"] == 1
        finally:
            holder.kill()
            holder.wait()
        reader.join(60)
        deadline = time.monotonic() + 30
        while store.pinned_bytes_by_tenant(cached=True) != {"tenant-a": size}:
            assert time.monotonic() < deadline, "the deferred drop never happened"
            time.sleep(0.05)
        assert store.pinned_bytes_by_tenant() == {"tenant-a": size} == pins_truth(root)
        assert store.usage_bytes() == store_disk_bytes(root)


# ----------------------------------------------------------------------------- item 6

OUTSIDE_STATE = {"tenants": {"tenant-a": {"bytes": 7, "records": 1}}, "journal": None}


def _plant_state(root, variant: str, tmp_path) -> None:
    path = os.path.join(root, "pins", "state")
    if os.path.lexists(path):
        os.unlink(path)
    if variant == "fifo":
        os.mkfifo(path)
        return
    if variant == "symlink":
        outside = tmp_path / "outside-state"
        outside.write_text(json.dumps(OUTSIDE_STATE))
        os.symlink(outside, path)
        return
    text = {
        "inf": '{"tenants": {"tenant-a": {"bytes": 1e999, "records": 1}}, "journal": null}',
        "deep": '{"tenants": {"tenant-a": ' + "[" * 100_000 + "]" * 100_000 + "}}",
        "journal": json.dumps(
            {
                "tenants": {},
                "journal": {
                    "op": "pin",
                    "doc": 5,
                    "items": [
                        [1, 2, "new", "x", []],
                        "junk",
                        [NS_A.dirname, "k" * 64 + ".rec", "last", {"a": 1}, ["t"]],
                    ],
                },
            }
        ),
        "huge": json.dumps(
            {"tenants": {"tenant-a": {"bytes": 10**30, "records": 1}}, "journal": None}
        ),
    }[variant]
    with open(path, "w") as handle:
        handle.write(text)


VARIANTS = ["inf", "deep", "journal", "huge", "fifo", "symlink"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_hostile_state_file_never_raises_and_is_repaired(store_factory, tmp_path, variant):
    root = str(tmp_path / "store")
    size = record_bytes("p-00")
    with store_factory(root, max_bytes=10 * size, durability="none") as store:
        store.register_namespace(NS_A)
        fill(store, NS_A, [f"p-{i:02d}" for i in range(8)])
        assert store.pin(NS_A, ["p-00", "p-01"], "doc").pinned_records == 2
        truth = {"tenant-a": 2 * size}
        # A batch that needs eviction: it is stored (unpinned records make room), and the
        # ledger equals the disk afterwards (no reservation leaked).
        _plant_state(root, variant, tmp_path)
        keys = [f"n-{i:02d}" for i in range(6)]
        assert all(store.put_many(NS_A, keys, [content(k, RAW) for k in keys]))
        assert store.usage_bytes() == store_disk_bytes(root)
        assert store.contains(NS_A, "p-00") and store.contains(NS_A, "p-01")
        _plant_state(root, variant, tmp_path)
        store.pinned_bytes_by_tenant(cached=True)  # never raises
        assert store.pinned_bytes_by_tenant() == truth == pins_truth(root)
        _plant_state(root, variant, tmp_path)
        assert store.pin(NS_A, ["n-00"], "doc").pinned_records == 1
        truth = {"tenant-a": 3 * size}
        assert store.pinned_bytes_by_tenant() == truth == pins_truth(root)
    _plant_state(root, variant, tmp_path)
    stats = galahad("stats", "--root", root, "--json")
    assert stats.returncode == 0, stats.stderr
    _plant_state(root, variant, tmp_path)
    repair = galahad("unpin", "--root", root, "--tenant", "nobody", "--json")
    assert repair.returncode == 0, repair.stderr
    assert json.loads(repair.stdout)["pinned_bytes_by_tenant"] == truth == pins_truth(root)
    _plant_state(root, variant, tmp_path)
    everything = galahad("unpin", "--root", root, "--all", "--json")
    assert everything.returncode == 0, everything.stderr
    assert json.loads(everything.stdout)["pinned_bytes_by_tenant"] == {} == pins_truth(root)
    if variant == "symlink":
        assert json.loads((tmp_path / "outside-state").read_text()) == OUTSIDE_STATE
    with store_factory(root, durability="none") as store:
        assert store.usage_bytes() == store_disk_bytes(root)


# ----------------------------------------------------------------------------- item 9


def test_the_pin_limit_of_a_live_store_binds_a_process_without_one(store_factory, tmp_path):
    """A server with max_pinned_bytes is open on the root; a `warm --pin` process that could
    not read the server's configuration (no limit of its own) pins within the server's
    limit, and after the server is gone, within the last limit applied on the root."""
    root = str(tmp_path / "store")
    size = record_bytes("l-00")
    keys = [f"l-{i:02d}" for i in range(8)]
    with store_factory(root, max_bytes=20 * size, max_pinned_bytes=3 * size) as server:
        server.register_namespace(NS_A)
        fill(server, NS_A, keys)
        with store_factory(root, durability="none") as warm:
            result = warm.pin(NS_A, keys[:5], "doc")
            assert result.pinned_records == 3 and len(result.refused_keys) == 2
            assert warm.pinned_bytes_by_tenant() == {"tenant-a": 3 * size}
    with store_factory(root, durability="none") as warm:
        assert warm.pin(NS_A, keys[5:], "other").refused_keys == keys[5:]
        assert warm.pinned_bytes_by_tenant() == {"tenant-a": 3 * size} == pins_truth(root)
    with store_factory(root, max_pinned_bytes=5 * size, durability="none") as raised:
        assert raised.pin(NS_A, keys[5:], "other").pinned_records == 2  # its own limit


# ----------------------------------------------------------------------------- item 10


def test_purging_a_tenants_pinned_records_drops_their_pins_in_batches(
    store_factory, tmp_path, monkeypatch
):
    """Each pin drop was its own locked, journaled change (two replacements of pins/state
    per record): a purge by tenant drops them in one locked change per batch."""
    root = str(tmp_path / "store")
    count = 600
    keys = [f"b-{i:04d}" for i in range(count)]
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        fill(store, NS_A, keys, raw=64)
        assert store.pin(NS_A, keys, "doc").pinned_records == count
    from hicache_galahad.ops.reports import purge

    replaced: list[str] = []
    real_rename = os.rename

    def rename(source, target, *args, **kwargs):
        if target == "state":
            replaced.append(source)
        return real_rename(source, target, *args, **kwargs)

    with store_factory(root, durability="none") as store:
        monkeypatch.setattr(os, "rename", rename)
        report = purge(StoreAdmin(store), tenant="tenant-a")
        monkeypatch.undo()
        assert report.removed_records == count
        assert store.pinned_bytes_by_tenant() == {} == pins_truth(root)
        assert store.usage_bytes() == store_disk_bytes(root)
    assert 0 < len(replaced) <= 2 * (count // 256 + 1) + 2
