"""What a request would restore now, from the store alone: the leading run of a prefix's pages
present in every rank's namespace, over SGLang's strict prefix (floor((N-1)/P) pages for a
request of exactly the document), and for a hybrid the deepest page of that run whose state is
present in every rank's state namespace. A request that continues the document (a question
after it) may restore up to floor(N/P) pages: `continuation_tokens`."""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint.prefill import deepest_checkpoint

from .namespaces import RankNamespaces


@dataclass
class Readiness:
    tokens: int  # the document's token count N
    restorable_tokens: int  # a request of exactly the document, now
    continuation_tokens: int  # a request that continues the document (a question after it)
    pages_expected: int  # the pages SGLang stores: floor(N/P), for a hybrid C*floor(N/C)/P
    pages_stored: int  # of those, present in every rank's namespace
    checkpoints: list[int]  # token positions with a state in every rank (hybrid)
    hybrid: bool
    leading_pages: int = 0  # the leading run present in every rank (what a request reads)


def readiness(
    store, ranks: list[RankNamespaces], keys: list[str], num_tokens: int, page_size: int
) -> Readiness:
    """From the store alone: how much of a prefix of `num_tokens` tokens (page keys `keys`)
    a request would restore now (see the module docstring)."""
    hybrid = any(rank.states for rank in ranks)
    if not ranks:
        return Readiness(num_tokens, 0, 0, len(keys), 0, [], hybrid)
    stored = min(store.leading_run(rank.kv, keys) for rank in ranks)
    present = [sum(1 for key in keys if store.contains(rank.kv, key)) for rank in ranks]
    checkpoints = []
    if hybrid:
        for page in range(stored):
            if all(all(store.contains(ns, keys[page]) for ns in rank.states) for rank in ranks):
                checkpoints.append((page + 1) * page_size)

    def restorable(pages: int) -> int:
        if not hybrid:
            return pages * page_size
        return deepest_checkpoint(checkpoints, pages * page_size)

    alone_pages = min(stored, max(0, num_tokens - 1) // page_size)
    return Readiness(
        num_tokens,
        restorable(alone_pages),
        restorable(stored),
        len(keys),
        min(present),
        checkpoints,
        hybrid,
        stored,
    )
