"""Issue 30's hybrid goal on a real server: under a budget that evicts, a recurrent-state
checkpoint is never kept without the KV run before it, and `galahad ready` still equals what a
restart restores.

The tiny hybrid Qwen3-Next of tests/test_e2e_hybrid.py (C = 64, P = 16) writes documents of
several lengths through SGLang's write-through into a root whose max_bytes holds about two of
them, one document asked again from storage in between (its records move to the main queue).
Then, for every state record on disk, every KV page of its leading run is on disk in every KV
namespace; and after a restart, for each document, what `ready` (no probe: the store alone)
says a request restores is what the next request restores from storage, asked right before
it (each request's own write-through evicts others' records: the documents ready finds
restorable at the restart go first).

On the sampled eviction before issue 30's shared order (bc6b778^) the first check fails:
"doc0: state at 128 without pages [2, 3, 4, 5, 6, 7]". 62-87 s on 2 shared cores."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.records import page_keys, pool_records
from test_e2e_hybrid import HARNESS_ENV, INTERVAL, PAGE_SIZE, hybrid_args
from test_e2e_warm import prompt_of, sigkill

import hicache_galahad
from bench import sglang_server as e2e
from hicache_galahad.store import RecordStore

pytestmark = pytest.mark.e2e

# A KV page of the tiny model is 4 KiB of K and V (one full-attention layer), a state about
# 17 KiB (three GDN layers); on disk with their headers about 8 and 20 KiB. A document of
# 163 tokens keeps 8 pages and the state at 128: about 84 KiB. The budget holds about two.
MAX_BYTES = 192 << 10
LENGTHS = (163, 100, 230, 163, 140, 200)  # states at 128, 64, 192, 128, 128, 192
ASKED_AGAIN = 0  # read back from storage after the third document is written


def documents() -> list[tuple[str, list[int]]]:
    return [(f"doc{index}", prompt_of(length, 30 + index)) for index, length in enumerate(LENGTHS)]


def namespace_keys(root: Path, pool: str) -> list[set[str]]:
    """The record keys of each namespace of one pool."""
    by_directory: dict[Path, set[str]] = {}
    for path in pool_records(root, pool):
        by_directory.setdefault(path.parent, set()).add(path.stem)
    return list(by_directory.values())


def records_on_disk(root: Path) -> tuple[frozenset, frozenset]:
    kv = frozenset(path.name for path in pool_records(root, "kv"))
    return kv, frozenset(path.name for path in pool_records(root, "mamba"))


def settle(root: Path) -> None:
    """Write-through done and evictions unlinked: the records stopped changing for a second."""
    e2e.wait_settled(lambda: records_on_disk(root), quiet_s=1.5, timeout_s=60)


def orphaned_states(root: Path, docs) -> list[str]:
    """State records whose KV head is gone: a state under page k's key whose pages 0..k are
    not all present in every KV namespace."""
    chains = {}
    for name, ids in docs:
        keys = page_keys(ids, PAGE_SIZE)
        for page, key in enumerate(keys):
            chains[key] = (name, keys[: page + 1])
    kv_namespaces = namespace_keys(root, "kv")
    found = []
    for states in namespace_keys(root, "mamba"):
        for key in states:
            name, run = chains[key]  # every state the server wrote is one of the documents'
            missing = [
                index
                for index, page_key in enumerate(run)
                if not all(page_key in kv for kv in kv_namespaces)
            ]
            if missing:
                found.append(f"{name}: state at {len(run) * PAGE_SIZE} without pages {missing}")
    return found


def test_hybrid_state_kept_with_its_kv_head_and_ready_equals_restart(hybrid_model, tmp_path):
    root = tmp_path / "store"
    docs = documents()
    args = hybrid_args(root, max_bytes=MAX_BYTES)
    server = e2e.start_server(hybrid_model, args, env=HARNESS_ENV, log_path=tmp_path / "first.log")
    try:
        for index, (_, ids) in enumerate(docs):
            e2e.generate(server, ids, 1)
            settle(root)
            if index == 2:  # the first document again, from storage: used, so kept longer
                e2e.flush_cache(server)
                e2e.generate(server, docs[ASKED_AGAIN][1], 1)
                settle(root)
        e2e.assert_storage_healthy(server, "transfer failed")
    finally:
        sigkill(server)

    with RecordStore(str(root), read_only=True) as store:
        assert store.usage_bytes() <= MAX_BYTES
    kv = set().union(*namespace_keys(root, "kv"))
    headless = [name for name, ids in docs if page_keys(ids, PAGE_SIZE)[0] not in kv]
    assert headless, "the budget evicted no document: the test proves nothing"
    assert orphaned_states(root, docs) == []
    assert namespace_keys(root, "mamba"), "every state evicted: the test proves nothing"

    server = e2e.start_server(
        hybrid_model, args, env=HARNESS_ENV, log_path=tmp_path / "restart.log"
    )
    try:
        first = hicache_galahad.ready(server.url, docs, root=str(root), probe=False)
        kept = {name: state.restorable_tokens for (name, _), state in zip(docs, first, strict=True)}
        assert sum(1 for tokens in kept.values() if tokens) >= 2, kept
        # What ready says restorable first: a request restoring a whole run writes nothing new,
        # so it evicts nothing another document's ready counted on.
        restored = {}
        for document in sorted(docs, key=lambda doc: -kept[doc[0]]):
            settle(root)  # the previous request's write-through, and what it evicted
            (state,) = hicache_galahad.ready(server.url, [document], root=str(root), probe=False)
            result = e2e.generate(server, document[1], 1)
            restored[document[0]] = (state.restorable_tokens, result.storage_tokens)
            e2e.assert_cached(result, storage=state.restorable_tokens)
        print(
            f"\nheadless: {headless}; ready at the restart: {kept}; (ready, restored): {restored}"
        )
        assert any(tokens for tokens, _ in restored.values()), restored
        assert all(tokens % INTERVAL == 0 for tokens, _ in restored.values()), restored
        settle(root)
        assert orphaned_states(root, docs) == []
        e2e.assert_storage_healthy(server, "transfer failed")
    finally:
        server.stop()
