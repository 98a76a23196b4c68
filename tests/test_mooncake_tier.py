"""MooncakeTier against a real Mooncake master and store daemon on loopback (no mocks).

Faults are real: the master or the daemon is SIGKILLed, SIGSTOPped or restarted, and the
daemon's memory is made too small. In every case the tier answers within its timeout, never
raises, counts what happened and recovers when Mooncake does.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bench.mooncake_cluster import (
    ENV,
    MooncakeCluster,
    RawClient,
    mooncake_cluster_fixture,
    skip_unless_mooncake,
)
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.tier.mooncake.buffers import ReadBuffer, chunks, read_only
from hicache_galahad.tier.mooncake.tier import MooncakeConfigError, MooncakeOptions, MooncakeTier

REPO = Path(__file__).resolve().parents[1]
KIB, MIB = 1 << 10, 1 << 20

cluster = mooncake_cluster_fixture()
small_cluster = mooncake_cluster_fixture(segment_bytes=16 * MIB)


def wait_until(predicate, timeout_s: float, step_s: float = 0.05) -> float:
    """Seconds until predicate() held; fails the test after timeout_s."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(step_s)
    return time.monotonic() - start


@pytest.fixture
def make_tier():
    """Builds tiers and closes every one of them after the test, also on failure."""
    tiers = []

    def make(cluster_: MooncakeCluster, **overrides) -> MooncakeTier:
        tier = MooncakeTier(MooncakeOptions.from_config(cluster_.tier_config(**overrides)))
        tiers.append(tier)
        return tier

    yield make
    for tier in tiers:
        tier.close(timeout_s=3)


def connected(make_tier, cluster_, **overrides) -> MooncakeTier:
    tier = make_tier(cluster_, **overrides)
    wait_until(lambda: tier.available, 10)
    return tier


def put_all(tier: MooncakeTier, items: dict[str, bytes]) -> None:
    for key, value in items.items():
        assert tier.put_async(key, value)
    assert tier.flush(10)


# -- options ------------------------------------------------------------------------------------

ISSUE_EXAMPLE = {
    "master_server_address": "127.0.0.1:50551",
    "metadata_server": "P2PHANDSHAKE",
    "protocol": "tcp",
    "local_hostname": "127.0.0.1",
    "global_segment_size": 0,
    "local_buffer_size": 268435456,
    "timeout_s": 2,
}


def test_options_accept_the_issue_example():
    options = MooncakeOptions.from_config(ISSUE_EXAMPLE)
    assert options.master_server_address == "127.0.0.1:50551"
    assert options.local_buffer_size == 256 * MIB
    assert options.timeout_s == 2.0
    assert options.queue_max_bytes == 256 * MIB
    sized = MooncakeOptions.from_config(dict(ISSUE_EXAMPLE, queue_max_bytes="1GiB"))
    assert sized.queue_max_bytes == 1 << 30
    http = dict(ISSUE_EXAMPLE, metadata_server="http://10.0.0.1:8580/metadata")
    assert MooncakeOptions.from_config(http).endpoints()[1] == ("10.0.0.1", 8580)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("master_server_address", "127.0.0.1", "'host:port'"),
        ("master_server_address", "etcd://x:2379", "'host:port'"),
        ("metadata_server", "etcd://10.0.0.1:2379", "P2PHANDSHAKE"),
        ("protocol", "udp", "'tcp' or 'rdma'"),
        ("local_hostname", "", "this node's address"),
        ("global_segment_size", -1, "byte count"),
        ("local_buffer_size", "lots", "byte count"),
        ("timeout_s", 0, "seconds"),
        ("timeout_s", True, "seconds"),
        ("queue_max_bytes", 0, "byte count"),
        ("transfer_buffer_bytes", 1024, "byte count"),
        ("integrity_key_file", "", "32 random bytes"),
        ("integrity_key_file", 7, "32 random bytes"),
        ("tenant_id", "a", "one of the keys"),
    ],
)
def test_options_reject_bad_values_naming_key_value_and_expectation(key, value, expected):
    with pytest.raises(MooncakeConfigError) as caught:
        MooncakeOptions.from_config(dict(ISSUE_EXAMPLE, **{key: value}))
    message = str(caught.value)
    assert repr(key) in message and repr(value) in message and expected in message
    assert isinstance(caught.value, ValueError)


def test_options_require_master_and_hostname_and_an_object():
    for key in ("master_server_address", "local_hostname"):
        config = {k: v for k, v in ISSUE_EXAMPLE.items() if k != key}
        with pytest.raises(MooncakeConfigError, match=key):
            MooncakeOptions.from_config(config)
    with pytest.raises(MooncakeConfigError, match="object"):
        MooncakeOptions.from_config(["127.0.0.1:1"])


MODULES = ("buffers", "connection", "integrity", "reads", "tier", "writes")


def test_modules_import_without_torch_or_sglang():
    code = "import sys; sys.modules['torch'] = None; sys.modules['sglang'] = None\n"
    code += "import hicache_galahad.config.mooncake\n"
    code += "".join(f"import hicache_galahad.tier.mooncake.{name}\n" for name in MODULES)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# -- the read buffer (no cluster) ---------------------------------------------------------------


def test_read_buffer_lends_regions_until_their_last_view_is_gone():
    buffer = ReadBuffer(MIB)
    first_address, first = buffer.lend(1000)  # aligned to 1024
    second_address, second = buffer.lend(5000)
    assert (first_address, second_address) == (buffer.address, buffer.address + 1024)
    assert buffer.free_bytes() == MIB - 1024 - 5056
    view = read_only(second, 4000)
    del second  # the view still holds the region
    assert buffer.free_bytes() == MIB - 1024 - 5056
    assert len(view) == 4000 and view.readonly and view == bytes(4000)
    with pytest.raises(TypeError):
        view[0] = 1
    del first
    assert buffer.free_bytes() == MIB - 5056
    assert buffer.lend(MIB) is None  # no region that large is free
    del view
    assert buffer.free_bytes() == MIB  # merged back into one region
    assert buffer.lend(MIB) is not None


def test_read_buffer_is_touched_and_reuses_freed_regions_first():
    buffer = ReadBuffer(4 * MIB)
    assert bytes(buffer.buffer.view[: 4 * MIB : 4096]) == bytes(1024)  # every page touched
    kept = [buffer.lend(MIB) for _ in range(3)]
    del kept[1]
    address, _ = buffer.lend(MIB // 2)
    assert address == buffer.address + MIB  # first fit: the hole left by the freed region


def test_read_buffer_regions_never_overlap_and_all_come_back():
    rng = random.Random(9)
    buffer = ReadBuffer(MIB)
    held: dict[int, tuple] = {}
    for step in range(3000):
        if held and rng.random() < 0.45:
            del held[rng.choice(list(held))]
        else:
            held[step] = buffer.lend(rng.randrange(1, 96 * KIB))
            if held[step] is None:
                del held[step]
        spans = sorted((address, len(owner)) for address, owner in held.values())
        for (address, size), (next_address, _) in zip(spans, spans[1:], strict=False):
            assert address + size <= next_address
        assert buffer.free_bytes() + sum(size for _, size in spans) == MIB
    held.clear()
    assert buffer.free_bytes() == MIB and buffer.lend(MIB) is not None


def test_chunks_fit_the_capacity_and_keep_the_order():
    runs = list(chunks([(0, 100), (1, 900), (2, 30), (3, 1000)], 1024))
    assert runs == [[(0, 0)], [(1, 0), (2, 960)], [(3, 0)]]


# -- a real cluster -----------------------------------------------------------------------------

WRITER = """
import hashlib, json, os, sys, time
from hicache_galahad.tier.mooncake.tier import MooncakeOptions, MooncakeTier
tier = MooncakeTier(MooncakeOptions.from_config(json.loads(sys.argv[1])))
deadline = time.monotonic() + 10
while not tier.available and time.monotonic() < deadline:
    time.sleep(0.05)
sizes = {"small": 32 * 1024, "mid": 1 << 20, "large": 8 << 20}
digests = {}
for name, size in sizes.items():
    for i in range(4):
        value = os.urandom(size)
        digests[f"rt/{name}/{i}"] = hashlib.sha256(value).hexdigest()
        assert tier.put_async(f"rt/{name}/{i}", value)
assert tier.flush(20)
counters = tier.counters()
tier.close()
print(json.dumps({"digests": digests, "counters": counters}))
"""

READER = """
import hashlib, json, sys, time
from hicache_galahad.tier.mooncake.tier import MooncakeOptions, MooncakeTier
tier = MooncakeTier(MooncakeOptions.from_config(json.loads(sys.argv[1])))
keys = json.loads(sys.argv[2])
deadline = time.monotonic() + 10
while not tier.available and time.monotonic() < deadline:
    time.sleep(0.05)
values = tier.get_many(keys, [8 << 20] * len(keys))
counters = tier.counters()
tier.close()
print(json.dumps({
    "digests": [None if v is None else hashlib.sha256(v).hexdigest() for v in values],
    "counters": counters,
}))
"""


def run_child(code: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        env=dict(os.environ, **ENV),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_round_trip_between_two_processes(cluster):
    config = json.dumps(cluster.tier_config())
    written = run_child(WRITER, config)
    assert written["counters"]["put_ok"] == 12
    assert written["counters"]["put_failed"] == written["counters"]["put_dropped"] == 0
    keys = [*written["digests"], "rt/absent"]
    read = run_child(READER, config, json.dumps(keys))
    assert read["digests"] == [*written["digests"].values(), None]
    assert read["counters"]["hits"] == 12 and read["counters"]["misses"] == 1


@pytest.mark.slow
def test_missing_empty_and_oversized_values_are_none(cluster, make_tier):
    tier = connected(make_tier, cluster)
    put_all(tier, {"v/a": b"a" * 1000, "v/b": b"b" * 10})
    got = tier.get_many(["v/a", "v/a", "v/b", "v/none", "v/b"], [1000, 999, 10, 100, 0])
    assert got == [b"a" * 1000, None, b"b" * 10, None, None]
    assert tier.get_many([], []) == []
    assert tier.get_many(["v/a"], []) == [None]  # mismatched lengths: a miss, not an exception
    assert tier.exists_many(["v/a", "v/none"]) == [True, False]
    assert not tier.put_async("v/empty", b"")
    counters = tier.counters()
    assert counters["hits"] == 2 and counters["misses"] == 3
    assert counters["put_dropped"] == 1 and counters["unexpected_errors"] == 0


@pytest.mark.slow
def test_first_writer_wins_until_removed(cluster, make_tier):
    tier = connected(make_tier, cluster)
    raw = RawClient(cluster)
    try:
        assert raw.put("fw/key", b"garbage from someone else") == 0
        put_all(tier, {"fw/key": b"our record"})
        assert tier.counters()["put_exists"] == 1
        assert tier.get_many(["fw/key"], [100]) == [b"garbage from someone else"]
        tier.remove("fw/key")  # right after a read: its lease would refuse a plain remove
        put_all(tier, {"fw/key": b"our record"})
        assert tier.get_many(["fw/key"], [100]) == [b"our record"]
        assert raw.get("fw/key") == b"our record"
    finally:
        raw.close()
    assert tier.put_async("fw/twice", b"first") and tier.put_async("fw/twice", b"second")
    assert tier.flush(10)
    assert tier.get_many(["fw/twice"], [100]) == [b"first"]
    assert tier.counters()["put_exists"] == 2


@pytest.mark.slow
def test_values_are_lent_from_private_memory_and_come_back(cluster, make_tier):
    """Values are lent out of the private buffer (copied there at once); the registered one,
    which peers can write, holds nothing once a read has returned."""
    tier = connected(make_tier, cluster, transfer_buffer_bytes=4 * MIB)
    values = {f"lend/{i}": os.urandom(MIB) for i in range(3)}
    put_all(tier, values)
    registered, private = tier._reads.buffer, tier._reads.private
    held = tier.get_many(list(values), [MIB] * 3)
    assert held == list(values.values()) and all(value.readonly for value in held)
    assert private.free_bytes() == MIB and tier.counters()["get_spilled"] == 0
    assert registered.free_bytes() == 4 * MIB
    again = tier.get_many(list(values), [MIB] * 3)  # 1 MiB left: two values spill
    assert again == list(values.values()) and tier.counters()["get_spilled"] == 2
    assert hashlib.sha256(again[2]).digest() == hashlib.sha256(values["lend/2"]).digest()
    del held, again
    assert private.free_bytes() == 4 * MIB
    assert tier.get_many(list(values), [MIB] * 3) == list(values.values())
    assert tier.counters()["get_spilled"] == 2 and private.free_bytes() == 4 * MIB
    assert registered.free_bytes() == 4 * MIB


@pytest.mark.slow
def test_full_queue_drops_and_counts(cluster, make_tier):
    tier = connected(make_tier, cluster, queue_max_bytes=MIB, transfer_buffer_bytes=MIB)
    value = os.urandom(300 * KIB)
    accepted = [tier.put_async(f"q/{i}", value) for i in range(40)]
    assert not tier.put_async("q/too-large", os.urandom(MIB + 1))
    assert tier.flush(20)
    counters = tier.counters()
    assert counters["put_dropped"] == accepted.count(False) + 1 > 0
    assert counters["put_enqueued"] == accepted.count(True)
    assert counters["put_ok"] + counters["put_exists"] == counters["put_enqueued"]
    assert counters["queued_bytes"] == 0
    kept = [f"q/{i}" for i, ok in enumerate(accepted) if ok]
    assert tier.get_many(kept, [300 * KIB] * len(kept)) == [value] * len(kept)


@pytest.mark.slow
def test_concurrent_readers_and_a_writer(cluster, make_tier):
    tier = connected(make_tier, cluster)
    values = {f"c/{i}": os.urandom(64 * KIB) for i in range(64)}
    put_all(tier, values)
    errors = []

    def read():
        for _ in range(20):
            got = tier.get_many(list(values), [64 * KIB] * len(values))
            if got != list(values.values()):
                errors.append(sum(v is None for v in got))

    threads = [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for i in range(64):
        tier.put_async(f"c/new/{i}", os.urandom(64 * KIB))
    for thread in threads:
        thread.join()
    assert errors == [] and tier.flush(10)


@pytest.mark.slow
def test_full_mooncake_memory_fails_puts_without_exceptions(small_cluster, make_tier):
    tier = connected(make_tier, small_cluster)
    for i in range(6):
        assert tier.put_async(f"full/{i}", os.urandom(6 * MIB))
    assert tier.flush(20)
    counters = tier.counters()
    assert counters["put_ok"] >= 1
    assert counters["put_failed"] == counters["put_no_space"] >= 1
    assert counters["put_ok"] + counters["put_failed"] == 6
    assert counters["unexpected_errors"] == 0 and tier.available


@pytest.mark.slow
def test_master_killed_then_restarted(cluster, make_tier):
    tier = connected(make_tier, cluster, timeout_s=1)
    put_all(tier, {"m/a": b"before"})
    cluster.kill_master()
    started = time.monotonic()
    assert tier.get_many(["m/a", "m/b"], [100, 100]) in ([b"before", None], [None, None])
    assert time.monotonic() - started < 2.0
    wait_until(lambda: not tier.available, 3)
    started = time.monotonic()
    assert tier.get_many(["m/a"], [100]) == [None]
    assert tier.exists_many(["m/a"]) == [False]
    assert time.monotonic() - started < 0.25
    assert not tier.put_async("m/c", b"while down")
    assert tier.counters()["disconnects"] == 1

    cluster.start_master()
    cluster.wait_capacity(cluster.segment_bytes)  # the daemon re-mounts its segment
    wait_until(lambda: tier.available, 10)
    assert tier.get_many(["m/a"], [100]) == [None]  # a restarted master starts empty
    put_all(tier, {"m/a": b"after"})
    assert tier.get_many(["m/a"], [100]) == [b"after"]
    counters = tier.counters()
    assert counters["reconnects"] == 1 and counters["unexpected_errors"] == 0


@pytest.mark.slow
def test_stuck_master_bounds_reads_and_recovers(cluster, make_tier):
    tier = connected(make_tier, cluster, timeout_s=1)
    put_all(tier, {"s/a": b"value"})
    try:
        for _ in range(3):
            # Under load the connection's own probe can mark the stopped master down before
            # the read starts (then the read is skipped at once, as it must be): stop it again
            # until a read meets the stuck master itself.
            os.killpg(cluster.master.pid, signal.SIGSTOP)
            started = time.monotonic()
            assert tier.get_many(["s/b"], [100]) == [None]
            elapsed_s = time.monotonic() - started
            assert elapsed_s < 2.0  # never longer than timeout_s and a margin
            if elapsed_s > 0.9:
                break
            os.killpg(cluster.master.pid, signal.SIGCONT)
            wait_until(lambda: tier.available, 15)
        else:
            pytest.fail("no read met the stopped master in three tries")
        assert not tier.available  # a read is stuck: no second one is started behind it
        started = time.monotonic()
        assert tier.get_many(["s/a"], [100]) == [None]
        assert time.monotonic() - started < 0.25
    finally:
        os.killpg(cluster.master.pid, signal.SIGCONT)
    wait_until(lambda: tier.available, 15)
    assert tier.get_many(["s/a"], [100]) == [b"value"]
    assert tier.counters()["timeouts"] >= 1
    buffer = tier._reads.buffer  # the late read's region came back when it returned
    assert buffer.free_bytes() == buffer.size


STUCK_CHILD = """
import json, sys, time
from hicache_galahad.tier.mooncake.tier import MooncakeOptions, MooncakeTier
tier = MooncakeTier(MooncakeOptions.from_config(json.loads(sys.argv[1])))
while not tier.available:
    time.sleep(0.05)
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
missed = tier.get_many(["x"], [10]) == [None]
print(json.dumps({"missed": missed, "s": time.monotonic() - started}), flush=True)
tier.close(timeout_s=1)
"""


@pytest.mark.slow
def test_a_stuck_read_does_not_hold_up_process_exit(cluster):
    child = subprocess.Popen(
        [sys.executable, "-c", STUCK_CHILD, json.dumps(cluster.tier_config(timeout_s=1))],
        cwd=REPO,
        env=dict(os.environ, **ENV),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        os.killpg(cluster.master.pid, signal.SIGSTOP)
        child.stdin.write("go\n")
        child.stdin.flush()
        result = json.loads(child.stdout.readline())
        assert result["missed"] and result["s"] < 2.0
        started = time.monotonic()
        child.wait(timeout=20)
        assert time.monotonic() - started < 5  # the read stays stuck for ~30 s
    finally:
        child.kill()
        child.wait()
        os.killpg(cluster.master.pid, signal.SIGCONT)


@pytest.mark.slow
def test_hung_master_at_start_never_stalls_the_process(cluster, make_tier):
    os.killpg(cluster.master.pid, signal.SIGSTOP)  # accepts connections, answers nothing
    try:
        tier = make_tier(cluster, timeout_s=1)
        gaps, start = [], time.monotonic()
        last = start
        while last - start < 5:  # 5 s of 10 ms sleeps: how long was this thread held up?
            time.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last += gaps[-1]
        assert max(gaps) < 1.0  # an in-process setup() would hold the GIL for ~90 s
        assert not tier.available and tier.get_many(["h"], [10]) == [None]
    finally:
        os.killpg(cluster.master.pid, signal.SIGCONT)
    wait_until(lambda: tier.available, 20)
    put_all(tier, {"h": b"1"})
    assert tier.get_many(["h"], [10]) == [b"1"]


@pytest.mark.slow
def test_daemon_killed_then_restarted(cluster, make_tier):
    tier = connected(make_tier, cluster, timeout_s=1)
    put_all(tier, {"d/a": b"held by the daemon"})
    cluster.kill_daemon()
    started = time.monotonic()
    assert tier.get_many(["d/a"], [100]) == [None]
    assert time.monotonic() - started < 2.0
    wait_until(lambda: cluster.capacity_bytes() == 0, 10)  # client_ttl: the segment is gone
    put_all(tier, {"d/b": b"nowhere to go"})
    counters = tier.counters()
    assert counters["put_no_space"] == 1 and counters["unexpected_errors"] == 0
    cluster.start_daemon()
    put_all(tier, {"d/c": b"back"})
    assert tier.get_many(["d/a", "d/c"], [100, 100]) == [None, b"back"]


@pytest.mark.slow
def test_start_with_master_down_returns_at_once_and_connects_later(tmp_path, make_tier):
    skip_unless_mooncake()
    os.environ.update(ENV)
    cluster_ = MooncakeCluster(tmp_path)  # ports chosen, nothing started
    try:
        started = time.monotonic()
        tier = make_tier(cluster_, timeout_s=1)
        assert time.monotonic() - started < 0.5
        started = time.monotonic()
        assert tier.get_many(["x"], [10]) == [None]
        assert not tier.put_async("x", b"1")
        assert time.monotonic() - started < 1.0
        cluster_.start()
        wait_until(lambda: tier.available, 10)
        put_all(tier, {"x": b"1"})
        assert tier.get_many(["x"], [10]) == [b"1"]
    finally:
        cluster_.stop()


@pytest.mark.slow
def test_close_is_bounded_with_the_master_down(cluster, make_tier):
    tier = connected(make_tier, cluster, timeout_s=1)
    for i in range(8):
        tier.put_async(f"cl/{i}", os.urandom(MIB))
    cluster.kill_master()
    started = time.monotonic()
    tier.close(timeout_s=2)
    assert time.monotonic() - started < 8  # 2 s for the threads, then Mooncake's own close()
    assert tier.get_many(["cl/0"], [MIB]) == [None] and not tier.put_async("cl/x", b"1")


# -- TieredStore: what a put shares ---------------------------------------------------------------


def tiered_store(make_tier, cluster_, root: Path, sealed: bool):
    """A TieredStore on `root`: plaintext with the cluster's integrity key, or `sealed`
    (encrypted, zstd, no integrity key: its AES-GCM tags vouch)."""
    from hicache_galahad.store import RecordStore
    from hicache_galahad.tier.tiered import TieredStore

    options = {"durability": "none"}
    overrides = {}
    if sealed:
        key_file = root.parent / "tenants.key"
        if not key_file.exists():
            key_file.write_bytes(os.urandom(32))
            key_file.chmod(0o600)
        options |= {"encryption_key_file": str(key_file), "compression": "zstd"}
        overrides["integrity_key_file"] = None
    local = RecordStore(str(root), **options)
    return TieredStore(local, connected(make_tier, cluster_, **overrides))


@pytest.mark.slow
@pytest.mark.parametrize("sealed", [False, True], ids=["tagged", "sealed"])
def test_a_put_shares_the_bytes_it_wrote_once_and_a_present_record_not_again(
    cluster, make_tier, tmp_path, monkeypatch, sealed
):
    from hicache_galahad.record.namespace import Namespace
    from hicache_galahad.tier.mooncake.integrity import TAG_BYTES, ValueTag
    from hicache_galahad.tier.tiered import shared_key

    namespace = Namespace("tenant", f"fp-share-{sealed}", "kv", {"page": 1})
    page = (b"galahad page " * 8000)[: 64 * KIB]
    writer = tiered_store(make_tier, cluster, tmp_path / "a", sealed)
    reader = tiered_store(make_tier, cluster, tmp_path / "b", sealed)
    try:
        writer.register_namespace(namespace)
        reader.register_namespace(namespace)
        encoded = []  # the real codec, its calls counted
        real_encode = writer.local.codec.encode
        monkeypatch.setattr(
            writer.local.codec, "encode", lambda *a: encoded.append(a[1]) or real_encode(*a)
        )
        assert writer.put(namespace, "k0", page)
        assert len(encoded) == 1  # one encoding, for the file and the shared value
        assert writer.tier.flush(10)
        name = shared_key(namespace, "k0")
        value = bytes(reader.tier.get_many([name], [len(page) + 4 * KIB])[0])
        with open(StoreAdmin(writer.local).record_file_path(namespace.dirname, "k0"), "rb") as file:
            on_disk = file.read()
        if sealed:
            assert value == on_disk  # the sealed record alone
        else:  # record || nonce || tag, under the cluster's key
            tag = ValueTag(cluster.integrity_key_file.read_bytes())
            assert value[:-TAG_BYTES] == on_disk and bytes(tag.open(name, value)) == on_disk
        # the record is there: a second put stores nothing, encodes nothing, shares nothing
        assert writer.put_many(namespace, ["k0", "k1"], [page, page]) == [True, True]
        assert encoded == [b"k0", b"k1"]
        assert writer.tier.flush(10)
        counts = writer.counters.snapshot()
        assert counts["puts_existing"] == 1 and counts["mooncake_puts_queued"] == 2
        assert writer.tier.counters()["put_enqueued"] == 2
        # another server serves the shared value, verified, and writes it through without
        # sharing it back
        assert reader.get(namespace, "k1", len(page)) == page
        assert reader.flush_write_through(10)
        assert reader.local.get(namespace, "k1", len(page)) == page
        assert reader.counters.snapshot().get("mooncake_puts_queued", 0) == 0
        assert reader.tier.counters()["put_enqueued"] == 0
    finally:
        writer.close()
        reader.close()


def test_a_bug_is_counted_and_logged_by_the_stores_rule_in_the_tier(tmp_path, make_tier, caplog):
    """One rule for a bug caught and not raised (telemetry.metrics.count_bug), in the store's
    writer and in the Mooncake client alike: unexpected_errors, and a warning with its
    traceback at most once per topic and interval (the tier logged an error once per call
    site, forever, by a rule of its own)."""
    import logging

    from hicache_galahad.record.namespace import Namespace
    from hicache_galahad.store import RecordStore

    skip_unless_mooncake()
    tier = make_tier(MooncakeCluster(tmp_path / "down"), timeout_s=1)  # nothing started
    store = RecordStore(str(tmp_path / "store"), durability="none")
    namespace = Namespace("tenant", "fp", "kv", {"page": 1})
    store.register_namespace(namespace)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                assert tier.get_many(["x"], object()) == [None]  # a bug: len() of no list
                assert store.put(namespace, "k", object()) is False  # a bug: no buffer
        assert tier.counters()["unexpected_errors"] == 2
        assert store.stats().counter("unexpected_errors") == 2
        logged = [r for r in caplog.records if "unexpected" in r.getMessage()]
        assert [(r.levelname, r.exc_info is not None) for r in logged] == [("WARNING", True)] * 2
        assert {r.name for r in logged} == {"hicache_galahad.store", tier._log.name}
    finally:
        store.close()


def down_tiered_store(tmp_path, make_tier, **local_options):
    """A TieredStore whose Mooncake master was never started (every shared read a miss)."""
    from hicache_galahad.store import RecordStore
    from hicache_galahad.tier.tiered import TieredStore

    skip_unless_mooncake()
    overrides = {"timeout_s": 1}
    if "encryption_key_file" in local_options:
        overrides["integrity_key_file"] = None  # the AES-GCM tags vouch
    tier = make_tier(MooncakeCluster(tmp_path / "down"), **overrides)
    local = RecordStore(str(tmp_path / "store"), durability="none", **local_options)
    return TieredStore(local, tier)


def test_pins_through_the_tier_are_the_local_stores(tmp_path, make_tier):
    """TieredStore.pin, unpin and pinned_bytes_by_tenant are the local store's (pins are
    local): what is pinned through the tier is what the local store counts, and a key with no
    local record is missing (Mooncake holds no pins)."""
    from hicache_galahad.record.namespace import Namespace

    namespace = Namespace("tenant", "fp-pins", "kv", {"page": 1})
    page = os.urandom(64 * KIB)
    store = down_tiered_store(tmp_path, make_tier)
    try:
        store.register_namespace(namespace)
        assert store.put_many(namespace, ["a", "b"], [page, page]) == [True, True]
        result = store.pin(namespace, ["a", "nowhere"], "handbook")
        assert (result.pinned_records, result.missing_keys) == (1, ["nowhere"])
        pinned = store.pinned_bytes_by_tenant()
        assert pinned == store.local.pinned_bytes_by_tenant() and pinned["tenant"] >= len(page)
        assert store.pin(namespace, ["a"], "handbook").already_pinned_records == 1
        assert store.unpin(document="handbook") == pinned["tenant"]
        assert sum(store.local.pinned_bytes_by_tenant().values()) == 0
        assert store.pin(namespace, ["b"], "other").pinned_records == 1
        assert store.unpin(everything=True) == pinned["tenant"]
    finally:
        store.close()


def test_the_tier_removes_what_the_store_would_quarantine_and_squatters(tmp_path, make_tier):
    """The tier's rule for a failed Mooncake value is the local store's
    (RecordStore.config_may_explain), plus the squatters (V12, V16) that a file on disk is
    kept for: every failure removes the value except an AES-GCM tag that fails before this
    reader's key opened a record of the namespace."""
    from support.records import write_key_file

    from hicache_galahad.record import format as fmt
    from hicache_galahad.record.namespace import Namespace
    from hicache_galahad.tier.mooncake.integrity import ValueTagError

    namespace = Namespace("tenant", "fp-rule", "kv", {"page": 1})
    page = os.urandom(4 * KIB)
    store = down_tiered_store(
        tmp_path, make_tier, encryption_key_file=write_key_file(tmp_path / "tenants.key")
    )
    errors = [error_class("refused") for error_class in (*fmt.ALL_ERRORS, ValueTagError)]

    def left() -> list[str]:
        return [error.rule for error in errors if not store._removable(namespace, error)]

    def kept_on_disk() -> list[str]:
        return [error.rule for error in errors if store.local.config_may_explain(namespace, error)]

    try:
        assert (left(), kept_on_disk()) == (["V14"], ["V12", "V14", "V16"])
        store.register_namespace(namespace)
        assert store.put(namespace, "k", page)
        with open(StoreAdmin(store.local).record_file_path(namespace.dirname, "k"), "rb") as file:
            value = file.read()
        assert bytes(store.local.decode_value(namespace, "k", value, len(page))) == page
        assert (left(), kept_on_disk()) == ([], ["V12", "V16"])  # the key is proven now
    finally:
        store.close()
