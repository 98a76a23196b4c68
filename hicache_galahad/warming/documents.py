"""The documents to warm: paths, texts, token ids, and (with --sections) each Blaise section as
the page-aligned prefix of the prompt `Blaise.prompt` composes for it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from .keys import token_ids_checked


@dataclass
class Document:
    """A prefix to warm: its name, its token ids (or its text, tokenized by the server)."""

    name: str
    text: str | None = None
    token_ids: list[int] | None = None


def load_documents(documents: Iterable, sections: bool, target, profile) -> list[Document]:
    """Documents from paths (os.PathLike, or str naming a file), (name, text or ids) pairs,
    Document objects, or token-id lists; with `sections`, each Blaise section of each text as
    the prefix `Blaise.prompt` composes."""
    loaded: list[Document] = []
    for index, item in enumerate(documents):
        if isinstance(item, Document):
            document = item
        elif isinstance(item, os.PathLike) or (isinstance(item, str) and os.path.isfile(item)):
            path = os.fspath(item)
            with open(path, "rb") as handle:
                document = Document(path, handle.read().decode("utf-8"))
        elif isinstance(item, tuple) and len(item) == 2:
            name, body = item
            document = (
                Document(str(name), body)
                if isinstance(body, str)
                else Document(str(name), None, token_ids_checked(body))
            )
        elif isinstance(item, str):
            document = Document(f"document {index + 1}", item)
        else:
            document = Document(f"document {index + 1}", None, token_ids_checked(item))
        if sections and document.text is not None:
            loaded.extend(section_prefixes(document, target.tokenizer(profile), profile.page_size))
        else:
            loaded.append(document)
    return loaded


def section_prefixes(document: Document, tokenizer, page_size: int) -> list[Document]:
    """Each Blaise section of the document as the page-aligned prefix of the prompt
    `Blaise.prompt` composes for it (the same segmentation defaults as `Blaise.add`, the
    document named as `galahad blaise add` names it: its path as given)."""
    from ..blaise.prompt import compose
    from ..blaise.segment import segment

    data = (document.text or "").encode("utf-8")
    prefixes = []
    for number, section in enumerate(segment(data), 1):
        prompt = compose(
            tokenizer,
            doc_id=document.name,
            headings=section.headings,
            text=data[section.start : section.end].decode("utf-8"),
            question="",
            page_size=page_size,
        )
        prefixes.append(
            Document(f"{document.name}#{number}", None, prompt.input_ids[: prompt.prefix_len])
        )
    return prefixes
