"""The counter files under <root>/stats (store/lifetime.py) are replaced through
safe_files.replace_file: one exclusive temp (`<name>.<random>.tmp`) renamed over the file.
A temp a killed writer left is never counted and is swept once stale, whichever naming it
has (versions before replace_file hid it behind a leading dot)."""

from __future__ import annotations

import json
import os

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store.lifetime import STALE_TEMP_AGE_S, lifetime_totals

ALICE = Namespace("alice", "model", "kv", {"page_bytes": 4096})


def test_counts_survive_the_store_and_no_temp_stays(store_factory, tmp_path):
    store = store_factory(durability="none")
    namespace = store.register_namespace(ALICE)
    assert store.put_many(namespace, ["a" * 64, "b" * 64], [bytes(4096)] * 2) == [True] * 2
    stats_dir = tmp_path / "store" / "stats"
    assert f"{store.accounting.token}.json" in os.listdir(stats_dir)
    store.close()
    assert sorted(os.listdir(stats_dir)) == ["lifetime.json", "lifetime.json.lock"]
    assert lifetime_totals(str(tmp_path / "store"))["puts"] == 2


def test_stale_temps_of_either_naming_are_swept_fresh_ones_kept_none_counted(
    store_factory, tmp_path
):
    store_factory(durability="none").close()  # makes stats/ and lifetime.json
    stats_dir = tmp_path / "store" / "stats"
    document = json.dumps({"counters": {"puts": 1000}})
    stale = ["0123456789abcdef.json.00aa11bb22cc33dd.tmp", ".lifetime.json.0011223344556677.tmp"]
    fresh = "fedcba9876543210.json.8899aabbccddeeff.tmp"
    long_ago_s = os.path.getmtime(stats_dir) - 2 * STALE_TEMP_AGE_S
    for name in [*stale, fresh]:
        (stats_dir / name).write_text(document)
    for name in stale:
        os.utime(stats_dir / name, (long_ago_s, long_ago_s))
    assert lifetime_totals(str(tmp_path / "store")).get("puts", 0) == 0  # temps are no counts
    store_factory(durability="none").close()  # opening and closing folds, and sweeps
    left = os.listdir(stats_dir)
    assert fresh in left and not set(stale) & set(left)
