"""Real SGLang 0.5.23 host pools on CPU, and storage backends loaded the way SGLang loads them.

Shared by tests/test_adapter_*.py (their `galahad` fixture is in tests/conftest.py, records on
disk and page keys in tests/records.py) and tests/hybrid_models.py. Everything here is SGLang's
own code: device pools built on "cpu" supply the buffer descriptions, host pools are built with
pin_memory=False (pinning needs a CUDA driver), and backends come out of
`StorageBackendFactory.create_backend`, exactly as the cache controller gets them (with its
failure injector when the test environment variables are set). Host pool buffers are filled
with random bytes (NaN patterns included), so every comparison is of bytes: `torch.equal` on
uint8 views.
"""

from __future__ import annotations

import contextlib

import torch
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from bench.sglang_server import galahad_config
from bench.sglang_server import storage_config as _storage_config

PAGE_SIZE = 4
MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
# MLATokenToKVPoolHost.get_data_page supports these three (page_unified and
# page_first_kv_split have no flat-page path in 0.5.23).
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
# MambaPoolHost asserts a page-first layout.
MAMBA_LAYOUTS = ("page_first", "page_first_direct")
KV_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8": torch.float8_e4m3fn,  # the pools store it as uint8
}

FINGERPRINT = "test-fingerprint-1"
MODEL_NAME = "org/tiny-model"


# ----------------------------------------------------------------------------- host pools


def fill_random(pool, seed: int) -> None:
    """Random bytes in every buffer of the pool (deterministic per seed)."""
    generator = torch.Generator().manual_seed(seed)
    for buffer in pool_buffers(pool):
        raw = buffer.view(torch.uint8).reshape(-1)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))


def pool_buffers(pool) -> list[torch.Tensor]:
    if isinstance(pool, MambaPoolHost):
        return [pool.temporal_buffer, *pool.conv_buffer, *pool.slot_state_buffers]
    return [pool.kv_buffer]


def mha_pool(
    layout: str = "page_first",
    dtype: torch.dtype = torch.bfloat16,
    *,
    page_size: int = PAGE_SIZE,
    tokens: int = 32,
    heads: int = 2,
    head_dim: int = 8,
    layers: int = 2,
    ratio: float = 2.0,
    seed: int | None = 0,
) -> MHATokenToKVPoolHost:
    """An MHA host pool of (tokens * ratio / page_size + 1) pages, filled with random bytes
    (with seed None, left as SGLang allocates it)."""
    device = MHATokenToKVPool(
        tokens, page_size, dtype, heads, head_dim, layers, "cpu", False, start_layer=0,
        end_layer=layers - 1,
    )  # fmt: skip
    host = MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        ratio,
        0,
        page_size,
        layout,
        pin_memory=False,
        device_capacity_tokens=device.size,
        start_layer=device.start_layer,
        end_layer=device.end_layer,
    )
    if seed is not None:
        fill_random(host, seed)
    return host


def mla_pool(
    layout: str = "page_first",
    dtype: torch.dtype = torch.bfloat16,
    *,
    page_size: int = PAGE_SIZE,
    tokens: int = 32,
    kv_lora_rank: int = 32,
    rope_dim: int = 16,
    layers: int = 2,
    ratio: float = 2.0,
    seed: int = 0,
) -> MLATokenToKVPoolHost:
    device = MLATokenToKVPool(
        tokens, page_size, dtype, kv_lora_rank, rope_dim, layers, "cpu", False, 0, layers - 1
    )
    host = MLATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        ratio,
        0,
        page_size,
        layout,
        pin_memory=False,
        device_capacity_tokens=device.size,
        start_layer=0,
        end_layer=layers - 1,
        target_layer_num=layers,
    )
    fill_random(host, seed)
    return host


def mamba_pool(
    layout: str = "page_first",
    *,
    conv_states: int = 1,
    conv_dtype: torch.dtype = torch.bfloat16,
    side_state: bool = False,
    layers: int = 2,
    slots: int = 8,
    ratio: float = 2.0,
    seed: int = 0,
) -> MambaPoolHost:
    """A Mamba host pool (page size 1) from a MambaStateBufferInfo of plain tensors: an fp32
    temporal state, `conv_states` conv states (they must share a dtype) and, with
    `side_state`, an int16 per-slot side state (a third element size in one page)."""
    conv = tuple(
        torch.zeros(layers, slots, 3, 16 - 8 * index, dtype=conv_dtype)
        for index in range(conv_states)
    )
    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, 4, 8, dtype=torch.float32),
        conv=conv,
        extra_checkpoint_buffers=(torch.zeros(slots, 5, dtype=torch.int16),) if side_state else (),
    )
    host = MambaPoolHost(info, ratio, 0, device_capacity=slots, pin_memory=False, layout=layout)
    fill_random(host, seed)
    return host


def page_bytes(pool, slot: int) -> torch.Tensor:
    """A copy of the flat page SGLang would write for the page starting at token slot `slot`."""
    return pool.get_data_page(slot, flat=True).contiguous().view(torch.uint8).clone()


def slots_of(pages, page_size: int) -> torch.Tensor:
    """host_indices as the controller passes them: every token slot of the given pages."""
    return torch.tensor(
        [page * page_size + offset for page in pages for offset in range(page_size)],
        dtype=torch.int64,
    )


def assert_pages_equal(pool, src_pages, dst_pages, other_pool=None) -> None:
    """The pages at dst_pages (in other_pool, default pool) hold src_pages' bytes exactly."""
    other_pool = pool if other_pool is None else other_pool
    for src, dst in zip(src_pages, dst_pages, strict=True):
        expected = page_bytes(pool, src * pool.page_size)
        actual = page_bytes(other_pool, dst * other_pool.page_size)
        assert torch.equal(expected, actual), f"page {src} -> {dst}: bytes differ"


# ----------------------------------------------------------------------------- backends


def storage_config(
    extra_config: dict | None,
    *,
    model_name: str | None = MODEL_NAME,
    tp_rank: int = 0,
    tp_size: int = 1,
    is_mla_model: bool = False,
    metrics: bool = False,
    page_first: bool = True,
) -> HiCacheStorageConfig:
    """bench/sglang_server.py's builder, with this module's model name by default."""
    return _storage_config(
        extra_config,
        model_name=model_name,
        tp_rank=tp_rank,
        tp_size=tp_size,
        is_mla_model=is_mla_model,
        metrics=metrics,
        page_first=page_first,
    )


def galahad_extra(root, fingerprint: str | None = FINGERPRINT, **options) -> dict:
    if fingerprint is not None:
        options = {"model_fingerprint": fingerprint, **options}
    return galahad_config(root, **options)


def register(backend, kv_pool=None, pools: dict | None = None) -> None:
    """Registers pools as SGLang does: the KV anchor pool through register_mem_pool_host, and
    for hybrid models every pool of the group (KV included) through register_mem_host_pool_v2."""
    if kv_pool is not None:
        backend.register_mem_pool_host(kv_pool)
    if pools:
        if kv_pool is not None:
            backend.register_mem_host_pool_v2(kv_pool, PoolName.KV)
        for name, pool in pools.items():
            backend.register_mem_host_pool_v2(pool, name)


def create_galahad(
    root,
    kv_pool=None,
    pools: dict | None = None,
    *,
    fingerprint: str | None = FINGERPRINT,
    config: dict | None = None,
    as_server: bool = True,
    **options,
):
    """GalahadStorage through StorageBackendFactory's "dynamic" loader, pools registered.
    `config` holds HiCacheStorageConfig fields (tp_rank, model_name, ...); `options` go into
    the extra config."""
    storage_cfg = storage_config(galahad_extra(root, fingerprint, **options), **(config or {}))
    with _fp8_server_args(kv_pool if as_server else None):
        backend = StorageBackendFactory.create_backend("dynamic", storage_cfg, kv_pool)
        register(backend, kv_pool, pools)
    return backend


@contextlib.contextmanager
def _fp8_server_args(kv_pool):
    """Host pools keep fp8 KV as uint8; only a server's --kv-cache-dtype tells the backend
    which fp8 format it holds. For an fp8 pool built here (e4m3), stand in for the server's
    arguments the way a scheduler process publishes them."""
    import types
    from unittest import mock

    from hicache_galahad.serving import binding

    if kv_pool is None or kv_pool.dtype != torch.uint8 or binding.server_args() is not None:
        yield
        return

    args = types.SimpleNamespace(
        kv_cache_dtype="fp8_e4m3", mamba_ssm_dtype=None, dtype="bfloat16", model_path=None
    )
    with mock.patch("hicache_galahad.serving.binding.server_args", lambda: args):
        yield


def create_hicache_file(directory, kv_pool=None, pools: dict | None = None, **config):
    """SGLang's reference HiCacheFile through the factory ("file"), pools registered."""
    storage_cfg = storage_config({"file_storage_path": str(directory)}, **config)
    backend = StorageBackendFactory.create_backend("file", storage_cfg, kv_pool)
    register(backend, kv_pool, pools)
    return backend


def transfer(
    name,
    keys,
    pages=None,
    *,
    page_size: int = 1,
    policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES,
) -> PoolTransfer:
    return PoolTransfer(
        name=name,
        keys=list(keys),
        host_indices=None if pages is None else slots_of(pages, page_size),
        hit_policy=policy,
    )


def normalized(result) -> tuple:
    """A PoolTransferResult as plain values (pool names as strings)."""
    return (
        result.kv_hit_pages,
        {str(name): pages for name, pages in result.extra_pool_hit_pages.items()},
        list(result.restorable_prefix_pages or []),
    )
