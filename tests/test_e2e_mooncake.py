"""Two real SGLang servers on CPU, each with its own local root, sharing one real Mooncake
cluster through GalahadStorage: a prompt served by server A is a storage hit on server B with
identical output, for a Llama and for a hybrid Qwen3-Next (KV pages and recurrent states). A
server whose Mooncake master is down starts as fast as one without Mooncake and serves from
its own disk."""

from __future__ import annotations

import time

import pytest
from support.records import pool_records
from test_e2e_hybrid import HARNESS_ENV, INTERVAL, hybrid_args, prompt_of

from bench import sglang_server as e2e
from bench.mooncake_cluster import ENV, mooncake_cluster_fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

cluster = mooncake_cluster_fixture(segment_bytes=128 << 20)
PAGE_SIZE = 4
PROMPT = list(range(10, 53))
STORAGE_HIT = (len(PROMPT) - 1) // PAGE_SIZE * PAGE_SIZE


def llama_server(model, root, log_path, mooncake):
    args = e2e.galahad_args(root, page_size=PAGE_SIZE, mooncake=mooncake)
    return e2e.start_server(model, args, env=ENV, log_path=log_path)


def wait_shared(server):
    """Until the tier connected (writes before that are local only)."""
    e2e.wait_for(
        lambda: "mooncake tier connected" in e2e.server_log(server), 60, "Mooncake connected"
    )


def test_a_prompt_served_by_server_a_is_a_storage_hit_on_server_b(tiny_model, tmp_path, cluster):
    config = cluster.tier_config()
    server_a = llama_server(tiny_model, tmp_path / "a", tmp_path / "a.log", config)
    try:
        wait_shared(server_a)
        first = e2e.generate(server_a, PROMPT, 4)
        e2e.wait_for(lambda: len(pool_records(tmp_path / "a", "kv")) >= STORAGE_HIT // 4, 60)
        time.sleep(2)  # the tier's write-behind queue drains
    finally:
        server_a.stop()
    server_b = llama_server(tiny_model, tmp_path / "b", tmp_path / "b.log", config)
    try:
        wait_shared(server_b)
        second = e2e.generate(server_b, PROMPT, 4)
        e2e.assert_cached(second, storage=STORAGE_HIT)
        e2e.assert_same_output(second, first)
        e2e.assert_storage_healthy(server_b)
    finally:
        server_b.stop()
    assert len(pool_records(tmp_path / "b", "kv")) >= STORAGE_HIT // PAGE_SIZE  # written through


def test_the_hybrid_model_shares_kv_and_states_through_mooncake(hybrid_model, tmp_path, cluster):
    config = cluster.tier_config()
    prompt = prompt_of(2 * INTERVAL + 20, seed=7)  # restorable boundary: 2C = 128 tokens
    server_a = e2e.start_server(
        hybrid_model,
        hybrid_args(tmp_path / "a", mooncake=config),
        env={**HARNESS_ENV, **ENV},
        log_path=tmp_path / "a.log",
    )
    try:
        wait_shared(server_a)
        first = e2e.generate(server_a, prompt, 8)
        e2e.wait_for(lambda: len(pool_records(tmp_path / "a", "mamba")) >= 1, 60)
        time.sleep(2)
    finally:
        server_a.stop()
    server_b = e2e.start_server(
        hybrid_model,
        hybrid_args(tmp_path / "b", mooncake=config),
        env={**HARNESS_ENV, **ENV},
        log_path=tmp_path / "b.log",
    )
    try:
        wait_shared(server_b)
        second = e2e.generate(server_b, prompt, 8)
        e2e.assert_cached(second, storage=2 * INTERVAL)
        e2e.assert_same_output(second, first)
    finally:
        server_b.stop()
    assert pool_records(tmp_path / "b", "mamba")


def test_a_server_with_its_master_down_starts_at_once_and_serves_from_disk(
    tiny_model, tmp_path, cluster
):
    config = cluster.tier_config()
    cluster.kill_master()
    started = time.monotonic()
    server = llama_server(tiny_model, tmp_path / "down", tmp_path / "down.log", config)
    with_dead_master_s = time.monotonic() - started
    try:
        first = e2e.generate(server, PROMPT, 4)
        e2e.wait_for(lambda: len(pool_records(tmp_path / "down", "kv")) >= STORAGE_HIT // 4, 60)
        e2e.flush_cache(server)
        again = e2e.generate(server, PROMPT, 4)
        e2e.assert_cached(again, storage=STORAGE_HIT)  # from its own disk
        e2e.assert_same_output(again, first)
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()
    started = time.monotonic()
    plain = e2e.start_server(
        tiny_model, e2e.galahad_args(tmp_path / "plain", page_size=PAGE_SIZE),
        log_path=tmp_path / "plain.log",
    )  # fmt: skip
    without_mooncake_s = time.monotonic() - started
    plain.stop()
    assert with_dead_master_s < without_mooncake_s + 5, (with_dead_master_s, without_mooncake_s)
