"""Blaise's segmenter: sections are contiguous byte ranges whose concatenation is the document,
cut at headings, paragraphs and sentences, never inside a sentence."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache_galahad.blaise.segment import estimate_tokens, segment


def within_budget(data: bytes, section, budget: int) -> bool:
    """A section's count is the sum of its pieces' counts; counted whole, a BPE-like estimate
    may come out a few percent higher (its rounding is per piece)."""
    return estimate_tokens(data[section.start : section.end]) <= budget * 1.05 + 2


def assert_exact(data: bytes, sections) -> None:
    assert b"".join(data[s.start : s.end] for s in sections) == data
    assert all(s.start < s.end for s in sections)
    for before, after in zip(sections, sections[1:], strict=False):
        assert before.end == after.start


def sentence(rng: random.Random, number: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30)))
    return f"Sentence {number} says {words}."


WORDS = ("river", "stone", "market", "harbour", "tower", "bridge", "valley", "winter", "north")


def make_document(seed: int, num_paragraphs: int = 60) -> tuple[str, list[str]]:
    """A markdown document of known sentences: (text, every sentence)."""
    rng = random.Random(seed)
    parts, sentences, number = ["# Title\n\n"], [], 0
    for paragraph in range(num_paragraphs):
        if paragraph % 7 == 3:
            parts.append(f"{'#' * rng.randint(2, 3)} Part {paragraph}\n\n")
        items = []
        for _ in range(rng.randint(1, 12)):
            number += 1
            items.append(sentence(rng, number))
        sentences += items
        parts.append(" ".join(items) + "\n\n")
    return "".join(parts), sentences


@pytest.mark.parametrize("seed", range(5))
def test_known_sentences_are_never_split(seed):
    text, sentences = make_document(seed)
    data = text.encode()
    sections = segment(data, budget_tokens=200, min_tokens=40)
    assert_exact(data, sections)
    assert len(sections) > 10
    for item in sentences:
        start = data.index(item.encode())
        end = start + len(item.encode())
        inside = [s for s in sections if s.start <= start and end <= s.end]
        assert len(inside) == 1, item


def test_budget_is_respected_and_headings_open_sections():
    text, _ = make_document(7)
    data = text.encode()
    sections = segment(data, budget_tokens=200, min_tokens=40)
    for section in sections:
        assert within_budget(data, section, 200)
        body = data[section.start : section.end].rstrip()
        assert not body.splitlines()[-1].startswith(b"#"), "a heading ended a section"
    opened = [s for s in sections if data[s.start : s.end].startswith(b"#")]
    assert len(opened) == text.count("\n#") + 1  # every heading opens a section


def test_heading_paths_markdown_wiki_and_setext():
    text = (
        "Intro line one.\n\n# Alpha\n\nText under alpha.\n\n## Beta\n\nText under beta.\n\n"
        "== Gamma ==\nText under gamma.\n\nDelta\n-----\n\nText under delta.\n"
    )
    data = text.encode()
    sections = segment(data, budget_tokens=8, min_tokens=0)
    assert_exact(data, sections)
    paths = {data[s.start : s.end].decode().strip().splitlines()[-1]: s.headings for s in sections}
    assert paths["Text under alpha."] == ("Alpha",)
    assert paths["Text under beta."] == ("Alpha", "Beta")
    assert paths["Text under gamma."] == ("Alpha", "Gamma")  # "==" is level 2: replaces Beta
    assert paths["Text under delta."] == ("Alpha", "Delta")  # a "---" underline: level 2


def test_short_headed_parts_share_a_section():
    text = "".join(f"## Entry {i}\n\nA short line about entry {i}.\n\n" for i in range(20))
    data = text.encode()
    sections = segment(data, budget_tokens=100, min_tokens=50)
    assert_exact(data, sections)
    assert len(sections) < 10


def test_a_sentence_longer_than_the_budget_is_cut_at_lines_then_spaces():
    table = "".join(f"| row {i} | {i * 7} | {i * 13} |\n" for i in range(300))
    wall = " ".join(f"word{i}" for i in range(3000))
    for text in (table, wall):
        data = text.encode()
        sections = segment(data, budget_tokens=100, min_tokens=0)
        assert_exact(data, sections)
        assert len(sections) > 5
        assert all(within_budget(data, s, 100) for s in sections)


def test_abbreviations_and_initials_do_not_end_sentences():
    text = ("Dr. Smith met J. R. Tolkien in St. Louis, e.g. at the fair. " * 40).encode()
    sections = segment(text, budget_tokens=60, min_tokens=0)
    assert_exact(text, sections)
    for section in sections:
        assert text[section.start : section.end].startswith(b"Dr. Smith")


def test_unicode_crlf_and_no_trailing_newline():
    text = "Überschrift\r\n===========\r\n\r\nDer Fluß ist 3 km lang. Straße “quoted.” Ende" * 30
    data = text.encode()
    sections = segment(data, budget_tokens=40, min_tokens=5)
    assert_exact(data, sections)
    for section in sections:
        data[section.start : section.end].decode("utf-8")  # never inside a character


def test_empty_and_whitespace_documents():
    assert segment(b"") == []
    for data in (b"\n\n\n", b"   ", b"x"):
        sections = segment(data)
        assert_exact(data, sections)
        assert len(sections) == 1


def test_bad_budget_is_refused():
    with pytest.raises(ValueError):
        segment(b"text", budget_tokens=0)
    with pytest.raises(ValueError):
        segment(b"text", budget_tokens=10, min_tokens=11)


def test_estimate_tracks_words_digits_and_marks():
    assert estimate_tokens(b"") == 0
    assert 8 <= estimate_tokens(b"The bridge is 4,381 metres long.") <= 14
    assert estimate_tokens(b"a " * 100) == 102  # 100 words, 100 letters / 34


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(min_size=0, max_size=80),
            st.sampled_from(["\n", "\n\n", "# H\n", "== W ==\n", ". ", "! ", "\r\n", "---\n"]),
        ),
        max_size=40,
    ),
    st.integers(min_value=1, max_value=60),
    st.integers(min_value=0, max_value=60),
)
def test_any_text_is_covered_exactly(pieces, budget, minimum):
    data = "".join(pieces).encode("utf-8", "surrogatepass")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return
    sections = segment(data, budget_tokens=budget, min_tokens=min(minimum, budget))
    if data:
        assert_exact(data, sections)
        for section in sections:
            data[section.start : section.end].decode("utf-8")
    else:
        assert sections == []
