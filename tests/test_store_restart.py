"""Restart: another process sees every record; re-puts never rewrite; opening a big store
is fast and light."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from support.records import record_path, store_disk_bytes, temp_files, write_key_file
from support.store_helpers import NS_A, checked_get, content, hex_key, run_json

from hicache_galahad.store.admin import StoreAdmin


def sample_items(count: int = 40) -> list:
    """(key, size, compressible): hex and free-form keys, 1 byte .. ~300 KB, some packable."""
    items = []
    for index in range(count):
        key = hex_key(f"restart-{index}") if index % 2 else f"restart/{index}"
        items.append((key, 1 + (index * 7_777) % 300_000, index % 3 == 0))
    return items


@pytest.mark.parametrize("mode", ["plain", "zstd", "aes-zstd"])
@pytest.mark.parametrize("writer_open", [True, False], ids=["writer-open", "writer-closed"])
def test_a_new_process_sees_every_record(tmp_path, mode, writer_open, store_factory):
    root = str(tmp_path / "store")
    key_file = None
    if mode.startswith("aes"):
        key_file = write_key_file(tmp_path / "master.key", os.urandom(32))
    compression = "zstd" if "zstd" in mode else "none"
    items = sample_items()
    items_file = tmp_path / "items.json"
    items_file.write_text(json.dumps(items))
    store = store_factory(root, compression=compression, encryption_key_file=key_file)
    try:
        store.register_namespace(NS_A)
        keys = [key for key, _, _ in items]
        datas = [content(*item) for item in items]
        assert store.put_many(NS_A, keys[:20], datas[:20]) == [True] * 20
        for key, data in zip(keys[20:], datas[20:], strict=True):
            assert store.put(NS_A, key, data)
        if not writer_open:
            store.close()
        args = ["reader", root, "--items", items_file]
        if key_file:
            args += ["--key-file", key_file]
        seen = run_json(*args)
        assert seen["wrong_keys"] == []
        assert sorted(seen["hit_keys"]) == sorted(keys)
        assert seen["corrupt"] == seen["foreign"] == seen["misses"] == 0
        if writer_open:  # the reader's open must not have disturbed the writer's ledger
            assert store.usage_bytes() == store_disk_bytes(root)
    finally:
        store.close()
    with store_factory(root, encryption_key_file=key_file) as reopened:
        report = StoreAdmin(reopened).check()
        assert report.clean and report.records == len(items), report.as_dict()


def _identity(path: str) -> tuple:
    info = os.stat(path)
    return info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_reput_of_an_existing_key_does_not_rewrite(tmp_path, compression, store_factory):
    root = str(tmp_path / "store")
    keys = [f"again-{index}" for index in range(4)]
    datas = [content(key, 50_000, compressible=True) for key in keys]
    with store_factory(root, compression=compression) as store:
        store.register_namespace(NS_A)
        assert store.put_many(NS_A, keys, datas) == [True] * 4
        paths = [record_path(root, NS_A, key) for key in keys]
        identities = [_identity(path) for path in paths]
        ledger = store.usage_bytes()
        time.sleep(0.05)  # a rewrite now would show in mtime/ctime
        before = store.counters.snapshot()
        assert store.put(NS_A, keys[0], datas[0]) is True
        assert store.put_many(NS_A, keys, datas) == [True] * 4
        after = store.counters.snapshot()
        assert after["puts"] == before["puts"]
        assert after["puts_existing"] - before["puts_existing"] == 5
        assert [_identity(path) for path in paths] == identities
        assert store.usage_bytes() == ledger
    # And from a store opened later (another "process" lifetime) on the same root.
    with store_factory(root, compression=compression) as store:
        assert store.put(NS_A, keys[1], datas[1]) is True
        assert store.counters.snapshot()["puts"] == 0
        assert [_identity(path) for path in paths] == identities
        assert temp_files(root) == []
        for key, data in zip(keys, datas, strict=True):
            assert checked_get(store, NS_A, key, data)


@pytest.mark.slow
def test_open_a_store_of_100k_records(tmp_path, store_factory):
    root = str(tmp_path / "store")
    count = 100_000
    size = 64
    started = time.perf_counter()
    # check=False: the root is removed at the end (100k files), nothing is left to check.
    with store_factory(root, check=False, durability="none") as store:
        store.register_namespace(NS_A)
        put = store.put
        for index in range(count):
            key = f"s{index}"
            if not put(NS_A, key, content(key, size)):
                raise AssertionError(f"put {key} failed")
    write_s = time.perf_counter() - started
    probe = f"s{count // 2}"
    measured = run_json("open-measure", root, "--probe-key", probe, "--probe-size", size)
    print(
        f"\n100k records: written in {write_s:.1f} s; open {measured['open_s']:.3f} s, "
        f"RSS +{measured['rss_delta_bytes'] / 2**20:.1f} MiB "
        f"(process RSS {measured['rss_after_bytes'] / 2**20:.1f} MiB)"
    )
    assert measured["indexed_records"] < 1000  # no index of the records (issue 19)
    assert measured["probe_ok"]
    assert measured["ledger_bytes"] == store_disk_bytes(root)
    assert measured["open_s"] < 1.0  # reads no record directory: milliseconds
    assert measured["rss_delta_bytes"] < 32 * 2**20
    shutil.rmtree(root)  # 100k files: do not leave them in pytest's kept temp dirs
