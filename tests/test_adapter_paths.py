"""GalahadStorage on real SGLang host pools: every I/O path, every pool, byte-exact.

The backend is loaded through StorageBackendFactory("dynamic") and driven as SGLang's cache
controller drives it: generic flat pages (batch_set of get_data_page, batch_get into dummy
pages then set_from_flat_data_page), zero-copy v1 (token-slot host_indices, page i starting at
host_indices[i * page_size]) and v2 PoolTransfers for the KV and Mamba pools. A record written
by any path must read back identically through every other, since its bytes are defined as
those of get_data_page(index, flat=True).
"""

from __future__ import annotations

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransferResult
from support.records import chain_keys, find_record
from support.sglang_pools import (
    KV_DTYPES,
    MAMBA_LAYOUTS,
    MHA_LAYOUTS,
    MLA_LAYOUTS,
    assert_pages_equal,
    mamba_pool,
    mha_pool,
    mla_pool,
    page_bytes,
    slots_of,
    transfer,
)

PATHS = ("generic", "single", "v1", "v2")
SRC_PAGES = [1, 2, 3]
DST_PAGES = [9, 10, 11]

KV_POOLS = {
    **{
        f"mha-{layout}-{name}": (lambda layout=layout, dtype=dtype: mha_pool(layout, dtype))
        for layout in MHA_LAYOUTS
        for name, dtype in KV_DTYPES.items()
    },
    **{
        f"mla-{layout}-bf16": (lambda layout=layout: mla_pool(layout, torch.bfloat16))
        for layout in MLA_LAYOUTS
    },
    "mla-page_first-fp8": lambda: mla_pool("page_first", torch.float8_e4m3fn),
    "mla-layer_first-fp32": lambda: mla_pool("layer_first", torch.float32),
}
MAMBA_POOLS = {
    **{f"{layout}-1conv": (lambda layout=layout: mamba_pool(layout)) for layout in MAMBA_LAYOUTS},
    **{
        f"{layout}-2conv-side": (
            lambda layout=layout: mamba_pool(
                layout, conv_states=2, conv_dtype=torch.float16, side_state=True
            )
        )
        for layout in MAMBA_LAYOUTS
    },
}


def write(path: str, backend, pool, keys, pages) -> None:
    """Writes host pages to storage the way the controller's page_set_func does."""
    page_size = pool.page_size
    host_indices = slots_of(pages, page_size)
    if path == "generic":
        values = [pool.get_data_page(host_indices[i * page_size]) for i in range(len(keys))]
        assert backend.batch_set(keys, values) is True
    elif path == "single":
        for key, page in zip(keys, pages, strict=True):
            assert backend.set(key, pool.get_data_page(page * page_size, flat=True)) is True
    elif path == "v1":
        assert backend.batch_set_v1(keys, host_indices) == [True] * len(keys)
    else:
        results = backend.batch_set_v2([transfer(PoolName.KV, keys, pages, page_size=page_size)])
        assert results == {"kv": [True] * len(keys)}


def read(path: str, backend, pool, keys, pages) -> list[bool]:
    """Reads storage into host pages the way the controller's prefetch does; per-key flags."""
    page_size = pool.page_size
    host_indices = slots_of(pages, page_size)
    if path in ("generic", "single"):
        dummies = [pool.get_dummy_flat_data_page() for _ in keys]
        if path == "generic":
            got = backend.batch_get(keys, dummies)
        else:
            got = [backend.get(key, dummy) for key, dummy in zip(keys, dummies, strict=True)]
        assert len(got) == len(keys)
        for index, page in enumerate(got):
            if page is not None:
                assert page is dummies[index]  # filled in place, as HiCacheFile does
                pool.set_from_flat_data_page(host_indices[index * page_size], page)
        return [page is not None for page in got]
    if path == "v1":
        return backend.batch_get_v1(keys, host_indices)
    results = backend.batch_get_v2([transfer(PoolName.KV, keys, pages, page_size=page_size)])
    assert list(results) == ["kv"]
    return results["kv"]


@pytest.mark.parametrize("pool_id", list(KV_POOLS))
def test_every_kv_path_reads_back_what_every_path_wrote(galahad, pool_id):
    pool = KV_POOLS[pool_id]()
    backend = galahad(pool, {}, config={"is_mla_model": pool_id.startswith("mla")})
    assert backend.binder.kv().layout.supported  # the zero-copy path is the one under test
    for writer in PATHS:
        keys = chain_keys(len(SRC_PAGES), f"{pool_id}/{writer}")
        write(writer, backend, pool, keys, SRC_PAGES)
        assert backend.batch_exists(keys) == len(keys)
        assert all(backend.exists(key) for key in keys)
        for reader in PATHS:
            for page in DST_PAGES:  # no stale copy of the right bytes from the last reader
                pool.set_from_flat_data_page(page * pool.page_size, pool.get_dummy_flat_data_page())
            assert read(reader, backend, pool, keys, DST_PAGES) == [True] * len(keys)
            assert_pages_equal(pool, SRC_PAGES, DST_PAGES)


@pytest.mark.parametrize(
    "pool_id", ["mha-page_first-bf16", "mha-page_head-fp8", "mla-page_first-bf16"]
)
def test_flat_page_fallback_and_zero_copy_share_records(galahad, pool_id):
    """A pool too small for the zero-copy page map is served through flat pages; records stay
    byte-identical between the two, both ways."""
    kind, layout, dtype = pool_id.split("-")
    build = mha_pool if kind == "mha" else mla_pool
    big = build(layout, KV_DTYPES[dtype])
    small = build(layout, KV_DTYPES[dtype], tokens=4, ratio=1.0)
    small_pages = small.size // small.page_size
    zero_copy, fallback = galahad(big), galahad(small)
    assert zero_copy.binder.kv().layout.supported and not fallback.binder.kv().layout.supported
    assert zero_copy.binder.kv().namespace == fallback.binder.kv().namespace

    keys = chain_keys(1, f"fallback/{pool_id}")
    assert fallback.batch_set_v1(keys, slots_of([0], small.page_size)) == [True]
    assert zero_copy.batch_get_v1(keys, slots_of([5], big.page_size)) == [True]
    assert torch.equal(page_bytes(small, 0), page_bytes(big, 5 * big.page_size))

    keys = chain_keys(1, f"zero-copy/{pool_id}")
    assert zero_copy.batch_set_v1(keys, slots_of([6], big.page_size)) == [True]
    assert fallback.batch_get_v1(keys, slots_of([small_pages - 1], small.page_size)) == [True]
    assert torch.equal(
        page_bytes(big, 6 * big.page_size), page_bytes(small, (small_pages - 1) * small.page_size)
    )


@pytest.mark.parametrize("pool_id", list(MAMBA_POOLS))
def test_mamba_states_round_trip_through_v2(galahad, pool_id):
    states = MAMBA_POOLS[pool_id]()
    kv = mha_pool("page_first")
    backend = galahad(kv, {PoolName.MAMBA: states})
    assert backend.binder.bindings["mamba"].layout.supported
    keys = chain_keys(len(SRC_PAGES), f"mamba/{pool_id}")
    mamba = PoolHitPolicy.TRAILING_PAGES
    results = backend.batch_set_v2([transfer(PoolName.MAMBA, keys, SRC_PAGES, policy=mamba)])
    assert results == {"mamba": [True, True, True]}
    results = backend.batch_get_v2([transfer(PoolName.MAMBA, keys, DST_PAGES, policy=mamba)])
    assert results == {"mamba": [True, True, True]}
    assert_pages_equal(states, SRC_PAGES, DST_PAGES)
    # A flat Mamba page is uint8: [temporal, conv_0.., side states], in that order.
    assert page_bytes(states, 1).numel() == states.size_per_token


def test_mamba_states_zero_copy_and_flat_page_fallback_agree(galahad):
    big = mamba_pool(conv_states=2, side_state=True)
    small = mamba_pool(conv_states=2, side_state=True, slots=1, ratio=1.0, seed=7)
    zero_copy = galahad(mha_pool(), {PoolName.MAMBA: big})
    fallback = galahad(mha_pool(), {PoolName.MAMBA: small})
    assert not fallback.binder.bindings["mamba"].layout.supported
    keys = chain_keys(2, "mamba-fallback")
    assert zero_copy.batch_set_v2([transfer(PoolName.MAMBA, keys[:1], [4])]) == {"mamba": [True]}
    assert fallback.batch_set_v2([transfer(PoolName.MAMBA, keys[1:], [0])]) == {"mamba": [True]}
    assert fallback.batch_get_v2([transfer(PoolName.MAMBA, keys[:1], [1])]) == {"mamba": [True]}
    assert zero_copy.batch_get_v2([transfer(PoolName.MAMBA, keys[1:], [5])]) == {"mamba": [True]}
    assert torch.equal(page_bytes(big, 4), page_bytes(small, 1))
    assert torch.equal(page_bytes(small, 0), page_bytes(big, 5))


def test_kv_and_mamba_in_one_v2_call(galahad):
    kv, states = mha_pool("page_first_direct"), mamba_pool("page_first_direct")
    backend = galahad(kv, {PoolName.MAMBA: states})
    keys = chain_keys(4, "hybrid")
    results = backend.batch_set_v2(
        [
            transfer(PoolName.KV, keys, [0, 1, 2, 3], page_size=kv.page_size),
            transfer(PoolName.MAMBA, keys[3:], [2], policy=PoolHitPolicy.TRAILING_PAGES),
        ]
    )
    assert results == {"kv": [True] * 4, "mamba": [True]}
    placeholder = transfer(
        PoolName.MAMBA, ["__placeholder__"], [6], policy=PoolHitPolicy.TRAILING_PAGES
    )
    result = backend.batch_exists_v2(keys, [placeholder])
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (4, [4])
    assert dict(result.extra_pool_hit_pages) == {"kv": 4, "mamba": 4}
    results = backend.batch_get_v2(
        [
            transfer(PoolName.KV, keys, [10, 11, 12, 13], page_size=kv.page_size),
            transfer(PoolName.MAMBA, keys[3:], [6], policy=PoolHitPolicy.TRAILING_PAGES),
        ]
    )
    assert results == {"kv": [True] * 4, "mamba": [True]}
    assert_pages_equal(kv, [0, 1, 2, 3], [10, 11, 12, 13])
    assert_pages_equal(states, [2], [6])


def test_partial_hits_give_one_flag_per_key(galahad):
    pool = mha_pool()
    backend = galahad(pool, {PoolName.MAMBA: mamba_pool()})
    keys = chain_keys(4, "partial")
    assert backend.batch_set_v1([keys[0], keys[2]], slots_of([0, 2], 4)) == [True, True]
    assert backend.batch_exists(keys) == 1
    assert [backend.exists(key) for key in keys] == [True, False, True, False]
    assert backend.batch_get_v1(keys, slots_of([4, 5, 6, 7], 4)) == [True, False, True, False]
    assert_pages_equal(pool, [0, 2], [4, 6])
    got = backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
    assert [page is not None for page in got] == [True, False, True, False]
    results = backend.batch_get_v2([transfer(PoolName.KV, keys, [4, 5, 6, 7], page_size=4)])
    assert results == {"kv": [True, False, True, False]}
    mamba = backend.batch_get_v2([transfer(PoolName.MAMBA, keys, [0, 1, 2, 3])])
    assert mamba == {"mamba": [False] * 4}


def test_get_without_target_returns_a_new_flat_page(galahad):
    pool = mha_pool("layer_first", torch.float16)
    backend = galahad(pool)
    keys = chain_keys(2, "no-target")
    assert backend.batch_set_v1(keys, slots_of([3, 4], 4)) == [True, True]
    page = backend.get(keys[0])
    assert page is not None and page.dtype == torch.float16
    assert torch.equal(page.view(torch.uint8), page_bytes(pool, 12))
    pages = backend.batch_get(keys)
    assert torch.equal(pages[1].view(torch.uint8), page_bytes(pool, 16))
    assert backend.get(chain_keys(1, "absent")[0]) is None


def test_empty_calls(galahad):
    backend = galahad(mha_pool(), {PoolName.MAMBA: mamba_pool()})
    empty = torch.empty(0, dtype=torch.int64)
    assert backend.batch_exists([]) == 0
    assert backend.batch_get_v1([], empty) == [] and backend.batch_set_v1([], empty) == []
    assert backend.batch_get([], []) == []
    assert backend.batch_get_v2([transfer(PoolName.KV, [], [])]) == {"kv": []}
    assert backend.batch_set_v2([]) == {}
    result = backend.batch_exists_v2([], [transfer(PoolName.MAMBA, ["x"])])
    assert (result.kv_hit_pages, result.extra_pool_hit_pages) == (0, {})
    assert result.restorable_prefix_pages == []


def test_misuse_is_a_miss_with_one_flag_per_key(galahad, tmp_path):
    pool = mha_pool()
    backend = galahad(pool, {PoolName.MAMBA: mamba_pool()})
    keys = chain_keys(3, "misuse")
    assert backend.batch_set_v1(keys, slots_of([0, 1, 2], 4)) == [True] * 3
    # host_indices that do not cover len(keys) pages of page_size tokens (HiCacheFile: same)
    assert backend.batch_get_v1(keys, slots_of([5, 6], 4)) == [False] * 3
    assert backend.batch_set_v1(keys, torch.arange(3)) == [False] * 3
    assert backend.batch_get_v1(keys, None) == [False] * 3
    results = backend.batch_get_v2([transfer(PoolName.KV, keys, [5, 6], page_size=4)])
    assert results == {"kv": [False] * 3}
    results = backend.batch_set_v2([transfer(PoolName.MAMBA, keys, None)])
    assert results == {"mamba": [False] * 3}
    # a pool that was never registered
    results = backend.batch_get_v2([transfer(PoolName.SWA, keys, [0, 1, 2])])
    assert results == {"swa": [False] * 3}
    # batch_set with a value missing, batch_get with fewer targets than keys
    assert backend.batch_set(keys, [pool.get_data_page(0)] * 2) is False
    assert backend.batch_get(keys, [pool.get_dummy_flat_data_page()]) == [None] * 3
    assert backend.set(keys[0], None) is False
    # a backend with no KV pool registered yet
    bare = galahad(root=tmp_path / "bare")
    assert bare.batch_exists(keys) == 0 and bare.exists(keys[0]) is False
    assert bare.batch_get_v1(keys, slots_of([0, 1, 2], 4)) == [False] * 3
    assert bare.batch_set_v1(keys, slots_of([0, 1, 2], 4)) == [False] * 3
    assert bare.get(keys[0], pool.get_dummy_flat_data_page()) is None
    assert bare.batch_exists_v2(keys) == PoolTransferResult(0, {}, [])
    # everything written above is intact
    assert backend.batch_get_v1(keys, slots_of([5, 6, 7], 4)) == [True] * 3
    assert_pages_equal(pool, [0, 1, 2], [5, 6, 7])


def test_wrong_size_flat_pages_are_refused_without_harming_records(galahad):
    """Regression: a flat page of the wrong size reached the store, which takes a size mismatch
    for a damaged record: get() quarantined the sound record, set() published an unreadable
    one. Now the adapter refuses such a page (a miss / False) before touching the store, and
    counts the refusal in adapter_errors, never in unexpected_errors (the exporter's "bugs
    caught": before, each refusal counted there)."""
    pool = mha_pool()
    backend = galahad(pool)
    keys = chain_keys(2, "wrong-size")
    assert backend.batch_set_v1(keys[:1], slots_of([0], 4)) == [True]
    before = backend.stats()
    short = torch.zeros(pool.get_dummy_flat_data_page().numel() - 1, dtype=pool.dtype)
    long_ = torch.zeros(pool.get_dummy_flat_data_page().numel() + 8, dtype=pool.dtype)
    assert backend.get(keys[0], short) is None
    assert backend.batch_get(keys[:1], [long_]) == [None]
    assert backend.exists(keys[0]) and backend.store.stats().counter("quarantined") == 0
    assert backend.set(keys[1], short) is False
    assert backend.batch_set(keys[1:], [long_]) is False
    assert find_record(backend.store.root, keys[1]) is None
    after = backend.stats()
    assert after.counter("adapter_errors") - before.counter("adapter_errors") == 4
    assert after.counter("unexpected_errors") == before.counter("unexpected_errors")
    assert backend.batch_get_v1(keys[:1], slots_of([3], 4)) == [True]
    assert_pages_equal(pool, [0], [3])


def test_store_exceptions_become_misses(galahad, monkeypatch):
    """Fault injection: whatever the store raises, SGLang gets misses of the right shape."""
    pool = mha_pool()
    backend = galahad(pool, {PoolName.MAMBA: mamba_pool()})
    keys = chain_keys(3, "faults")

    def explode(*args, **kwargs):
        raise OSError("injected")

    for name in ("get_many_into", "put_many", "get_into", "put", "contains", "leading_run"):
        monkeypatch.setattr(backend.store, name, explode)
    assert backend.batch_set_v1(keys, slots_of([0, 1, 2], 4)) == [False] * 3
    assert backend.batch_get_v1(keys, slots_of([0, 1, 2], 4)) == [False] * 3
    assert backend.batch_get(keys, [pool.get_dummy_flat_data_page()] * 3) == [None] * 3
    assert backend.batch_set(keys, [pool.get_data_page(0)] * 3) is False
    assert backend.get(keys[0], pool.get_dummy_flat_data_page()) is None
    assert backend.set(keys[0], pool.get_data_page(0)) is False
    assert backend.exists(keys[0]) is False and backend.batch_exists(keys) == 0
    both = [
        transfer(PoolName.KV, keys, [0, 1, 2], page_size=4),
        transfer(PoolName.MAMBA, keys[:1], [0]),
    ]
    assert backend.batch_set_v2(both) == {"kv": [False] * 3, "mamba": [False]}
    assert backend.batch_get_v2(both) == {"kv": [False] * 3, "mamba": [False]}
    assert backend.batch_exists_v2(keys, both[1:]) == PoolTransferResult(0, {}, [])
    assert backend.stats().counter("adapter_errors") > 0


def test_a_bug_in_the_zero_copy_map_falls_back_to_flat_pages_and_says_so(monkeypatch, caplog):
    """PageLayout turns zero copy off when a pool cannot be mapped; a failure that is not such
    a pool (a bug, injected here: a real one cannot be made on purpose) used to turn it off
    silently. Now it still falls back, and logs the failure with its traceback."""
    from hicache_galahad.serving import pages

    def broken(view):
        raise RuntimeError("injected bug")

    monkeypatch.setattr(pages, "_byte_runs", broken)
    with caplog.at_level("WARNING", logger="hicache_galahad.serving.pages"):
        layout = pages.PageLayout(mha_pool())
    assert layout.supported is False
    assert any(record.exc_info and "zero-copy" in record.getMessage() for record in caplog.records)
