"""The operator's CLI on a real store: stats, check (and --fix), purge by tenant."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hicache_galahad.namespace import Namespace
from hicache_galahad.store import RecordStore


def run_cli(root, *args):
    result = subprocess.run(
        [sys.executable, "-m", "hicache_galahad.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
    )
    return result.returncode, result.stdout


def test_stats_check_fix_and_purge(tmp_path):
    store = RecordStore(str(tmp_path))
    alice = store.register_namespace(Namespace("alice", "model", "kv", {"page_bytes": 64}))
    bob = store.register_namespace(Namespace("bob", "model", "kv", {"page_bytes": 64}))
    for index in range(3):
        assert store.put(alice, f"{index:064x}", bytes([index]) * 64)
        assert store.put(bob, f"{index:064x}", bytes([index + 10]) * 64)
    store.close()

    code, out = run_cli(tmp_path, "stats")
    stats = json.loads(out)
    assert code == 0
    assert sorted((ns["tenant"], ns["records"]) for ns in stats["namespaces"]) == [
        ("alice", 3),
        ("bob", 3),
    ]

    damaged = os.path.join(tmp_path, "ns", alice.dirname, f"{1:064x}.rec")
    with open(damaged, "r+b") as record:
        record.seek(-1, os.SEEK_END)
        last = record.read(1)[0]
        record.seek(-1, os.SEEK_END)
        record.write(bytes([last ^ 0xFF]))
    code, out = run_cli(tmp_path, "check")
    report = json.loads(out)
    assert code == 1 and len(report["damaged"]) == 1 and "V13" in report["damaged"][0][1]
    code, out = run_cli(tmp_path, "check", "--fix")
    assert code == 0 and json.loads(out)["fixed"]
    code, out = run_cli(tmp_path, "check")
    assert code == 0 and json.loads(out)["clean"] and json.loads(out)["records"] == 5

    code, out = run_cli(tmp_path, "purge", "--tenant", "alice")
    assert code == 0 and json.loads(out)["removed_records"] == 2
    store = RecordStore(str(tmp_path))
    assert store.get(bob, f"{2:064x}", 64) == bytes([12]) * 64
    assert store.get(alice, f"{0:064x}", 64) is None
    store.close()


def test_missing_store_is_an_error(tmp_path):
    code, _ = run_cli(tmp_path / "nothing", "stats")
    assert code == 2
