"""End-to-end proof of the CPU SGLang harness (tests/sglang_cpu/) with HiCache L3 storage.

A real SGLang 0.5.23 server (and an in-process ``sglang.Engine``) runs the tiny local Llama on
CPU with SGLang's built-in ``file`` storage backend: a prompt is answered, ``/flush_cache`` empties
the device and host tiers, and the same prompt again must report its page-aligned prefix as
coming from storage, with identical output tokens and logprobs.
"""

from __future__ import annotations

import importlib.util

import pytest

from bench import sglang_server as e2e

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed"),
]

PAGE_SIZE = 4
PROMPT = list(range(10, 53))  # 43 token ids
# SGLang reuses at most input_len - 1 tokens, aligned down to whole pages: 42 -> 40.
EXPECTED_STORAGE_HIT = (len(PROMPT) - 1) // PAGE_SIZE * PAGE_SIZE
MAX_NEW_TOKENS = 4
LAYOUTS = ["layer_first", "page_first_direct"]


def _assert_storage_round_trip(first, second):
    e2e.assert_cached(first)
    e2e.assert_cached(second, storage=EXPECTED_STORAGE_HIT, backend="HiCacheFile")
    assert len(first.output_ids) == MAX_NEW_TOKENS
    e2e.assert_same_output(second, first)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_server_file_backend_storage_hit(tiny_model, tmp_path, layout):
    storage = tmp_path / "l3"
    storage.mkdir()
    server = e2e.start_server(
        tiny_model,
        [*e2e.TINY_SERVER_ARGS, *e2e.hicache_args(layout, page_size=PAGE_SIZE)],
        env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(storage)},
        log_path=tmp_path / "server.log",
    )
    pgid = server.pgid
    try:
        print(f"{layout}: server healthy after {server.startup_s:.1f}s")
        first = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        # Write-through to L3 is asynchronous and a flush drops queued writes.
        e2e.wait_for_files(storage, EXPECTED_STORAGE_HIT // PAGE_SIZE)
        e2e.flush_cache(server)
        second = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        _assert_storage_round_trip(first, second)
    finally:
        server.stop()
    assert e2e.group_members(pgid) == [], "a server process survived stop()"


def test_engine_in_process_file_backend_storage_hit(tiny_model, tmp_path):
    storage = tmp_path / "l3"
    storage.mkdir()
    result = e2e.run_engine_roundtrip(
        tiny_model, "--layout", "page_first_direct", "--storage-dir", str(storage),
        "--page-size", str(PAGE_SIZE), "--prompt-len", str(len(PROMPT)),
        "--max-new-tokens", str(MAX_NEW_TOKENS),
    )  # fmt: skip
    assert result["flush_success"], result
    first, second = (e2e.GenerateResult.from_record(result[run]) for run in ("first", "second"))
    _assert_storage_round_trip(first, second)
