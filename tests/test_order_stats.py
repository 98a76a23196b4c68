"""The operator's figure of the eviction order (issue 30): `galahad stats` and the metrics show
the queues, the ghost, the reserved bytes and the restorable share estimated from a sample of
the order's entries (store/order_stats.py), read-only, on real stores whose budget evicts."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib

from test_cache_policy import document_keys, rank_namespace, record_bytes, run_workload

from hicache_galahad.store import RecordStore, StoreAdmin
from hicache_galahad.store.fifo import EVICT_DIR, STATE_FILE, STATE_MAGIC, parse_state
from hicache_galahad.store.order_stats import order_figures

DOCUMENTS, PAGES, RANKS, BATCH = 24, 16, 2, 8  # run_workload writes batches of 8 pages


def full_store(tmp_path) -> tuple[str, list[list[int]]]:
    """Two ranks on one root whose budget holds a quarter of what is written; each rank's
    leading run of every document."""
    root = str(tmp_path / "store")
    max_bytes = DOCUMENTS * PAGES * RANKS * record_bytes(tmp_path / "probe") // 4
    with RecordStore(root, max_bytes=max_bytes, durability="none") as store:
        namespaces = [store.register_namespace(rank_namespace(r, RANKS)) for r in range(RANKS)]
        runs = run_workload(store, namespaces, DOCUMENTS, PAGES)
    return root, runs


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hicache_galahad", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def records_on_disk(root: str) -> int:
    with RecordStore(root, read_only=True) as store:
        return sum(count.records for count in StoreAdmin(store).namespace_counts().values())


def test_stats_shows_the_order_and_every_record_restorable(tmp_path):
    """Every document the budget kept is whole on both ranks, so a census of the log (the
    sample covers its entries) finds every record restorable: the truth, 1.00."""
    root, runs = full_store(tmp_path)
    restorable_pages = sum(min(rank_runs) for rank_runs in zip(*runs, strict=True))
    assert 0 < restorable_pages < DOCUMENTS * PAGES  # the budget evicted, and kept some

    answer = cli("stats", "--root", root, "--json")
    assert answer.returncode == 0, answer.stderr
    order = json.loads(answer.stdout)["eviction_order"]
    assert order["log"] and order["ghost_keys"] > 0  # evicted from the small queue
    assert order["small_bytes"] + order["main_bytes"] > 0
    assert order["sampled"] == order["small_entries"] + order["main_entries"]  # a census
    assert order["sampled"] - order["stale"] == records_on_disk(root)  # each record once
    assert order["restorable"] == order["on_every_rank"] == RANKS * restorable_pages
    assert order["restorable_share"] == 1.0 and order["restorable_error"] == 0.0
    assert order["reserved_bytes"] == 0  # no process alive

    text = cli("stats", "--root", root).stdout
    assert "eviction order: small queue" in text and "ghost" in text
    assert "restorable (estimate): 1.00 +/- 0.00" in text


def test_holes_are_seen_on_every_rank_and_inside_a_batch(tmp_path):
    """Rank 1 loses page 2 of every kept document, rank 0 page 12: a page is restorable when
    both ranks hold it and every page before it in its batch of 8 (a census equals that count
    exactly); a hole in an earlier batch is what the estimate cannot see, so it is an upper
    bound of the share in leading runs. A sample of 64 lands within its stated error."""
    root, runs = full_store(tmp_path)
    kept = [d for d in range(DOCUMENTS) if min(run[d] for run in runs) == PAGES]
    assert kept
    with RecordStore(root, durability="none") as store:
        namespaces = [store.register_namespace(rank_namespace(r, RANKS)) for r in range(RANKS)]
        for document in kept:
            keys = document_keys(document, PAGES)
            assert store.delete(namespaces[1], keys[2]) and store.delete(namespaces[0], keys[12])
        held = {
            (rank, key)
            for rank, namespace in enumerate(namespaces)
            for document in kept
            for key in document_keys(document, PAGES)
            if store.contains(namespace, key)
        }

    def everywhere(key) -> bool:
        return all((rank, key) in held for rank in range(RANKS))

    expected = in_leading_runs = 0
    for document in kept:
        keys = document_keys(document, PAGES)
        for page, key in enumerate(keys):
            start = page // BATCH * BATCH
            if everywhere(key) and all(everywhere(k) for k in keys[start:page]):
                expected += RANKS  # both ranks' records of the page
            if all(everywhere(k) for k in keys[: page + 1]):
                in_leading_runs += RANKS

    with RecordStore(root, read_only=True) as store:
        census = order_figures(store.layout, sample=10**6)
        sampled = order_figures(store.layout, sample=64, seed=7)
    present = census.sampled - census.stale
    assert present == records_on_disk(root) == len(held)
    assert census.on_every_rank == len(held) - 2 * len(kept)  # each lost page's other copy
    assert census.restorable == expected
    assert in_leading_runs / present <= census.restorable_share < 1.0
    assert sampled.sampled == 64 and sampled.restorable_error > 0
    error = abs(sampled.restorable_share - census.restorable_share)
    assert error <= sampled.restorable_error, (sampled, census)


def test_a_root_without_a_log(tmp_path):
    """A root no writable store used since the log exists: said so, no figure invented."""
    root = str(tmp_path / "store")
    RecordStore(root).close()
    answer = cli("stats", "--root", root, "--json")
    assert answer.returncode == 0, answer.stderr
    order = json.loads(answer.stdout)["eviction_order"]
    assert not order["log"] and order["restorable_share"] is None
    assert "no log on this root yet" in cli("stats", "--root", root).stdout


def test_metrics_export_the_order(galahad, tmp_path):
    """The SGLang backend's get_stats sets the order's gauges (a real backend through SGLang's
    factory, its metrics on, a budget of 8 pages that 16 pages' writes overrun). The figures
    are read on a thread of their own: the first call starts it, a later one shows them."""
    from prometheus_client import REGISTRY
    from support.records import chain_keys
    from support.sglang_pools import mha_pool, slots_of

    pool = mha_pool()
    probe = galahad(pool, root=tmp_path / "probe")
    assert probe.batch_set_v1(chain_keys(1, "probe"), slots_of([0], pool.page_size)) == [True]
    page_bytes = probe.store.usage_bytes()
    backend = galahad(pool, config={"metrics": True}, max_bytes=8 * page_bytes)
    for chain in range(4):
        keys = chain_keys(4, f"chain-{chain}")
        assert backend.batch_set_v1(keys, slots_of(range(4), pool.page_size)) == [True] * 4
    backend.get_stats()
    backend._order_figures.wait(30)
    backend.get_stats()
    labels = {"tenant": backend.options.tenant}
    small = REGISTRY.get_sample_value("galahad_eviction_queue_bytes", labels | {"queue": "small"})
    assert 0 < small <= 8 * page_bytes
    assert (
        REGISTRY.get_sample_value("galahad_eviction_queue_bytes", labels | {"queue": "main"}) == 0
    )
    assert REGISTRY.get_sample_value("galahad_eviction_ghost_keys", labels) >= 8
    assert REGISTRY.get_sample_value("galahad_restorable_share", labels) == 1.0
    assert REGISTRY.get_sample_value("galahad_reaper_backlog_bytes", labels) >= 0


def test_a_forged_state_costs_nothing(tmp_path):
    """A state claiming a tail segment 2^40 (its CRC right): stats looks at the segments on
    disk between hand and tail, never at every number of the range."""
    root, _ = full_store(tmp_path)
    before = json.loads(cli("stats", "--root", root, "--json").stdout)["eviction_order"]
    path = os.path.join(root, EVICT_DIR, STATE_FILE)
    with open(path, "rb") as handle:
        fields = parse_state(handle.read())
    fields[2] = 1 << 40  # the small queue's tail segment
    body = struct.pack("<8s8q", STATE_MAGIC, *fields)
    with open(path, "wb") as handle:
        handle.write(body + struct.pack("<I", zlib.crc32(body)))
    answer = cli("stats", "--root", root, "--json")
    assert answer.returncode == 0, answer.stderr
    order = json.loads(answer.stdout)["eviction_order"]
    assert order["small_entries"] == before["small_entries"]
    assert order["restorable_share"] == before["restorable_share"]
