"""How often a put into a full budget takes the ledger's lock (issue 30's cost goal: every
section is a wait for the root's other writers), and that the fewer sections keep the ledger
true: one eviction section takes every sibling namespace's victims, a SIGKILL between two of
its journals recovers."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import threading

from support.store_helpers import PYTHON, REPO_ROOT, assert_store_consistent, helper_env

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore

PAGE_BYTES = 4096
BATCH_PAGES = 8
MAX_BYTES = 64 * (PAGE_BYTES + 200)  # 64 records (a record: the page, its header and key)
# Sections the putting thread takes per batch of 8 pages into a full budget: a failed
# reserve, the eviction (plan and every namespace's victims), the reserve, the publish (the
# reaper's releases, on its threads, come on top: about one a batch). Before the cut: 8.
MAX_SECTIONS_PER_FULL_BATCH = 4.5


class ThreadSections:
    """Counts the ledger's locked sections the calling thread takes (the reaper's releases
    run on their own threads, as many as the scheduler makes them)."""

    def __init__(self, ledger):
        self.ledger = ledger
        self.thread = threading.get_ident()
        self.count = 0
        self._locked = ledger._locked

    def __enter__(self):
        def counted(update):
            if threading.get_ident() == self.thread:
                self.count += 1
            return self._locked(update)

        self.ledger._locked = counted
        return self

    def __exit__(self, *exc):
        self.ledger._locked = self._locked


def rank_namespace(rank: int) -> Namespace:
    geometry = {
        "dtype": "bfloat16",
        "layout": "layer_first",
        "page_size": 64,
        "parallel": {"tp_rank": rank, "tp_size": 2},
    }
    return Namespace("tenant-a", "model-fp-1", "kv", geometry)


def put_batch(store: RecordStore, namespace: Namespace, tag: str) -> None:
    keys = [f"{tag}-{index}" for index in range(BATCH_PAGES)]
    assert all(store.put_many(namespace, keys, [os.urandom(PAGE_BYTES) for _ in keys]))


def test_a_put_into_a_full_budget_takes_few_locked_sections(tmp_path, store_factory):
    store = store_factory(max_bytes=MAX_BYTES, durability="none")
    namespace = rank_namespace(0)
    store.register_namespace(namespace)
    for batch in range(16):  # twice the budget: full, and evicting
        put_batch(store, namespace, f"fill{batch}")
    reaper = store.accounting.order.reaper
    assert reaper.wait_idle(10)
    evictions_before = store.counters.snapshot()["evictions"]
    batches = 40
    with ThreadSections(store.accounting.ledger) as sections:
        for batch in range(batches):
            put_batch(store, namespace, f"measured{batch}")
    assert reaper.wait_idle(10)
    sections_per_batch = sections.count / batches
    evicted = store.counters.snapshot()["evictions"] - evictions_before
    assert evicted >= batches * BATCH_PAGES  # every batch paid for itself by evicting
    assert sections_per_batch <= MAX_SECTIONS_PER_FULL_BATCH, sections_per_batch


def test_one_eviction_section_takes_every_sibling_namespace(tmp_path, store_factory):
    """Two TP ranks' namespaces (siblings: a key's pages leave together): one locked section
    plans and takes both ranks' victims (a journal each), and the ledger equals the disk."""
    store = store_factory(max_bytes=MAX_BYTES, durability="none")
    ranks = [rank_namespace(0), rank_namespace(1)]
    for namespace in ranks:
        store.register_namespace(namespace)
    for batch in range(3):
        for namespace in ranks:
            put_batch(store, namespace, f"fill{batch}")
    store.accounting.order._committed_recently()  # (read at most once a second: done now)
    with ThreadSections(store.accounting.ledger) as sections:
        evicted, freed = store.accounting.order.evict_in_order(2 * BATCH_PAGES * PAGE_BYTES)
    assert sections.count == 1, sections.count
    assert evicted >= 2 * BATCH_PAGES and freed >= evicted * PAGE_BYTES
    for namespace in ranks:  # each rank lost the same keys: the first batch's
        assert not any(store.contains(namespace, f"fill0-{i}") for i in range(BATCH_PAGES))
        assert all(store.contains(namespace, f"fill2-{i}") for i in range(BATCH_PAGES))
    assert store.accounting.order.reaper.wait_idle(10)


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, "tests")
    from test_ledger_sections import BATCH_PAGES, MAX_BYTES, put_batch, rank_namespace
    from hicache_galahad.store import RecordStore
    from hicache_galahad.store.eviction_order import EvictionOrder

    store = RecordStore(sys.argv[1], max_bytes=MAX_BYTES, durability="none")
    ranks = [rank_namespace(0), rank_namespace(1)]
    for namespace in ranks:
        store.register_namespace(namespace)
    for batch in range(4):
        for namespace in ranks:
            put_batch(store, namespace, f"fill{batch}")
    assert store.accounting.order.reaper.wait_idle(10)
    take = EvictionOrder._take
    taken = []

    def take_then_die(self, dirname, victims, journal, into):
        freed = take(self, dirname, victims, journal, into)
        taken.append(dirname)
        if len(set(taken)) == 2:  # the second namespace journaled and renamed: killed
            print("dying", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return freed

    EvictionOrder._take = take_then_die
    for batch in range(8):
        for namespace in ranks:
            put_batch(store, namespace, f"more{batch}")
    print("never killed", flush=True)
    """
)


def test_sigkill_between_two_namespaces_journals_recovers(tmp_path):
    """Killed in the eviction section after the second namespace's journal and renames
    (the first's already done in the state on disk): the next process to take the lock
    recovers the second journal, and the ledger equals the disk."""
    root = str(tmp_path / "store")
    child = subprocess.run(
        [PYTHON, "-c", CHILD, root],
        cwd=REPO_ROOT,
        env=helper_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, (child.stdout, child.stderr[-2000:])
    assert "dying" in child.stdout
    store = RecordStore(root, max_bytes=MAX_BYTES, durability="none")
    try:
        store.accounting.ledger.read()  # (a locked section: the journal is recovered in one)
        assert store.accounting.ledger.recovered_bytes > 0  # (no recount: the journal did)
        store.accounting.repair.wait_for_sweep(30)  # the dead writer's renamed victims
    finally:
        store.close()
    assert_store_consistent(root)
