"""The hybrid hit policy (how many pages every pool of a prompt can restore) and where a
hybrid's checkpoints land (the grid, the prefill plan that `galahad warm` sends).

Pure Python: importing this package never imports torch or SGLang, so the policy can be
read, tested and reused without a GPU. See docs/CHECKPOINTS.md for the rule it implements.
"""

from checkpoint.hits import ALL_PAGES, TRAILING_PAGES, PoolHits, PoolQuery, combine_pool_hits
from checkpoint.policy import PagesWithState, TrailingPagesHits, trailing_pages_hits

__all__ = [
    "ALL_PAGES",
    "TRAILING_PAGES",
    "PagesWithState",
    "PoolHits",
    "PoolQuery",
    "TrailingPagesHits",
    "combine_pool_hits",
    "trailing_pages_hits",
]
