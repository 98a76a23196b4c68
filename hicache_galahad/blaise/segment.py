"""Sections: contiguous byte ranges of a document, cut along its own structure.

Pure code (no I/O). A document's UTF-8 bytes are cut into blocks (headings and paragraphs),
paragraphs longer than the budget into sentences, and the pieces are packed greedily into
sections of at most `budget_tokens` tokens (a section's count is the sum of its pieces' counts). Every cut falls at a block or sentence
boundary, so the concatenation of the sections is the document, byte for byte, and a sentence
is never split. The one exception: a single sentence longer than the whole budget (a table, a
list without full stops) is cut at line breaks, and failing that at spaces.

A heading starts a new section; the text before it, when shorter than `min_tokens`, first
joins the section before it if that stays within the budget (so runs of short headed parts
share sections). A heading is never the last piece of a section: it goes with the text it
introduces.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_BUDGET_TOKENS = 600
DEFAULT_MIN_TOKENS = 150

_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_DIGITS_AND_SPACE = b"0123456789 \t\n\r\x0b\x0c"
_LINE_END = re.compile(rb"\r\n?|\n|$")  # where bytes.splitlines ends a line
_ATX_OPEN = re.compile(rb"(#{1,6})[ \t]+")  # markdown: "## Title ##"
_HEADING_MARKS = (b"#", b"=")
_RULE_MARKS = (b"=", b"-", b"*", b"~", b"^", b"+")
MAX_HEADING_BYTES = 1024  # a longer line is text, not a heading (it bounds heading paths)
# A sentence ends at . ! ? (and closing quotes or brackets), then whitespace, then something
# that can start a sentence. Abbreviations and initials are checked separately. A match starts
# only at the first mark of a run and its quantifiers never give back (possessive: what
# follows each cannot start with what it takes), so a run of 80,000 marks is read once, not
# once per mark (that was quadratic: 40 KB of "." took 33 s).
_SENTENCE_END = re.compile(
    rb"(?<![.!?])[.!?]++[\"')\]\xe2\x80\x9d\xe2\x80\x99]*+(\s++)(?=[\"'(\[A-Z0-9\xc2-\xf4*#|=-])"
)
# The most bytes of a piece cut at a character boundary (the last resort, after sentences,
# lines and spaces), and of a run of headings glued together: no piece, and so no section, is
# unbounded (16 KiB holds 600 tokens of letters, one per 34; the store's read cap is 16 MiB).
HARD_CUT_BYTES = 16 << 10
_ABBREVIATIONS = frozenset(
    b"mr mrs ms dr prof st jr sr vs etc e.g i.e no nos mt ft inc ltd co corp gen col lt sgt "
    b"capt rev hon fig figs vol approx ca cf al u.s u.k op pp ed eds jan feb mar apr jun jul "
    b"aug sep sept oct nov dec".split()
)


def estimate_tokens(data: bytes) -> int:
    """A fast estimate of a BPE tokenizer's count: one token per word (whitespace), per digit
    and per 1.4 other marks, plus one per 34 letters for long words. A least-squares fit to
    Mistral's Tekken tokenizer on the benchmark's Wikipedia corpus: the estimate is within
    0.91x..1.10x of the real count for 90% of paragraphs, at C speed (bytes.translate)."""
    num_bytes = len(data)
    non_letters = data.translate(None, _LETTERS)
    marks = non_letters.translate(None, _DIGITS_AND_SPACE)
    num_digits_and_spaces = len(non_letters) - len(marks)
    num_letters = num_bytes - len(non_letters)
    return num_digits_and_spaces + (len(marks) * 7) // 10 + num_letters // 34


@dataclass(frozen=True, slots=True)
class Section:
    """Bytes [start, end) of a document, under the heading path in force at `start`."""

    start: int
    end: int
    headings: tuple[str, ...]


@dataclass(slots=True)
class _Piece:
    start: int
    end: int
    tokens: int
    heading: tuple[int, str] | None = None  # (level, title) for a heading line


def segment(
    data: bytes,
    *,
    budget_tokens: int = DEFAULT_BUDGET_TOKENS,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    count_tokens: Callable[[bytes], int] = estimate_tokens,
) -> list[Section]:
    """Cuts `data` into sections; their concatenation is `data`. Empty data gives none."""
    if budget_tokens < 1 or not 0 <= min_tokens <= budget_tokens:
        raise ValueError(
            f"need 1 <= budget ({budget_tokens}) and 0 <= min <= budget ({min_tokens})"
        )
    if not data:
        return []
    pieces = _pieces(data, budget_tokens, count_tokens)
    return _pack(pieces, budget_tokens, min_tokens)


# ------------------------------------------------------------------------------- blocks


def _blocks(data: bytes):
    """(start, end, heading) for each heading line and paragraph; trailing blank lines stay
    with the block before them, leading ones with the first block."""
    lines = data.splitlines(keepends=True)
    stripped = [line.strip() for line in lines]
    # A heading is a line that starts with a heading mark, or one followed by a setext rule;
    # only those lines (few) go through the full check.
    marks = _HEADING_MARKS
    rules = _RULE_MARKS
    maybe = [text[:1] in marks for text in stripped]
    ruled = [text[:1] in rules for text in stripped]
    blocks: list[list] = []
    offset = 0
    in_paragraph = False
    last = len(lines) - 1
    for index, line in enumerate(lines):
        end = offset + len(line)
        text = stripped[index]
        heading = None
        if maybe[index] or (index < last and ruled[index + 1]):
            heading = _heading(line, lines[index + 1] if index < last else b"")
        if heading is not None:
            blocks.append([offset, end, heading])
            in_paragraph = False
        elif ruled[index] and blocks and blocks[-1][2] and _is_setext_rule(text):
            blocks[-1][1] = end  # the underline of a setext heading joins its heading
            in_paragraph = False
        elif not text:
            if blocks:
                blocks[-1][1] = end
            else:
                blocks.append([offset, end, None])
            in_paragraph = False
        elif in_paragraph:
            blocks[-1][1] = end
        else:
            if blocks and blocks[-1][2] is None and not data[blocks[-1][0] : blocks[-1][1]].strip():
                blocks[-1][1] = end  # leading blank lines join the first paragraph
            else:
                blocks.append([offset, end, None])
            in_paragraph = True
        offset = end
    return blocks


def _heading(line: bytes, next_line: bytes) -> tuple[int, str] | None:
    text = line.strip()
    if len(text) > MAX_HEADING_BYTES:
        return None
    mark = text[:1]
    if mark == b"#":
        found = _atx(text)
        if found is not None:
            return found
    elif mark == b"=":
        found = _wiki(text)
        if found is not None:
            return found
    rule = next_line.strip()
    if rule[:1] not in _RULE_MARKS:
        return None
    if text and _is_setext_rule(rule) and len(rule) >= 3 and not _is_setext_rule(text):
        return (1 if rule[:1] in b"=*" else 2), _title(text)
    return None


# The heading forms are parsed by hand, in one pass each. As regular expressions with a lazy
# title followed by a run of marks or spaces and the end of the line, they retried that run at
# every character of the title: quadratic in a long line ("# a", 80 KB of spaces and a letter
# took 47 s; "= a", spaces, "b" over 120 s). `text` is stripped (no whitespace at either end,
# no line break); the results are those the expressions gave.


def _atx(text: bytes) -> tuple[int, str] | None:
    """A markdown heading "## Title ##": 1-6 marks, spaces, the title, optional closing marks."""
    opening = _ATX_OPEN.match(text)  # seven marks or more do not match
    if opening is None:
        return None
    rest = text[opening.end() :]
    title = rest.rstrip(b" \t#") or rest[:1]  # at least one character: "# #" is titled "#"
    return len(opening.group(1)), _title(title)


def _wiki(text: bytes) -> tuple[int, str] | None:
    """A wiki heading "== Title ==": the same number (1-6) of marks on both sides."""
    level = len(text) - len(text.lstrip(b"="))
    closing = b"=" * level
    rest = text[level:]
    if not 1 <= level <= 6 or len(rest) <= level or not rest.endswith(closing):
        return None
    return level, _title(rest[:-level])


def _is_setext_rule(text: bytes) -> bool:
    """A markdown or reStructuredText underline: 3 or more of one mark, then spaces or tabs."""
    mark = text[:1]
    return len(text) >= 3 and mark in _RULE_MARKS and not text.rstrip(b" \t").lstrip(mark)


def _title(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").strip()


# ------------------------------------------------------------------------------- pieces


def _pieces(data: bytes, budget: int, count: Callable[[bytes], int]) -> list[_Piece]:
    pieces: list[_Piece] = []
    for start, end, heading in _blocks(data):
        if heading is not None and end - start > HARD_CUT_BYTES:
            # a heading line (at most MAX_HEADING_BYTES) with a huge underline or run of
            # blank lines: the heading is its first line, the rest is cut as text
            line_end = _LINE_END.search(data, start, end).end()
            pieces.append(_Piece(start, line_end, count(data[start:line_end]), heading))
            if line_end < end:
                pieces += _split_long(data, line_end, end, budget, count)
            continue
        tokens = count(data[start:end])
        if heading is not None or tokens <= budget:
            pieces.append(_Piece(start, end, tokens, heading))
            continue
        for s_start, s_end in _sentences(data, start, end):
            s_tokens = count(data[s_start:s_end])
            if s_tokens <= budget:
                pieces.append(_Piece(s_start, s_end, s_tokens))
            else:
                pieces += _split_long(data, s_start, s_end, budget, count)
    return pieces


def _sentences(data: bytes, start: int, end: int):
    """Sentence ranges covering [start, end): each ends after the whitespace that follows it."""
    cut = start
    for match in _SENTENCE_END.finditer(data, start, end):
        if _is_abbreviation(data, cut, match.start()):
            continue
        boundary = match.end(1)
        if boundary < end:
            yield cut, boundary
            cut = boundary
    yield cut, end


def _is_abbreviation(data: bytes, floor: int, dot: int) -> bool:
    """Whether the full stop at `dot` ends a known abbreviation or a single initial."""
    if data[dot : dot + 1] != b".":
        return False
    word_start = dot
    while word_start > floor and (
        data[word_start - 1 : word_start].isalpha() or data[word_start - 1 : word_start] == b"."
    ):
        word_start -= 1
    word = data[word_start:dot].lower()
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _split_long(data: bytes, start: int, end: int, budget: int, count) -> list[_Piece]:
    """A sentence longer than the budget: cut at line breaks, or at spaces if it has none, and
    a run with neither at a character boundary every HARD_CUT_BYTES (so the concatenation is
    still the document, and no piece is unbounded)."""
    text = data[start:end]
    if text.rstrip().count(b"\n"):
        cuts = [start + m.end() for m in re.finditer(rb"\n", text)]
        return _packed(data, _bounds(start, end, cuts), budget, count, _split_long_spaces)
    return _split_long_spaces(data, start, end, budget, count)


def _split_long_spaces(data: bytes, start: int, end: int, budget: int, count) -> list[_Piece]:
    cuts = [start + m.end() for m in re.finditer(rb"[ \t]+", data[start:end])]
    return _packed(data, _bounds(start, end, cuts), budget, count, _split_hard)


def _split_hard(data: bytes, start: int, end: int, budget: int, count) -> list[_Piece]:
    """A run without line breaks or spaces: cut before a UTF-8 lead byte every `budget` bytes
    (at least 256, at most HARD_CUT_BYTES: no tokenizer gives a byte more than one token, so
    a part holds at most the budget), each part decoding on its own, the parts packed up to
    the budget."""
    step = min(HARD_CUT_BYTES, max(256, budget))
    cuts = []
    cut = start
    while end - cut > step:
        at = cut + step
        while at > cut + 1 and 0x80 <= data[at] < 0xC0:  # a continuation byte: back off
            at -= 1
        cuts.append(at)
        cut = at
    return _packed(data, _bounds(start, end, cuts), budget, count, None)


def _bounds(start: int, end: int, cuts: list[int]) -> list[int]:
    return [start, *[c for c in cuts if start < c < end], end]


def _packed(data: bytes, bounds: list[int], budget: int, count, finer) -> list[_Piece]:
    """The parts between consecutive bounds, packed greedily up to the budget; a part over the
    budget is cut finer (by `finer`) when there is a finer way, else kept whole."""
    pieces: list[_Piece] = []
    for low, high in zip(bounds, bounds[1:], strict=False):
        if low == high:
            continue
        tokens = count(data[low:high])
        if pieces and pieces[-1].tokens + tokens <= budget:
            pieces[-1].end, pieces[-1].tokens = high, pieces[-1].tokens + tokens
        elif finer is not None and (tokens > budget or high - low > HARD_CUT_BYTES):
            pieces += finer(data, low, high, budget, count)
        else:
            pieces.append(_Piece(low, high, tokens))
    return pieces


# ------------------------------------------------------------------------------- packing


def _pack(pieces: list[_Piece], budget: int, min_tokens: int) -> list[Section]:
    sections: list[Section] = []
    last_tokens = 0  # estimated tokens of sections[-1]
    path: list[tuple[int, str]] = []
    start, tokens, section_path = pieces[0].start, 0, ()
    index = 0
    while index < len(pieces):
        group = _glued(pieces, index)  # headings travel with the piece after them
        group_tokens = sum(piece.tokens for piece in group)
        cut = group[0].start
        opens_heading = group[0].heading is not None
        short_tail = opens_heading and 0 < tokens < min_tokens
        if short_tail and sections and last_tokens + tokens <= budget:
            # a short tail joins the section before it
            sections[-1] = Section(sections[-1].start, cut, sections[-1].headings)
            last_tokens += tokens
            start, tokens = cut, 0
        if tokens and (tokens + group_tokens > budget or opens_heading):
            sections.append(Section(start, cut, section_path))
            last_tokens = tokens
            start, tokens = cut, 0
        if tokens == 0:
            section_path = _path_after(path, group)
        for piece in group:
            if piece.heading is not None:
                level, title = piece.heading
                path = [item for item in path if item[0] < level] + [(level, title)]
        tokens += group_tokens
        index += len(group)
    sections.append(Section(start, pieces[-1].end, section_path))
    return sections


def _glued(pieces: list[_Piece], index: int) -> list[_Piece]:
    """The piece at `index` and, if it is a heading, the headings after it and the piece they
    introduce; a run of headings longer than HARD_CUT_BYTES (hostile: a document of "# a"
    lines) is cut there, so that no group, and no section, is unbounded."""
    end = index
    start = pieces[index].start
    while (
        end < len(pieces) - 1
        and pieces[end].heading is not None
        and pieces[end].end - start <= HARD_CUT_BYTES
    ):
        end += 1
    return pieces[index : end + 1]


def _path_after(path: list[tuple[int, str]], group: list[_Piece]) -> tuple[str, ...]:
    """The heading path of a section whose first pieces are `group`."""
    current = list(path)
    for piece in group:
        if piece.heading is None:
            break
        level, title = piece.heading
        current = [item for item in current if item[0] < level] + [(level, title)]
    return tuple(title for _, title in current)
