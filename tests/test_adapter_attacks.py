"""Regression tests for the attack pass on the SGLang-facing backend (issue 14), through
SGLang's own backend factory and real host pools."""

from __future__ import annotations

import itertools

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
from support.records import chain_keys
from support.sglang_pools import (
    create_galahad,
    mamba_pool,
    mha_pool,
    mla_pool,
    page_bytes,
    slots_of,
    transfer,
)

from hicache_galahad.errors import ConfigError

# ----------------------------------------------------------------------------- 9. host indices


@pytest.mark.parametrize(
    "indices",
    [
        lambda pool: torch.arange(-4, 0),  # negative
        lambda pool: torch.arange(pool.size, pool.size + 4),  # past the pool
        lambda pool: torch.arange(2, 6),  # not a page boundary
        lambda pool: torch.tensor([0, 1, 3, 2]),  # not one page's slots in order
        lambda pool: torch.arange(0, 8),  # two pages for one key
    ],
)
def test_bad_host_indices_are_refused_and_publish_nothing(galahad, indices):
    pool = mha_pool()
    backend = galahad(pool)
    keys = chain_keys(1, "bad-indices")
    assert backend.batch_set_v1(keys, indices(pool)) == [False]
    assert backend.batch_get_v1(keys, indices(pool)) == [False]
    bad = PoolTransfer(name=PoolName.KV, keys=keys, host_indices=indices(pool))
    assert backend.batch_set_v2([bad]) == {"kv": [False]}
    assert backend.exists(keys[0]) is False and backend.batch_exists(keys) == 0


def test_a_poisoned_key_is_replaced_by_a_correct_put(galahad):
    """A 0-byte record (what the old code published for bad indices) is never answered
    'already stored': the next correct put replaces it."""
    pool = mha_pool()
    backend = galahad(pool)
    keys = chain_keys(1, "poison")
    path = backend.store.layout.record_path(backend.binder.kv().namespace.dirname, keys[0])
    open(path, "wb").close()
    assert backend.batch_set_v1(keys, slots_of([3], 4)) == [True]
    assert backend.batch_get_v1(keys, slots_of([5], 4)) == [True]
    assert torch.equal(page_bytes(pool, 3 * 4), page_bytes(pool, 5 * 4))


# ----------------------------------------------------------------------------- 10. None


def test_none_arguments_are_misses_of_the_right_shape(galahad):
    backend = galahad(mha_pool(), {PoolName.MAMBA: mamba_pool()})
    assert backend.batch_get_v1(None, None) == []
    assert backend.batch_set_v1(None, None) == []
    assert backend.batch_get_v1(chain_keys(2), None) == [False, False]
    assert backend.batch_exists(None) == 0
    assert backend.batch_get(None) == []
    assert backend.batch_set(None, None) is False
    assert backend.batch_get_v2(None) == {}
    assert backend.batch_set_v2(None) == {}
    assert backend.batch_exists_v2(None).kv_hit_pages == 0
    broken = transfer(PoolName.KV, chain_keys(3))
    broken.keys = None
    assert backend.batch_get_v2([broken]) == {"kv": []}
    assert backend.stats().counter("adapter_errors") >= 1


# ----------------------------------------------------------------------------- 12. config


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_bytes": int("9" * 400)}, "max_bytes"),
        ({"max_bytes": 100}, "max_bytes"),  # below one page
        ({"encryption_key_file": "/tmp/k\0"}, "encryption_key_file"),
        ({"tenant": "lone \udc80 surrogate"}, "tenant"),
        ({"tenant": "new\nline"}, "tenant"),
    ],
)
def test_config_errors_at_start_name_the_key(tmp_path, options, named):
    with pytest.raises(ConfigError, match=named):
        create_galahad(tmp_path / "store", mha_pool(), **options)


def test_roots_that_cannot_hold_a_store_are_config_errors_naming_root(tmp_path):
    (tmp_path / "file").write_text("x")
    for root in (tmp_path / "file", "/tmp/a\0b"):
        with pytest.raises(ConfigError, match="root"):
            create_galahad(root, mha_pool())


# ----------------------------------------------------------------------------- 14. layouts

MHA_ORDER = {  # how each layout's host buffer holds logical KV[kv, layer, token, head, dim]
    "layer_first": lambda t, p, ps: t,
    "page_first": lambda t, p, ps: t.permute(0, 2, 1, 3, 4),
    "page_first_direct": lambda t, p, ps: t.reshape(2, t.shape[1], p, ps, *t.shape[3:]).permute(
        0, 2, 1, 3, 4, 5
    ),
    "page_head": lambda t, p, ps: t.reshape(2, t.shape[1], p, ps, *t.shape[3:]).permute(
        0, 2, 4, 3, 1, 5
    ),
}
MLA_ORDER = {  # logical KV[layer, token, 1, dim]
    "layer_first": lambda t, p, ps: t,
    "page_first": lambda t, p, ps: t.permute(1, 0, 2, 3),
    "page_first_direct": lambda t, p, ps: t.reshape(t.shape[0], p, ps, *t.shape[2:]).permute(
        1, 0, 2, 3, 4
    ),
}


def _mha_with(layout, logical):
    pool = mha_pool(layout, seed=None)
    pool.kv_buffer.copy_(MHA_ORDER[layout](logical, pool.size // pool.page_size, pool.page_size))
    return pool


def _mla_with(layout, logical):
    pool = mla_pool(layout)
    pool.kv_buffer.copy_(MLA_ORDER[layout](logical, pool.size // pool.page_size, pool.page_size))
    return pool


def _pools(kind):
    if kind == "mha":
        reference = mha_pool("layer_first", seed=None)
        logical = torch.randn(reference.kv_buffer.shape).to(reference.kv_buffer.dtype)
        return {layout: _mha_with(layout, logical) for layout in MHA_ORDER}
    reference = mla_pool("layer_first")
    logical = torch.randn(reference.kv_buffer.shape).to(reference.kv_buffer.dtype)
    return {layout: _mla_with(layout, logical) for layout in MLA_ORDER}


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_layouts_share_records_exactly_when_their_page_bytes_are_identical(tmp_path, kind):
    """For every pair of host layouts holding the same KV: if their flat pages are the same
    bytes, a page stored under one is a hit under the other, byte-exact; if not, never."""
    pools = _pools(kind)
    config = {"is_mla_model": kind == "mla"}
    keys = chain_keys(2, f"layouts-{kind}")
    for first, second in itertools.combinations(pools, 2):
        root = tmp_path / f"{first}-{second}"
        writer = create_galahad(root, pools[first], config=config)
        assert writer.batch_set_v1(keys, slots_of([1, 2], 4)) == [True, True]
        writer.close()
        same_bytes = all(
            torch.equal(page_bytes(pools[first], page * 4), page_bytes(pools[second], page * 4))
            for page in (1, 2)
        )
        target = pools[second]
        reader = create_galahad(root, target, config=config)
        before = page_bytes(target, 6 * 4)
        hits = reader.batch_get_v1(keys, slots_of([6, 7], 4))
        assert hits == [same_bytes] * 2, (first, second)
        if same_bytes:
            assert torch.equal(page_bytes(target, 6 * 4), page_bytes(target, 1 * 4))
        else:
            assert torch.equal(page_bytes(target, 6 * 4), before)
        reader.close()
    assert any(
        torch.equal(page_bytes(pools[a], 4), page_bytes(pools[b], 4))
        for a, b in itertools.combinations(pools, 2)
    ), "no pair of layouts shares bytes: the test would prove nothing"


def test_mamba_layouts_share_records(tmp_path):
    first, second = mamba_pool("page_first", seed=3), mamba_pool("page_first_direct", seed=3)
    assert torch.equal(page_bytes(first, 1), page_bytes(second, 1))
    keys = chain_keys(2, "mamba-layouts")
    mamba = PoolName.MAMBA
    writer = create_galahad(tmp_path / "s", mha_pool(), {mamba: first})
    assert writer.batch_set_v2([transfer(mamba, keys[:1], [1])]) == {str(mamba): [True]}
    writer.close()
    reader = create_galahad(tmp_path / "s", mha_pool(), {mamba: second})
    policy = PoolHitPolicy.ALL_PAGES
    assert reader.batch_get_v2([transfer(mamba, keys[:1], [4], policy=policy)]) == {
        str(mamba): [True]
    }
    assert torch.equal(page_bytes(second, 4), page_bytes(first, 1))
    reader.close()
