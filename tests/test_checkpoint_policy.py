"""Alignment policy for recurrent-state checkpoints: grids, restorable boundary, TRAILING_PAGES."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.checkpoints import (
    CheckpointGrid,
    cache_chunk_size,
    checkpoint_grid,
    restorable_boundary,
    suffix_to_recompute,
    track_grid,
)

from checkpoint import TrailingPagesHits, trailing_pages_hits

# --- reference implementations, written from the definitions and not from the code -----


def brute_force_boundary(
    num_prompt_tokens: int, grid: CheckpointGrid, num_leading_kv_pages: int, states: set[int]
) -> int:
    """Try every token position B in [1, N-1] and keep the deepest valid one."""
    page, interval = grid.page_size_tokens, grid.interval_tokens
    best = 0
    for boundary in range(1, num_prompt_tokens):
        on_grid = boundary % interval == 0
        kv_covered = all(index < num_leading_kv_pages for index in range(boundary // page))
        if on_grid and kv_covered and (boundary // page - 1) in states:
            best = boundary
    return best


def sglang_trailing_reference(
    num_leading_kv_pages: int, states: set[int], num_trailing_keys: int
) -> list[int]:
    """The loop of SGLang 0.5.23 ``HiCacheFile.batch_exists_v2`` for TRAILING_PAGES."""
    trailing = max(1, num_trailing_keys)
    return [
        prefix_len
        for prefix_len in range(1, num_leading_kv_pages + 1)
        if all(i in states for i in range(max(0, prefix_len - trailing), prefix_len))
    ]


# --- strategies ------------------------------------------------------------------------


@st.composite
def grids(draw: st.DrawFn) -> CheckpointGrid:
    page = draw(st.sampled_from([1, 2, 3, 4, 16, 64]))
    return CheckpointGrid(page, page * draw(st.integers(1, 8)))


@st.composite
def prompt_lengths(draw: st.DrawFn, grid: CheckpointGrid) -> int:
    """Anything up to ~10 intervals, biased towards k*C - 1, k*C and k*C + 1."""
    interval = grid.interval_tokens
    near_multiple = draw(st.integers(0, 10)) * interval + draw(st.sampled_from([-1, 0, 1]))
    anywhere = draw(st.integers(0, 10 * interval + 2))
    return max(0, draw(st.sampled_from([near_multiple, anywhere])))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, CheckpointGrid, int, set[int]]:
    grid = draw(grids())
    num_prompt_tokens = draw(prompt_lengths(grid))
    max_pages = num_prompt_tokens // grid.page_size_tokens + 2
    num_leading_kv_pages = draw(st.integers(0, max_pages))
    states = draw(st.sets(st.integers(0, max_pages)))
    return num_prompt_tokens, grid, num_leading_kv_pages, states


def everything_present(num_prompt_tokens: int, grid: CheckpointGrid) -> tuple[int, set[int]]:
    num_pages = num_prompt_tokens // grid.page_size_tokens + 1
    return num_pages, set(range(num_pages))


# --- restorable_boundary ---------------------------------------------------------------


@settings(max_examples=1500, deadline=None)
@given(scenarios())
def test_boundary_invariants_and_brute_force(scenario):
    num_prompt_tokens, grid, num_leading_kv_pages, states = scenario
    boundary = restorable_boundary(num_prompt_tokens, grid, num_leading_kv_pages, states)

    assert boundary <= max(num_prompt_tokens - 1, 0)
    assert boundary % grid.interval_tokens == 0
    assert boundary // grid.page_size_tokens <= num_leading_kv_pages  # pages [0, B/P) present
    if boundary:
        assert boundary // grid.page_size_tokens - 1 in states  # the state at B
    assert boundary == brute_force_boundary(num_prompt_tokens, grid, num_leading_kv_pages, states)


@settings(max_examples=800, deadline=None)
@given(scenarios())
def test_boundary_is_maximal(scenario):
    num_prompt_tokens, grid, num_leading_kv_pages, states = scenario
    boundary = restorable_boundary(num_prompt_tokens, grid, num_leading_kv_pages, states)
    page, interval = grid.page_size_tokens, grid.interval_tokens
    for deeper in range(boundary + interval, num_prompt_tokens, interval):
        kv_ok = deeper // page <= num_leading_kv_pages
        assert not (kv_ok and deeper // page - 1 in states), f"{deeper} was also valid"


@settings(max_examples=800, deadline=None)
@given(st.data())
def test_boundary_with_everything_present_is_c_floor_n_minus_one_over_c(data):
    grid = data.draw(grids())
    num_prompt_tokens = data.draw(prompt_lengths(grid))
    num_pages, states = everything_present(num_prompt_tokens, grid)
    boundary = restorable_boundary(num_prompt_tokens, grid, num_pages, states)
    if num_prompt_tokens == 0:
        assert boundary == 0
    else:
        c = grid.interval_tokens
        assert boundary == c * ((num_prompt_tokens - 1) // c)
    assert suffix_to_recompute(num_prompt_tokens, boundary) == range(boundary, num_prompt_tokens)


@pytest.mark.parametrize("k", [1, 2, 3, 7])
@pytest.mark.parametrize("page, interval", [(1, 2), (4, 4), (16, 64), (64, 1792)])
def test_boundary_at_exact_multiples(k, page, interval):
    grid = CheckpointGrid(page, interval)
    for num_prompt_tokens, expected in [
        (k * interval - 1, (k - 1) * interval),
        (k * interval, (k - 1) * interval),  # a full-prompt hit at N is never used
        (k * interval + 1, k * interval),
    ]:
        num_pages, states = everything_present(num_prompt_tokens, grid)
        assert restorable_boundary(num_prompt_tokens, grid, num_pages, states) == expected


def test_boundary_with_interval_of_one_token():
    grid = CheckpointGrid(1, 1)
    for num_prompt_tokens in range(0, 6):
        num_pages, states = everything_present(num_prompt_tokens, grid)
        expected = max(num_prompt_tokens - 1, 0)
        assert restorable_boundary(num_prompt_tokens, grid, num_pages, states) == expected


def test_worked_example_from_docs():
    grid = CheckpointGrid(page_size_tokens=64, interval_tokens=1792, model_chunk_size_tokens=64)
    num_pages, states = everything_present(3584, grid)
    boundary = restorable_boundary(3584, grid, num_pages, states)
    assert boundary == 1792
    assert suffix_to_recompute(3584, boundary) == range(1792, 3584)
    # One token more and the second checkpoint becomes usable.
    assert restorable_boundary(3585, grid, num_pages + 1, states) == 3584


def test_boundary_falls_back_to_an_earlier_checkpoint_or_zero():
    grid = CheckpointGrid(4, 8)
    everything = set(range(100))
    assert restorable_boundary(33, grid, 8, everything) == 32
    assert restorable_boundary(33, grid, 8, everything - {7}) == 24  # state at 32 missing
    assert restorable_boundary(33, grid, 7, everything) == 24  # KV page 7 missing
    assert restorable_boundary(33, grid, 8, {1, 3}) == 16
    assert restorable_boundary(33, grid, 8, set()) == 0
    assert restorable_boundary(33, grid, 0, everything) == 0
    assert restorable_boundary(8, grid, 8, everything) == 0  # B = 8 would need N >= 9
    assert restorable_boundary(0, grid, 8, everything) == 0
    assert restorable_boundary(1, grid, 8, everything) == 0


def test_off_grid_states_are_ignored():
    grid = CheckpointGrid(4, 8)
    # States after 4, 12 and 20 tokens exist but are not multiples of C = 8.
    assert restorable_boundary(33, grid, 8, {0, 2, 4}) == 0


@settings(max_examples=500, deadline=None)
@given(scenarios())
def test_predicate_and_container_agree_and_lookups_are_bounded(scenario):
    num_prompt_tokens, grid, num_leading_kv_pages, states = scenario
    queried: list[int] = []

    def has_state(page_index: int) -> bool:
        queried.append(page_index)
        return page_index in states

    boundary = restorable_boundary(num_prompt_tokens, grid, num_leading_kv_pages, has_state)
    assert boundary == restorable_boundary(num_prompt_tokens, grid, num_leading_kv_pages, states)
    assert queried == sorted(queried, reverse=True)
    assert len(queried) <= max(num_prompt_tokens - 1, 0) // grid.interval_tokens
    assert all((q + 1) * grid.page_size_tokens % grid.interval_tokens == 0 for q in queried)


@settings(max_examples=500, deadline=None)
@given(scenarios(), st.sets(st.integers(0, 400)), st.integers(0, 50))
def test_boundary_is_monotone_in_what_is_present(scenario, more_states, more_pages):
    num_prompt_tokens, grid, num_leading_kv_pages, states = scenario
    before = restorable_boundary(num_prompt_tokens, grid, num_leading_kv_pages, states)
    after = restorable_boundary(
        num_prompt_tokens, grid, num_leading_kv_pages + more_pages, states | more_states
    )
    assert after >= before


@pytest.mark.parametrize(
    "args, message",
    [
        ((-1, 0, set()), "num_prompt_tokens=-1"),
        ((5, -1, set()), "num_leading_kv_pages=-1"),
        ((5.0, 1, set()), "num_prompt_tokens=5.0"),
        ((True, 1, set()), "num_prompt_tokens=True"),
    ],
)
def test_boundary_rejects_bad_counts(args, message):
    num_prompt_tokens, num_leading_kv_pages, states = args
    with pytest.raises(ValueError, match=message):
        restorable_boundary(num_prompt_tokens, CheckpointGrid(4, 8), num_leading_kv_pages, states)


@settings(max_examples=500, deadline=None)
@given(scenarios())
def test_boundary_from_page_capped_keys_is_the_same(scenario):
    """SGLang queries floor((N-1)/P) page keys; N' = len(keys) * P + 1 gives the same B."""
    num_prompt_tokens, grid, num_leading_kv_pages, states = scenario
    num_keys = max(num_prompt_tokens - 1, 0) // grid.page_size_tokens
    from_keys = restorable_boundary(
        num_keys * grid.page_size_tokens + 1, grid, num_leading_kv_pages, states
    )
    if num_prompt_tokens:
        assert from_keys == restorable_boundary(
            num_prompt_tokens, grid, num_leading_kv_pages, states
        )


def test_python_examples_in_checkpoints_doc_run():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "CHECKPOINTS.md"), encoding="utf-8") as doc:
        blocks = re.findall(r"```python\n(.*?)```", doc.read(), flags=re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/CHECKPOINTS.md", "exec"), {})


# --- suffix_to_recompute ---------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_suffix_to_recompute(num_prompt_tokens, boundary):
    if boundary <= max(num_prompt_tokens - 1, 0):
        suffix = suffix_to_recompute(num_prompt_tokens, boundary)
        assert suffix == range(boundary, num_prompt_tokens)
        assert len(suffix) >= 1 or num_prompt_tokens == 0
    else:
        with pytest.raises(ValueError, match="at most num_prompt_tokens - 1"):
            suffix_to_recompute(num_prompt_tokens, boundary)


def test_suffix_rejects_a_boundary_at_n():
    """Restoring the state for all N tokens is exactly the published double-apply bug."""
    with pytest.raises(ValueError, match="boundary_tokens=3584"):
        suffix_to_recompute(3584, 3584)
    with pytest.raises(ValueError, match="boundary_tokens=-1"):
        suffix_to_recompute(3584, -1)
    assert suffix_to_recompute(0, 0) == range(0)


# --- TRAILING_PAGES --------------------------------------------------------------------


@settings(max_examples=1500, deadline=None)
@given(st.integers(0, 40), st.sets(st.integers(0, 45)), st.integers(0, 6))
def test_trailing_pages_matches_sglang_loop(num_leading_kv_pages, states, num_trailing_keys):
    hits = trailing_pages_hits(num_leading_kv_pages, states, num_trailing_keys)
    expected = sglang_trailing_reference(num_leading_kv_pages, states, num_trailing_keys)
    assert hits == TrailingPagesHits(expected, expected[-1] if expected else 0)
    by_predicate = trailing_pages_hits(num_leading_kv_pages, states.__contains__, num_trailing_keys)
    assert by_predicate == hits


def test_trailing_pages_examples():
    # Mamba: one trailing key. Pages 1 and 3 carry a state.
    assert trailing_pages_hits(4, {1, 3}, 1) == TrailingPagesHits([2, 4], 4)
    # The tail is absent: fall back to a shorter prefix.
    assert trailing_pages_hits(4, {1}, 1) == TrailingPagesHits([2], 2)
    assert trailing_pages_hits(4, set(), 1) == TrailingPagesHits([], 0)
    assert trailing_pages_hits(0, {0, 1}, 1) == TrailingPagesHits([], 0)
    # Zero keys behaves like one, as in SGLang.
    assert trailing_pages_hits(4, {1, 3}, 0) == trailing_pages_hits(4, {1, 3}, 1)
    # A window of 2: a prefix of 1 page only needs page 0 (the window is clamped at 0).
    assert trailing_pages_hits(4, {0, 2, 3}, 2) == TrailingPagesHits([1, 4], 4)


def test_trailing_pages_filtered_to_the_grid_equals_the_boundary():
    grid = CheckpointGrid(4, 8)
    states = {1, 2, 3, 5, 6}
    hits = trailing_pages_hits(7, states, 1)
    on_grid = [p for p in hits.restorable_prefix_pages if grid.is_checkpoint_position(p * 4)]
    assert on_grid == [2, 4, 6]
    # A prompt whose capped page keys are exactly these 7 pages: N - 1 >= 28.
    assert restorable_boundary(29, grid, 7, states) == on_grid[-1] * 4


@pytest.fixture(scope="module")
def sglang_storage():
    return pytest.importorskip("sglang.srt.mem_cache.hicache_storage")


def hicache_file_exists_v2(storage, num_keys, num_kv_pages, states, num_trailing_keys):
    """Run SGLang's own HiCacheFile.batch_exists_v2 over files laid out on disk."""
    from bench.sglang_server import storage_config

    config = storage_config(model_name="checkpoint-test")
    with tempfile.TemporaryDirectory() as directory:
        backend = storage.HiCacheFile(config, file_path=directory)
        keys = [f"{index:064x}" for index in range(num_keys)]
        present = [backend._get_component_key(k) for k in keys[:num_kv_pages]]
        present += [
            backend._get_component_key(keys[i], storage.PoolName.MAMBA)
            for i in states
            if i < num_keys
        ]
        for name in present:
            open(os.path.join(directory, f"{name}.bin"), "wb").close()
        transfer = storage.PoolTransfer(
            name=storage.PoolName.MAMBA,
            keys=[f"placeholder{i}" for i in range(num_trailing_keys)],
            hit_policy=storage.PoolHitPolicy.TRAILING_PAGES,
        )
        return backend.batch_exists_v2(keys, [transfer])


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 12), st.data())
def test_trailing_pages_matches_real_hicache_file(sglang_storage, num_keys, data):
    """Cross-check against SGLang's HiCacheFile itself (skipped when SGLang is absent)."""
    num_kv_pages = data.draw(st.integers(0, num_keys))
    states = data.draw(st.sets(st.integers(0, max(num_keys - 1, 0))))
    num_trailing_keys = data.draw(st.integers(0, 3))
    result = hicache_file_exists_v2(
        sglang_storage, num_keys, num_kv_pages, states, num_trailing_keys
    )
    hits = trailing_pages_hits(num_kv_pages, states, num_trailing_keys)
    assert result.restorable_prefix_pages == hits.restorable_prefix_pages
    assert result.kv_hit_pages == hits.deepest_prefix_pages
    mamba_hit = result.extra_pool_hit_pages.get(sglang_storage.PoolName.MAMBA, 0)
    assert mamba_hit == hits.deepest_prefix_pages


# --- grids -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, fragments",
    [
        (dict(page_size_tokens=64, interval_tokens=100), ["interval_tokens=100", "64"]),
        (dict(page_size_tokens=64, interval_tokens=32), ["interval_tokens=32", "multiple"]),
        (dict(page_size_tokens=0, interval_tokens=64), ["page_size_tokens=0", "positive"]),
        (dict(page_size_tokens=-4, interval_tokens=8), ["page_size_tokens=-4"]),
        (dict(page_size_tokens=64, interval_tokens=0), ["interval_tokens=0", "positive"]),
        (dict(page_size_tokens=64, interval_tokens=-64), ["interval_tokens=-64"]),
        (dict(page_size_tokens=64, interval_tokens=64.0), ["interval_tokens=64.0"]),
        (dict(page_size_tokens=True, interval_tokens=1), ["page_size_tokens=True"]),
        (
            dict(page_size_tokens=64, interval_tokens=192, model_chunk_size_tokens=256),
            ["interval_tokens=192", "mamba_checkpoint_grid=256"],
        ),
        (
            dict(page_size_tokens=64, interval_tokens=192, model_chunk_size_tokens=48),
            ["model_chunk_size_tokens=48", "page_size_tokens=64", "divide"],
        ),
        (
            dict(page_size_tokens=64, interval_tokens=64, model_chunk_size_tokens=0),
            ["model_chunk_size_tokens=0", "positive"],
        ),
    ],
)
def test_grid_validation_names_parameter_value_and_rule(kwargs, fragments):
    with pytest.raises(ValueError) as raised:
        CheckpointGrid(**kwargs)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_grid_is_frozen():
    grid = CheckpointGrid(64, 1792)
    with pytest.raises(AttributeError):
        grid.interval_tokens = 64  # type: ignore[misc]


@pytest.mark.parametrize(
    "page, chunk, track_interval, cache_chunk, checkpoint, track",
    [
        (64, 64, 256, 64, 64, 256),  # SGLang's documented launch line defaults
        (64, 256, 128, 256, 256, 256),
        (16, 64, 48, 64, 64, 192),
        (128, 64, 128, 128, 128, 128),
        (1, 64, 256, 64, 64, 256),
        (64, None, 192, 64, 64, 192),  # chunk unknown: only page alignment is known
    ],
)
def test_grid_helpers_mirror_sglang(page, chunk, track_interval, cache_chunk, checkpoint, track):
    grid = CheckpointGrid(page, checkpoint, chunk)
    assert grid.cache_chunk_size_tokens == cache_chunk
    assert grid.checkpoint_grid_tokens == checkpoint
    assert grid.track_grid_tokens(track_interval) == track
    if chunk is not None:
        assert cache_chunk_size(chunk, page) == cache_chunk
    assert checkpoint_grid(cache_chunk, page) == checkpoint
    assert track_grid(checkpoint, track_interval) == track


def test_track_interval_must_be_a_multiple_of_the_page():
    grid = CheckpointGrid(64, 256, 64)
    with pytest.raises(ValueError, match="track_interval_tokens=100.*page_size_tokens=64"):
        grid.track_grid_tokens(100)
    with pytest.raises(ValueError, match="track_interval_tokens=0"):
        grid.track_grid_tokens(0)


@pytest.mark.parametrize(
    "function, args, message",
    [
        (cache_chunk_size, (0, 64), "model_chunk_size_tokens=0"),
        (cache_chunk_size, (48, 64), "divide"),
        (checkpoint_grid, (64, 0), "tree_page_tokens=0"),
        (track_grid, (64, -1), "track_interval_tokens=-1"),
    ],
)
def test_grid_functions_validate(function, args, message):
    with pytest.raises(ValueError, match=message):
        function(*args)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 10), st.integers(0, 10), st.integers(1, 8))
def test_checkpoint_grid_is_the_larger_of_chunk_and_page(page_log2, chunk_log2, track_pages):
    """Because SGLang requires chunk and page to divide one another, lcm == max."""
    page, chunk = 2**page_log2, 2**chunk_log2
    grid_tokens = checkpoint_grid(cache_chunk_size(chunk, page), page)
    assert grid_tokens == max(chunk, page)
    assert grid_tokens % page == 0 and grid_tokens % chunk == 0
    grid = CheckpointGrid(page, grid_tokens, chunk)
    track = grid.track_grid_tokens(track_pages * page)
    assert track % grid_tokens == 0 and track % (track_pages * page) == 0
    assert CheckpointGrid(page, track, chunk).interval_tokens == track


def test_dcp_widened_tree_page_changes_the_checkpoint_grid():
    # SGLang passes the radix tree's page, which DCP can widen past the cache chunk.
    assert checkpoint_grid(cache_chunk_size(64, 64), 192) == 192
    assert checkpoint_grid(256, 192) == 768


def test_is_checkpoint_position():
    grid = CheckpointGrid(64, 1792)
    assert [grid.is_checkpoint_position(p) for p in (0, 64, 1792, 3584, 3583)] == [
        False,
        False,
        True,
        True,
        False,
    ]
    assert grid.pages_per_interval == 28


# --- purity ----------------------------------------------------------------------------


def test_importing_checkpoint_imports_neither_torch_nor_sglang():
    script = textwrap.dedent(
        """
        import sys
        for blocked in ("torch", "sglang", "numpy"):
            sys.modules[blocked] = None  # any import of them now raises ImportError
        import checkpoint, checkpoint.policy, checkpoint.hits
        leaked = [m for m in sys.modules if m.split(".")[0] in ("torch", "sglang", "numpy")
                  and sys.modules[m] is not None]
        assert not leaked, leaked
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
