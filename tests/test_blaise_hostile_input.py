"""Issue 20, Blaise's items, each tried as the attack was: real stores on real files.

7.  Two writers of one tenant with different key files never destroy each other's records
    (each key has a namespace of its own); a catalog append that races another keeps the
    first entry; a run without spaces is cut so that every section stays readable.
12. Hostile text costs time linear in its size: segmenting, indexing and selecting each input
    of the attack under a generous bound, in a child process killed if it hangs.
14. Input that cannot be stored is refused by `add` before anything is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.records import write_key_file

import hicache_galahad
from hicache_galahad.blaise import Blaise
from hicache_galahad.blaise import layout as layout_module
from hicache_galahad.blaise.records import (
    LOG_ENTRY_BYTES,
    MAX_DOC_ID_BYTES,
    MAX_SECTION_BYTES,
    log_entry,
)
from hicache_galahad.blaise.segment import (
    HARD_CUT_BYTES,
    MAX_HEADING_BYTES,
    estimate_tokens,
    segment,
)

PACKAGE_PARENT = Path(hicache_galahad.__file__).parents[1]  # the child imports the same code


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def quarantined(root: Path) -> list[str]:
    return [name for name in files_under(root) if "/quarantine/" in f"/{name}"]


# ------------------------------------------------------------------------------ item 7


def test_two_key_files_of_one_tenant_never_quarantine_each_other(tmp_path):
    """The attack: writers A and B of tenant "t" with different key files take turns. Before,
    the second writer's replay opened its own entry (the key proven), then took A's entry's
    failing tag as damage and quarantined it; A's next open found nothing of what it added."""
    key_a = write_key_file(tmp_path / "key-a")
    key_b = write_key_file(tmp_path / "key-b")
    root = tmp_path / "root"
    facts = {
        key_a: ("a1.md", "The Zorblat bridge was built in 1901 by Frank Quill.\n"),
        key_b: ("b1.md", "The Quexo tower is 300 metres high.\n"),
    }
    later = {
        key_a: ("a2.md", "The Gizmo river is 12 km long and floods in March.\n"),
        key_b: ("b2.md", "The Pelmet harbour has nine quays.\n"),
    }
    for key in (key_a, key_b):
        with Blaise(str(root), tenant="t", encryption_key_file=key) as memory:
            memory.add(*facts[key])
    for key in (key_a, key_b):
        with Blaise(str(root), tenant="t", encryption_key_file=key) as memory:
            memory.add(*later[key])
    assert quarantined(root) == []
    for key in (key_a, key_b):
        with Blaise(str(root), tenant="t", encryption_key_file=key) as memory:
            assert memory.documents() == [facts[key][0], later[key][0]]
            assert memory.skipped == []
            for doc_id, text in (facts[key], later[key]):
                assert memory.read(doc_id) == text.encode()
    with Blaise(str(root), tenant="t", encryption_key_file=key_a) as memory:
        found = memory.select("When was the Zorblat bridge built?")
        assert found and found[0].doc_id == "a1.md"
    assert quarantined(root) == []


def test_a_racing_catalog_append_keeps_the_entry_already_read_back(tmp_path):
    """Two writers race for one log number: B looked before A published, then B's put
    arrives. The store replaces an existing record of another size, so B's put replaced A's
    confirmed entry (and A's document was gone at the next open); entries of one size make
    B's put keep A's and B move on. B opened on the same empty catalog, so its add's batch
    names log/0, which A holds by then: the batch does not link it, and B appends after."""
    root = tmp_path / "root"
    writer_a = Blaise(str(root))
    writer_b = Blaise(str(root))  # opened on the same empty catalog: both will try log/0
    writer_a.add("first.md", "Alpha text about the quay.\n")
    assert writer_b._records._next_log == 0
    writer_b.add("second-with-a-longer-name.md", "Beta text about the harbour wall.\n")
    assert writer_b._records._next_log == 2  # log/0 was A's; B's entry is log/1
    writer_a.close()
    writer_b.close()
    with Blaise(str(root)) as memory:
        assert memory.documents() == ["first.md", "second-with-a-longer-name.md"]
        assert memory.skipped == []
    assert quarantined(root) == []
    assert len(log_entry({"op": "remove", "doc_id": "x"})) == LOG_ENTRY_BYTES
    longest = '"\\' * (MAX_DOC_ID_BYTES // 2)
    entry = {"op": "add", "doc_id": longest, "manifest": "m/" + "f" * 32 + "/" + "f" * 64}
    assert len(log_entry(entry)) == LOG_ENTRY_BYTES


def test_a_run_without_spaces_over_the_read_cap_is_cut_and_survives_a_reopen(tmp_path):
    """An 18 MB run without spaces was one section of 18 MB that every read refuses (16 MiB
    cap): after a reopen the document was gone. It is cut at a character boundary now, and
    the sections concatenate to the document."""
    run = b"x" * (17 << 20) + b"\xc3\xa9" * (1 << 19)  # ASCII, then two-byte characters
    data = b"Intro line.\n\n" + run + b"\n\nThe Quorvane Bridge is 4,381 metres long.\n"
    with Blaise(str(tmp_path)) as memory:
        sections = memory.add("wall.txt", data)
    assert b"".join(data[s.start : s.end] for s in sections) == data
    assert max(s.end - s.start for s in sections) <= MAX_SECTION_BYTES
    for section in sections:
        data[section.start : section.end].decode("utf-8")  # never inside a character
    with Blaise(str(tmp_path)) as memory:
        assert memory.documents() == ["wall.txt"]
        assert memory.skipped == []
        assert memory.read("wall.txt") == data
        assert "4,381" in memory.select("How long is the Quorvane Bridge?")[0].text


def test_huge_heading_blocks_and_runs_are_cut_byte_exact():
    """Every piece of the fallback is bounded: an underline or a run of blank lines after a
    heading, a run of one mark, a heading line too long to be one."""
    big = 3 * HARD_CUT_BYTES
    documents = [
        b"Title\n" + b"=" * big + b"\n\nText after.\n",
        b"# Title\n" + b"\n" * big + b"Text after.\n",
        b"== Wiki ==\r\n" + b"\r\n" * big + b"Text.",
        b"." * big,
        "é".encode() * big,
        b"# a\n" * big,  # one run of headings
        b"# " + b"h" * (MAX_HEADING_BYTES + 10) + b"\n\nText.\n",
    ]
    for data in documents:
        for budget in (600, 30):
            sections = segment(data, budget_tokens=budget, min_tokens=min(150, budget // 2))
            assert b"".join(data[s.start : s.end] for s in sections) == data
            assert max(s.end - s.start for s in sections) <= 2 * HARD_CUT_BYTES
            for section in sections:
                data[section.start : section.end].decode("utf-8")
    for data in documents[1:5]:  # runs of blank lines, marks, characters: within the budget
        for section in segment(data):
            assert estimate_tokens(data[section.start : section.end]) <= 600 * 1.05 + 2
    titled = segment(documents[0])
    assert titled[0].headings == ("Title",)
    long_heading = segment(documents[-1])
    assert all(s.headings == () for s in long_heading)  # a 1 KiB+ line is text, not a title


def test_a_section_over_the_read_cap_is_refused_at_add(tmp_path):
    """A budget no section can respect (a count that says every text is 0 tokens) gives one
    section of the whole document: refused with the limit named, nothing written."""
    data = b"word " * ((MAX_SECTION_BYTES // 5) + 10)
    before = files_under(tmp_path)
    with Blaise(str(tmp_path), count_tokens=lambda _: 0) as memory:
        opened = files_under(tmp_path)
        with pytest.raises(ValueError, match=str(MAX_SECTION_BYTES)):
            memory.add("big.txt", data)
        assert files_under(tmp_path) == opened
        assert memory.documents() == []
    assert before == []


# ------------------------------------------------------------------------------ item 12

CHILD = textwrap.dedent(
    """
    import json, sys, tempfile, time
    from hicache_galahad.blaise import Blaise, segment

    inputs = {
        "dots": b"." * 80_000,
        "atx_spaces": b"# a" + b" " * 80_000,
        "atx_spaces_letter": b"# a" + b" " * 80_000 + b"b",
        "atx_marks": b"# a" + b"# " * 40_000 + b"b",
        "wiki_spaces": b"= a" + b" " * 80_000 + b"b",
        "wiki_marks": b"= a" + b"=" * 80_000 + b"b",
        "setext": b"a" * 80_000 + b"\\n" + b"=" * 80_000 + b"\\n",
        "setext_rule_spaces": b"=" * 40_000 + b" " * 40_000 + b"x\\n===\\n",
        "quotes": b'."' * 40_000,
        "numbers": b"Prices\\n\\n" + b",".join([b"1990"] * 2_000) + b"\\n",
        "headings": b"# a\\n" * 20_000,
        "blank_lines": b"# a\\n" + b"\\n" * 80_000 + b"Text.\\n",
    }
    questions = [
        "What was the price in 1990?",
        "How long is it in km?",
        "Where is a?",
        "Who made a?",
        "How many a are there?",
    ]
    times = {}
    for name, data in inputs.items():
        start = time.perf_counter()
        sections = segment(data)
        assert b"".join(data[s.start : s.end] for s in sections) == data, name
        times[name + ":segment"] = time.perf_counter() - start
        with Blaise(tempfile.mkdtemp()) as memory:
            start = time.perf_counter()
            memory.add(name, data)
            times[name + ":add"] = time.perf_counter() - start
            for question in questions:
                start = time.perf_counter()
                memory.select(question, k=3)
                times[name + ":select " + question] = time.perf_counter() - start
        print(json.dumps({"name": name}), flush=True)
    from hicache_galahad.blaise.prompt import opening_words
    start = time.perf_counter()
    assert opening_words("\\n" * 400_000 + "x") == "x"  # the index's words of a section
    times["opening_words"] = time.perf_counter() - start
    print("TIMES " + json.dumps(times), flush=True)
    """
)


def test_hostile_text_is_segmented_indexed_and_selected_in_linear_time():
    """The attack's inputs (40 KB of "." took 33 s to segment, `# a` and 80 KB of spaces 47 s,
    the `=` forms over 120 s, a question over a 10 KB line of `1990,` 20 s), and runs of
    headings and blank lines, each at 80 KB and asked five kinds of question, and the index's
    opening words of 400,000 blank lines (2 s per 200,000 before): every step under 2 s on this
    slow 2-core box (they take milliseconds). A child process, killed at 120 s, so that a
    regression fails, not hangs."""
    path = os.pathsep.join([str(PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    except subprocess.TimeoutExpired as error:
        out = error.stdout.decode() if isinstance(error.stdout, bytes) else error.stdout or ""
        pytest.fail(f"hostile text still running after 120 s; finished: {out!r}")
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("TIMES "))
    times = json.loads(line[len("TIMES ") :])
    slow = {step: round(seconds, 2) for step, seconds in times.items() if seconds > 2.0}
    assert slow == {}
    assert len(times) == 12 * 7 + 1


# ------------------------------------------------------------------------------ item 14


@pytest.mark.parametrize(
    "doc_id, limit",
    [
        ("x" * (1 << 20), str(MAX_DOC_ID_BYTES)),  # the attack: a 1 MiB id
        ("é" * (MAX_DOC_ID_BYTES // 2 + 1), str(MAX_DOC_ID_BYTES)),
        ("a\x00b", "control character"),
        ("line\nbreak", "control character"),
        ("del\x7f", "control character"),
        ("\ud800", "UTF-8"),
        ("", "non-empty str"),
        (b"bytes-id", "non-empty str"),
        (7, "non-empty str"),
        (None, "non-empty str"),
    ],
)
def test_ids_that_cannot_be_stored_are_refused_before_anything_is_written(tmp_path, doc_id, limit):
    """A 1 MiB id wrote 1,002 records (1.05 GB, each fsynced) in 15 s before failing, and
    every reopen reported 1,000 skipped entries. Refused now with the limit named, and not
    one file is written."""
    with Blaise(str(tmp_path)) as memory:
        memory.add("kept.md", "Some text to keep.\n")
        before = files_under(tmp_path)
        with pytest.raises(ValueError, match=limit):
            memory.add(doc_id, "The Quorvane Bridge is 4,381 metres long.\n")
        assert files_under(tmp_path) == before
        assert memory.documents() == ["kept.md"]
    with Blaise(str(tmp_path)) as memory:
        assert memory.documents() == ["kept.md"] and memory.skipped == []


def test_the_longest_id_is_stored_and_replayed(tmp_path):
    """The limit is the longest id that fits a catalog entry, quotes and backslashes (which
    JSON doubles) included."""
    doc_id = '"\\' * (MAX_DOC_ID_BYTES // 2)
    with Blaise(str(tmp_path)) as memory:
        memory.add(doc_id, "The Quorvane Bridge is 4,381 metres long.\n")
    with Blaise(str(tmp_path)) as memory:
        assert memory.documents() == [doc_id] and memory.skipped == []
        assert memory.select("How long is the Quorvane Bridge?")[0].doc_id == doc_id


@pytest.mark.parametrize("text", [None, 12, ["a list"], {"a": "dict"}])
def test_a_document_of_another_type_is_refused(tmp_path, text):
    """`bytes(12)` is twelve zero bytes: such a document was stored as text."""
    with Blaise(str(tmp_path)) as memory:
        before = files_under(tmp_path)
        with pytest.raises(ValueError, match="str or UTF-8 bytes"):
            memory.add("doc.md", text)
        assert files_under(tmp_path) == before


def test_a_manifest_over_the_read_cap_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """A manifest the store would refuse to read back (64 MiB) is refused before its sections
    are written; the cap is lowered here so that a small document reaches it."""
    monkeypatch.setattr(layout_module, "MAX_MANIFEST_BYTES", 4096)
    text = "".join(f"# Part {i}\n\nThe part {i} says little.\n\n" for i in range(200))
    with Blaise(str(tmp_path), budget_tokens=20, min_tokens=0) as memory:
        before = files_under(tmp_path)
        with pytest.raises(ValueError, match="4096"):
            memory.add("parts.md", text)
        assert files_under(tmp_path) == before
        memory.add("small.md", "# One part\n\nShort.\n")
        assert memory.documents() == ["small.md"]


QUESTIONS_CHILD = textwrap.dedent(
    """
    import json, tempfile, time
    from hicache_galahad.blaise import Blaise
    from hicache_galahad.blaise.answer import question_type

    questions = {
        "what_is_the": "what is the fee " * 5_000,
        "phrase": "What is the " + "a " * 40_000 + "fee?",
        "how_many": ("how many " + "x" * 10_000 + " ") * 8,
        "members": "the " + "collection of " * 8_000,
        "which": "which " * 14_000,
    }
    times = {}
    with Blaise(tempfile.mkdtemp()) as memory:
        memory.add("doc", "The collection of the Quorvane Hall holds 5,200 volumes. " * 50)
        memory.add("fees", "The fee of the Quorvane Hall is 40 crowns. " * 50)
        for name, question in questions.items():
            start = time.perf_counter()
            question_type(question)
            times[name + ":type"] = time.perf_counter() - start
            start = time.perf_counter()
            memory.select(question, k=3)
            times[name + ":select"] = time.perf_counter() - start
    print("TIMES " + json.dumps(times), flush=True)
    """
)


def test_hostile_questions_are_typed_in_linear_time():
    """Round 5's head-noun pattern scanned from every "what is the" to the end of the
    question: 84 KB of "what is the " took 17.7 s (answer.question_type alone). The noun phrase
    is now at most four words. Each question of 80 KB under 2 s, in a child killed at 120 s."""
    path = os.pathsep.join([str(PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    try:
        done = subprocess.run(
            [sys.executable, "-c", QUESTIONS_CHILD],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("hostile questions still running after 120 s")
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("TIMES "))
    times = json.loads(line[len("TIMES ") :])
    assert {step: round(s, 2) for step, s in times.items() if s > 2.0} == {}
    assert len(times) == 10
