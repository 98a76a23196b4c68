"""The request traces of bench_cache: prompts as token ids, each sized against a page budget
(pure Python: no torch, no SGLang).

Every trace is a function of (seed, budget_pages, page_tokens) and nothing else, so a seed names
one trace exactly. Sizes are in pages of `page_tokens` tokens, relative to the budget:

- `zipf_chat`: documents of Zipf popularity, each the start of a conversation; a request asks
  its conversation again with a new user turn, and the conversation then grows by that turn
  and an answer (page by page). The documents together are about 3x the budget.
- `coding_agent`: an agent session re-sends a system prompt and a repository's files (real
  files: Python standard library sources, tokenized by words) in the session's order, then its
  own growing tail (tool outputs, answers); sessions come back to a few orders. Contexts grow
  from about 0.6x to 1.4x the budget: a run longer than the budget is LRU's classic loop.
- `document_qa`: a question after a system prompt and one document of a corpus about 4x the
  budget, documents of mildly skewed popularity.
- `scan`: a hot set (about half the budget) asked in rounds, with one-shot prompts (never
  asked again) about 1.2x the budget between two asks of the same hot document.

Tokens: synthetic documents are seeded random ids; the agent's files are words mapped to ids
by crc32 (cheap and deterministic; only equality of prefixes matters to a cache).
"""

from __future__ import annotations

import os
import random
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

VOCAB = 50_000
WORD = re.compile(r"\w+|[^\w\s]")

TUNING_SEEDS = (1, 2)
# Chosen before any result was seen; never look at them while tuning (`--split tuning`).
HELD_OUT_SEEDS = (7207, 9431)


@dataclass(frozen=True)
class Trace:
    name: str
    seed: int
    budget_pages: int
    page_tokens: int
    prompts: list[list[int]]


def _tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(count)]


def _zipf_weights(count: int, exponent: float) -> list[float]:
    return [1.0 / (rank + 1) ** exponent for rank in range(count)]


def zipf_chat(seed: int, budget_pages: int, page_tokens: int) -> Trace:
    rng = random.Random(f"zipf_chat/{seed}")
    system = _tokens(rng, 2 * page_tokens)
    conversations = []
    corpus_pages = 0
    while corpus_pages < 3 * budget_pages:
        pages = rng.randint(4, 16)
        conversations.append(
            system + _tokens(rng, pages * page_tokens + rng.randrange(page_tokens))
        )
        corpus_pages += pages + 2
    weights = _zipf_weights(len(conversations), 1.1)
    order = list(range(len(conversations)))
    rng.shuffle(order)  # popularity independent of creation order
    prompts = []
    for _ in range(8 * budget_pages // 10):
        conversation = conversations[rng.choices(order, weights)[0]]
        turn = _tokens(rng, rng.randint(page_tokens // 2, 2 * page_tokens))
        prompts.append(conversation + turn)
        conversation += turn + _tokens(rng, rng.randint(page_tokens, 3 * page_tokens))
    return Trace("zipf_chat", seed, budget_pages, page_tokens, prompts)


def stdlib_files() -> list[str]:
    """The standard library's own Python sources (top level of its directory), sorted."""
    directory = os.path.dirname(os.__file__)
    return sorted(
        os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(".py")
    )


def _file_tokens(path: str) -> list[int]:
    with open(path, encoding="utf-8", errors="replace") as source:
        words = WORD.findall(source.read())
    return [zlib.crc32(word.encode()) % (VOCAB - 1) + 1 for word in words]


def coding_agent(seed: int, budget_pages: int, page_tokens: int) -> Trace:
    rng = random.Random(f"coding_agent/{seed}")
    system = _tokens(rng, 3 * page_tokens)
    budget_tokens = budget_pages * page_tokens
    candidates = stdlib_files()
    rng.shuffle(candidates)
    repository, repository_tokens = [], 0
    for path in candidates:
        tokens = _file_tokens(path)
        if not tokens or len(tokens) > budget_tokens // 6:
            continue
        if repository_tokens + len(tokens) > 0.6 * budget_tokens:
            break
        repository.append(tokens)
        repository_tokens += len(tokens)
    orders = []
    for _ in range(3):
        order = list(range(len(repository)))
        rng.shuffle(order)
        orders.append(order)
    prompts = []
    tail_cap_tokens = int(0.8 * budget_tokens)
    while len(prompts) < budget_pages // 3:
        context = list(system)
        for index in rng.choice(orders):
            context += repository[index]
        tail = 0
        while tail < tail_cap_tokens:
            step = _tokens(rng, rng.randint(2 * page_tokens, 8 * page_tokens))
            prompts.append(context + step)
            context += step + _tokens(rng, rng.randint(page_tokens, 4 * page_tokens))
            tail = len(context) - repository_tokens - len(system)
    return Trace("coding_agent", seed, budget_pages, page_tokens, prompts)


def document_qa(seed: int, budget_pages: int, page_tokens: int) -> Trace:
    rng = random.Random(f"document_qa/{seed}")
    system = _tokens(rng, page_tokens)
    documents, corpus_pages = [], 0
    while corpus_pages < 4 * budget_pages:
        pages = rng.randint(8, 32)
        documents.append(system + _tokens(rng, pages * page_tokens + rng.randrange(page_tokens)))
        corpus_pages += pages
    weights = _zipf_weights(len(documents), 0.6)
    prompts = []
    for _ in range(budget_pages // 2):
        document = rng.choices(documents, weights)[0]
        prompts.append(document + _tokens(rng, rng.randint(page_tokens // 2, 2 * page_tokens)))
    return Trace("document_qa", seed, budget_pages, page_tokens, prompts)


def scan(seed: int, budget_pages: int, page_tokens: int) -> Trace:
    rng = random.Random(f"scan/{seed}")
    system = _tokens(rng, page_tokens)
    hot, hot_pages = [], 0
    while hot_pages < budget_pages // 2:
        pages = rng.randint(4, 12)
        hot.append(system + _tokens(rng, pages * page_tokens))
        hot_pages += pages
    prompts = []
    for _round in range(5):
        order = list(range(len(hot)))
        rng.shuffle(order)
        scan_pages_per_ask = 1.2 * budget_pages / len(hot)
        for index in order:
            prompts.append(hot[index] + _tokens(rng, rng.randint(4, page_tokens)))
            scanned = 0
            while scanned < scan_pages_per_ask:
                pages = rng.randint(4, 12)
                prompts.append(system + _tokens(rng, pages * page_tokens + 1))
                scanned += pages
    return Trace("scan", seed, budget_pages, page_tokens, prompts)


TRACES: dict[str, Callable[[int, int, int], Trace]] = {
    "zipf_chat": zipf_chat,
    "coding_agent": coding_agent,
    "document_qa": document_qa,
    "scan": scan,
}
