"""What Blaise sends to the model, as token ids, laid out so the section's KV is reused.

Pure code: the tokenizer is any object with `encode(text, add_special_tokens=False)` (a
transformers tokenizer, for one). The layout:

    [bos] PREAMBLE | SOURCE + HEADING PATH + SECTION TEXT | pad ... pad | QUESTION
    <---------------------- prefix: a whole number of pages ----------> <- suffix ->

Each part is tokenized on its own, so no BPE merge across a boundary can shift the section's
tokens, and the same section always gives the same prefix ids whatever the question. The
prefix is padded (with the tokenizer's newline, or `pad_id`) to a multiple of the server's
page size, so every page of it is a full page that SGLang caches (device, host) and backs up
to our store: a second question about the section finds the whole prefix there.

The index (mode 2) is rendered by `render_index`: one block per document in order of
addition, each line derived from that document alone, so adding a document only appends.
`compose_index` lays it out for the model:

    [bos] INDEX PREAMBLE + TITLE | pad | DOCUMENT 1 | pad | ... | DOCUMENT N | pad | QUESTION
    <------------------- prefix: every block a whole number of pages ----------> <- suffix ->

Each block is tokenized and padded to whole pages on its own, so adding a document appends
pages and changes none before them: the server caches the index once (and our store keeps
it), and the next prompt, after any number of additions, reuses every page of the old prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

PREAMBLE = (
    "You answer questions about a document. Below is one section of it, with its source and "
    "heading path. Answer from that section only; if it does not hold the answer, say so.\n\n"
)
QUESTION_TEMPLATE = "\n\nQuestion: {question}\nAnswer:"
INDEX_PREAMBLE = (
    "You answer questions about a collection of documents. Below is its index: one line per "
    "section, with the section's name (<document>#<number>), heading path and opening words. "
    "Answer from the index; if the answer needs a section's text, name that section.\n\n"
)
INDEX_TITLE = "Blaise index: sections as <document>#<number>, heading path, opening words."


@dataclass(frozen=True, slots=True)
class Prompt:
    input_ids: list[int]
    prefix_len: int  # tokens of preamble + section + padding: a multiple of page_size
    page_size: int
    num_pad: int

    @property
    def num_prefix_pages(self) -> int:
        return self.prefix_len // self.page_size


def section_header(doc_id: str, headings: tuple[str, ...]) -> str:
    path = " > ".join(headings) if headings else "(top)"
    return f"Source: {doc_id}\nSection: {path}\n\n"


def compose(
    tokenizer,
    *,
    doc_id: str,
    headings: tuple[str, ...],
    text: str,
    question: str,
    page_size: int,
    preamble: str = PREAMBLE,
    pad_id: int | None = None,
    bos_id: int | None = None,
) -> Prompt:
    """The prompt's token ids. `bos_id` defaults to the tokenizer's `bos_token_id` (if any)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if bos_id is None:
        bos_id = getattr(tokenizer, "bos_token_id", None)
    head = [bos_id] if bos_id is not None else []
    head += _encode(tokenizer, preamble)
    body = _encode(tokenizer, section_header(doc_id, headings) + text)
    num_pad = -(len(head) + len(body)) % page_size
    pad = [pad_id if pad_id is not None else default_pad_id(tokenizer)] * num_pad
    prefix = head + body + pad
    suffix = _encode(tokenizer, QUESTION_TEMPLATE.format(question=question.strip()))
    return Prompt(prefix + suffix, len(prefix), page_size, num_pad)


def default_pad_id(tokenizer) -> int:
    """The newline's id when it is one token, else the tokenizer's pad or eos id."""
    newline = _encode(tokenizer, "\n")
    if len(newline) == 1:
        return newline[0]
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("no single-token newline, pad or eos id: pass pad_id")


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_index(documents) -> str:
    """The corpus index: `documents` is an iterable of (doc_id, [(headings, first_words)])
    in order of addition. Deterministic; each document's block depends on it alone."""
    lines = [INDEX_TITLE, ""]
    for doc_id, sections in documents:
        lines.append(index_block(doc_id, sections).rstrip("\n"))
        lines.append("")
    return "\n".join(lines)


def index_block(doc_id: str, sections) -> str:
    """One document's block of the index (its header line, then a line per section)."""
    lines = [f"## {doc_id} ({len(sections)} sections)"]
    for number, (headings, opening) in enumerate(sections, 1):
        path = " > ".join(headings) if headings else "(top)"
        lines.append(f"{doc_id}#{number} | {path} | {opening}")
    return "\n".join(lines) + "\n\n"


def compose_index(
    tokenizer,
    *,
    blocks: list[list[int]],
    question: str,
    page_size: int,
    preamble: str = INDEX_PREAMBLE,
    pad_id: int | None = None,
    bos_id: int | None = None,
) -> Prompt:
    """Mode 2's token ids: the preamble and title, then each document's block (`blocks`:
    their token ids, from `encode_block`), each padded to whole pages, then the question."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if bos_id is None:
        bos_id = getattr(tokenizer, "bos_token_id", None)
    pad = pad_id if pad_id is not None else default_pad_id(tokenizer)
    head = [bos_id] if bos_id is not None else []
    head += _encode(tokenizer, preamble + INDEX_TITLE + "\n\n")
    prefix: list[int] = []
    num_pad = 0
    for part in (head, *blocks):
        padding = -len(part) % page_size
        prefix += part
        prefix += [pad] * padding
        num_pad += padding
    suffix = _encode(tokenizer, QUESTION_TEMPLATE.format(question=question.strip()))
    return Prompt(prefix + suffix, len(prefix), page_size, num_pad)


def encode_block(tokenizer, doc_id: str, sections) -> list[int]:
    """A document's index block as token ids (tokenized on its own)."""
    return _encode(tokenizer, index_block(doc_id, sections))


def opening_words(text: str, num_words: int = 16) -> str:
    """The first words of a section's text, past its heading lines."""
    lines = text.splitlines()
    first = 0  # (an index: deleting the head of the list each time was quadratic in the lines)
    while first < len(lines):
        if first + 1 < len(lines) and _is_rule(lines[first + 1]):  # setext heading, underline
            first += 2
        elif not lines[first].strip() or _is_heading_line(lines[first]):
            first += 1
        else:
            break
    rest = lines[first:]
    words = " ".join(rest).split(maxsplit=num_words)  # the rest, if any, stays in one piece
    tail = " ..." if len(words) > num_words else ""
    return " ".join(words[:num_words]) + tail


def _is_heading_line(line: str) -> bool:
    return line.lstrip().startswith(("#", "=")) or _is_rule(line)


def _is_rule(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= 3 and len(set(stripped)) == 1 and stripped[0] in "=-*~^+"
