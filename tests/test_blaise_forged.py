"""Issue 32 item 7: on a plaintext root a record's digest is unkeyed, so anyone who can write
the root can store a digest-valid catalog entry or manifest with any bytes. Each forged
record is a miss (counted in `skipped`, warned at most once per kind in an interval); the
honest documents stay answerable, through the API and through `galahad blaise ask` (which
exited 4, an unexpected error, on every variant)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from hicache_galahad.blaise import Blaise
from hicache_galahad.blaise.records import TextRecords, log_entry

FACT = "The Quorvane Bridge is 4,381 metres long."
QUESTION = "How long is the Quorvane Bridge?"
NESTED = b"[" * 100_000 + b"]" * 100_000


def honest_root(root) -> None:
    with Blaise(str(root)) as memory:
        memory.add("guide.md", f"# Bridges\n\n{FACT} It crosses the estuary.\n")
        memory.add("notes.md", "# Markets\n\nThe fish market opens at five.\n")


def forge(root, records: dict[str, bytes]) -> None:
    """Stores records as an attacker with write access would: digest-valid, any bytes."""
    text = TextRecords(str(root), "default")
    try:
        for key, data in records.items():
            assert text.store.put(text.namespace, key, data)
        text.sync()
    finally:
        text.close()


def next_log(root) -> int:
    text = TextRecords(str(root), "default")
    try:
        text.replay()
        return text._next_log
    finally:
        text.close()


def forged_entry(root, body: bytes) -> dict[str, bytes]:
    return {f"log/{next_log(root)}": body}


def forged_manifest(root, body: bytes) -> dict[str, bytes]:
    """A catalog entry (well formed) naming a forged manifest of a third document."""
    key = "m/forged/" + "0" * 64
    entry = log_entry({"op": "add", "doc_id": "forged.md", "manifest": key})
    return {key: body, f"log/{next_log(root)}": entry}


VARIANTS = {
    "entry []": lambda root: forged_entry(root, b"[]"),
    "entry without manifest": lambda root: forged_entry(
        root, json.dumps({"op": "add", "doc_id": "forged.md"}).encode()
    ),
    "entry of 10^5 nested arrays": lambda root: forged_entry(root, NESTED),
    "entry with a non-str manifest": lambda root: forged_entry(
        root, json.dumps({"op": "add", "doc_id": "forged.md", "manifest": [1]}).encode()
    ),
    "manifest []": lambda root: forged_manifest(root, b"[]"),
    "manifest of 10^5 nested arrays": lambda root: forged_manifest(root, NESTED),
    "manifest with sections of the wrong shape": lambda root: forged_manifest(
        root,
        json.dumps(
            {
                "schema": 2,
                "doc_id": "forged.md",
                "size": 1,
                "sha256": "0" * 64,
                "blocks": [[0, 1, "b/x"]],
                "sections": [[0, 1, "0" * 64, "heading", 7]],
            }
        ).encode(),
    ),
    "manifest naming an inline block outside schema 3": lambda root: forged_manifest(
        root,
        json.dumps(
            {
                "schema": 2,
                "doc_id": "forged.md",
                "size": 1,
                "sha256": "0" * 64,
                "blocks": [[0, 1, ""]],
                "sections": [[0, 1, "0" * 64, [], 0]],
            }
        ).encode(),
    ),
    "manifest without doc_id": lambda root: forged_manifest(
        root, json.dumps({"schema": 2, "blocks": [], "sections": []}).encode()
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_forged_record_is_a_miss_and_the_honest_documents_answer(tmp_path, variant, caplog):
    honest_root(tmp_path)
    forge(tmp_path, VARIANTS[variant](tmp_path))
    with (
        caplog.at_level(logging.WARNING, "hicache_galahad.blaise"),
        Blaise(str(tmp_path)) as memory,  # raised on every variant
    ):
        assert memory.documents() == ["guide.md", "notes.md"]
        assert [item.what for item in memory.skipped] in (["catalog entry"], ["manifest"])
        assert FACT in memory.select(QUESTION)[0].text
        memory.add("later.md", "The Vellore Tower is 212 metres tall.\n")
    with Blaise(str(tmp_path)) as memory:  # and the root stays writable and readable
        assert "later.md" in memory.documents()
        assert "Vellore" in memory.select("How tall is the Vellore Tower?")[0].text
    assert any("not served" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("variant", ["entry []", "manifest of 10^5 nested arrays"])
def test_galahad_blaise_ask_answers_past_a_forged_record(tmp_path, variant):
    """`galahad blaise ask` exited 4 (unexpected error) on a root with a forged record."""
    honest_root(tmp_path)
    forge(tmp_path, VARIANTS[variant](tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "hicache_galahad.ops.cli", "blaise", "ask"]
        + ["--root", str(tmp_path), QUESTION],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"PYTHONPATH": os.getcwd()},
    )
    assert done.returncode == 0, done.stderr
    assert FACT in done.stdout


def test_warnings_about_forged_records_are_rate_limited(tmp_path, caplog):
    """Fifty forged catalog entries: all fifty counted, one warning."""
    honest_root(tmp_path)
    first = next_log(tmp_path)
    forge(tmp_path, {f"log/{first + i}": b"[]" for i in range(50)})
    with caplog.at_level(logging.WARNING, "hicache_galahad.blaise"), Blaise(str(tmp_path)) as m:
        assert len(m.skipped) == 50
        assert FACT in m.select(QUESTION)[0].text
    warnings = [r for r in caplog.records if "catalog entry" in r.getMessage()]
    assert len(warnings) == 1
