"""checkpoint/prefill.py, the checkpoint arithmetic `galahad warm` and `ready` use, held to the
tests' oracle of SGLang's grids and checkpoint rule (tests/support/checkpoints.py): the grid is
SGLang's, the strict-prefix bound is the oracle's restorable boundary with every state present,
and every prefill plan leaves a state exactly where the prompts that reuse a document resume."""

from __future__ import annotations

import pytest
from support.checkpoints import (
    DEFAULT_MODEL_CHUNK_SIZE_TOKENS,
    CheckpointGrid,
    cache_chunk_size,
    checkpoint_grid,
    restorable_boundary,
)

from checkpoint.prefill import (
    MAMBA_CHUNK_TOKENS,
    checkpoint_interval,
    deepest_checkpoint,
    grid_floor,
    prefill_plan,
    state_pages,
    strict_prefix_bound,
)

PAGE_SIZES = [1, 4, 16, 64, 128, 256]


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_checkpoint_interval_is_sglangs_grid(page_size):
    assert MAMBA_CHUNK_TOKENS == DEFAULT_MODEL_CHUNK_SIZE_TOKENS
    chunk = cache_chunk_size(DEFAULT_MODEL_CHUNK_SIZE_TOKENS, page_size)
    assert checkpoint_interval(page_size) == checkpoint_grid(chunk, page_size)


@pytest.mark.parametrize("page_size", [4, 16, 64])
def test_strict_prefix_bound_is_the_oracles_boundary_with_everything_present(page_size):
    interval = checkpoint_interval(page_size)
    grid = CheckpointGrid(page_size_tokens=page_size, interval_tokens=interval)
    for length in range(0, 5 * interval):
        everything = restorable_boundary(length, grid, length // page_size, lambda page: True)
        assert strict_prefix_bound(length, interval) == everything, length


@pytest.mark.parametrize(
    "length,plan",
    [(63, [63]), (64, [64]), (65, [65]), (128, [64, 128]), (163, [163]), (192, [128, 192])],
)
def test_prefill_plan_puts_checkpoints_where_prompts_need_them(length, plan):
    assert prefill_plan(length, 64) == plan


@pytest.mark.parametrize("page_size", [4, 16, 64])
def test_every_plan_leaves_what_the_document_and_its_continuations_restore(page_size):
    """With the states a plan leaves (and every KV page), the document alone restores the
    strict-prefix bound and a prompt that continues it restores C*floor(D/C), by the oracle."""
    interval = checkpoint_interval(page_size)
    grid = CheckpointGrid(page_size_tokens=page_size, interval_tokens=interval)
    for length in range(1, 4 * interval + 3):
        states = set(state_pages(prefill_plan(length, interval), interval, page_size))
        pages = grid_floor(length, interval) // page_size
        alone = restorable_boundary(length, grid, pages, states)
        continued = restorable_boundary(length + 1, grid, pages, states)
        assert alone == strict_prefix_bound(length, interval), length
        assert continued == grid_floor(length, interval), length


def test_prefill_plan_checkpoint_every():
    assert prefill_plan(300, 64, checkpoint_every=128) == [128, 256, 300]
    with pytest.raises(ValueError, match="multiple of the checkpoint grid C=64"):
        prefill_plan(300, 64, checkpoint_every=100)


def test_deepest_checkpoint():
    assert deepest_checkpoint([64, 128, 192], 150) == 128
    assert deepest_checkpoint([64], 63) == 0 and deepest_checkpoint([], 500) == 0
