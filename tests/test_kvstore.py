"""The KVStore protocol (store/kvstore.py): RecordStore and TieredStore implement every verb
with the parameters the protocol names, so the adapter can hold either. Read from the
classes (inspect), and checked on a real RecordStore."""

from __future__ import annotations

import inspect

import pytest

from hicache_galahad.store import RecordStore
from hicache_galahad.store.kvstore import KVStore
from hicache_galahad.tier.tiered import TieredStore

VERBS = [
    name
    for name, member in vars(KVStore).items()
    if not name.startswith("_") and (callable(member) or isinstance(member, property))
]


@pytest.mark.parametrize("store_class", [RecordStore, TieredStore], ids=lambda c: c.__name__)
def test_both_stores_have_every_verb_with_its_parameters(store_class):
    assert len(VERBS) >= 14
    for name in VERBS:
        wanted = getattr(KVStore, name)
        if isinstance(wanted, property):  # RecordStore's are instance attributes (see below)
            assert store_class is RecordStore or isinstance(getattr(store_class, name), property)
            continue
        have = getattr(store_class, name, None)
        assert have is not None, f"{store_class.__name__} has no {name}"
        assert list(inspect.signature(have).parameters) == list(
            inspect.signature(wanted).parameters
        ), f"{store_class.__name__}.{name}{inspect.signature(have)}"


def test_a_record_store_is_a_kvstore(tmp_path):
    store = RecordStore(str(tmp_path / "store"), durability="none")
    try:
        assert isinstance(store, KVStore)
    finally:
        store.close()


def test_stats_are_typed_and_as_dict_keeps_the_flat_shape(tmp_path):
    import dataclasses
    import json

    from hicache_galahad.record.namespace import Namespace
    from hicache_galahad.store.kvstore import StoreStats

    namespace = Namespace("tenant", "fp", "kv", {"page": 1})
    store = RecordStore(str(tmp_path / "store"), durability="none")
    try:
        store.register_namespace(namespace)
        assert store.put(namespace, "k", b"x" * 100)
        assert store.get(namespace, "k", 100) == b"x" * 100
        stats = store.stats()
        assert isinstance(stats, StoreStats)
        assert stats.counter("puts") == stats.counter("hits") == 1
        assert stats.counter("failed_V13") == stats.counter("mooncake_hits") == 0
        assert stats.indexed_records == len(store.index) and stats.ledger_bytes > 100
        with pytest.raises(KeyError, match="'hit'"):  # a typo fails, never reads 0
            stats.counter("hit")
        assert stats.as_dict() == store.counters.snapshot() | {
            "ledger_bytes": stats.ledger_bytes,
            "indexed_records": stats.indexed_records,
        }
        json.dumps(stats.as_dict())
        with pytest.raises(dataclasses.FrozenInstanceError):
            stats.ledger_bytes = 0
        with pytest.raises(TypeError):  # a snapshot: nobody changes it
            stats.counters["puts"] = 5
    finally:
        store.close()


def test_tiered_stats_add_the_mooncake_clients_counters():
    import typing

    from hicache_galahad.store.kvstore import StoreStats
    from hicache_galahad.tier.tiered import TieredStats

    stats = TieredStats(
        counters={"puts": 1},
        ledger_bytes=5,
        indexed_records=1,
        shared={"put_ok": 2, "available": 1},
    )
    assert isinstance(stats, StoreStats) and stats.counter("puts") == 1
    assert stats.as_dict() == {
        "puts": 1,
        "ledger_bytes": 5,
        "indexed_records": 1,
        "mooncake_tier_put_ok": 2,
        "mooncake_tier_available": 1,
    }
    for store_class in (RecordStore, TieredStore, KVStore):
        assert issubclass(typing.get_type_hints(store_class.stats)["return"], StoreStats)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_the_publish_hook_gets_the_files_bytes_of_what_the_put_published_only(
    tmp_path, compression
):
    """RecordStore.publish_many (the writer's publish hook, what a tier shares): the exact
    bytes of each record the put linked into place, once; nothing for a record already stored;
    a hook that raises is a bug counted, never a failed put."""
    from hicache_galahad.record.namespace import Namespace

    namespace = Namespace("tenant", "fp", "kv", {"page": 1})
    pages = [bytes([index]) * 40000 for index in range(3)]
    published = []

    def hook(namespace_, records):
        assert namespace_ == namespace
        published.extend(
            (key, b"".join(bytes(piece) for piece in pieces)) for key, pieces in records
        )

    store = RecordStore(str(tmp_path / "store"), durability="none", compression=compression)
    try:
        store.register_namespace(namespace)
        assert store.put(namespace, "k0", pages[0])  # stored by a plain put first
        keys = ["k0", "k1", "k2"]
        assert store.publish_many(namespace, keys, pages, hook) == [True] * 3
        assert [key for key, _ in published] == ["k1", "k2"]
        for key, record in published:
            with open(store.record_file_path(namespace.dirname, key), "rb") as file:
                assert file.read() == record
        assert store.publish_many(namespace, keys, pages, hook) == [True] * 3
        assert len(published) == 2  # all there: nothing published, nothing handed over

        def broken(namespace_, records):
            raise RuntimeError("a bug in the hook")

        assert store.publish_many(namespace, ["k3"], [pages[0]], broken) == [True]
        assert store.stats().counter("unexpected_errors") == 1
        assert store.get(namespace, "k3", len(pages[0])) == pages[0]
    finally:
        store.close()
