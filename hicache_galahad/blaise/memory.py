"""Blaise: documents kept byte-exact in sections; a question selects the section it needs.

    memory = Blaise("/var/lib/galahad", tenant="acme")
    memory.add("handbook.md", text)                 # -> its sections
    best = memory.select("Who signs expense reports?")[0]
    best.doc_id, best.start, best.end, best.text, best.score
    prompt = memory.prompt("Who signs expense reports?", tokenizer, page_size=16)

Sections are stored in the record store (see records.py) and indexed in memory (rank.py); the
index is rebuilt from the verified records when a Blaise opens. `select` reads the chosen
section back from the store on every call, so a record damaged since it was indexed is never
served: it is skipped, logged, listed in the result's `skipped`, and dropped from the index.
Not thread-safe: use one Blaise per thread (several processes may share a root).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from . import prompt as prompt_mod
from .layout import check_doc_id, decoded_slice, lay_out
from .rank import Ranker, RankParams
from .records import Manifest, SectionRef, TextRecords
from .segment import DEFAULT_BUDGET_TOKENS, DEFAULT_MIN_TOKENS, Section, estimate_tokens
from .skips import SkipLog, Skipped

__all__ = ["Blaise", "Selection", "Selections", "Skipped"]


@dataclass(frozen=True, slots=True)
class Selection:
    doc_id: str
    start: int  # byte offsets into the document's UTF-8 bytes
    end: int
    text: str  # exactly those bytes, decoded
    score: float
    headings: tuple[str, ...]
    number: int  # 1-based position of the section in its document


class Selections(list):
    """`select`'s result: a list of Selection, best first, with `skipped` alongside."""

    def __init__(self, items=(), skipped=()):
        super().__init__(items)
        self.skipped: list[Skipped] = list(skipped)


@dataclass(frozen=True, slots=True)
class _Entry:
    doc_id: str
    number: int
    ref: SectionRef


class Blaise:
    def __init__(
        self,
        root: str,
        tenant: str = "default",
        encryption_key_file: str | None = None,
        *,
        budget_tokens: int = DEFAULT_BUDGET_TOKENS,
        min_tokens: int = DEFAULT_MIN_TOKENS,
        count_tokens: Callable[[bytes], int] = estimate_tokens,
        rank_params: RankParams | None = None,
        durability: str = "deferred",
    ):
        self.tenant = tenant
        self.budget_tokens = budget_tokens
        self.min_tokens = min_tokens
        self.count_tokens = count_tokens
        self._records = TextRecords(root, tenant, encryption_key_file, durability)
        self._ranker = Ranker(rank_params)
        self._manifests: dict[str, tuple[str, Manifest]] = {}  # doc_id -> (key, manifest)
        self._entries: dict[int, _Entry] = {}
        self._ids_of: dict[str, list[int]] = {}
        self._openings: dict[str, list[tuple[tuple[str, ...], str]]] = {}
        self._next_id = 0
        # mode 2: doc_id -> (tokenizer, manifest key, the document's index block as token ids)
        self._index_ids: dict[str, tuple[object, str, list[int]]] = {}
        self.skipped = SkipLog()  # everything skipped since open
        self._load()

    # ------------------------------------------------------------------ open

    def _load(self) -> None:
        catalog, damaged_log = self._records.replay()
        for number in damaged_log:
            self.skipped.add(Skipped("", "catalog entry", number, number))
        for doc_id, key in catalog.items():
            manifest = self._records.get_manifest(key)
            if manifest is None or manifest.doc_id != doc_id:
                self.skipped.add(Skipped(doc_id, "manifest"))
                continue
            texts = []
            datas = self._records.get_sections(manifest.sections)
            for ref, data in zip(manifest.sections, datas, strict=True):
                text = _decoded(data)
                if text is None:
                    self.skipped.add(Skipped(doc_id, "section", ref.start, ref.end))
                texts.append(text)
            self._index(doc_id, key, manifest, texts)

    def _index(self, doc_id, key, manifest, texts) -> None:
        self._manifests[doc_id] = (key, manifest)
        ids, openings, batch = [], [], []
        for number, (ref, text) in enumerate(zip(manifest.sections, texts, strict=True), 1):
            openings.append((ref.headings, prompt_mod.opening_words(text or "")))
            if text is None:
                continue
            section_id = self._next_id
            self._next_id += 1
            batch.append((section_id, text, ref.headings))
            self._entries[section_id] = _Entry(doc_id, number, ref)
            ids.append(section_id)
        self._ranker.add_many(batch)
        self._ids_of[doc_id] = ids
        self._openings[doc_id] = openings

    def _unindex(self, doc_id: str) -> None:
        for section_id in self._ids_of.pop(doc_id, []):
            self._ranker.remove(section_id)
            del self._entries[section_id]
        self._openings.pop(doc_id, None)
        self._manifests.pop(doc_id, None)
        self._index_ids.pop(doc_id, None)

    # ------------------------------------------------------------------ documents

    def add(self, doc_id: str, text: str | bytes) -> list[Section]:
        """Stores and indexes a document (replacing one of the same id); returns its
        sections. Raises ValueError, before anything is written, for input that cannot be
        stored (see check_doc_id; bytes that are not UTF-8; a section or manifest over the
        store's read cap), and OSError if the store cannot write."""
        check_doc_id(doc_id)
        if not isinstance(text, str | bytes | bytearray | memoryview):
            raise ValueError(f"blaise: a document is str or UTF-8 bytes, not {type(text).__name__}")
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        data.decode("utf-8")  # raises UnicodeDecodeError (a ValueError) if it is not UTF-8
        digest = hashlib.sha256(data).hexdigest()
        previous = self._manifests.get(doc_id)
        if previous is not None and previous[1].sha256 == digest:
            return [Section(r.start, r.end, r.headings) for r in previous[1].sections]
        layout = lay_out(
            doc_id,
            data,
            digest,
            budget_tokens=self.budget_tokens,
            min_tokens=self.min_tokens,
            count_tokens=self.count_tokens,
        )
        # the blocks, the manifest and the catalog entry that names them: one batch
        entry = {"op": "add", "doc_id": doc_id, "manifest": layout.key}
        if not self._records.put_document(layout.keys, layout.datas, entry):
            raise OSError(f"blaise: could not store {doc_id!r}")
        self._unindex(doc_id)
        refs = layout.manifest.sections
        self._index(doc_id, layout.key, layout.manifest, [decoded_slice(data, r) for r in refs])
        if previous is not None:
            self._delete_records(previous, keep={r.key for r in refs})
        return layout.sections

    def remove(self, doc_id: str) -> bool:
        """Forgets a document and deletes its records; False if it was not there."""
        previous = self._manifests.get(doc_id)
        if previous is None:
            return False
        if not self._records.append_log({"op": "remove", "doc_id": doc_id}):
            raise OSError(f"blaise: could not record the removal of {doc_id!r}")
        self._unindex(doc_id)
        self._delete_records(previous, keep=set())
        return True

    def _delete_records(self, previous: tuple[str, Manifest], keep: set[str]) -> None:
        # the entry that replaced or removed them first becomes durable: a power loss must
        # never keep the deletion and lose the entry (the catalog would name missing blocks)
        self._records.sync()
        key, manifest = previous
        for record in dict.fromkeys(ref.key for ref in manifest.sections):
            if record not in keep and record != key:
                self._records.delete_record(record)
        self._records.delete_record(key)

    def documents(self) -> list[str]:
        """Document ids in order of addition."""
        return list(self._manifests)

    def sections(self, doc_id: str) -> list[Section]:
        return [Section(r.start, r.end, r.headings) for r in self._manifests[doc_id][1].sections]

    def read(self, doc_id: str) -> bytes | None:
        """The whole document from its verified sections; None if any section fails."""
        _, manifest = self._manifests[doc_id]
        parts = self._records.get_sections(manifest.sections)
        if any(part is None for part in parts):
            return None
        data = b"".join(parts)
        return data if hashlib.sha256(data).hexdigest() == manifest.sha256 else None

    # ------------------------------------------------------------------ questions

    def select(self, question: str, k: int = 1) -> Selections:
        """The k best sections for `question`, best first, each read back and verified."""
        chosen: list[Selection] = []
        skipped: list[Skipped] = []
        ranked = self._ranker.search(question, k)
        while ranked:
            num_skipped = len(skipped)
            for section_id, score in ranked:
                selection = self._read(section_id, score)
                if selection is None:
                    skipped.append(self._drop(section_id))
                else:
                    chosen.append(selection)
            if len(skipped) == num_skipped or len(chosen) >= k:
                break  # nothing was dropped, so a new search would find nothing new
            seen = {(s.doc_id, s.start) for s in chosen}
            ranked = [
                (section_id, score)
                for section_id, score in self._ranker.search(question, k)
                if (self._entries[section_id].doc_id, self._entries[section_id].ref.start)
                not in seen
            ][: k - len(chosen)]
        return Selections(chosen, skipped)

    def _read(self, section_id: int, score: float) -> Selection | None:
        entry = self._entries[section_id]
        data = self._records.get_section(entry.ref)
        if data is None:
            return None
        return Selection(
            entry.doc_id,
            entry.ref.start,
            entry.ref.end,
            data.decode("utf-8"),
            score,
            entry.ref.headings,
            entry.number,
        )

    def _drop(self, section_id: int) -> Skipped:
        entry = self._entries.pop(section_id)
        self._ranker.remove(section_id)
        self._ids_of[entry.doc_id].remove(section_id)
        return self.skipped.add(Skipped(entry.doc_id, "section", entry.ref.start, entry.ref.end))

    def prompt(
        self,
        question: str,
        tokenizer,
        *,
        page_size: int,
        selection: Selection | None = None,
        **options,
    ) -> prompt_mod.Prompt | None:
        """The token ids to send for `question` (see prompt.py for the layout), built on
        `selection` or on the best section; None when no section matches."""
        if selection is None:
            found = self.select(question, 1)
            if not found:
                return None
            selection = found[0]
        return prompt_mod.compose(
            tokenizer,
            doc_id=selection.doc_id,
            headings=selection.headings,
            text=selection.text,
            question=question,
            page_size=page_size,
            **options,
        )

    def prompt_with_index(
        self,
        question: str,
        tokenizer,
        *,
        page_size: int,
        **options,
    ) -> prompt_mod.Prompt:
        """Mode 2: the token ids of the corpus index as a page-aligned prefix (each document's
        block padded to whole pages, see prompt.compose_index), then the question. Adding a
        document appends pages: every page of an earlier prompt's prefix is unchanged, so the
        server's cache and our store serve it. A document's block is tokenized once per
        tokenizer and version of the document."""
        blocks = []
        for doc_id, (key, _) in self._manifests.items():
            known = self._index_ids.get(doc_id)
            if known is None or known[0] is not tokenizer or known[1] != key:
                ids = prompt_mod.encode_block(tokenizer, doc_id, self._openings[doc_id])
                known = self._index_ids[doc_id] = (tokenizer, key, ids)
            blocks.append(known[2])
        return prompt_mod.compose_index(
            tokenizer, blocks=blocks, question=question, page_size=page_size, **options
        )

    def index_text(self) -> str:
        """The corpus index (mode 2): deterministic; adding a document only appends."""
        return prompt_mod.render_index(
            (doc_id, self._openings[doc_id]) for doc_id in self._manifests
        )

    # ------------------------------------------------------------------ lifetime

    def sync(self) -> None:
        """Makes every document added so far durable now. Without it, records are fsynced
        by the store's flusher within its window (1 s) and at close: a power loss may lose
        the last second of adds (they are then misses, never wrong text)."""
        self._records.sync()

    def close(self) -> None:
        self._records.close()

    def __enter__(self) -> Blaise:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _decoded(data: bytes | None) -> str | None:
    """Verified section bytes as text; None if missing or not UTF-8 (a forged manifest may
    name a slice with its true digest that cuts a character)."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
