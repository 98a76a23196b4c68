"""Mode 2: `Blaise.prompt_with_index` sends the corpus index as a page-aligned prefix, each
document's block padded to whole pages on its own, then the question; adding a document only
appends pages, so every page of an earlier prefix is reused."""

from __future__ import annotations

import pytest

from hicache_galahad.blaise import Blaise
from hicache_galahad.blaise.prompt import INDEX_PREAMBLE, INDEX_TITLE

HARBOUR = (
    "# Harbour\n\nThe harbour has three quays.\n\n## Bridges\n\nThe Quorvane Bridge is long.\n"
)
ORCHARD = "Orchard notes\n=============\n\nThe orchard holds 212 apple trees of eleven kinds.\n"
LIGHT = "# Lighthouse\n\nThe lamp turns every nine seconds.\n"
PAD = 10  # ByteTokenizer's newline


class ByteTokenizer:
    """One token per UTF-8 byte; a BOS of 256; counts its calls to encode."""

    bos_token_id = 256

    def __init__(self):
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls += 1
        return list(text.encode())


def text_of(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode()


@pytest.mark.parametrize("page_size", [1, 4, 16, 64])
def test_the_index_prefix_is_whole_pages_and_appends_only(tmp_path, page_size):
    tokenizer = ByteTokenizer()
    with Blaise(str(tmp_path / str(page_size)), budget_tokens=30, min_tokens=5) as memory:
        empty = memory.prompt_with_index("Anything?", tokenizer, page_size=page_size)
        memory.add("harbour.md", HARBOUR)
        one = memory.prompt_with_index("How many quays?", tokenizer, page_size=page_size)
        memory.add("orchard.txt", ORCHARD)
        memory.add("light.md", LIGHT)
        three = memory.prompt_with_index("How many apple trees?", tokenizer, page_size=page_size)
        index = memory.index_text()
    for prompt in (empty, one, three):
        assert prompt.prefix_len % page_size == 0 and prompt.input_ids[0] == 256
    # every page of an earlier prefix is a page of the later one
    assert three.input_ids[: one.prefix_len] == one.input_ids[: one.prefix_len]
    assert one.input_ids[: empty.prefix_len] == empty.input_ids[: empty.prefix_len]
    assert three.prefix_len > one.prefix_len > empty.prefix_len
    # the prefix is the preamble and the index, with padding between blocks only
    prefix = text_of(three.input_ids[1 : three.prefix_len])
    assert prefix.startswith(INDEX_PREAMBLE + INDEX_TITLE)
    squeezed = prefix[len(INDEX_PREAMBLE) :]
    while "\n\n\n" in squeezed:
        squeezed = squeezed.replace("\n\n\n", "\n\n")
    assert squeezed.rstrip("\n") == index.rstrip("\n")
    assert text_of(three.input_ids[three.prefix_len :]) == (
        "\n\nQuestion: How many apple trees?\nAnswer:"
    )
    assert 0 <= three.num_pad < 4 * page_size  # at most a page less one per block (3 + head)


def test_index_blocks_are_tokenized_once_per_document_version(tmp_path):
    tokenizer = ByteTokenizer()
    with Blaise(str(tmp_path)) as memory:
        memory.add("harbour.md", HARBOUR)
        memory.add("orchard.txt", ORCHARD)
        memory.prompt_with_index("q?", tokenizer, page_size=16)
        calls = tokenizer.calls
        memory.prompt_with_index("another q?", tokenizer, page_size=16)
        assert tokenizer.calls - calls == 3  # head, pad, question: no block again
        memory.add("orchard.txt", ORCHARD + "\nThe gate is blue.\n")  # a new version
        replaced = memory.prompt_with_index("Which colour is the gate?", tokenizer, page_size=16)
        assert "gate is blue" in text_of(replaced.input_ids)
        memory.remove("harbour.md")
        gone = memory.prompt_with_index("q?", tokenizer, page_size=16)
        assert "harbour.md" not in text_of(gone.input_ids)
        other = ByteTokenizer()
        assert memory.prompt_with_index("q?", other, page_size=16).input_ids == gone.input_ids


def test_page_size_must_be_positive(tmp_path):
    with Blaise(str(tmp_path)) as memory, pytest.raises(ValueError):
        memory.prompt_with_index("q?", ByteTokenizer(), page_size=0)
