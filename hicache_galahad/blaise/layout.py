"""A document's bytes laid out as the records that store it: its sections, packed into
blocks, and the manifest that names them, every limit checked before a byte is written.
Pure code (segment.py, records.py's formats)."""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace

from .records import (
    INLINE,
    MAX_DOC_ID_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_SECTION_BYTES,
    Manifest,
    SectionRef,
    block_key,
    manifest_record,
    pack_blocks,
)
from .segment import Section, segment


@dataclass(frozen=True, slots=True)
class Layout:
    sections: list[Section]
    manifest: Manifest  # as indexed: a one-block document's sections name the manifest's key
    key: str  # the manifest's record key
    keys: list[str]  # the records to put, in order: the blocks, then the manifest
    datas: list[bytes]


def lay_out(
    doc_id: str,
    data: bytes,
    digest: str,
    *,
    budget_tokens: int,
    min_tokens: int,
    count_tokens: Callable[[bytes], int],
) -> Layout:
    """The records of document `doc_id` (`data`: its UTF-8 bytes, `digest`: their SHA-256).
    Raises ValueError naming the limit for a section or a manifest over the store's read
    cap. A document of one block is one record: the manifest, then the block's bytes."""
    sections = segment(
        data, budget_tokens=budget_tokens, min_tokens=min_tokens, count_tokens=count_tokens
    )
    chunks = [data[s.start : s.end] for s in sections]
    for section, chunk in zip(sections, chunks, strict=True):
        if len(chunk) > MAX_SECTION_BYTES:
            raise ValueError(
                f"blaise: {doc_id!r} has a section of {len(chunk)} bytes "
                f"[{section.start}, {section.end}): over the read cap of "
                f"{MAX_SECTION_BYTES} bytes (lower budget_tokens)"
            )
    digests = [hashlib.sha256(chunk).hexdigest() for chunk in chunks]
    blocks = pack_blocks([(s.start, s.end) for s in sections])
    block_datas = [data[base:end] for base, end in blocks]
    inline = len(blocks) == 1  # one block: it follows the manifest in the same record
    block_keys = [INLINE] if inline else [block_key(doc_id, b) for b in block_datas]
    refs, number = [], 0
    for section, section_digest in zip(sections, digests, strict=True):
        while section.start >= blocks[number][1]:
            number += 1
        refs.append(
            SectionRef(
                section.start,
                section.end,
                block_keys[number],
                section.headings,
                section_digest,
                blocks[number][0],
            )
        )
    refs = tuple(refs)
    key, encoded = manifest_record(
        Manifest(doc_id, len(data), digest, refs), block_datas[0] if inline else None
    )
    if inline:  # its sections are read from the manifest's own record
        refs = tuple(replace(ref, key=key) for ref in refs)
        block_keys, block_datas = [], []
    if len(encoded) > MAX_MANIFEST_BYTES:
        raise ValueError(
            f"blaise: the manifest of {doc_id!r} would be {len(encoded)} bytes: over the "
            f"read cap of {MAX_MANIFEST_BYTES} bytes ({len(refs)} sections; raise "
            "budget_tokens or split the document)"
        )
    manifest = Manifest(doc_id, len(data), digest, refs)
    return Layout(sections, manifest, key, [*block_keys, key], [*block_datas, encoded])


def check_doc_id(doc_id) -> None:
    """Raises ValueError unless `doc_id` can be stored: a non-empty str of at most
    MAX_DOC_ID_BYTES UTF-8 bytes without control characters (C0, DEL, C1: a line break in an
    id would break the prompt's "Source:" line and the index's one line per section)."""
    if not isinstance(doc_id, str) or not doc_id:
        raise ValueError(f"blaise: doc_id must be a non-empty str, not {doc_id!r:.80}")
    try:
        size = len(doc_id.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise ValueError(f"blaise: doc_id is not encodable as UTF-8: {error}") from None
    if size > MAX_DOC_ID_BYTES:
        raise ValueError(f"blaise: doc_id of {size} UTF-8 bytes: the limit is {MAX_DOC_ID_BYTES}")
    bad = next((c for c in doc_id if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise ValueError(f"blaise: doc_id {doc_id!r:.80} holds the control character {bad!r}")


def decoded_slice(data: bytes, ref: SectionRef) -> str:
    return data[ref.start : ref.end].decode("utf-8")
