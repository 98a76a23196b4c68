"""Blaise: documents byte-exact in verified records, persistent across restarts, isolated per
tenant, encrypted with a key, never evicted by the KV budget; damaged records are skipped."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.records import flip_byte, record_path, write_key_file

from hicache_galahad.blaise import Blaise, compose
from hicache_galahad.blaise.records import MODEL_FINGERPRINT, POOL, SCHEMA
from hicache_galahad.record.namespace import Namespace

HARBOUR = """# Harbour

The harbour has three quays. Ferries leave every hour in summer and twice a day in winter.

## Bridges

The Quorvane Bridge is 4,381 metres long. It crosses the estuary south of the old town.

## Markets

The fish market opens at five. Traders sell cod, herring and mussels from the northern banks.
"""
ORCHARD = """Orchard notes
=============

The orchard holds 212 apple trees of eleven kinds. Pruning happens in late February.

Pests
-----

Codling moths are trapped with pheromone lures; the traps are checked every Tuesday.
"""
SMALL = {"budget_tokens": 30, "min_tokens": 5}


def open_memory(root: Path, **options) -> Blaise:
    return Blaise(str(root), **(SMALL | options))


def blaise_record(root: Path, tenant: str, key: str) -> Path:
    """Where Blaise keeps `key` of `tenant`: in its own store, under root/blaise."""
    namespace = Namespace(tenant, MODEL_FINGERPRINT, POOL, {"schema": SCHEMA})
    return Path(record_path(root / "blaise", namespace, key))


def all_record_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (root / "blaise").rglob("*") if p.is_file())


# ------------------------------------------------------------------------------ documents


def test_every_document_is_byte_exact_in_its_sections(tmp_path):
    documents = {
        "harbour.md": HARBOUR,
        "orchard.txt": ORCHARD,
        "unicode.txt": "Straße “quoted.” Ünïcödé ✓ — 日本語の文。\r\nSecond line. " * 40,
        "raw.bin": b"bytes \xc3\xa9t\xc3\xa9. " * 100,
    }
    with open_memory(tmp_path) as memory:
        for doc_id, text in documents.items():
            data = text if isinstance(text, bytes) else text.encode()
            sections = memory.add(doc_id, text)
            assert b"".join(data[s.start : s.end] for s in sections) == data
            assert memory.read(doc_id) == data
            assert memory.sections(doc_id) == sections
        assert memory.documents() == list(documents)


def test_select_returns_offsets_and_exact_text(tmp_path):
    with open_memory(tmp_path) as memory:
        memory.add("harbour.md", HARBOUR)
        memory.add("orchard.txt", ORCHARD)
        found = memory.select("How long is the Quorvane Bridge?", k=2)
        assert len(found) == 1  # no other section shares a term with the question
        best = found[0]
        data = HARBOUR.encode()
        assert best.doc_id == "harbour.md"
        assert best.text == data[best.start : best.end].decode()
        assert "4,381 metres" in best.text
        assert best.headings == ("Harbour", "Bridges")
        assert best.score > 0 and found.skipped == []
        several = memory.select("harbour bridge market orchard", k=3)
        assert len(several) == 3 and len({(s.doc_id, s.start) for s in several}) == 3
        assert [s.score for s in several] == sorted((s.score for s in several), reverse=True)
        assert memory.select("When are the moth traps checked?")[0].doc_id == "orchard.txt"
        assert memory.select("zzz qqq") == []


def test_non_utf8_bytes_are_refused(tmp_path):
    with open_memory(tmp_path) as memory, pytest.raises(ValueError):
        memory.add("bad.bin", b"\xff\xfe not text")


def record_keys(memory: Blaise, doc_id: str) -> set[str]:
    """The keys of a document's records: its manifest and the blocks its sections are in."""
    key, manifest = memory._manifests[doc_id]
    return {key, *(ref.key for ref in manifest.sections)}


def test_replace_and_remove(tmp_path):
    orchard = ORCHARD.encode()
    with open_memory(tmp_path) as memory:
        memory.add("doc", HARBOUR)
        replaced = record_keys(memory, "doc")
        assert all(blaise_record(tmp_path, "default", key).exists() for key in replaced)
        memory.add("doc", HARBOUR)  # the same bytes: nothing changes
        memory.add("doc", ORCHARD)
        assert memory.read("doc") == orchard
        assert memory.select("How long is the Quorvane Bridge?") == []
        assert not any(blaise_record(tmp_path, "default", key).exists() for key in replaced)
        removed = record_keys(memory, "doc")
        assert memory.remove("doc") and not memory.remove("doc")
        assert memory.documents() == [] and memory.select("apple trees") == []
        assert not any(blaise_record(tmp_path, "default", key).exists() for key in removed)
    with open_memory(tmp_path) as memory:
        assert memory.documents() == []


# ------------------------------------------------------------------------------ persistence


def test_documents_survive_a_restart(tmp_path):
    with open_memory(tmp_path) as memory:
        memory.add("harbour.md", HARBOUR)
        memory.add("orchard.txt", ORCHARD)
        before = memory.select("How long is the Quorvane Bridge?")[0]
        index = memory.index_text()
    with open_memory(tmp_path) as memory:
        assert memory.documents() == ["harbour.md", "orchard.txt"]
        assert memory.read("harbour.md") == HARBOUR.encode()
        assert memory.select("How long is the Quorvane Bridge?")[0] == before
        assert memory.index_text() == index
        assert memory.skipped == []


def test_index_text_is_deterministic_and_append_only(tmp_path):
    with open_memory(tmp_path) as memory:
        memory.add("harbour.md", HARBOUR)
        first = memory.index_text()
        memory.add("orchard.txt", ORCHARD)
        second = memory.index_text()
    assert second.startswith(first)
    assert "harbour.md#2 | Harbour > Bridges | The Quorvane Bridge is 4,381 metres long." in second
    assert "orchard.txt#" in second[len(first) :]
    with open_memory(tmp_path / "other") as memory:
        memory.add("harbour.md", HARBOUR)
        memory.add("orchard.txt", ORCHARD)
        assert memory.index_text() == second


def test_two_writers_on_one_root_both_land(tmp_path):
    first, second = open_memory(tmp_path), open_memory(tmp_path)
    try:
        first.add("harbour.md", HARBOUR)
        second.add("orchard.txt", ORCHARD)  # its log position was taken: it must move on
    finally:
        first.close()
        second.close()
    with open_memory(tmp_path) as memory:
        assert sorted(memory.documents()) == ["harbour.md", "orchard.txt"]


# ------------------------------------------------------------------------------ isolation


def test_tenants_are_isolated(tmp_path):
    with open_memory(tmp_path, tenant="alice") as alice:
        alice.add("harbour.md", HARBOUR)
    with open_memory(tmp_path, tenant="bob") as bob:
        assert bob.documents() == []
        assert bob.select("How long is the Quorvane Bridge?") == []
        bob.add("orchard.txt", ORCHARD)
    with open_memory(tmp_path, tenant="alice") as alice:
        assert alice.documents() == ["harbour.md"]


def test_encrypted_records_hold_no_plaintext_and_need_the_key(tmp_path, caplog):
    key = write_key_file(tmp_path / "key")
    root = tmp_path / "root"
    with open_memory(root, encryption_key_file=key) as memory:
        memory.add("harbour.md", HARBOUR)
        assert memory.read("harbour.md") == HARBOUR.encode()
    stored = all_record_bytes(root)
    for needle in (b"Quorvane", b"harbour.md", b"fish market"):
        assert needle not in stored
    with open_memory(root, encryption_key_file=key) as memory:
        assert memory.select("How long is the Quorvane Bridge?")[0].doc_id == "harbour.md"
    other = write_key_file(tmp_path / "other-key")
    with caplog.at_level(logging.WARNING), open_memory(root, encryption_key_file=other) as memory:
        assert memory.documents() == [] and memory.select("Quorvane Bridge") == []
        assert memory.skipped == []  # each key has a namespace of its own: nothing to fail
    with open_memory(root) as memory:  # no key: encrypted records are never served as text
        assert memory.documents() == []
    with open_memory(root, encryption_key_file=key, tenant="bob") as memory:
        assert memory.documents() == []
    with open_memory(root, encryption_key_file=key) as memory:  # nothing was harmed
        assert memory.read("harbour.md") == HARBOUR.encode()


def test_the_kv_budget_never_evicts_text(tmp_path, store_factory):
    with open_memory(tmp_path) as memory:
        memory.add("harbour.md", HARBOUR)
    kv = store_factory(tmp_path, max_bytes=64 * 1024)
    namespace = kv.register_namespace(Namespace("default", "model", "kv", {"page": 1}))
    page = os.urandom(4096)
    for index in range(100):  # 400 KB of pages through a 64 KB budget
        kv.put(namespace, f"{index:064x}", page)
    assert kv.usage_bytes() <= 64 * 1024
    kv.close()
    with open_memory(tmp_path) as memory:
        assert memory.read("harbour.md") == HARBOUR.encode()


# ------------------------------------------------------------------------------ damage


def test_a_damaged_section_is_skipped_and_reported(tmp_path, caplog):
    with open_memory(tmp_path) as memory:
        sections = memory.add("harbour.md", HARBOUR)
        memory.add("orchard.txt", ORCHARD)
        question = "How long is the Quorvane Bridge?"
        target = memory.select(question)[0]
        # the record holding the section: the document's one block, which (the document
        # being far below BLOCK_BYTES) is in its manifest's record, so every section fails
        ref = next(
            r for r in memory._manifests["harbour.md"][1].sections if r.start == target.start
        )
        flip_byte(blaise_record(tmp_path, "default", ref.key), mask=0x5A)
        with caplog.at_level(logging.WARNING):
            found = memory.select(question)
        assert ("harbour.md", target.start) in [(s.doc_id, s.start) for s in found.skipped]
        assert {s.doc_id for s in found.skipped} == {"harbour.md"}
        assert all(s.doc_id == "orchard.txt" for s in found)
        assert "not served" in caplog.text
        assert memory.read("harbour.md") is None  # a document with a damaged part is not served
        assert memory.select(question).skipped == []  # dropped from the index: reported once
        assert len(sections) > 2
        assert ref.key == memory._manifests["harbour.md"][0]  # inline: the manifest's record
    with caplog.at_level(logging.WARNING), open_memory(tmp_path) as memory:
        # reopened, the manifest (whose record it is) fails its check: the document is a miss
        assert [(s.what, s.doc_id) for s in memory.skipped] == [("manifest", "harbour.md")]
        found = memory.select(question)
        assert all("4,381" not in s.text for s in found)
        assert memory.documents() == ["orchard.txt"]
        assert memory.read("orchard.txt") == ORCHARD.encode()


def test_a_damaged_manifest_skips_only_its_document(tmp_path, caplog):
    with open_memory(tmp_path) as memory:
        memory.add("harbour.md", HARBOUR)
        memory.add("orchard.txt", ORCHARD)
    manifests = [
        p for p in (tmp_path / "blaise" / "ns").rglob("*.rec") if b"orchard.txt" in p.read_bytes()
    ]
    manifests = [p for p in manifests if b'"sections"' in p.read_bytes()]
    assert len(manifests) == 1
    flip_byte(manifests[0], mask=0x5A)
    with caplog.at_level(logging.WARNING), open_memory(tmp_path) as memory:
        assert memory.documents() == ["harbour.md"]
        assert [(s.what, s.doc_id) for s in memory.skipped] == [("manifest", "orchard.txt")]
        assert memory.select("How long is the Quorvane Bridge?")[0].doc_id == "harbour.md"


def test_a_damaged_catalog_entry_is_skipped(tmp_path, caplog):
    with open_memory(tmp_path) as memory:
        memory.add("harbour.md", HARBOUR)
        memory.add("orchard.txt", ORCHARD)
    flip_byte(blaise_record(tmp_path, "default", "log/0"), mask=0x5A)
    with caplog.at_level(logging.WARNING), open_memory(tmp_path) as memory:
        assert memory.documents() == ["orchard.txt"]  # entry 1 is still read after the gap
        assert [s.what for s in memory.skipped] == ["catalog entry"]
    with open_memory(tmp_path) as memory:  # quarantined: now a gap, and new entries follow
        memory.add("harbour.md", HARBOUR)
    with open_memory(tmp_path) as memory:
        assert memory.documents() == ["orchard.txt", "harbour.md"]


# ------------------------------------------------------------------------------ prompt


class ByteTokenizer:
    """One token per UTF-8 byte (the newline is token 10); a BOS of 256."""

    bos_token_id = 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


def test_prompt_prefix_is_whole_pages_and_the_same_for_every_question(tmp_path):
    with open_memory(tmp_path) as memory:
        memory.add("harbour.md", HARBOUR)
        tokenizer = ByteTokenizer()
        first = memory.prompt("How long is the Quorvane Bridge?", tokenizer, page_size=16)
        second = memory.prompt("What does the Quorvane Bridge cross?", tokenizer, page_size=16)
    assert first.prefix_len % 16 == 0 and first.prefix_len == second.prefix_len
    assert first.input_ids[: first.prefix_len] == second.input_ids[: second.prefix_len]
    assert first.input_ids[0] == 256 and 0 <= first.num_pad < 16
    assert first.input_ids[first.prefix_len - first.num_pad : first.prefix_len] == [10] * (
        first.num_pad
    )
    text = bytes(first.input_ids[1 : first.prefix_len - first.num_pad]).decode()
    assert "Source: harbour.md\nSection: Harbour > Bridges\n\n" in text
    assert text.endswith("It crosses the estuary south of the old town.\n\n")
    suffix = bytes(first.input_ids[first.prefix_len :]).decode()
    assert suffix == "\n\nQuestion: How long is the Quorvane Bridge?\nAnswer:"


def test_compose_pads_with_the_given_id_and_checks_the_page_size():
    prompt = compose(
        ByteTokenizer(), doc_id="d", headings=(), text="x", question="q?", page_size=7, pad_id=0
    )
    assert prompt.prefix_len % 7 == 0 and prompt.num_prefix_pages == prompt.prefix_len // 7
    assert set(prompt.input_ids[prompt.prefix_len - prompt.num_pad : prompt.prefix_len]) <= {0}
    with pytest.raises(ValueError):
        compose(ByteTokenizer(), doc_id="d", headings=(), text="x", question="q", page_size=0)


def test_prompt_is_none_without_a_match(tmp_path):
    with open_memory(tmp_path) as memory:
        assert memory.prompt("anything at all?", ByteTokenizer(), page_size=4) is None


def test_the_package_imports_without_torch_or_sglang():
    code = (
        "import sys\n"
        "sys.modules.update(torch=None, sglang=None, transformers=None)\n"
        "import hicache_galahad.blaise, hicache_galahad.blaise.cli\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
