"""The ledger stays equal to the bytes on disk under concurrent eviction, restarts and a
SIGKILL (issue 24).

Four writer processes share one root under a byte budget small enough that nearly every put
evicts; each also opens (and closes) a second store on the root now and then, as a rank that
restarts does; one writer is SIGKILLed in the middle. Once every writer has stopped, the
ledger's committed bytes must equal, to the byte, the bytes of the record and quarantined
files on disk, counted independently here (an inode once) and by `check` (what `galahad
verify` reports). Before the fix it drifted both ways: a recount that ran while another
process had linked a record but not yet settled it counted that record twice, and one that
missed a record another process had just unlinked subtracted it twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.records import record_files
from support.store_helpers import helper_env

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.layout import QUARANTINE_DIRNAME

pytestmark = pytest.mark.slow
NAMESPACE = Namespace("truth", "model", "kv", {})

CHILD = r"""
import os, random, sys, time
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin

role, root, seed, max_bytes, stop_file = sys.argv[1:6]
rng, max_bytes = random.Random(int(seed)), int(max_bytes)
namespace = Namespace("truth", "model", "kv", {})
store = RecordStore(root, max_bytes=max_bytes, durability="none", io_threads=2)
store.register_namespace(namespace)
print("ready", flush=True)
while not os.path.exists(stop_file):
    if role == "restarts":  # a rank of this root restarting, and an operator's recount
        RecordStore(root, max_bytes=max_bytes, durability="none").close()
        StoreAdmin(store).rebuild_ledger()
        continue
    roll = rng.random()
    if roll < 0.8:  # new keys: nearly every put evicts
        batch = [f"{rng.randrange(10**12):064x}" for _ in range(rng.randint(2, 8))]
        datas = [os.urandom(rng.randint(1, 3) * 1024 + rng.randint(0, 99)) for _ in batch]
        store.put_many(namespace, batch, datas)
    elif roll < 0.9:
        store.get(namespace, f"{rng.randrange(3000):064x}", 2048)
    else:
        store.delete(namespace, f"{rng.randrange(3000):064x}")
store.close()
print("done", flush=True)
"""


def _accounted(info: os.stat_result) -> int:
    return min(info.st_size, info.st_blocks * 512)


def disk_bytes(root) -> int:
    """Record files and quarantined files, each inode once (as the budget counts them)."""
    sizes = {}
    for path in [*record_files(root), *Path(root, "quarantine").glob("*")]:
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            sizes[(info.st_dev, info.st_ino)] = _accounted(info)
    return sum(sizes.values())


def disk_counts(root) -> dict:
    """(records, bytes) of each namespace directory and of the quarantine (under
    QUARANTINE_DIRNAME), counted here: the ledger's per-namespace counts must equal them."""
    found = {}
    for directory in Path(root, "ns").iterdir():
        infos = []
        for path in directory.glob("*.rec"):
            with contextlib.suppress(FileNotFoundError):
                infos.append(os.lstat(path))
        infos = [info for info in infos if _accounted(info)]
        if infos:
            found[directory.name] = (len(infos), sum(_accounted(info) for info in infos))
    quarantined = [os.lstat(path) for path in Path(root, "quarantine").glob("*")]
    if quarantined:
        found[QUARANTINE_DIRNAME] = (len(quarantined), sum(map(_accounted, quarantined)))
    return found


def logical_bytes(root) -> int:
    """The page bytes every record's header declares (raw_len, at offset 24)."""
    total = 0
    for path in record_files(root):
        with open(path, "rb") as record:
            total += int.from_bytes(record.read(32)[24:32], "little")
    return total


def assert_counts_equal_disk(store, root) -> None:
    counts = store.accounting.ledger.namespace_counts()
    assert counts is not None, "the ledger's namespace counts are not complete"
    kept = {name: (count.records, count.disk_bytes) for name, count in counts.items()}
    assert kept == disk_counts(root)
    truth = logical_bytes(root)  # an estimate between recounts (deletions: the mean share)
    kept_logical = sum(count.logical_bytes for count in counts.values())
    assert abs(kept_logical - truth) <= truth // 10, (kept_logical, truth)


def _start(role, root, seed, max_bytes, stop_file) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, role, root, str(seed), str(max_bytes), str(stop_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=helper_env(),
    )
    assert process.stdout.readline().strip() == "ready", process.stderr.read()
    return process


def _finish(process: subprocess.Popen) -> None:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and "done" in out, err


@pytest.mark.parametrize("round_", range(2))
def test_ledger_equals_disk_after_four_writers_evicting_and_a_sigkill(
    store_factory, tmp_path, round_
):
    root = str(tmp_path / "root")
    # 3,000 records of 2 KiB first: a recount takes long enough for the writers to link and
    # unlink records while it runs (production size in miniature).
    with store_factory(root, durability="none") as store:
        store.register_namespace(NAMESPACE)
        for first in range(0, 3000, 300):
            keys = [f"{index:064x}" for index in range(first, first + 300)]
            assert all(store.put_many(NAMESPACE, keys, [os.urandom(2048)] * len(keys)))
        max_bytes = store.usage_bytes()
    stops = [tmp_path / "stop-restarts", tmp_path / "stop-writers"]
    processes = []
    try:
        processes.append(_start("restarts", root, 0, max_bytes, stops[0]))
        for seed in range(4):
            processes.append(_start("writer", root, 10 * round_ + seed, max_bytes, stops[1]))
        time.sleep(2.0)
        os.kill(processes[2].pid, signal.SIGKILL)  # mid-put, mid-eviction or mid-settle
        processes[2].wait(timeout=30)
        time.sleep(2.0)
        stops[0].touch()  # the last recount ran while the writers wrote
        _finish(processes[0])
        time.sleep(1.5)  # the writers go on (and take back the dead writer's reservation)
        stops[1].touch()
        for index in (1, 3, 4):
            _finish(processes[index])
    finally:
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
    with store_factory(root, read_only=True) as store:
        ledger = store.accounting.ledger.committed()
        report = StoreAdmin(store).check()
        assert_counts_equal_disk(store, root)  # per namespace, exactly (records and bytes)
    on_disk = disk_bytes(root)
    assert ledger == on_disk, f"ledger {ledger} B, disk {on_disk} B: drift {ledger - on_disk} B"
    assert report.ledger_drift_bytes == 0, report.as_dict()
    assert report.actual_bytes == on_disk


DIE_AMONG_LINKS = r"""
import os, signal, sys
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore

store = RecordStore(sys.argv[1], durability="none")
namespace = Namespace("truth", "model", "kv", {})
store.register_namespace(namespace)
real_link, linked = os.link, []

def link_then_die(*args, **kwargs):  # SIGKILL between the second link and the settle
    real_link(*args, **kwargs)
    linked.append(args[1])
    if len(linked) == 2:
        os.kill(os.getpid(), signal.SIGKILL)

os.link = link_then_die
store.put_many(namespace, [f"{i:064x}" for i in range(4)], [bytes([i]) * 5000 for i in range(4)])
"""


def test_a_writer_killed_among_its_links_is_counted_by_the_next_process(store_factory, tmp_path):
    """The kill lands between link(2) and the ledger's settle (injected: a SIGKILL at that
    instant cannot be timed for real). The journal the writer left in the ledger is how the
    next process counts the two records that were linked, exactly, without a recount."""
    root = str(tmp_path / "root")
    store_factory(root, durability="none").close()
    child = subprocess.run(
        [sys.executable, "-c", DIE_AMONG_LINKS, root], env=helper_env(), capture_output=True
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert len(record_files(root)) == 2
    with store_factory(root, durability="none") as store:
        assert store.stats().counter("ledger_rebuilds") == 0  # no recount: the journal did it
        assert store.accounting.ledger.committed() == disk_bytes(root)
        assert_counts_equal_disk(store, root)
        assert store.get(NAMESPACE, f"{1:064x}", 5000) == bytes([1]) * 5000
        report = StoreAdmin(store).check()
        store.accounting.repair.wait_for_sweep(30)  # the dead writer's temp files, in the back
    assert report.ledger_drift_bytes == 0, report.as_dict()
