"""Blaise's records as `add` writes them: a document is a few records (its blocks of sections
and its manifest, one batch, then one catalog entry), made durable by the store's flusher
(deferred) and flushed before anything is deleted; a catalog entry that survived a power loss
without its blocks is a miss, never wrong text; roots of schema 1 (a record per section) still
read."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
from support.records import record_files, record_path

from hicache_galahad.blaise import Blaise
from hicache_galahad.blaise.records import (
    BLOCK_BYTES,
    TextRecords,
    doc_prefix,
    pack_blocks,
    section_key,
)

FACT = "The Quorvane Bridge is 4,381 metres long."


def long_document(paragraphs: int = 400) -> str:
    body = [
        f"Paragraph {i} talks about ledger line {i} and the harbour tide tables of week {i}."
        for i in range(paragraphs)
    ]
    body.insert(paragraphs // 2, FACT)
    return "# Notes\n\n" + "\n\n".join(body) + "\n"


def blaise_records(root: Path) -> list[Path]:
    return record_files(root / "blaise")


@pytest.mark.parametrize("paragraphs", [400, 4000])
def test_a_document_is_a_few_records_not_one_per_section(tmp_path, paragraphs):
    """add() wrote one record per section, each fsynced: 291 files and 0.6-1.1 s for the
    434 KB benchmark corpus. Then: its blocks (64 KiB each) and its manifest in one batch,
    then one catalog entry. Now: one batch, the entry last; and a document of one block
    (most are) is one record with its manifest, so two files in all (issue 33: a file per
    record is what add() costs per document)."""
    text = long_document(paragraphs)
    with Blaise(str(tmp_path), budget_tokens=60, min_tokens=5) as memory:
        sections = memory.add("notes.md", text)
        assert len(sections) > 100
        blocks = len(pack_blocks([(s.start, s.end) for s in sections]))
        assert blocks <= 1 + len(text.encode()) // (BLOCK_BYTES // 2)
        inline = blocks == 1
        assert inline == (paragraphs == 400)
        # blocks (none apart when inline) + manifest + log entry
        assert len(blaise_records(tmp_path)) == (0 if inline else blocks) + 2
        assert FACT in memory.select("How long is the Quorvane Bridge?")[0].text
    with Blaise(str(tmp_path), budget_tokens=60, min_tokens=5) as memory:
        assert memory.read("notes.md") == text.encode() and memory.skipped == []
        assert FACT in memory.select("How long is the Quorvane Bridge?")[0].text
        memory.add("notes.md", text + "A last line.\n")  # replaced: the old records go
        memory.remove("other.md")
        assert len(blaise_records(tmp_path)) == (0 if inline else blocks) + 3
        memory.remove("notes.md")
        assert len(blaise_records(tmp_path)) == 3  # the catalog entries only


def test_pack_blocks_is_greedy_and_keeps_a_large_section_alone():
    assert pack_blocks([(0, 10), (10, 20), (20, 30)], limit=20) == [(0, 20), (20, 30)]
    assert pack_blocks([(0, 5), (5, 100), (100, 104)], limit=20) == [(0, 5), (5, 100), (100, 104)]
    assert pack_blocks([]) == []


def test_equal_blocks_at_two_offsets_keep_their_own_offsets(tmp_path):
    """Two blocks of equal bytes share a key (content-named); the manifest keeps each one's
    offset, so both read back after a reopen (they were taken for one block and refused)."""
    run = "x" * (200 << 10)  # cut into equal pieces, packed into equal blocks
    data = "Intro line.\n\n" + run + "\n\n" + FACT + "\n"
    with Blaise(str(tmp_path)) as memory:
        memory.add("wall.txt", data)
        refs = memory._manifests["wall.txt"][1].sections
        assert len({(r.key, r.base) for r in refs}) > len({r.key for r in refs})
    with Blaise(str(tmp_path)) as memory:
        assert memory.skipped == [] and memory.read("wall.txt") == data.encode()


@pytest.mark.parametrize("inline", [True, False])
def test_a_catalog_entry_that_outlived_its_blocks_is_a_miss(tmp_path, caplog, inline):
    """Deferred durability: a power loss may keep the catalog entry and lose (or zero, or
    truncate) the blocks it names. Each of these is a miss, with a warning; the document is not
    served and other documents are. A document of one block is one record with its manifest
    (inline): losing it loses the manifest."""
    filler = "" if inline else long_document(3000).replace(FACT, "")  # two blocks and more
    for damage in ("missing", "zeroed", "truncated"):
        root = tmp_path / damage
        with Blaise(str(root)) as memory:
            memory.add("lost.md", "# Lost\n\n" + FACT + "\n" + filler)
            memory.add("kept.md", "# Kept\n\nThe orchard holds 212 apple trees.\n")
            key, manifest = memory._manifests["lost.md"]
            ref = manifest.sections[0]
            assert (ref.key == key) == inline
            path = Path(record_path(root / "blaise", memory._records.namespace, ref.key))
        size = path.stat().st_size
        if damage == "missing":
            path.unlink()
        elif damage == "zeroed":
            path.write_bytes(bytes(size))
        else:
            os.truncate(path, size // 2)
        with caplog.at_level(logging.WARNING), Blaise(str(root)) as memory:
            skipped = {(s.what, s.doc_id) for s in memory.skipped}
            assert skipped == {("manifest" if inline else "section", "lost.md")}
            assert memory.documents() == (["kept.md"] if inline else ["lost.md", "kept.md"])
            if not inline:
                assert memory.read("lost.md") is None
            found = memory.select("How long is the Quorvane Bridge?")
            assert all("4,381" not in s.text for s in found)
            assert memory.select("How many apple trees?")[0].doc_id == "kept.md"
            assert memory.read("kept.md") is not None


def test_nothing_is_deleted_before_the_entry_that_replaces_it_is_durable(tmp_path):
    """Replacing or removing a document deletes its old records; with deferred durability a
    power loss could keep the deletion and lose the new catalog entry, so everything pending
    is flushed first."""
    with Blaise(str(tmp_path)) as memory:
        flusher = memory._records.store.flusher
        assert flusher is not None  # deferred durability by default
        memory.add("doc.md", "# A\n\nThe first version of the text.\n")
        assert flusher.pending > 0  # published, not yet fsynced: add() does not wait
        memory.add("doc.md", "# A\n\nThe second version of the text.\n")
        assert flusher.pending == 0
        memory.add("other.md", "# B\n\nAnother text.\n")
        assert flusher.pending > 0
        memory.remove("other.md")
        assert flusher.pending == 0
        memory.add("third.md", "# C\n\nA third text.\n")
        memory.sync()
        assert flusher.pending == 0


def test_fsync_durability_is_still_available(tmp_path):
    with Blaise(str(tmp_path), durability="fsync") as memory:
        assert memory._records.store.flusher is None
        memory.add("doc.md", "# A\n\n" + FACT + "\n")
        assert FACT in memory.select("How long is the Quorvane Bridge?")[0].text


def test_a_root_of_schema_1_still_reads(tmp_path):
    """Manifests written before blocks (a record per section, keyed by its SHA-256) open."""
    data = ("# Notes\n\nThe harbour has three quays.\n\n## Bridge\n\n" + FACT + "\n").encode()
    cut = data.index(b"## Bridge")
    parts = [(0, cut, ("Notes",)), (cut, len(data), ("Notes", "Bridge"))]
    records = TextRecords(str(tmp_path), "default")
    keys = [section_key("old.md", data[a:b]) for a, b, _ in parts]
    assert all(records.store.put_many(records.namespace, keys, [data[a:b] for a, b, _ in parts]))
    body = {
        "schema": 1,
        "doc_id": "old.md",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "sections": [[a, b, k, list(h)] for (a, b, h), k in zip(parts, keys, strict=True)],
    }
    manifest = json.dumps(body).encode()
    key = f"m/{doc_prefix('old.md')}/{hashlib.sha256(manifest).hexdigest()}"
    assert records.store.put(records.namespace, key, manifest)
    assert records.append_log({"op": "add", "doc_id": "old.md", "manifest": key})
    records.close()
    with Blaise(str(tmp_path)) as memory:
        assert memory.skipped == [] and memory.read("old.md") == data
        best = memory.select("How long is the Quorvane Bridge?")[0]
        assert best.headings == ("Notes", "Bridge") and FACT in best.text
        namespace = memory._records.namespace
        memory.remove("old.md")
        for gone in [*keys, key]:
            assert not os.path.exists(record_path(tmp_path / "blaise", namespace, gone))


def test_an_unknown_durability_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match="durability"):
        Blaise(str(tmp_path), durability="sometimes")


def test_close_makes_every_add_durable(tmp_path):
    memory = Blaise(str(tmp_path))
    flusher = memory._records.store.flusher
    memory.add("doc.md", "# A\n\n" + FACT + "\n")
    assert flusher.pending > 0
    memory.close()
    assert flusher.pending == 0
