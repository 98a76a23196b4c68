"""Recurrent-state checkpoint policy for hybrid models.

Pure Python: importing this package never imports torch or SGLang, so the policy can be
read, tested and reused without a GPU. See docs/CHECKPOINTS.md for the rule it implements.
"""

from checkpoint.grid import CheckpointGrid, cache_chunk_size, checkpoint_grid, track_grid
from checkpoint.hits import ALL_PAGES, TRAILING_PAGES, PoolHits, PoolQuery, combine_pool_hits
from checkpoint.policy import (
    PagesWithState,
    TrailingPagesHits,
    restorable_boundary,
    suffix_to_recompute,
    trailing_pages_hits,
)

__all__ = [
    "ALL_PAGES",
    "TRAILING_PAGES",
    "CheckpointGrid",
    "PagesWithState",
    "PoolHits",
    "PoolQuery",
    "TrailingPagesHits",
    "cache_chunk_size",
    "checkpoint_grid",
    "combine_pool_hits",
    "restorable_boundary",
    "suffix_to_recompute",
    "track_grid",
    "trailing_pages_hits",
]
