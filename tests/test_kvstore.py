"""The KVStore protocol (store/kvstore.py): RecordStore and TieredStore implement every verb
with the parameters the protocol names, so the adapter can hold either. Read from the
classes (inspect), and checked on a real RecordStore."""

from __future__ import annotations

import inspect

import pytest

from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.kvstore import KVStore
from hicache_galahad.tier.tiered import TieredStore

VERBS = [
    name
    for name, member in vars(KVStore).items()
    if not name.startswith("_") and (callable(member) or isinstance(member, property))
]


@pytest.mark.parametrize("store_class", [RecordStore, TieredStore], ids=lambda c: c.__name__)
def test_both_stores_have_every_verb_with_its_parameters(store_class):
    assert len(VERBS) >= 17
    assert {"pin", "unpin", "pinned_bytes_by_tenant"} <= set(VERBS)  # pins: either store
    for name in VERBS:
        wanted = getattr(KVStore, name)
        if isinstance(wanted, property):  # RecordStore's are instance attributes (see below)
            assert store_class is RecordStore or isinstance(getattr(store_class, name), property)
            continue
        have = getattr(store_class, name, None)
        assert have is not None, f"{store_class.__name__} has no {name}"
        assert [(p.name, p.kind) for p in inspect.signature(have).parameters.values()] == [
            (p.name, p.kind) for p in inspect.signature(wanted).parameters.values()
        ], f"{store_class.__name__}.{name}{inspect.signature(have)}"


def test_a_record_store_is_a_kvstore(store_factory):
    assert isinstance(store_factory(durability="none"), KVStore)


def test_stats_are_typed_and_as_dict_keeps_the_flat_shape(store_factory):
    import dataclasses
    import json

    from hicache_galahad.record.namespace import Namespace
    from hicache_galahad.store.kvstore import StoreStats

    namespace = Namespace("tenant", "fp", "kv", {"page": 1})
    store = store_factory(durability="none")
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
    store_factory, compression
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

    store = store_factory(durability="none", compression=compression)
    store.register_namespace(namespace)
    assert store.put(namespace, "k0", pages[0])  # stored by a plain put first
    keys = ["k0", "k1", "k2"]
    assert store.publish_many(namespace, keys, pages, hook) == [True] * 3
    assert [key for key, _ in published] == ["k1", "k2"]
    for key, record in published:
        with open(StoreAdmin(store).record_file_path(namespace.dirname, key), "rb") as file:
            assert file.read() == record
    assert store.publish_many(namespace, keys, pages, hook) == [True] * 3
    assert len(published) == 2  # all there: nothing published, nothing handed over

    def broken(namespace_, records):
        raise RuntimeError("a bug in the hook")

    assert store.publish_many(namespace, ["k3"], [pages[0]], broken) == [True]
    assert store.stats().counter("unexpected_errors") == 1
    assert store.get(namespace, "k3", len(pages[0])) == pages[0]


def test_the_tier_uses_only_the_local_stores_public_verbs():
    """tier/ reads the local store through its verbs (KVStore's and RecordStore's public
    methods), never its parts: no `local.reader.`, `local.codec.` or any other attribute set in
    RecordStore.__init__ (the tier once decoded values and tested keys on the reader itself)."""
    import ast
    from pathlib import Path

    allowed = {name for name in dir(RecordStore) if not name.startswith("_")}
    allowed |= set(VERBS) | set(KVStore.__annotations__)  # root, max_bytes, counters
    tier_dir = Path(__file__).resolve().parent.parent / "hicache_galahad" / "tier"
    holders = ("local", "self.local", "self._local")  # how tier/ names the local store
    reached = [
        f"{path.name}:{node.lineno} {ast.unparse(node)}"
        for path in sorted(tier_dir.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and ast.unparse(node.value) in holders
        and node.attr not in allowed
    ]
    assert reached == []


def test_a_value_in_memory_is_judged_by_the_stores_rules_and_its_one_rule_of_keeping(
    store_factory, tmp_path
):
    """RecordStore.decode_value applies the rules of a record file to bytes in memory (a shared
    tier's value), and RecordStore.config_may_explain is the one rule of what a failure leaves
    in place: V12, V16, and V14 until this reader's key has opened a record of the namespace."""
    from support.records import write_key_file

    from hicache_galahad.record import format as fmt
    from hicache_galahad.record.namespace import Namespace

    namespace = Namespace("tenant", "fp", "kv", {"page": 1})
    page = bytes(range(256)) * 16

    def stored_value(store, key: str) -> bytes:
        store.register_namespace(namespace)
        assert store.put(namespace, key, page)
        with open(StoreAdmin(store).record_file_path(namespace.dirname, key), "rb") as file:
            return file.read()

    def failure(store, key: str, value, size: int = len(page)) -> fmt.FormatError:
        with pytest.raises(fmt.FormatError) as caught:
            store.decode_value(namespace, key, value, size)
        return caught.value

    plain = store_factory(tmp_path / "plain", durability="none")
    sealed = store_factory(
        tmp_path / "sealed",
        durability="none",
        encryption_key_file=write_key_file(tmp_path / "a.key"),
    )
    other_key = store_factory(
        tmp_path / "other",
        durability="none",
        encryption_key_file=write_key_file(tmp_path / "b.key"),
    )
    assert (plain.encrypted, sealed.encrypted) == (False, True)
    value = stored_value(plain, "k")
    assert bytes(plain.decode_value(namespace, "k", value, len(page))) == page
    damaged = bytearray(value)
    damaged[-1] ^= 1
    failures = {
        "V16": failure(plain, "k", value, len(page) - 1),
        "V10": failure(plain, "other", value),
        "V13": failure(plain, "k", bytes(damaged)),
        "V12": failure(sealed, "k", value),  # plaintext in an encrypted store
    }
    assert {rule: error.rule for rule, error in failures.items()} == {
        rule: rule for rule in failures
    }
    kept = {rule for rule, error in failures.items() if plain.config_may_explain(namespace, error)}
    assert kept == {"V12", "V16"}

    sealed_value = stored_value(sealed, "s")
    wrong_key = failure(other_key, "s", sealed_value)
    assert wrong_key.rule == "V14"
    assert other_key.config_may_explain(namespace, wrong_key)  # its key never opened one
    own = stored_value(other_key, "own")
    assert bytes(other_key.decode_value(namespace, "own", own, len(page))) == page
    # its key has opened a record of the namespace: a tag that fails now is damage
    assert not other_key.config_may_explain(namespace, failure(other_key, "s", sealed_value))
