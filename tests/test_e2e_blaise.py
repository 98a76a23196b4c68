"""Blaise end to end on a real SGLang 0.5.23 server on CPU with GalahadStorage as its L3: two
questions about one section, then a restart and a third. The section's pages (preamble, source,
heading path, section text and padding: the prompt's prefix, a whole number of pages) come from
SGLang's cache for the second question and from our store after the restart; we count them.

Blaise and the KV store share one root: text under <root>/blaise, KV pages under <root>/ns.
"""

from __future__ import annotations

import pytest
from support.records import pool_records

from bench import sglang_server as e2e
from hicache_galahad.blaise import Blaise

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PAGE_SIZE = 4
MAX_NEW_TOKENS = 4
DOCUMENT = """# Harbour guide

The harbour of Quessaly has three quays and a lighthouse. Ferries leave every hour in summer.

## Bridges

The Quorvane Bridge is 4,381 metres long. It crosses the estuary south of the old town and
carries two railway tracks. Its towers were painted grey in 1931.

## Markets

The fish market opens at five in the morning. Traders sell cod, herring and mussels from the
northern banks, and the auction closes before nine.
"""
QUESTIONS = (
    "How long is the Quorvane Bridge?",
    "When were the towers of the Quorvane Bridge painted?",
    "What does the Quorvane Bridge carry across the estuary?",
)


def _reusable(prompt_ids: list[int], earlier: list[list[int]]) -> int:
    """Tokens SGLang can reuse for `prompt_ids` after serving `earlier`: the longest common
    prefix, strictly shorter than the prompt, in whole pages."""
    best = 0
    for ids in earlier:
        common = 0
        for a, b in zip(prompt_ids, ids, strict=False):
            if a != b:
                break
            common += 1
        best = max(best, min(common, len(prompt_ids) - 1))
    return best // PAGE_SIZE * PAGE_SIZE


def _settled_kv_files(root, at_least: int) -> int:
    """Waits until at least `at_least` KV records exist and their count is stable for 2 s."""
    return e2e.wait_settled(
        lambda: len(pool_records(root, "kv")),
        lambda count: count >= at_least,
        quiet_s=2.0,
        what="write-through",
    )


def test_section_pages_come_from_cache_then_from_our_store(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    root = tmp_path / "galahad"
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    with Blaise(str(root), budget_tokens=60, min_tokens=10) as memory:
        memory.add("harbour.md", DOCUMENT)
        selections = [memory.select(question)[0] for question in QUESTIONS]
        assert {(s.doc_id, s.start, s.end) for s in selections} == {
            (selections[0].doc_id, selections[0].start, selections[0].end)
        }, "the three questions must select the same section"
        assert "Quorvane Bridge is 4,381 metres long" in selections[0].text
        prompts = [
            memory.prompt(q, tokenizer, page_size=PAGE_SIZE, selection=s)
            for q, s in zip(QUESTIONS, selections, strict=True)
        ]
    prefix_len = prompts[0].prefix_len
    assert prefix_len % PAGE_SIZE == 0 and prefix_len >= 8 * PAGE_SIZE
    for prompt in prompts:  # the same prefix ids, whatever the question
        assert prompt.prefix_len == prefix_len
        assert prompt.input_ids[:prefix_len] == prompts[0].input_ids[:prefix_len]
    assert max(len(p.input_ids) for p in prompts) + MAX_NEW_TOKENS < 2048

    ids = [prompt.input_ids for prompt in prompts]
    # The question suffixes share their first tokens ("Question: "), so a reuse may run a page
    # past the prefix; the exact expectation is the common prefix in whole pages.
    expected_second = _reusable(ids[1], ids[:1])
    expected_third = _reusable(ids[2], ids[:2])
    assert prefix_len <= expected_second < prefix_len + 4 * PAGE_SIZE
    assert prefix_len <= expected_third < prefix_len + 4 * PAGE_SIZE
    num_pages = prefix_len // PAGE_SIZE

    server = e2e.start_server(
        tiny_model, e2e.galahad_args(root, page_size=PAGE_SIZE), log_path=tmp_path / "first.log"
    )
    try:
        first = e2e.generate(server, ids[0], MAX_NEW_TOKENS)
        assert first.cached_tokens == 0, first.meta_info
        second = e2e.generate(server, ids[1], MAX_NEW_TOKENS)
        details = second.cache_details
        # every page of the section's prefix from SGLang's own cache (device or host tier)
        assert second.cached_tokens == expected_second, second.meta_info
        assert details.get("device", 0) + details.get("host", 0) == expected_second, details
        assert details.get("storage", 0) == 0, details
        # SGLang writes the pages through to our store in the background
        stored = _settled_kv_files(root, expected_third // PAGE_SIZE)
        assert stored >= num_pages
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()

    server = e2e.start_server(
        tiny_model, e2e.galahad_args(root, page_size=PAGE_SIZE), log_path=tmp_path / "restart.log"
    )
    try:
        third = e2e.generate(server, ids[2], MAX_NEW_TOKENS)
        details = third.cache_details
        assert third.cached_tokens == expected_third, third.meta_info
        assert third.storage_tokens == expected_third, details  # all of it from our store
        assert details["storage_backend"] == "GalahadStorage", details
        assert third.storage_tokens // PAGE_SIZE >= num_pages  # every page of the section
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()

    with Blaise(str(root)) as memory:  # the text survived alongside the KV pages
        assert memory.read("harbour.md") == DOCUMENT.encode()


ORCHARD = """# Orchard notes

The orchard holds 212 apple trees of eleven kinds. Pruning happens in late February.

## Pests

Codling moths are trapped with pheromone lures; the traps are checked every Tuesday.
"""
LIGHTHOUSE = """# Lighthouse

The lamp of the Quessaly lighthouse turns every nine seconds and is seen 22 miles out.
"""
INDEX_QUESTIONS = (
    "Which section tells how long the Quorvane Bridge is?",
    "Which section tells when the moth traps are checked?",
    "Which section tells how far out the lamp is seen?",
)


def test_mode_2_index_pages_come_from_cache_then_from_our_store(tiny_model, tmp_path):
    """Mode 2 (prompt_with_index): the corpus index as a page-aligned prefix. After a document
    is added, the next prompt reuses every page of the earlier index from SGLang's cache;
    after a restart, a third question gets the whole index from our store. Written for issue
    22; the index's size is in docs/BLAISE.md."""
    from transformers import AutoTokenizer

    root = tmp_path / "galahad"
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    with Blaise(str(root), budget_tokens=60, min_tokens=10) as memory:
        memory.add("harbour.md", DOCUMENT)
        memory.add("orchard.md", ORCHARD)
        first = memory.prompt_with_index(INDEX_QUESTIONS[0], tokenizer, page_size=PAGE_SIZE)
        memory.add("lighthouse.md", LIGHTHOUSE)
        prompts = [
            first,
            *(
                memory.prompt_with_index(q, tokenizer, page_size=PAGE_SIZE)
                for q in INDEX_QUESTIONS[1:]
            ),
        ]
    assert all(p.prefix_len % PAGE_SIZE == 0 for p in prompts)
    grown = prompts[1].prefix_len
    assert grown > first.prefix_len and prompts[2].prefix_len == grown
    assert prompts[1].input_ids[: first.prefix_len] == first.input_ids[: first.prefix_len]
    assert max(len(p.input_ids) for p in prompts) + MAX_NEW_TOKENS < 2048

    ids = [prompt.input_ids for prompt in prompts]
    expected_second = _reusable(ids[1], ids[:1])  # the whole earlier index, in pages
    expected_third = _reusable(ids[2], ids[:2])  # the whole grown index (and maybe a page)
    assert expected_second >= first.prefix_len
    assert grown <= expected_third < len(ids[2])  # the questions share their first words

    server = e2e.start_server(
        tiny_model, e2e.galahad_args(root, page_size=PAGE_SIZE), log_path=tmp_path / "first.log"
    )
    try:
        assert e2e.generate(server, ids[0], MAX_NEW_TOKENS).cached_tokens == 0
        second = e2e.generate(server, ids[1], MAX_NEW_TOKENS)
        assert second.cached_tokens == expected_second, second.meta_info
        assert second.cache_details.get("storage", 0) == 0, second.cache_details
        stored = _settled_kv_files(root, expected_third // PAGE_SIZE)
        assert stored >= grown // PAGE_SIZE
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()

    server = e2e.start_server(
        tiny_model, e2e.galahad_args(root, page_size=PAGE_SIZE), log_path=tmp_path / "restart.log"
    )
    try:
        third = e2e.generate(server, ids[2], MAX_NEW_TOKENS)
        assert third.cached_tokens == expected_third, third.meta_info
        assert third.storage_tokens == expected_third, third.cache_details
        assert third.storage_tokens // PAGE_SIZE >= grown // PAGE_SIZE  # every index page
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()
