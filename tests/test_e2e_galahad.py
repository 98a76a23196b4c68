"""A real SGLang 0.5.23 server on CPU with GalahadStorage as its L3: write-back, flush or
restart, prefetch from our store, identical output. Damage, tenants and eviction too."""

from __future__ import annotations

import json
import os

import pytest
from support.records import budgeted_files, flip_byte, pool_records, record_files

from bench import sglang_server as e2e

pytestmark = pytest.mark.e2e

PAGE_SIZE = 4
PROMPT = list(range(10, 53))  # 43 token ids
EXPECTED_STORAGE_HIT = (len(PROMPT) - 1) // PAGE_SIZE * PAGE_SIZE  # 40: strict prefix, whole pages
MAX_NEW_TOKENS = 4


def settled_store_bytes(root) -> int:
    """The store's bytes once SGLang's background write-back has gone quiet (a scan racing a
    write and an eviction could see the new file and the evicted one together)."""
    files = e2e.wait_settled(
        lambda: frozenset(budgeted_files(root).items()), quiet_s=0.3, poll_s=0.3, timeout_s=30
    )
    return sum(size for _, size in files)


def serve(model, root, tmp_path, name, **kwargs):
    return e2e.start_server(
        model,
        e2e.galahad_args(root, page_size=PAGE_SIZE, **kwargs),
        log_path=tmp_path / f"{name}.log",
    )


def ask(server, root, expected_pages=EXPECTED_STORAGE_HIT // PAGE_SIZE):
    result = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
    e2e.wait_for(lambda: len(pool_records(root, "kv")) >= expected_pages, 60, "write-through")
    return result


@pytest.mark.parametrize(
    "layout,interface_v1", [("page_first_direct", True), ("layer_first", False)]
)
def test_flush_then_restart_then_damage(tiny_model, tmp_path, layout, interface_v1):
    root = tmp_path / "store"
    server = serve(tiny_model, root, tmp_path, "first", layout=layout, interface_v1=interface_v1)
    try:
        cold = ask(server, root)
        e2e.assert_cached(cold)
        e2e.flush_cache(server)
        warm = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        e2e.assert_cached(warm, storage=EXPECTED_STORAGE_HIT)
        e2e.assert_same_output(warm, cold)
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()

    server = serve(tiny_model, root, tmp_path, "restart", layout=layout, interface_v1=interface_v1)
    try:
        restored = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        e2e.assert_cached(restored, storage=EXPECTED_STORAGE_HIT)
        e2e.assert_same_output(restored, cold)
    finally:
        server.stop()

    for path in record_files(root):  # flip one payload byte in every record
        flip_byte(path, mask=0x5A)
    server = serve(tiny_model, root, tmp_path, "damaged", layout=layout, interface_v1=interface_v1)
    try:
        recomputed = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        e2e.assert_cached(recomputed)
        e2e.assert_same_output(recomputed, cold)
        e2e.assert_storage_healthy(server)
        # the damage was seen and reported, not served
        assert "failed V13" in e2e.server_log(server)
    finally:
        server.stop()


def test_tenants_never_share(tiny_model, tmp_path):
    root = tmp_path / "store"
    server = serve(tiny_model, root, tmp_path, "alice", tenant="alice")
    try:
        reference = ask(server, root)
    finally:
        server.stop()
    server = serve(tiny_model, root, tmp_path, "bob", tenant="bob")
    try:
        result = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        e2e.assert_cached(result)
        e2e.assert_same_output(result, reference)
    finally:
        server.stop()


def test_eviction_keeps_answers_correct_within_budget(tiny_model, tmp_path):
    root = tmp_path / "store"
    probe = serve(tiny_model, root, tmp_path, "probe")
    try:
        ask(probe, root)
        page_bytes = max(path.stat().st_size for path in pool_records(root, "kv"))
    finally:
        probe.stop()
    for path in record_files(root):
        os.unlink(path)
    budget = 12 * page_bytes  # room for 12 of the ~40 pages the prompts below produce
    server = serve(tiny_model, root, tmp_path, "budget", max_bytes=budget)
    try:
        prompts = [[(base * 7 + index) % 300 + 5 for index in range(43)] for base in range(4)]
        references = [e2e.generate(server, prompt, MAX_NEW_TOKENS) for prompt in prompts]
        e2e.wait_for(lambda: len(pool_records(root, "kv")) >= 10, 60, "write-through")
        e2e.flush_cache(server)
        for prompt, reference in zip(prompts, references, strict=True):
            again = e2e.generate(server, prompt, MAX_NEW_TOKENS)
            e2e.assert_same_output(again, reference)
            assert settled_store_bytes(root) <= budget
        server.stop()
        assert settled_store_bytes(root) <= budget
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()


@pytest.mark.parametrize("form", ["json", "file"])
def test_engine_in_process(tiny_model, tmp_path, form):
    """sglang.Engine(...) in-process with the dynamic backend, the extra config given as a JSON
    string or as @config.json."""
    root = tmp_path / "store"
    config = json.dumps(e2e.galahad_config(root, interface_v1=1, prefetch_threshold=4))
    if form == "file":
        (tmp_path / "galahad.json").write_text(config)
        config = "@" + str(tmp_path / "galahad.json")
    result = e2e.run_engine_roundtrip(
        tiny_model, "--layout", "page_first_direct", "--backend", "dynamic",
        "--extra-config", config, "--storage-dir", str(root), "--record-glob", "ns/*/*.rec",
        "--page-size", str(PAGE_SIZE), "--prompt-len", str(len(PROMPT)),
        "--max-new-tokens", str(MAX_NEW_TOKENS),
    )  # fmt: skip
    assert result["flush_success"], result
    first, second = (e2e.GenerateResult.from_record(result[run]) for run in ("first", "second"))
    e2e.assert_cached(first)
    e2e.assert_cached(second, storage=EXPECTED_STORAGE_HIT)
    e2e.assert_same_output(second, first)
