"""Pins (store/pins/, issue 23): records eviction keeps, shared by every process on a root.

Real files and real processes throughout: eviction storms come from another process, pins
are killed with SIGKILL in the middle (at random moments, and at exact steps by a child that
kills itself after its Nth link(2): a moment no timing can hit reliably), and every check of
the counts is against what the disk holds.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from support.records import record_path, store_disk_bytes
from support.store_helpers import (
    NS_A,
    REPO_ROOT,
    TESTS_DIR,
    checked_get,
    children,
    content,
    count_directory_entries,
    helper_env,
    read_line,
)

from hicache_galahad.errors import ConfigError
from hicache_galahad.record import format as fmt
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.layout import record_filename
from hicache_galahad.store.pins import PinResult, document_id

NS_B = Namespace("tenant-b", "model-fp-1", "kv", NS_A.geometry)
RAW = 20_000


def record_bytes(key: str, raw: int = RAW) -> int:
    return fmt.FIXED_HEADER_BYTES + len(key.encode()) + raw


def fill(store: RecordStore, namespace: Namespace, keys, raw: int = RAW) -> dict:
    data = {key: content(key, raw) for key in keys}
    assert all(store.put_many(namespace, list(data), list(data.values())))
    return data


def pins_truth(root) -> dict[str, int]:
    """Pinned bytes per tenant from the disk: every pin file, its bytes and tenant, with the
    invariants of store/pins/ checked on the way (a pin file has a record link and at
    least one document's link; a record link has its pin file)."""
    truth: dict[str, int] = {}
    refs = os.path.join(root, "pins", "refs")
    records = os.path.join(root, "pins", "records")
    for dirname in os.listdir(refs) if os.path.isdir(refs) else []:
        for name in os.listdir(os.path.join(refs, dirname)):
            ref = os.path.join(refs, dirname, name)
            info = os.lstat(ref)
            assert info.st_nlink >= 2, f"a pin file no document links: {ref}"
            assert os.path.exists(os.path.join(records, dirname, name)), f"no record link: {ref}"
            with open(ref) as handle:
                data = json.load(handle)
            truth[data["t"]] = truth.get(data["t"], 0) + data["b"]
    for dirname in os.listdir(records) if os.path.isdir(records) else []:
        for name in os.listdir(os.path.join(records, dirname)):
            assert os.path.exists(os.path.join(refs, dirname, name)), f"a link with no pin: {name}"
    return truth


def state(root) -> dict:
    path = os.path.join(root, "pins", "state")
    if not os.path.exists(path):
        return {"tenants": {}, "journal": None}
    with open(path) as handle:
        return json.load(handle)


# ----------------------------------------------------------------------------- children

CHILD = r"""
import json, os, signal, sys
sys.path.insert(0, sys.argv[1])
from support.store_helpers import NS_A, content
from hicache_galahad.store import RecordStore

role, root = sys.argv[2], sys.argv[3]
if role == "storm":  # writes `total` bytes of other records under the budget
    max_bytes, total, raw = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    store = RecordStore(root, max_bytes=max_bytes, durability="none")
    store.register_namespace(NS_A)
    written = failed = 0
    index = 0
    while written < total:
        keys = [f"storm-{os.getpid()}-{index + i}" for i in range(4)]
        index += 4
        results = store.put_many(NS_A, keys, [content(k, raw) for k in keys])
        written += raw * results.count(True)
        failed += results.count(False)
    counters = store.counters.snapshot()
    store.close()
    print(json.dumps({"failed": failed, "evictions": counters["evictions"],
                      "no_space_pinned": counters.get("no_space_pinned", 0)}), flush=True)
elif role == "evictor":  # a long-lived process: "go N" writes N records, then reports
    max_bytes, raw = int(sys.argv[4]), int(sys.argv[5])
    store = RecordStore(root, max_bytes=max_bytes, durability="none")
    store.register_namespace(NS_A)
    print("ready", flush=True)
    index = 0
    for line in sys.stdin:
        count = int(line.split()[1])
        keys = [f"evictor-{index + i}" for i in range(count)]
        index += count
        for key in keys:
            store.put(NS_A, key, content(key, raw))
        print(json.dumps(store.counters.snapshot()), flush=True)
elif role == "pin":  # pins documents of `keys` in a loop; with `die_after`, SIGKILLs itself
    keys = json.loads(sys.argv[4])
    die_after = int(sys.argv[5])
    loops = int(sys.argv[6])
    if die_after >= 0:
        calls = [0]
        real_link, real_unlink = os.link, os.unlink
        def counted(real):
            def step(*args, **kwargs):
                if calls[0] == die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                calls[0] += 1
                return real(*args, **kwargs)
            return step
        os.link, os.unlink = counted(real_link), counted(real_unlink)
    store = RecordStore(root, durability="none")
    print("ready", flush=True)
    for loop in range(loops):
        store.pin(NS_A, keys[loop % 3::2], f"doc-{loop % 4}")
        if loop % 3 == 2:
            store.unpin(document=f"doc-{(loop + 1) % 4}")
        if loop % 4 == 1:  # a pinned record deleted: its pin is dropped
            store.delete(NS_A, keys[loop % len(keys)])
    print("done", flush=True)
"""


def child(*args, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, TESTS_DIR, *map(str, args)],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=helper_env(),
        cwd=REPO_ROOT,
    )


def child_json(*args, timeout_s: float = 120) -> dict:
    process = child(*args)
    out, err = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- the storm


def test_pinned_records_survive_a_storm_of_ten_budgets_from_another_process(
    store_factory, tmp_path
):
    root = str(tmp_path / "store")
    max_bytes = 1_000_000
    with store_factory(root, max_bytes=max_bytes, durability="none") as store:
        store.register_namespace(NS_A)
        pinned = fill(store, NS_A, [f"doc-page-{i}" for i in range(20)])  # ~400 KB
        result = store.pin(NS_A, list(pinned), "the corpus")
        assert result == PinResult(20, 0, [], [], sum(record_bytes(k) for k in pinned))
        assert store.pinned_bytes_by_tenant() == {"tenant-a": result.pinned_bytes}
    report = child_json("storm", root, max_bytes, 10 * max_bytes, RAW)
    assert report["evictions"] > 300 and report["failed"] == 0
    assert store_disk_bytes(root) <= max_bytes
    with store_factory(root, max_bytes=max_bytes, durability="none") as store:  # a restart
        for key, data in pinned.items():
            assert checked_get(store, NS_A, key, data), key
        assert store.pinned_bytes_by_tenant() == pins_truth(root)
        assert StoreAdmin(store).check().clean


def test_a_process_that_sampled_a_record_before_it_was_pinned_does_not_evict_it(
    store_factory, tmp_path
):
    """The other process's eviction pool may hold the record from before the pin: the check
    under the ledger's lock (a second link) keeps it."""
    root = str(tmp_path / "store")
    max_bytes = 400_000
    with store_factory(root, max_bytes=max_bytes, durability="none") as store:
        store.register_namespace(NS_A)
        old = fill(store, NS_A, [f"old-{i}" for i in range(10)])  # ~200 KB, the oldest
    with children() as started:
        evictor = child("evictor", root, max_bytes, RAW, stdin=subprocess.PIPE)
        started.append(evictor)
        assert read_line(evictor, 60) == "ready"
        evictor.stdin.write("go 12\n")  # past the budget: its pool now holds old records
        evictor.stdin.flush()
        before = json.loads(read_line(evictor, 60))
        with store_factory(root, max_bytes=max_bytes, durability="none") as store:
            kept = [key for key in old if store.contains(NS_A, key)][:5]
            assert len(kept) == 5 and before["evictions"] > 0
            assert store.pin(NS_A, kept, "kept").pinned_records == len(kept)
        evictor.stdin.write("go 60\n")
        evictor.stdin.flush()
        after = json.loads(read_line(evictor, 120))
        assert after["evictions"] - before["evictions"] > 20
    with store_factory(root, max_bytes=max_bytes, durability="none") as store:
        for key in kept:
            assert checked_get(store, NS_A, key, old[key])
    assert store_disk_bytes(root) <= max_bytes


# ----------------------------------------------------------------------------- the budget


def test_a_put_that_only_evicting_a_pin_could_fit_fails_and_is_counted(store_factory, tmp_path):
    root = str(tmp_path / "store")
    size = record_bytes("p-00")
    max_bytes = 10 * size
    with store_factory(
        root, max_bytes=max_bytes, max_pinned_bytes=max_bytes, durability="none"
    ) as store:
        store.register_namespace(NS_A)
        pinned = fill(store, NS_A, [f"p-{i:02d}" for i in range(9)])
        assert store.pin(NS_A, list(pinned), "nine").pinned_records == 9
        loose = fill(store, NS_A, ["l-00"])  # the budget is full now
        assert store.put(NS_A, "l-01", content("l-01", RAW))  # evicts l-00, the only loose one
        assert not store.contains(NS_A, "l-00")
        before = store.counters.snapshot()
        assert not store.put(NS_A, "big", content("big", 2 * RAW))  # only a pin would do
        after = store.counters.snapshot()
        assert after["no_space_pinned"] > before.get("no_space_pinned", 0)
        assert after["no_space"] == before["no_space"] + 1
        assert after["evictions"] == before["evictions"]  # nothing was evicted for it
        assert after.get("ledger_rebuilds", 0) == before.get("ledger_rebuilds", 0)
        assert store.contains(NS_A, "l-01") and all(store.contains(NS_A, k) for k in pinned)
        assert store.usage_bytes() == store_disk_bytes(root) <= max_bytes
        del loose


def test_pinning_past_max_pinned_bytes_is_refused_and_never_evicts(store_factory, tmp_path):
    root = str(tmp_path / "store")
    size = record_bytes("r-00")
    with store_factory(
        root, max_bytes=20 * size, max_pinned_bytes=5 * size, durability="none"
    ) as store:
        store.register_namespace(NS_A)
        data = fill(store, NS_A, [f"r-{i:02d}" for i in range(8)])
        result = store.pin(NS_A, list(data), "too much")
        assert result.pinned_records == 5 and result.pinned_bytes == 5 * size
        assert result.refused_keys == [f"r-{i:02d}" for i in range(5, 8)]
        assert store.counters.snapshot()["pins_refused"] == 3
        assert all(store.contains(NS_A, key) for key in data)  # nothing evicted
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 5 * size}
        with pytest.raises(ConfigError, match="max_pinned_bytes"):
            RecordStore(root, max_bytes=size, max_pinned_bytes=2 * size)
        with pytest.raises(ConfigError, match="max_pinned_bytes"):
            RecordStore(root, max_pinned_bytes="lots")
    with store_factory(root, max_bytes=20 * size, max_pinned_bytes=0) as store:
        assert store.pin(NS_A, ["r-07"], "none allowed").refused_keys == ["r-07"]


def test_the_default_limit_is_half_the_budget(store_factory, tmp_path):
    root = str(tmp_path / "store")
    size = record_bytes("h-00")
    with store_factory(root, max_bytes=10 * size, durability="none") as store:
        store.register_namespace(NS_A)
        data = fill(store, NS_A, [f"h-{i:02d}" for i in range(7)])
        assert store.pin(NS_A, list(data), "half").pinned_records == 5


# ----------------------------------------------------------------------------- unpinning


def test_unpin_by_document_tenant_and_all_releases_bytes_and_records_become_evictable(
    store_factory, tmp_path
):
    root = str(tmp_path / "store")
    size = record_bytes("a-00")
    max_bytes = 12 * size
    with store_factory(
        root, max_bytes=max_bytes, max_pinned_bytes=max_bytes, durability="none"
    ) as store:
        for namespace in (NS_A, NS_B):
            store.register_namespace(namespace)
        a = fill(store, NS_A, [f"a-{i:02d}" for i in range(4)])
        b = fill(store, NS_B, [f"a-{i:02d}" for i in range(4)])  # same keys, other tenant
        store.pin(NS_A, list(a)[:2], "first")
        store.pin(NS_A, list(a)[2:], "second")
        store.pin(NS_B, list(b), "first")  # one label, two tenants
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 4 * size, "tenant-b": 4 * size}
        assert store.unpin(document="first", tenant="tenant-b") == 4 * size
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 4 * size}
        assert store.unpin(document="second") == 2 * size
        assert store.unpin(tenant="tenant-a") == 2 * size
        assert store.pinned_bytes_by_tenant() == {} == pins_truth(root)
        store.pin(NS_A, list(a), "again")
        assert store.unpin(everything=True) == 4 * size
        assert store.pinned_bytes_by_tenant() == {} == pins_truth(root)
        assert os.listdir(os.path.join(root, "pins")) == sorted(["lock", "state"]) or set(
            os.listdir(os.path.join(root, "pins"))
        ) <= {"lock", "state", "docs"}
        # Evictable again: a storm takes them.
        for i in range(30):
            assert store.put(NS_A, f"after-{i}", content(f"after-{i}", RAW))
        assert not any(store.contains(NS_A, key) for key in a)
        assert not any(store.contains(NS_B, key) for key in b)


def test_two_documents_share_a_record_and_unpinning_one_keeps_it(store_factory, tmp_path):
    root = str(tmp_path / "store")
    size = record_bytes("s-00")
    max_bytes = 8 * size
    with store_factory(
        root, max_bytes=max_bytes, max_pinned_bytes=max_bytes, durability="none"
    ) as store:
        store.register_namespace(NS_A)
        data = fill(store, NS_A, ["s-00", "s-01", "s-02"])
        first = store.pin(NS_A, ["s-00", "s-01"], "one")
        second = store.pin(NS_A, ["s-01", "s-02"], "two")
        assert (first.pinned_bytes, second.pinned_bytes) == (2 * size, size)  # s-01 once
        assert second.pinned_records == 2
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 3 * size}
        assert store.unpin(document="one") == size  # s-00 only: s-01 stays for "two"
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 2 * size} == pins_truth(root)
        for i in range(20):
            store.put(NS_A, f"f-{i}", content(f"f-{i}", RAW))
        assert not store.contains(NS_A, "s-00")
        assert checked_get(store, NS_A, "s-01", data["s-01"])
        assert checked_get(store, NS_A, "s-02", data["s-02"])


def test_galahad_unpin_command(store_factory, tmp_path):
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        data = fill(store, NS_A, ["c-00", "c-01"])
        store.pin(NS_A, list(data), "cli doc")

    def galahad(*args):
        return subprocess.run(
            [sys.executable, "-m", "hicache_galahad", *args],
            capture_output=True,
            text=True,
            env=helper_env(),
            timeout=60,
        )

    refused = galahad("unpin", "--root", root)
    assert refused.returncode == 2 and "--document, --tenant or --all" in refused.stderr
    done = galahad("unpin", "--root", root, "--document", "cli doc", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "unpinned_bytes": 2 * record_bytes("c-00"),
        "pinned_bytes_by_tenant": {},
    }


# ----------------------------------------------------------------------------- records that leave


def test_quarantine_and_purge_of_a_pinned_record_drop_the_pin_and_its_bytes(
    store_factory, tmp_path
):
    root = str(tmp_path / "store")
    size = record_bytes("q-00")
    with store_factory(root, max_bytes=20 * size, durability="none") as store:
        store.register_namespace(NS_A)
        fill(store, NS_A, [f"q-{i:02d}" for i in range(4)])
        store.pin(NS_A, [f"q-{i:02d}" for i in range(4)], "doc")
        path = record_path(root, NS_A, "q-00")
        with open(path, "r+b") as record:  # damage: the read quarantines it
            record.seek(-1, os.SEEK_END)
            last = record.read(1)
            record.seek(-1, os.SEEK_END)
            record.write(bytes([last[0] ^ 0xFF]))
        assert store.get(NS_A, "q-00", RAW) is None
        assert store.counters.snapshot()["quarantined"] == 1
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 3 * size} == pins_truth(root)
        assert store.delete(NS_A, "q-01")
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 2 * size} == pins_truth(root)
        store.clear_namespace(NS_A)
        assert store.pinned_bytes_by_tenant() == {} == pins_truth(root)
        # The document still names the records that left: unpinning it is quiet and exact.
        assert store.unpin(document="doc") == 0
        assert not os.listdir(os.path.join(root, "pins", "docs"))
    purge = subprocess.run(
        [sys.executable, "-m", "hicache_galahad", "purge", "--root", root, "--tenant", "x"],
        capture_output=True,
        env=helper_env(),
        timeout=60,
    )
    assert purge.returncode == 0


def test_galahad_purge_by_tenant_drops_that_tenants_pins(store_factory, tmp_path):
    root = str(tmp_path / "store")
    size = record_bytes("g-00")
    with store_factory(root, durability="none") as store:
        for namespace in (NS_A, NS_B):
            store.register_namespace(namespace)
            fill(store, namespace, ["g-00", "g-01"])
            store.pin(namespace, ["g-00", "g-01"], "doc")
    purge = subprocess.run(
        [sys.executable, "-m", "hicache_galahad", "purge", "--root", root, "--tenant", "tenant-a"],
        capture_output=True,
        text=True,
        env=helper_env(),
        timeout=60,
    )
    assert purge.returncode == 0, purge.stderr
    with store_factory(root, durability="none") as store:
        assert store.pinned_bytes_by_tenant() == {"tenant-b": 2 * size} == pins_truth(root)


def test_purge_by_age_keeps_pinned_records_and_stats_shows_pinned_bytes(store_factory, tmp_path):
    """`purge --older-than` alone never removes a pinned record (the pin is the operator's
    word that it stays); `stats` shows the pinned bytes per tenant and the limit."""
    root = str(tmp_path / "store")
    size = record_bytes("o-00")
    with store_factory(root, max_bytes=40 * size, durability="none") as store:
        store.register_namespace(NS_A)
        data = fill(store, NS_A, [f"o-{i:02d}" for i in range(4)])
        store.pin(NS_A, ["o-00", "o-01"], "kept doc")
    old_s = time.time() - 3600
    for key in data:
        os.utime(record_path(root, NS_A, key), (old_s, old_s))

    def galahad(*args):
        done = subprocess.run(
            [sys.executable, "-m", "hicache_galahad", *args, "--root", root, "--json"],
            capture_output=True,
            text=True,
            env=helper_env(),
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    purged = galahad("purge", "--older-than", "10m")
    assert (purged["removed_records"], purged["kept_pinned_records"]) == (2, 2)
    with store_factory(root, durability="none") as store:
        assert [key for key in data if store.contains(NS_A, key)] == ["o-00", "o-01"]
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 2 * size} == pins_truth(root)
    budget = galahad("stats")["budget"]
    assert budget["pinned_bytes_by_tenant"] == {"tenant-a": 2 * size}


def test_a_dead_writers_temp_link_does_not_miscount_a_pin(store_factory, tmp_path):
    """A writer killed between its link(2) and the unlink of its temp file leaves the record
    with two links: the pin's count is its own pin file's, so pinning and unpinning it stay
    exact, and the sweep of the temp file changes nothing."""
    root = str(tmp_path / "store")
    size = record_bytes("t-00")
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        fill(store, NS_A, ["t-00"])
        path = record_path(root, NS_A, "t-00")
        temp = os.path.join(os.path.dirname(path), ".tmp-00000001deadbeef-0000-t.part")
        os.link(path, temp)
        assert store.pin(NS_A, ["t-00"], "doc").pinned_bytes == size
        os.unlink(temp)  # the sweep
        assert store.pinned_bytes_by_tenant() == {"tenant-a": size}
        assert store.unpin(document="doc") == size
        assert store.pinned_bytes_by_tenant() == {} == pins_truth(root)
        assert os.stat(path).st_nlink == 1


# ----------------------------------------------------------------------------- SIGKILL


def _check_after_kill(store_factory, root, keys, raw: int) -> None:
    with store_factory(root, durability="none") as store:
        counted = store.pinned_bytes_by_tenant()  # takes the lock: finishes the journal
        assert state(root)["journal"] is None
        assert counted == pins_truth(root)
        for key in keys:  # every record link is the record (a deleted record: no link)
            link = os.path.join(root, "pins", "records", NS_A.dirname, record_filename(key))
            if os.path.exists(link):
                assert os.stat(link).st_ino == os.stat(record_path(root, NS_A, key)).st_ino
        store.unpin(everything=True)
        assert store.pinned_bytes_by_tenant() == {} == pins_truth(root)
        present = [k for k in keys if os.path.exists(record_path(root, NS_A, k))]
        assert all(os.stat(record_path(root, NS_A, k)).st_nlink == 1 for k in present)
        assert store.usage_bytes() == store_disk_bytes(root)  # the ledger agrees too
        fill(store, NS_A, keys, raw=raw)  # the next run starts with every record


def test_a_pin_killed_at_every_step_leaves_exact_counts(store_factory, tmp_path):
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        keys = list(fill(store, NS_A, [f"k-{i:02d}" for i in range(6)], raw=2_000))
    steps = 0
    for die_after in range(0, 90, 2):
        _check_after_kill(store_factory, root, keys, 2_000)  # (and starts each run from no pins)
        process = child("pin", root, json.dumps(keys), die_after, 8)
        out, err = process.communicate(timeout=60)
        if process.returncode == 0:
            assert "done" in out
            break
        assert process.returncode == -signal.SIGKILL, err
        steps += 1
        _check_after_kill(store_factory, root, keys, 2_000)
    assert steps >= 10  # it really died in the middle, at many steps


def test_pins_killed_at_random_moments_and_reopened_stay_exact(store_factory, tmp_path):
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        keys = list(fill(store, NS_A, [f"m-{i:03d}" for i in range(60)], raw=1_000))
    rng = random.Random(23)
    for _ in range(6):
        process = child("pin", root, json.dumps(keys), -1, 10_000)
        try:
            assert read_line(process, 60) == "ready"
            time.sleep(rng.uniform(0.05, 0.4))
        finally:
            os.kill(process.pid, signal.SIGKILL)
            process.communicate(timeout=30)
        with store_factory(root, durability="none") as store:
            assert store.pinned_bytes_by_tenant() == pins_truth(root)
            assert state(root)["journal"] is None
    _check_after_kill(store_factory, root, keys, 1_000)


# ----------------------------------------------------------------------------- links


def test_a_linked_pins_directory_is_refused(store_factory, tmp_path):
    root = str(tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        fill(store, NS_A, ["x-00"])
    os.symlink(outside, os.path.join(root, "pins"))
    with pytest.raises(ConfigError, match="pins"):
        RecordStore(root, durability="none")
    os.unlink(os.path.join(root, "pins"))
    with store_factory(root, durability="none") as store:
        store.pin(NS_A, ["x-00"], "doc")
        refs = os.path.join(root, "pins", "refs")
        os.rename(refs, os.path.join(root, "pins", "refs-real"))
        os.symlink(outside, refs)  # a link below pins/, made while the store runs
        with pytest.raises(NotADirectoryError):
            store.pin(NS_A, ["x-00"], "other")
        with pytest.raises(NotADirectoryError):
            store.unpin(document="doc")
    assert os.listdir(outside) == []


def test_document_ids_are_plain_names():
    assert document_id("../../etc") == document_id("../../etc")
    assert "/" not in document_id("a/b") and len(document_id("x" * 10_000)) == 33


@pytest.mark.parametrize("damage", ["garbage", "missing", "negative"])
def test_a_damaged_or_missing_state_file_is_counted_again_from_the_pin_files(
    store_factory, tmp_path, damage
):
    root = str(tmp_path / "store")
    size = record_bytes("d-00")
    with store_factory(root, durability="none") as store:
        for namespace in (NS_A, NS_B):
            store.register_namespace(namespace)
            fill(store, namespace, ["d-00", "d-01", "d-02"])
        store.pin(NS_A, ["d-00", "d-01"], "one")
        store.pin(NS_B, ["d-02"], "two")
        # A pin killed midway without its journal: a pin file no document links.
        half = os.path.join(root, "pins", "refs", NS_A.dirname, record_filename("d-02"))
        with open(half, "w") as handle:
            handle.write(json.dumps({"b": size, "t": "tenant-a"}))
        os.link(
            record_path(root, NS_A, "d-02"),
            os.path.join(root, "pins", "records", NS_A.dirname, record_filename("d-02")),
        )
        path = os.path.join(root, "pins", "state")
        if damage == "garbage":
            with open(path, "wb") as handle:
                handle.write(b"\x00not json")
        elif damage == "missing":
            os.unlink(path)
        else:
            with open(path, "w") as handle:
                json.dump({"tenants": {"tenant-a": {"bytes": -5, "records": 1}}}, handle)
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 2 * size, "tenant-b": size}
        assert pins_truth(root) == {"tenant-a": 2 * size, "tenant-b": size}
        assert os.stat(record_path(root, NS_A, "d-02")).st_nlink == 1  # the half pin went
        assert store.unpin(everything=True) == 3 * size


def test_metrics_export_the_tenants_pinned_bytes(galahad):
    """The SGLang backend's get_stats sets galahad_pinned_bytes{tenant} (a real backend
    loaded through SGLang's factory, its metrics on)."""
    from prometheus_client import REGISTRY
    from support.records import chain_keys
    from support.sglang_pools import mha_pool, slots_of

    backend = galahad(mha_pool(), config={"metrics": True})
    keys = chain_keys(2, "pinned")
    assert backend.batch_set_v1(keys, slots_of([0, 1], 4)) == [True, True]
    result = backend.store.pin(backend.binder.kv().namespace, keys, "doc")
    assert result.pinned_records == 2
    backend.get_stats()
    labels = {"tenant": backend.options.tenant}
    assert REGISTRY.get_sample_value("galahad_pinned_bytes", labels) == result.pinned_bytes
    backend.store.unpin(everything=True)
    backend.get_stats()
    assert REGISTRY.get_sample_value("galahad_pinned_bytes", labels) == 0


def test_max_pinned_bytes_in_the_extra_config_is_checked_at_start():
    from hicache_galahad.config.options import parse_options

    options = parse_options({"max_bytes": "1MiB", "max_pinned_bytes": "256KiB"})
    assert options.store.max_pinned_bytes == options.store.pin_limit_bytes == 256 * 1024
    assert parse_options({"max_bytes": "1MiB"}).store.pin_limit_bytes == 512 * 1024
    assert parse_options({"max_pinned_bytes": None}).store.pin_limit_bytes is None
    for bad in ({"max_bytes": "1MiB", "max_pinned_bytes": "2MiB"}, {"max_pinned_bytes": -1}):
        with pytest.raises(ConfigError, match="'max_pinned_bytes'"):
            parse_options(bad)


@pytest.mark.parametrize("durability", ["fsync", "deferred"])
def test_durable_pins_round_trip(store_factory, tmp_path, durability):
    root = str(tmp_path / "store")
    with store_factory(root, durability=durability) as store:
        store.register_namespace(NS_A)
        data = fill(store, NS_A, ["u-00", "u-01"])
        assert store.pin(NS_A, list(data), "durable").pinned_records == 2
    with store_factory(root, durability=durability) as store:
        assert store.pinned_bytes_by_tenant() == pins_truth(root)
        assert store.unpin(tenant="tenant-a") == 2 * record_bytes("u-00")


def test_eviction_among_nine_pinned_records_in_ten_reads_a_bounded_few(
    store_factory, tmp_path, monkeypatch
):
    """Pinned records fill 90% of the budget and of the directory: each put still evicts a
    loose record after reading a bounded number of directory entries (the sample walks on
    past pinned files; no listing of the pins), and no pinned record goes."""
    root = str(tmp_path / "store")
    raw, count = 200, 3000
    size = record_bytes(f"{0:064x}", raw)
    max_bytes = count * size
    keys = [f"{i:064x}" for i in range(count)]
    with store_factory(
        root, max_bytes=max_bytes, max_pinned_bytes=max_bytes, durability="none"
    ) as store:
        store.register_namespace(NS_A)
        for start in range(0, count, 32):
            batch = keys[start : start + 32]
            assert all(store.put_many(NS_A, batch, [content(k, raw) for k in batch]))
        rng = random.Random(5)
        pinned = [key for key in keys if rng.random() < 0.9]
        assert store.pin(NS_A, pinned, "most").pinned_records == len(pinned)
    with store_factory(
        root, max_bytes=max_bytes, max_pinned_bytes=max_bytes, durability="none"
    ) as store:
        read = count_directory_entries(monkeypatch)
        most = 0
        for index in range(40):
            new = f"{count + index:064x}"
            read[0] = 0
            assert store.put(NS_A, new, content(new, raw))
            most = max(most, read[0])
        monkeypatch.undo()
        counters = store.counters.snapshot()
        assert counters["evictions"] >= 40
        assert counters.get("eviction_misses", 0) == 0  # the sample never offered a pin
        assert most <= 2_000, most
    with store_factory(root, durability="none") as store:
        assert all(store.contains(NS_A, key) for key in pinned)


def test_verify_fix_drops_the_pins_of_records_removed_by_hand(store_factory, tmp_path):
    root = str(tmp_path / "store")
    size = record_bytes("v-00")
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        fill(store, NS_A, ["v-00", "v-01"])
        store.pin(NS_A, ["v-00", "v-01"], "doc")
        os.unlink(record_path(root, NS_A, "v-00"))  # an operator's rm: the pin holds its bytes
        assert store.pinned_bytes_by_tenant() == {"tenant-a": 2 * size}
        StoreAdmin(store).check(fix=True)
        assert store.pinned_bytes_by_tenant() == {"tenant-a": size} == pins_truth(root)


def test_two_processes_pinning_and_unpinning_shared_records_at_once_stay_exact(
    store_factory, tmp_path
):
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        keys = list(fill(store, NS_A, [f"w-{i:02d}" for i in range(12)], raw=1_000))
    processes = [child("pin", root, json.dumps(keys), -1, 40) for _ in range(2)]
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0 and "done" in out, err
    with store_factory(root, durability="none") as store:
        assert store.pinned_bytes_by_tenant() == pins_truth(root)
        assert state(root)["journal"] is None


def test_the_pin_limit_is_among_a_live_servers_settings(store_factory, tmp_path):
    root = str(tmp_path / "store")
    with store_factory(root, max_bytes=1000, durability="none") as store:
        assert [s["max_pinned_bytes"] for s in StoreAdmin(store).live_settings()] == [500]
