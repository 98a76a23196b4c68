"""A real SGLang server with --enable-metrics: its /metrics shows SGLang's own storage metrics
fed by our get_stats, and our counters (hits, bytes, batch latency), after a prompt is
restored from our store. The counters also reach `galahad stats` through the store."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
import requests
from support.records import pool_records

from bench import sglang_server as e2e
from hicache_galahad.store import lifetime

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PAGE_SIZE = 4
PROMPT = list(range(10, 53))
STORAGE_HIT = (len(PROMPT) - 1) // PAGE_SIZE * PAGE_SIZE


def metric(text: str, name: str) -> float:
    """The sum of every sample of `name` (any labels) in a Prometheus text exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def test_metrics_endpoint_shows_storage_and_galahad_counters(tiny_model, tmp_path):
    root = tmp_path / "store"
    args = [*e2e.galahad_args(root, page_size=PAGE_SIZE), "--enable-metrics"]
    server = e2e.start_server(tiny_model, args, log_path=tmp_path / "server.log")
    try:
        cold = e2e.generate(server, PROMPT, 4)
        e2e.wait_for(lambda: len(pool_records(root, "kv")) >= STORAGE_HIT // PAGE_SIZE, 60)
        e2e.flush_cache(server)
        warm = e2e.generate(server, PROMPT, 4)
        e2e.assert_cached(warm, storage=STORAGE_HIT)
        e2e.assert_same_output(warm, cold)

        def scraped():
            text = requests.get(f"{server.url}/metrics", timeout=30).text
            return text if metric(text, "galahad_hits_total") >= STORAGE_HIT // PAGE_SIZE else None

        e2e.wait_for(lambda: scraped() is not None, 60, "galahad counters at /metrics")
        text = scraped()
        time.sleep(lifetime.FLUSH_INTERVAL_S + 0.5)  # counters reach the store at that rate
        e2e.flush_cache(server)
        e2e.generate(server, PROMPT, 4)
    finally:
        server.stop()
    assert metric(text, "galahad_read_bytes_total") > 0
    assert metric(text, "galahad_written_bytes_total") > 0
    assert metric(text, "galahad_batch_seconds_count") >= 2  # a backup and a prefetch
    assert metric(text, "galahad_corrupt_total") == 0
    assert metric(text, "sglang:prefetch_pgs_count") >= 1  # SGLang's own, from get_stats
    assert metric(text, "sglang:backup_pgs_count") >= 1

    stats = subprocess.run(
        [sys.executable, "-m", "hicache_galahad", "stats", "--root", str(root), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    counters = json.loads(stats.stdout)["lifetime_counters"]
    assert counters["hits"] >= STORAGE_HIT // PAGE_SIZE and counters["puts"] >= 1
