"""Recurrent-state checkpoint policy and record codec for hybrid models.

Pure Python: importing this package never imports torch or SGLang, so the policy can be
read, tested and reused without a GPU. See docs/CHECKPOINTS.md for the rule it implements.
"""

from checkpoint.errors import (
    BadMagic,
    DtypeMismatch,
    GeometryMismatch,
    GridMismatch,
    MalformedHeader,
    PositionMismatch,
    StateRecordError,
    TrailingBytes,
    TruncatedRecord,
    UnsupportedVersion,
)
from checkpoint.geometry import ComponentSpec, StateGeometry
from checkpoint.grid import CheckpointGrid, cache_chunk_size, checkpoint_grid, track_grid
from checkpoint.policy import (
    PagesWithState,
    TrailingPagesHits,
    restorable_boundary,
    suffix_to_recompute,
    trailing_pages_hits,
)
from checkpoint.state import StateRecordHeader, pack_state, read_state_header, unpack_state

__all__ = [
    "BadMagic",
    "CheckpointGrid",
    "ComponentSpec",
    "DtypeMismatch",
    "GeometryMismatch",
    "GridMismatch",
    "MalformedHeader",
    "PagesWithState",
    "PositionMismatch",
    "StateGeometry",
    "StateRecordError",
    "StateRecordHeader",
    "TrailingBytes",
    "TrailingPagesHits",
    "TruncatedRecord",
    "UnsupportedVersion",
    "cache_chunk_size",
    "checkpoint_grid",
    "pack_state",
    "read_state_header",
    "restorable_boundary",
    "suffix_to_recompute",
    "track_grid",
    "trailing_pages_hits",
    "unpack_state",
]
