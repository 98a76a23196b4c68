"""Records outlive the backend instance, and stay within their namespace.

A new GalahadStorage on the same root (a server restart) finds every record and reads the same
bytes. Any instance that differs in tenant, model fingerprint, model name, TP rank, host layout,
KV dtype or page size sees none of them on the same root, and clear() removes only the calling
instance's own records.
"""

from __future__ import annotations

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName
from support.records import chain_keys, record_files
from support.sglang_pools import (
    assert_pages_equal,
    mamba_pool,
    mha_pool,
    mla_pool,
    page_bytes,
    slots_of,
    transfer,
)

TRAILING = PoolHitPolicy.TRAILING_PAGES


def test_records_survive_a_new_instance(galahad):
    kv, states = mha_pool("page_head", torch.float16), mamba_pool()
    keys = chain_keys(5, "restart")
    first = galahad(kv, {PoolName.MAMBA: states})
    assert first.batch_set_v1(keys[:3], slots_of([0, 1, 2], 4)) == [True] * 3
    assert first.batch_set(keys[3:], [kv.get_data_page(12), kv.get_data_page(16)]) is True
    assert first.batch_set_v2([transfer(PoolName.MAMBA, keys[4:], [4])]) == {"mamba": [True]}
    first.close()

    # a restarted server: new host pools (other contents), a new backend on the same root
    kv2, states2 = mha_pool("page_head", torch.float16, seed=11), mamba_pool(seed=12)
    second = galahad(kv2, {PoolName.MAMBA: states2})
    assert second.batch_exists(keys) == 5
    result = second.batch_exists_v2(keys, [transfer(PoolName.MAMBA, ["tail"], policy=TRAILING)])
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (5, [5])
    assert second.batch_get_v1(keys, slots_of([8, 9, 10, 11, 12], 4)) == [True] * 5
    assert_pages_equal(kv, [0, 1, 2, 3, 4], [8, 9, 10, 11, 12], other_pool=kv2)
    assert second.batch_get_v2([transfer(PoolName.MAMBA, keys[4:], [7])]) == {"mamba": [True]}
    assert torch.equal(page_bytes(states, 4), page_bytes(states2, 7))


OTHERS = {
    "tenant": {"tenant": "someone-else"},
    "fingerprint": {"fingerprint": "test-fingerprint-2"},
    "model_name": {"config": {"model_name": "org/other-model"}},
    "tp_rank": {"config": {"tp_rank": 1, "tp_size": 2}},
    "tp_size": {"config": {"tp_size": 2}},
}
OTHER_POOLS = {
    "layout": lambda: mha_pool("layer_first"),
    "dtype": lambda: mha_pool("page_first", torch.float16),  # same page bytes as bf16
    "page_size": lambda: mha_pool("page_first", page_size=8),
    "heads": lambda: mha_pool("page_first", heads=1, head_dim=16),  # same page bytes too
}


@pytest.mark.parametrize("difference", list(OTHERS) + list(OTHER_POOLS))
def test_other_instances_see_nothing_and_clear_only_their_own(galahad, difference):
    kv, states = mha_pool("page_first", torch.bfloat16), mamba_pool()
    keys = chain_keys(4, "isolation")
    mine = galahad(kv, {PoolName.MAMBA: states})
    assert mine.batch_set_v1(keys, slots_of([0, 1, 2, 3], 4)) == [True] * 4
    assert mine.batch_set_v2([transfer(PoolName.MAMBA, keys[3:], [3])]) == {"mamba": [True]}

    other_kv = OTHER_POOLS[difference]() if difference in OTHER_POOLS else mha_pool(seed=5)
    other = galahad(other_kv, {PoolName.MAMBA: mamba_pool(seed=6)}, **OTHERS.get(difference, {}))
    ps = other_kv.page_size
    assert other.batch_exists(keys) == 0
    assert not any(other.exists(key) for key in keys)
    result = other.batch_exists_v2(keys, [transfer(PoolName.MAMBA, ["tail"], policy=TRAILING)])
    assert (result.kv_hit_pages, result.extra_pool_hit_pages) == (0, {})
    assert other.batch_get_v1(keys, slots_of([4, 5, 6, 7], ps)) == [False] * 4
    assert other.batch_get(keys, [other_kv.get_dummy_flat_data_page() for _ in keys]) == [None] * 4
    assert other.batch_get_v2([transfer(PoolName.MAMBA, keys[3:], [9])]) == {"mamba": [False]}

    # the other instance writes the same keys, then clears: mine are untouched
    assert other.batch_set_v1(keys, slots_of([4, 5, 6, 7], ps)) == [True] * 4
    other.clear()
    assert other.batch_exists(keys) == 0
    assert mine.batch_exists(keys) == 4
    assert mine.batch_get_v1(keys, slots_of([8, 9, 10, 11], 4)) == [True] * 4
    assert_pages_equal(kv, [0, 1, 2, 3], [8, 9, 10, 11])
    assert mine.batch_get_v2([transfer(PoolName.MAMBA, keys[3:], [9])]) == {"mamba": [True]}

    mine.clear()
    assert mine.batch_exists(keys) == 0 and record_files(mine.store.root) == []


def test_states_belong_to_the_kv_namespace_they_were_saved_with(galahad):
    """Regression: states were namespaced by the Mamba pool alone, so a server whose KV pool
    differs (here bf16 -> fp16 KV, which changes the computed states) found the old server's
    state, kept it when saving its own (an existing record is never rewritten) and restored it
    next to its own KV pages. States now carry the KV namespace."""
    keys = chain_keys(2, "kv-tied")
    bf16_states = mamba_pool(seed=1)
    bf16 = galahad(mha_pool(dtype=torch.bfloat16), {PoolName.MAMBA: bf16_states})
    assert bf16.batch_set_v1(keys, slots_of([0, 1], 4)) == [True, True]
    assert bf16.batch_set_v2([transfer(PoolName.MAMBA, keys[1:], [1])]) == {"mamba": [True]}

    fp16_kv, fp16_states = mha_pool(dtype=torch.float16, seed=2), mamba_pool(seed=3)
    fp16 = galahad(fp16_kv, {PoolName.MAMBA: fp16_states})
    assert fp16.batch_get_v2([transfer(PoolName.MAMBA, keys[1:], [5])]) == {"mamba": [False]}
    assert fp16.batch_set_v1(keys, slots_of([0, 1], 4)) == [True, True]
    assert fp16.batch_set_v2([transfer(PoolName.MAMBA, keys[1:], [1])]) == {"mamba": [True]}
    tail = transfer(PoolName.MAMBA, ["tail"], policy=TRAILING)
    assert fp16.batch_exists_v2(keys, [tail]).restorable_prefix_pages == [2]
    assert fp16.batch_get_v2([transfer(PoolName.MAMBA, keys[1:], [5])]) == {"mamba": [True]}
    assert torch.equal(page_bytes(fp16_states, 5), page_bytes(fp16_states, 1))
    assert not torch.equal(page_bytes(fp16_states, 5), page_bytes(bf16_states, 1))


def test_mla_kv_is_shared_across_tp_ranks_but_states_are_not(galahad):
    """MLA KV is replicated over TP ranks (rank 0 writes, every rank reads); recurrent state is
    each rank's own shard even for MLA models."""
    kv, states = mla_pool("page_first"), mamba_pool()
    keys = chain_keys(2, "mla")
    rank0 = galahad(kv, {PoolName.MAMBA: states}, config={"is_mla_model": True, "tp_size": 2})
    assert rank0.batch_set_v1(keys, slots_of([0, 1], 4)) == [True, True]
    assert rank0.batch_set_v2([transfer(PoolName.MAMBA, keys[1:], [1])]) == {"mamba": [True]}
    rank1_config = {"is_mla_model": True, "tp_size": 2, "tp_rank": 1}
    rank1 = galahad(kv, {PoolName.MAMBA: mamba_pool(seed=4)}, config=rank1_config)
    assert rank1.batch_exists(keys) == 2
    assert rank1.batch_get_v1(keys, slots_of([5, 6], 4)) == [True, True]
    assert_pages_equal(kv, [0, 1], [5, 6])
    result = rank1.batch_exists_v2(keys, [transfer(PoolName.MAMBA, ["tail"], policy=TRAILING)])
    assert (result.kv_hit_pages, result.extra_pool_hit_pages) == (0, {"kv": 2})


def test_fp8_pools_outside_a_server_are_refused_loudly(galahad):
    """Host pools keep fp8 KV as uint8, so e4m3 and e5m2 look alike; outside a server the
    KV dtype cannot be read from SGLang's arguments, and binding such a pool is a config
    error at start rather than a namespace that cannot tell the two formats apart."""
    from hicache_galahad.errors import ConfigError

    with pytest.raises(ConfigError, match="kv-cache-dtype"):
        galahad(mha_pool(dtype=torch.float8_e4m3fn), as_server=False)


def test_fp8_formats_are_isolated_inside_a_server(galahad, monkeypatch):
    """In a scheduler process SGLang publishes its server arguments; the backend puts the
    KV cache dtype into every namespace, which tells the two fp8 formats apart."""
    import types

    from hicache_galahad.serving import binding

    keys = chain_keys(1, "fp8-server")
    monkeypatch.setattr(
        binding, "server_args", lambda: types.SimpleNamespace(kv_cache_dtype="fp8_e4m3")
    )
    e4m3 = galahad(mha_pool(dtype=torch.float8_e4m3fn))
    assert e4m3.batch_set_v1(keys, slots_of([0], 4)) == [True]
    assert galahad(mha_pool(dtype=torch.float8_e4m3fn)).batch_exists(keys) == 1
    monkeypatch.setattr(
        binding, "server_args", lambda: types.SimpleNamespace(kv_cache_dtype="fp8_e5m2")
    )
    assert galahad(mha_pool(dtype=torch.float8_e5m2)).batch_exists(keys) == 0
