"""No whole-root scan on any path SGLang calls, at 10^5 records (issue 19).

A root of 100,000 small records is built through the public API; then every directory entry
the store reads is counted (os.scandir and os.listdir wrapped: a measurement of what the
store under test does, not a stand-in for any part of it) while a second process-like store
opens the root and serves batch_exists (leading_run), get, put with room and put into a full
budget (every put evicts). A whole-root scan reads at least 100,000 entries; each of these
paths must read a few hundred at most, whatever the root holds.
"""

from __future__ import annotations

import shutil

import pytest
from support.store_helpers import count_directory_entries

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin

pytestmark = pytest.mark.slow

RECORDS = 100_000
NAMESPACE = Namespace("scale", "model", "kv", {})
BOUND = 2_000  # entries one path may read; a whole-root scan reads RECORDS


def key(index: int) -> str:
    return f"{index:064x}"


@pytest.fixture
def entries_read(monkeypatch):
    """[count]: directory entries read through os.scandir and os.listdir since last reset."""
    return count_directory_entries(monkeypatch)


def test_no_path_sglang_calls_scans_the_root_at_100k_records(tmp_path, entries_read):
    root = str(tmp_path / "root")
    with RecordStore(root, durability="none") as builder:
        builder.register_namespace(NAMESPACE)
        for first in range(0, RECORDS, 1000):
            keys = [key(index) for index in range(first, first + 1000)]
            assert all(builder.put_many(NAMESPACE, keys, [b"r" * 256] * len(keys)))
        full = builder.usage_bytes()
    read = {}

    def measure(name, action):
        entries_read[0] = 0
        action()
        read[name] = entries_read[0]

    stores = []
    measure("open", lambda: stores.append(RecordStore(root, durability="none", max_bytes=full)))
    store = stores[0]
    store.register_namespace(NAMESPACE)
    some = [key(index) for index in range(0, RECORDS, RECORDS // 64)]
    measure("batch_exists", lambda: store.leading_run(NAMESPACE, some))
    outs = [bytearray(256) for _ in some]
    measure("get", lambda: store.get_many_into(NAMESPACE, some, outs))
    store.delete(NAMESPACE, key(1))  # room for one batch of one
    measure("put with room", lambda: store.put(NAMESPACE, key(RECORDS + 1), b"n" * 256))
    fresh = [key(RECORDS + 2 + index) for index in range(64)]
    before = store.stats().counter("evictions")
    measure(
        "put into a full budget (64 puts)",
        lambda: [store.put(NAMESPACE, name, b"n" * 256) for name in fresh],
    )
    evicted = store.stats().counter("evictions") - before
    store.close()
    print(f"\nentries read at {RECORDS} records: {read}; evictions {evicted}")
    assert evicted >= 64  # every put evicted
    assert all(count <= BOUND for count in read.values()), read
    with RecordStore(root, read_only=True) as checker:
        report = StoreAdmin(checker).check()
    assert report.ledger_drift_bytes == 0, report.as_dict()
    shutil.rmtree(root)  # 100k files: not left in pytest's kept temp dirs
