"""Crash safety: a writer process SIGKILLed at random points, many times, over one store.

After every kill, the records of the key space that exist must read back byte-exact (a
record is published only complete), no record may be damaged, and the temp files the dead
writer left are reported by check(), removed by check(fix=True) or at the next lone open.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from support.records import record_files, store_disk_bytes, temp_files
from support.store_helpers import (
    NS_A,
    children,
    content,
    crash_keyspace,
    header_of,
    read_line,
    spawn,
)

from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin

KILLS = 25
KEYS = 160
MAX_BYTES = 16 * 2**20  # the key space holds ~24 MiB: the writer keeps evicting


def verify_keyspace(store: RecordStore, space) -> int:
    """Reads every key ever attempted; every hit must be exact. Returns the hit count."""
    hits = 0
    for key, size, compressible in space:
        expected = content(key, size, compressible)
        out = bytearray(b"\xa5" * size)
        if store.get_into(NS_A, key, out):
            assert bytes(out) == expected, f"damaged record served for {key!r}"
            hits += 1
    counters = store.counters.snapshot()
    assert counters["corrupt"] == 0, counters
    assert counters["foreign"] == 0, counters
    assert counters["io_errors"] == 0, counters
    assert counters["quarantined"] == 0, counters
    return hits


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["fsync", "deferred"])
def test_sigkilled_writer_never_leaves_a_damaged_record(store_factory, tmp_path, durability):
    root = str(tmp_path / "store")
    space = crash_keyspace(KEYS)
    rng = random.Random(20240601)
    hits_per_kill = []
    temps_seen = 0
    temps_removed_by_open = 0
    temps_removed_by_check = 0
    started = time.monotonic()
    with children() as procs:
        for kill in range(KILLS):
            # Odd rounds: a store stays open in this process while the writer runs, so the
            # writer is never alone and, after the kill, check(fix=True) must clean up.
            # Even rounds: nothing else is open; the next open is alone and cleans up.
            resident = store_factory(root, durability="none") if kill % 2 else None
            writer = spawn("crash-writer", root, "--seed", kill, "--keys", KEYS,
                           "--max-bytes", MAX_BYTES, "--durability", durability)  # fmt: skip
            procs.append(writer)
            assert read_line(writer, 60) == "ready"
            time.sleep(rng.uniform(0.05, 0.5))
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait(timeout=30)
            assert writer.returncode == -signal.SIGKILL

            left = sorted(temp_files(root))
            temps_seen += len(left)
            if resident is not None:
                report = StoreAdmin(resident).check()
                assert report.damaged == [], report.damaged
                assert sorted(report.stray_temp_files) == left  # all belong to the dead writer
                fixed = StoreAdmin(resident).check(fix=True)
                assert fixed.damaged == []
                temps_removed_by_check += len(fixed.stray_temp_files)
                report = StoreAdmin(resident).check()
                assert report.clean, report.as_dict()
                assert temp_files(root) == []
                hits_per_kill.append(verify_keyspace(resident, space))
                resident.close()
            else:
                with store_factory(root, durability="none") as fresh:  # alone: cleans after open
                    # (in the background: open scans none)
                    fresh.accounting.repair.wait_for_sweep(30)
                    assert temp_files(root) == []
                    removed = fresh.counters.snapshot()["stale_temp_removed"]
                    assert removed == len(left)
                    temps_removed_by_open += removed
                    report = StoreAdmin(fresh).check()
                    assert report.clean, report.as_dict()  # ledger reset to the disk's truth
                    hits_per_kill.append(verify_keyspace(fresh, space))
            assert store_disk_bytes(root) <= MAX_BYTES

    elapsed = time.monotonic() - started
    print(
        f"\ncrash test: {KILLS} kills in {elapsed:.1f} s; hits per kill {hits_per_kill}; "
        f"temp files left by killed writers {temps_seen} (removed by open "
        f"{temps_removed_by_open}, by check(fix=True) {temps_removed_by_check})"
    )
    assert sum(hits_per_kill) > 0 and max(hits_per_kill) >= 10  # the writer really wrote
    with store_factory(root) as final:
        report = StoreAdmin(final).check()
        assert report.damaged == [] and report.clean, report.as_dict()
        assert report.records == len(record_files(root)) == hits_per_kill[-1]
        # Some records really went through zstd (the writer mixes a compressing store).
        flags = [header_of(path).compressed for path in record_files(root)]
        assert any(flags) or len(flags) < 10
