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
