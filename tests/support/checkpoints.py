"""The checkpoint rule as an oracle for the tests: SGLang 0.5.23's token grids on which
recurrent-state checkpoints live, and the restorable boundary B of docs/CHECKPOINTS.md.

The backend does not compute B (SGLang's scheduler resumes from what the backend's hit policy,
checkpoint/hits.py, reports); the tests hold the backend's answers to this rule, and the
arithmetic `galahad warm` plans with (checkpoint/prefill.py) to these grids.

SGLang (`srt/arg_groups/overrides.py`, `srt/runtime_context.py`,
`srt/arg_groups/mamba_hook.py:validate_mamba_extra_buffer`) defines, for the
`extra_buffer` Mamba strategy:

- ``mamba_cache_chunk_size = max(model chunk size, page_size)``, and asserts that the
  larger of the two is a multiple of the smaller;
- ``mamba_checkpoint_grid(tree_page) = lcm(mamba_cache_chunk_size, tree_page)``: the depth
  a prefill-donated checkpoint lands on;
- ``mamba_track_grid(tree_page) = lcm(mamba_checkpoint_grid, mamba_track_interval)``:
  the depth a decode-donated checkpoint lands on; ``mamba_track_interval`` must be a
  multiple of ``page_size``.

`tree_page` is the radix tree's page, which equals ``page_size`` unless decode context
parallelism widens it. Because the chunk size and the page size divide one another, the
checkpoint grid equals ``max(chunk, page_size)`` whenever ``tree_page == page_size``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from checkpoint.policy import PagesWithState, _require_non_negative_int, _state_predicate

# SGLang's fallback when the HF config has no `mamba_chunk_size` (FLA's CHUNK_SIZE).
DEFAULT_MODEL_CHUNK_SIZE_TOKENS = 64


def _require_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a positive integer")


def cache_chunk_size(model_chunk_size_tokens: int, page_size_tokens: int) -> int:
    """SGLang's ``mamba_cache_chunk_size``: ``max(model chunk size, page size)``.

    Raises ValueError, as SGLang asserts, unless one of the two divides the other.
    """
    _require_positive_int("model_chunk_size_tokens", model_chunk_size_tokens)
    _require_positive_int("page_size_tokens", page_size_tokens)
    larger = max(model_chunk_size_tokens, page_size_tokens)
    smaller = min(model_chunk_size_tokens, page_size_tokens)
    if larger % smaller:
        raise ValueError(
            f"model_chunk_size_tokens={model_chunk_size_tokens} and "
            f"page_size_tokens={page_size_tokens}: SGLang requires one to divide the other"
        )
    return larger


def checkpoint_grid(cache_chunk_size_tokens: int, tree_page_tokens: int) -> int:
    """SGLang's ``mamba_checkpoint_grid``: ``lcm(mamba_cache_chunk_size, tree_page)``."""
    _require_positive_int("cache_chunk_size_tokens", cache_chunk_size_tokens)
    _require_positive_int("tree_page_tokens", tree_page_tokens)
    return math.lcm(cache_chunk_size_tokens, tree_page_tokens)


def track_grid(checkpoint_grid_tokens: int, track_interval_tokens: int) -> int:
    """SGLang's ``mamba_track_grid``: ``lcm(mamba_checkpoint_grid, mamba_track_interval)``."""
    _require_positive_int("checkpoint_grid_tokens", checkpoint_grid_tokens)
    _require_positive_int("track_interval_tokens", track_interval_tokens)
    return math.lcm(checkpoint_grid_tokens, track_interval_tokens)


@dataclass(frozen=True)
class CheckpointGrid:
    """Page size P, checkpoint interval C and, if known, the model's Mamba chunk size.

    Checkpoints are restorable only at positive multiples of C. Construction validates:

    - P and C are positive integers and C is a multiple of P (a state is keyed by the
      hash of the last page it covers, so it must end on a page boundary);
    - if `model_chunk_size_tokens` is given: it and P divide one another (SGLang's
      assert), and C is a multiple of SGLang's checkpoint grid
      ``lcm(max(chunk, P), P)``, because SGLang never donates a prefill checkpoint
      anywhere else.

    `page_size_tokens` is the radix tree's page (SGLang's ``tree_cache.page_size``).
    Without a model chunk size the engine grid is unknown and only page alignment is
    enforced.
    """

    page_size_tokens: int
    interval_tokens: int
    model_chunk_size_tokens: int | None = None

    def __post_init__(self) -> None:
        _require_positive_int("page_size_tokens", self.page_size_tokens)
        _require_positive_int("interval_tokens", self.interval_tokens)
        if self.interval_tokens % self.page_size_tokens:
            raise ValueError(
                f"interval_tokens={self.interval_tokens}: must be a positive multiple of "
                f"page_size_tokens={self.page_size_tokens} (checkpoints end on page boundaries)"
            )
        if self.model_chunk_size_tokens is None:
            return
        grid_tokens = self.checkpoint_grid_tokens
        if self.interval_tokens % grid_tokens:
            raise ValueError(
                f"interval_tokens={self.interval_tokens}: must be a multiple of SGLang's "
                f"mamba_checkpoint_grid={grid_tokens} = lcm(max(model_chunk_size_tokens="
                f"{self.model_chunk_size_tokens}, page_size_tokens={self.page_size_tokens}), "
                f"page_size_tokens), the only depths where SGLang donates prefill checkpoints"
            )

    @property
    def pages_per_interval(self) -> int:
        """C / P: how many pages separate two consecutive checkpoints."""
        return self.interval_tokens // self.page_size_tokens

    @property
    def cache_chunk_size_tokens(self) -> int:
        """SGLang's ``mamba_cache_chunk_size``; P alone when the model chunk size is unknown."""
        if self.model_chunk_size_tokens is None:
            return self.page_size_tokens
        return cache_chunk_size(self.model_chunk_size_tokens, self.page_size_tokens)

    @property
    def checkpoint_grid_tokens(self) -> int:
        """SGLang's ``mamba_checkpoint_grid(page_size_tokens)``; P when the chunk is unknown."""
        return checkpoint_grid(self.cache_chunk_size_tokens, self.page_size_tokens)

    def track_grid_tokens(self, track_interval_tokens: int) -> int:
        """SGLang's ``mamba_track_grid`` for ``--mamba-track-interval``.

        Raises ValueError unless the track interval is a positive multiple of P, the rule
        ``validate_mamba_extra_buffer`` asserts.
        """
        _require_positive_int("track_interval_tokens", track_interval_tokens)
        if track_interval_tokens % self.page_size_tokens:
            raise ValueError(
                f"track_interval_tokens={track_interval_tokens}: must be a multiple of "
                f"page_size_tokens={self.page_size_tokens} (SGLang's "
                f"validate_mamba_extra_buffer)"
            )
        return track_grid(self.checkpoint_grid_tokens, track_interval_tokens)

    def is_checkpoint_position(self, position_tokens: int) -> bool:
        """True when a state after `position_tokens` tokens is on this grid (k*C, k >= 1)."""
        return position_tokens > 0 and position_tokens % self.interval_tokens == 0


def restorable_boundary(
    num_prompt_tokens: int,
    grid: CheckpointGrid,
    num_leading_kv_pages: int,
    pages_with_state: PagesWithState,
) -> int:
    """Deepest checkpoint position B (tokens) a prompt of `num_prompt_tokens` may resume from.

    B is the largest positive multiple of ``grid.interval_tokens`` (C) such that
    ``B <= num_prompt_tokens - 1``, every KV page of [0, B) is in the leading run of
    `num_leading_kv_pages` present pages, and page ``B // P - 1`` has an intact state.
    Returns 0 when no such position exists (recompute everything). With everything
    present, ``B == C * ((N - 1) // C)``.

    `pages_with_state` is queried only at candidate pages, deepest first, and not
    beyond the first hit, so a lazy predicate costs at most ``(N - 1) // C`` lookups.
    """
    _require_non_negative_int("num_prompt_tokens", num_prompt_tokens)
    _require_non_negative_int("num_leading_kv_pages", num_leading_kv_pages)
    has_state = _state_predicate(pages_with_state)
    deepest_allowed_tokens = min(
        num_prompt_tokens - 1, num_leading_kv_pages * grid.page_size_tokens
    )
    candidate = (max(deepest_allowed_tokens, 0) // grid.interval_tokens) * grid.interval_tokens
    while candidate > 0:
        if has_state(candidate // grid.page_size_tokens - 1):
            return candidate
        candidate -= grid.interval_tokens
    return 0


def suffix_to_recompute(num_prompt_tokens: int, boundary_tokens: int) -> range:
    """The token positions ``[B, N)`` that must be computed after restoring up to B.

    Raises ValueError unless ``0 <= B <= N - 1`` (or ``B == N == 0``): restoring the
    state for all N tokens would make the scheduler feed the last token through the
    recurrence a second time.
    """
    _require_non_negative_int("num_prompt_tokens", num_prompt_tokens)
    _require_non_negative_int("boundary_tokens", boundary_tokens)
    if boundary_tokens > max(num_prompt_tokens - 1, 0):
        raise ValueError(
            f"boundary_tokens={boundary_tokens}: must be at most num_prompt_tokens - 1 = "
            f"{num_prompt_tokens - 1}; at least the last prompt token is always recomputed"
        )
    return range(boundary_tokens, num_prompt_tokens)
