"""Regression tests: a reader's own misconfiguration never destroys sound records, and a few
operational edge cases (read-only recency update, use after close) stay quiet misses."""

from __future__ import annotations

import os

import pytest
from support.records import flip_byte, record_files, record_path, write_key_file

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store.admin import StoreAdmin

NS = Namespace("tenant", "model", "kv", {"page_bytes": 4096})
PAGE = bytes(range(256)) * 16


def key_file(path, seed: int) -> str:
    return write_key_file(path, bytes((seed + index) % 256 for index in range(32)))


def test_wrong_key_misses_without_quarantining(tmp_path, store_factory):
    good = key_file(tmp_path / "good.key", 1)
    with store_factory(encryption_key_file=good) as store:
        store.register_namespace(NS)
        assert all(store.put_many(NS, ["a", "b", "c"], [PAGE] * 3))
    wrong = key_file(tmp_path / "wrong.key", 2)
    with store_factory(encryption_key_file=wrong) as store:
        assert store.get(NS, "a", len(PAGE)) is None
        assert store.get(NS, "b", len(PAGE)) is None
        report = StoreAdmin(store).check(fix=True)
        assert not report.damaged and len(report.unverifiable) == 3
    assert len(record_files(tmp_path / "store")) == 3
    with store_factory(encryption_key_file=good) as store:
        assert store.get(NS, "c", len(PAGE)) == PAGE


def test_tampered_record_is_quarantined_once_the_key_is_proven(tmp_path, store_factory):
    good = key_file(tmp_path / "good.key", 1)
    with store_factory(encryption_key_file=good) as store:
        store.register_namespace(NS)
        assert all(store.put_many(NS, ["a", "b"], [PAGE] * 2))
        path = record_path(tmp_path / "store", NS, "b")
        flip_byte(path, mask=1)
        assert store.get(NS, "a", len(PAGE)) == PAGE  # this key opens records here
        assert store.get(NS, "b", len(PAGE)) is None
        assert not os.path.exists(path) and store.stats().counter("quarantined") == 1


def test_plaintext_records_survive_an_encrypted_reader(tmp_path, store_factory):
    with store_factory() as store:
        store.register_namespace(NS)
        assert store.put(NS, "a", PAGE)
    with store_factory(encryption_key_file=key_file(tmp_path / "k", 3)) as store:
        assert store.get(NS, "a", len(PAGE)) is None
        assert not StoreAdmin(store).check(fix=True).damaged
    with store_factory() as store:
        assert store.get(NS, "a", len(PAGE)) == PAGE


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_reader_expecting_another_size_keeps_the_record(store_factory, compression):
    with store_factory(compression=compression) as store:
        store.register_namespace(NS)
        assert store.put(NS, "a", bytes(4096))
        assert store.get(NS, "a", 4095) is None
        assert store.get(NS, "a", 4096) == bytes(4096)
        assert store.stats().counter("quarantined") == 0


def test_failed_recency_update_is_not_a_miss(store_factory, monkeypatch):
    with store_factory() as store:
        store.register_namespace(NS)
        assert store.put(NS, "a", PAGE)

        def read_only(*args, **kwargs):
            raise OSError(30, "Read-only file system")

        monkeypatch.setattr(os, "utime", read_only)
        assert store.get(NS, "a", len(PAGE)) == PAGE


def test_closed_store_answers_misses(store_factory):
    store = store_factory()
    store.register_namespace(NS)
    assert store.put(NS, "a", PAGE)
    store.close()
    assert store.get(NS, "a", len(PAGE)) is None
    assert store.get_many_into(NS, ["a"], [bytearray(len(PAGE))]) == [False]
    assert store.put_many(NS, ["b"], [PAGE]) == [False]
    assert store.put(NS, "b", PAGE) is False
