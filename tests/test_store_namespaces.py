"""Namespace isolation: a record is only ever served in the namespace it was written in."""

from __future__ import annotations

import os
import shutil

import pytest
from support.records import ns_dir, record_path, write_key_file
from support.store_helpers import NS_A, checked_get, content

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store.admin import StoreAdmin

VARIANTS = {
    "tenant": Namespace("tenant-b", NS_A.model_fingerprint, NS_A.pool, NS_A.geometry),
    "fingerprint": Namespace(NS_A.tenant, "model-fp-2", NS_A.pool, NS_A.geometry),
    "pool": Namespace(NS_A.tenant, NS_A.model_fingerprint, "state", NS_A.geometry),
    "geometry-page-size": Namespace(
        NS_A.tenant, NS_A.model_fingerprint, NS_A.pool, NS_A.geometry | {"page_size": 32}
    ),
    "geometry-rank": Namespace(
        NS_A.tenant, NS_A.model_fingerprint, NS_A.pool, NS_A.geometry | {"tp_rank": 1}
    ),
    "geometry-extra-field": Namespace(
        NS_A.tenant, NS_A.model_fingerprint, NS_A.pool, NS_A.geometry | {"layers": [0, 28]}
    ),
}


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "aes"])
@pytest.mark.parametrize("differs_in", sorted(VARIANTS))
def test_records_of_one_namespace_are_misses_in_another(
    store_factory, tmp_path, differs_in, encrypted
):
    ns_b = VARIANTS[differs_in]
    assert ns_b.dirname != NS_A.dirname and ns_b.digest != NS_A.digest
    key_file = write_key_file(tmp_path / "key", os.urandom(32)) if encrypted else None
    root = str(tmp_path / "store")
    keys = [f"iso-{index}" for index in range(6)]
    datas = {key: content(key, 4096 + index) for index, key in enumerate(keys)}
    with store_factory(root, encryption_key_file=key_file, durability="none") as store:
        store.register_namespace(NS_A)
        store.register_namespace(ns_b)
        assert store.put_many(NS_A, keys, list(datas.values())) == [True] * len(keys)
        for key, data in datas.items():
            assert not store.contains(ns_b, key)
            assert not checked_get(store, ns_b, key, data)
        outs = [bytearray(len(data)) for data in datas.values()]
        assert store.get_many_into(ns_b, keys, outs) == [False] * len(keys)
        assert store.leading_run(ns_b, keys) == 0
        assert store.leading_run(NS_A, keys) == len(keys)
        snapshot = store.counters.snapshot()
        assert snapshot["hits"] == 0 and snapshot["misses"] == 2 * len(keys)
        assert snapshot["corrupt"] == snapshot["foreign"] == 0  # simply absent in B

        # B gets its own records under the same keys, with other bytes.
        other = {key: content("B:" + key, len(data)) for key, data in datas.items()}
        assert store.put_many(ns_b, keys, list(other.values())) == [True] * len(keys)
        for key in keys:
            assert checked_get(store, NS_A, key, datas[key])
            assert checked_get(store, ns_b, key, other[key])

        # Clearing B leaves A untouched.
        a_files = sorted(os.listdir(ns_dir(root, NS_A)))
        assert store.clear_namespace(ns_b) == len(keys)
        assert sorted(os.listdir(ns_dir(root, NS_A))) == a_files
        for key in keys:
            assert checked_get(store, NS_A, key, datas[key])
            assert not checked_get(store, ns_b, key, other[key])
        report = StoreAdmin(store).check()
        assert report.clean and report.records == len(keys), report.as_dict()


def test_check_flags_a_record_copied_into_another_namespace(store_factory, tmp_path):
    root = str(tmp_path / "store")
    ns_b = VARIANTS["pool"]
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        store.register_namespace(ns_b)
        assert store.put(NS_A, "k", b"a" * 100)
        shutil.copyfile(record_path(root, NS_A, "k"), record_path(root, ns_b, "k"))
        report = StoreAdmin(store).check(fix=True)
        assert [path for path, _ in report.damaged] == [record_path(root, ns_b, "k")]
        assert report.damaged[0][1].startswith("V11")
        assert StoreAdmin(store).check().clean
        assert checked_get(store, NS_A, "k", b"a" * 100)
        assert not store.contains(ns_b, "k")
