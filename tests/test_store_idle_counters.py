"""Regression test for issue 32's note on counters: OPERATIONS.md promises the counters are
persisted in the store every FLUSH_INTERVAL_S, but they were written only by a read or a write,
at most every 2 s, so an idle server's last counts never reached the disk and a SIGKILL lost
them. A real child process does some puts, goes idle and is SIGKILLed; its counter file holds
every put it made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store.lifetime import FLUSH_INTERVAL_S, lifetime_totals

REPO_ROOT = Path(__file__).resolve().parent.parent
PUTS = 7
CHILD = f"""
import sys, time
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
store = RecordStore(sys.argv[1], durability="none")
namespace = store.register_namespace(Namespace("alice", "model", "kv", {{"page_bytes": 4096}}))
for index in range({PUTS}):
    assert store.put(namespace, f"{{index:064x}}", bytes([index]) * 4096)
print("idle", flush=True)
time.sleep(600)
"""


def test_an_idle_servers_counts_reach_the_disk_before_a_sigkill(tmp_path):
    root = tmp_path / "root"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert child.stdout.readline().strip() == "idle"
        time.sleep(FLUSH_INTERVAL_S + 1.0)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    counters = lifetime_totals(str(root))
    assert counters.get("puts") == PUTS


def test_closing_the_store_stops_its_counter_thread_and_writes_the_last_counts(
    tmp_path, store_factory
):
    def counter_threads() -> int:
        return sum(thread.name == "galahad-counters" for thread in threading.enumerate())

    before = counter_threads()
    root = str(tmp_path / "root")
    store = store_factory(root, durability="none")
    namespace = store.register_namespace(Namespace("alice", "model", "kv", {"page_bytes": 8}))
    assert counter_threads() == before + 1
    assert store.put(namespace, "k", b"12345678")
    store.close()  # at once: before the thread's first write
    assert counter_threads() == before
    assert lifetime_totals(root).get("puts") == 1
