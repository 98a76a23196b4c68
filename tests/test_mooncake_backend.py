"""GalahadStorage with Mooncake Store as a shared tier: two nodes (two processes, two local
roots) on one real Mooncake cluster (a master and a store daemon on loopback).

A page written by node A is a storage hit on node B, byte-exact, and lands on B's disk; values
that are garbage, cut short, of another tenant or of another model are misses on B and never
reach B's host memory; Mooncake's failures are misses, never exceptions, and the local disk
keeps serving. A hostile peer's attacks (forgeries, squatting, bombs, writes into the read
buffer) are in test_mooncake_attacks.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName
from support.records import chain_keys, pool_records
from support.sglang_pools import (
    create_galahad,
    mamba_pool,
    mha_pool,
    page_bytes,
    slots_of,
    transfer,
)

from bench.mooncake_cluster import RawClient, mooncake_cluster_fixture
from hicache_galahad.record import format as fmt
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.tier.tiered import shared_key

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
cluster = mooncake_cluster_fixture(segment_bytes=64 << 20)
MAMBA = PoolName.MAMBA
PAGES = 6

NODE_A = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, "tests")
    from support.records import chain_keys
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from support.sglang_pools import create_galahad, mamba_pool, mha_pool, slots_of, transfer
    root, config, pages = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    backend = create_galahad(
        root, mha_pool(seed=1), {PoolName.MAMBA: mamba_pool(seed=1)}, mooncake=config
    )
    deadline = time.monotonic() + 30
    while not backend.store.tier.available and time.monotonic() < deadline:
        time.sleep(0.1)
    keys = chain_keys(pages, "shared")
    assert backend.batch_set_v1(keys, slots_of(range(pages), 4)) == [True] * pages
    assert backend.batch_set_v2([transfer(PoolName.MAMBA, keys[:2], [0, 1])]) == {
        "mamba": [True, True]
    }
    assert backend.store.tier.flush(30)
    print(json.dumps(backend.stats().as_dict()))
    backend.close()
    """
)


def run_node_a(root: Path, config: dict, pages: int = PAGES) -> None:
    import json

    result = subprocess.run(
        [sys.executable, "-c", NODE_A, str(root), json.dumps(config), str(pages)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["mooncake_puts_queued"] == PAGES + 2


def node_b(tmp_path, cluster, **options):
    kv, mamba = mha_pool(seed=2), mamba_pool(seed=2)
    backend = create_galahad(
        tmp_path / "node-b", kv, {MAMBA: mamba}, mooncake=cluster.tier_config(), **options
    )
    wait_available(backend)
    return backend, kv, mamba


def wait_available(backend, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not backend.store.tier.available:
        assert time.monotonic() < deadline, "the Mooncake tier never connected"
        time.sleep(0.1)


def test_a_page_written_on_node_a_is_a_hit_on_node_b(tmp_path, cluster):
    run_node_a(tmp_path / "node-a", cluster.tier_config())
    backend, kv, mamba = node_b(tmp_path, cluster)
    try:
        keys = chain_keys(PAGES, "shared")
        assert backend.batch_exists(keys) == PAGES
        hits = backend.batch_exists_v2(
            keys, [transfer(MAMBA, ["tail"], policy=PoolHitPolicy.TRAILING_PAGES)]
        )
        assert hits.kv_hit_pages == 2  # the deepest prefix with its recurrent state
        assert backend.batch_get_v1(keys, slots_of(range(10, 10 + PAGES), 4)) == [True] * PAGES
        assert backend.batch_get_v2([transfer(MAMBA, keys[:2], [5, 6])]) == {"mamba": [True, True]}
        reference_kv, reference_mamba = mha_pool(seed=1), mamba_pool(seed=1)
        for page in range(PAGES):
            assert torch.equal(page_bytes(kv, (10 + page) * 4), page_bytes(reference_kv, page * 4))
        for slot, source in ((5, 0), (6, 1)):
            assert torch.equal(page_bytes(mamba, slot), page_bytes(reference_mamba, source))
        # ... and B's own disk now holds them: a second read needs no Mooncake
        assert backend.store.flush_write_through(10)
        assert len(pool_records(tmp_path / "node-b", "kv")) == PAGES
        assert len(pool_records(tmp_path / "node-b", "mamba")) == 2
        stats = backend.stats()
        assert stats.counter("mooncake_hits") == PAGES + 2
        assert stats.counter("mooncake_bad_values") == 0
    finally:
        backend.close()


def _record(namespace: Namespace, key: str, raw: bytes) -> bytes:
    header, chunks = fmt.encode_record(
        raw, key=key.encode(), namespace=namespace.digest, digest_alg=fmt.DIGEST_XXH3_128
    )
    return bytes(header) + b"".join(bytes(chunk) for chunk in chunks)


def test_hostile_and_stale_values_are_misses_and_never_reach_host_memory(tmp_path, cluster):
    backend, kv, _ = node_b(tmp_path, cluster)
    raw_client = RawClient(cluster)
    try:
        namespace = backend.binder.kv().namespace
        page = bytes(page_bytes(mha_pool(seed=1), 0).numpy())
        keys = chain_keys(5, "hostile")
        other_tenant = Namespace("mallory", namespace.model_fingerprint, "kv", namespace.geometry)
        older_model = Namespace(namespace.tenant, "older-weights", "kv", namespace.geometry)
        good = _record(namespace, keys[0], page)
        values = {
            keys[0]: os.urandom(len(good)),  # garbage of the right size
            keys[1]: _record(namespace, keys[1], page)[:-100],  # cut short
            keys[2]: _record(other_tenant, keys[2], page),  # another tenant's record
            keys[3]: _record(older_model, keys[3], page),  # stale: older weights
            keys[4]: _record(namespace, keys[0], page),  # a sound record of another key
        }
        for key, value in values.items():  # tagged: a buggy peer holding the integrity key
            name = shared_key(namespace, key)
            assert raw_client.replace(name, cluster.tagged(name, value)) == 0
        before = [page_bytes(kv, (10 + i) * 4) for i in range(5)]
        assert backend.batch_get_v1(keys, slots_of(range(10, 15), 4)) == [False] * 5
        for index in range(5):
            assert torch.equal(page_bytes(kv, (10 + index) * 4), before[index])
        stats = backend.stats()
        assert stats.counter("mooncake_bad_values") == 5 and stats.counter("mooncake_hits") == 0
        assert stats.counter("failed_M1") == 0  # the record's own rules refused them
        assert pool_records(tmp_path / "node-b", "kv") == []
        deadline = time.monotonic() + 10  # bad values are removed, so good ones can land
        while any(raw_client.exists(shared_key(namespace, k)) for k in keys):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        raw_client.close()
        backend.close()


def test_mooncake_failures_are_misses_and_local_disk_keeps_serving(tmp_path, cluster):
    backend, kv, _ = node_b(tmp_path, cluster)
    try:
        local = chain_keys(3, "local")
        assert backend.batch_set_v1(local, slots_of([0, 1, 2], 4)) == [True] * 3
        assert backend.store.tier.flush(30)
        shared_only = chain_keys(2, "elsewhere")

        cluster.kill_master()
        started = time.monotonic()
        assert backend.batch_get_v1(local, slots_of([8, 9, 10], 4)) == [True] * 3
        assert backend.batch_get_v1(shared_only, slots_of([11, 12], 4)) == [False, False]
        assert backend.batch_exists(shared_only) == 0
        assert backend.batch_set_v1(chain_keys(1, "down"), slots_of([3], 4)) == [True]
        assert time.monotonic() - started < 3 * 2 + 2  # bounded by the tier's timeout

        cluster.restart_master()
        cluster.wait_capacity(1, timeout_s=30)  # the daemon mounts its segment again
        wait_available(backend, 30)
        fresh = chain_keys(1, "after-restart")
        assert backend.batch_set_v1(fresh, slots_of([4], 4)) == [True]
        assert backend.store.tier.flush(30)
        other = create_galahad(tmp_path / "node-c", mha_pool(), mooncake=cluster.tier_config())
        try:
            wait_available(other)
            assert other.batch_get_v1(fresh, slots_of([8], 4)) == [True]
        finally:
            other.close()

        cluster.kill_daemon()
        assert backend.batch_get_v1(local, slots_of([8, 9, 10], 4)) == [True] * 3
        assert backend.batch_get_v1(chain_keys(1, "gone"), slots_of([13], 4)) == [False]
        assert backend.stats().counter("adapter_errors") == 0
    finally:
        backend.close()


def test_a_full_mooncake_drops_writes_without_failing_them(tmp_path, cluster):
    big = mha_pool(page_size=64, tokens=4096, heads=8, head_dim=64, layers=4)  # 256 KiB pages
    writer = create_galahad(tmp_path / "big", big, mooncake=cluster.tier_config())
    try:
        wait_available(writer)
        pages = big.size // big.page_size - 1
        slots = slots_of(range(pages), 64)
        for round_ in range(4):  # about 2x the 64 MiB segment, under distinct keys
            keys = chain_keys(pages, f"flood-{round_}")
            assert writer.batch_set_v1(keys, slots) == [True] * pages  # the local disk has them
        writer.store.tier.flush(120)
        counters = writer.store.tier.counters()
        assert counters["put_ok"] >= 1
        assert writer.stats().counter("adapter_errors") == 0
        first = chain_keys(pages, "flood-0")
        assert writer.batch_get_v1(first, slots) == [True] * pages  # served from local disk
    finally:
        writer.close()
