"""How many pages of a prompt a hybrid model may restore: KV plus every extra pool (pure).

SGLang's v2 storage API asks, for a prompt's page keys, how long a prefix can be restored;
for a hybrid model the answer must hold for the KV pages and for each extra pool (Mamba /
GDN states, sliding-window KV) under that pool's hit policy. This is that decision, as a
function of what is present, so it can be read and tested without torch or SGLang.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from checkpoint.policy import trailing_pages_hits

ALL_PAGES = "all_pages"
TRAILING_PAGES = "trailing_pages"


class PoolQuery(NamedTuple):
    """One extra pool of a lookup.

    policy: ALL_PAGES (every page of the prefix needs this pool's record), TRAILING_PAGES
    (the last `window` pages do: a recurrent state is only needed where the prefix ends), or
    anything else (a policy this backend does not implement: never a hit).
    has_record(page_index): whether the pool has a record for that page (cheap).
    is_intact(prefix_pages): whether the records a restore of that prefix would read verify
    in full (TRAILING_PAGES only; the deepest candidates are tried first, so the boundary
    snaps back past a damaged state to an intact one).
    """

    name: str
    policy: str
    window: int
    has_record: Callable[[int], bool]
    is_intact: Callable[[int], bool] | None = None


class PoolHits(NamedTuple):
    """SGLang's PoolTransferResult, as plain data."""

    hit_pages: int
    pool_hit_pages: dict[str, int]
    restorable_prefix_pages: list[int]


def _pool_restorable(pool: PoolQuery, kv_pages: int) -> set[int]:
    if pool.policy == ALL_PAGES:
        present = 0
        while present < kv_pages and pool.has_record(present):
            present += 1
        return set(range(1, present + 1))
    if pool.policy != TRAILING_PAGES:
        return set()
    restorable = set(
        trailing_pages_hits(kv_pages, pool.has_record, max(1, pool.window)).restorable_prefix_pages
    )
    if pool.is_intact is not None:
        for length in sorted(restorable, reverse=True):
            if pool.is_intact(length):
                break
            restorable.discard(length)
    return restorable


def combine_pool_hits(kv_name: str, kv_pages: int, pools: Sequence[PoolQuery]) -> PoolHits:
    """The restorable prefixes of a prompt whose leading `kv_pages` KV pages are present: the
    prefix lengths every pool can restore, the deepest of them, and each pool's own deepest."""
    pool_hit_pages = {kv_name: kv_pages} if kv_pages else {}
    restorable = list(range(1, kv_pages + 1))
    for pool in pools:
        if not restorable:
            break
        pool_restorable = _pool_restorable(pool, kv_pages)
        boundary = max(pool_restorable, default=0)
        if boundary:
            pool_hit_pages[pool.name] = boundary
        restorable = [length for length in restorable if length in pool_restorable]
    return PoolHits(restorable[-1] if restorable else 0, pool_hit_pages, restorable)
