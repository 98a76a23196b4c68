# =================================================================================================
# TEST HARNESS ONLY -- NEVER SHIPPED IN THE hicache_galahad PACKAGE.
# Makes SGLang 0.5.23's HiCache host pools work on a CPU-only machine, for tests and demos.
# This is NOT a supported SGLang configuration; nothing here may be imported by hicache_galahad/.
# =================================================================================================
"""HiCache host-pool patches for SGLang on CPU (test harness only).

Patches (each opt-in by name through ``SGLANG_CPU_TEST_PATCHES``):

``host_unpinned``
    Host KV / Mamba pools are allocated with ``pin_memory=True`` by default, which registers
    the buffer with the CUDA driver (``cudaHostRegister``) and fails without one. Force
    ``pin_memory=False`` in ``HostKVCache.__init__`` and ``MambaPoolHost.__init__`` (the latter
    has its own constructor).

``kv_direct_io``
    The host pools import their host<->device transfer functions from ``sgl_kernel.kvcacheio``
    only on CUDA/HIP, so on CPU every transfer dies with ``NameError``. Inject pure-torch
    implementations of the three functions the ``--hicache-io-backend direct`` path calls:
    ``transfer_kv_direct`` (``layer_first``), ``transfer_kv_per_layer_direct_pf_lf`` and
    ``transfer_kv_all_layer_direct_lf_pf`` (``page_first_direct``; also used by the Mamba host
    pool with ``page_size=1``). Semantics follow sgl-kernel's ``csrc/kvcacheio/transfer.cu``
    (``transfer_kv_direct`` and ``transfer_kv_page_first_direct_impl``'s page-copy path). Names
    already present in a module (a real CUDA build) are left alone.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from . import register

if TYPE_CHECKING:  # torch is imported lazily: sitecustomize must stay cheap
    import torch

# ------------------------------------------------------------------------------------------------
# Pure-torch transfer functions (same signatures and semantics as sgl_kernel.kvcacheio)
# ------------------------------------------------------------------------------------------------


def _check_indices(src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    if src_indices.numel() != dst_indices.numel():
        raise RuntimeError("Source and destination indices must have the same length")
    if page_size <= 0:
        raise RuntimeError("Page size must be positive")
    if src_indices.numel() % page_size != 0:
        raise RuntimeError("Source indices size must be divisible by page size")


def _cpu_long(indices: torch.Tensor) -> torch.Tensor:
    import torch

    return indices.to(device="cpu", dtype=torch.int64)


def transfer_kv_direct(
    src_layers: Sequence[torch.Tensor],
    dst_layers: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """``dst_layers[j][dst_indices] = src_layers[j][src_indices]`` for every layer j.

    The C++ version copies maximal runs where both index lists advance by one; the result is
    the same as a row-wise gather/scatter along dim 0.
    """
    if len(src_layers) != len(dst_layers):
        raise RuntimeError("Source and destination layers must have the same number of layers")
    _check_indices(src_indices, dst_indices, page_size)
    if src_indices.numel() == 0:
        return
    src_rows = _cpu_long(src_indices)
    dst_rows = _cpu_long(dst_indices)
    for src, dst in zip(src_layers, dst_layers, strict=True):
        rows = src.index_select(0, src_rows.to(src.device))
        dst.index_copy_(0, dst_rows.to(dst.device), rows.to(device=dst.device, dtype=dst.dtype))


def _page_first_direct(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    start_layer_id: int,
    page_size: int,
    layer_first_to_page_first: bool,
) -> None:
    """The page-copy path of sgl-kernel's ``transfer_kv_page_first_direct_impl``.

    Page-first host buffers have shape ``(pages, layers, page_size, ...)``; layer-first device
    buffers are one tensor per layer with shape ``(tokens, ...)``. Page i is addressed by the
    first index of its group of ``page_size`` indices: the host page is ``index // page_size``,
    the device rows are ``index .. index + page_size - 1``. With two host buffers (K and V) the
    device list holds all K layers followed by all V layers; with one host buffer (MLA, Mamba)
    the device list holds one tensor per layer.
    """
    _check_indices(src_indices, dst_indices, page_size)
    num_pages = src_indices.numel() // page_size
    if num_pages == 0:
        return
    import torch

    src_starts = _cpu_long(src_indices)[::page_size]
    dst_starts = _cpu_long(dst_indices)[::page_size]
    offsets = torch.arange(page_size, dtype=torch.int64)

    if layer_first_to_page_first:  # device layers -> host pages
        host_buffers, device_layers = dst_ptrs, src_ptrs
        host_pages = dst_starts // page_size
        device_rows = (src_starts[:, None] + offsets).reshape(-1)
    else:  # host pages -> device layers
        host_buffers, device_layers = src_ptrs, dst_ptrs
        host_pages = src_starts // page_size
        device_rows = (dst_starts[:, None] + offsets).reshape(-1)
    num_layers = len(device_layers) // len(host_buffers)
    runs = _page_runs(host_pages, device_rows[::page_size], page_size)

    for j in range(num_layers):
        if runs is not None:  # the C++ kernel's way: one copy per run of consecutive pages
            for c, host in enumerate(host_buffers):
                device = device_layers[j + c * num_layers]
                for host_start, row_start, count in runs:
                    host_part = host[
                        host_start : host_start + count, start_layer_id + j, :page_size
                    ]
                    device_part = device[row_start : row_start + count * page_size]
                    device_part = device_part.view(count, page_size, *device.shape[1:])
                    if layer_first_to_page_first:
                        host_part.copy_(device_part)
                    else:
                        device_part.copy_(host_part)
            continue
        for c, host in enumerate(host_buffers):  # c = 0: K (or the only buffer), c = 1: V
            device = device_layers[j + c * num_layers]
            layer = start_layer_id + j
            pages = host_pages.to(host.device)
            rows = device_rows.to(device.device)
            if layer_first_to_page_first:
                data = device.index_select(0, rows).to(device=host.device, dtype=host.dtype)
                host[pages, layer, :page_size] = data.reshape(num_pages, page_size, *host.shape[3:])
            else:
                data = host[pages, layer, :page_size]
                data = data.reshape(num_pages * page_size, *device.shape[1:])
                device.index_copy_(0, rows, data.to(device=device.device, dtype=device.dtype))


def _page_runs(host_pages, device_starts, page_size: int):
    """[(host page, device row, pages)] for maximal runs where both sides advance by one page,
    or None when the pages are too scattered for runs to pay (then one gather and one scatter
    per layer, as before)."""
    import torch

    if host_pages.numel() == 1:
        breaks = torch.zeros(0, dtype=torch.int64)
    else:
        breaks = torch.nonzero(
            (host_pages[1:] - host_pages[:-1] != 1)
            | (device_starts[1:] - device_starts[:-1] != page_size)
        ).flatten()
    if breaks.numel() + 1 > max(4, host_pages.numel() // 8):
        return None
    starts = [0, *(breaks + 1).tolist()]
    ends = [*starts[1:], host_pages.numel()]
    hosts, rows = host_pages.tolist(), device_starts.tolist()
    return [(hosts[a], rows[a], b - a) for a, b in zip(starts, ends, strict=True)]


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
) -> None:
    """Load one layer from page-first host buffers into layer-first device buffers."""
    _page_first_direct(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size, False)


def transfer_kv_all_layer_direct_lf_pf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Back up all device layers into page-first host buffers."""
    _page_first_direct(src_ptrs, dst_ptrs, src_indices, dst_indices, 0, page_size, True)


DIRECT_IO_FUNCTIONS = {
    "transfer_kv_direct": transfer_kv_direct,
    "transfer_kv_per_layer_direct_pf_lf": transfer_kv_per_layer_direct_pf_lf,
    "transfer_kv_all_layer_direct_lf_pf": transfer_kv_all_layer_direct_lf_pf,
}

# Host-pool modules that call the direct transfer functions as module globals.
DIRECT_IO_MODULES = (
    "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.mem_cache.pool_host.mla",
    "sglang.srt.mem_cache.pool_host.mamba",
    "sglang.srt.mem_cache.pool_host.dsa",
    "sglang.srt.mem_cache.pool_host.unified",
)


def _inject_direct_io(module: ModuleType) -> None:
    for name, fn in DIRECT_IO_FUNCTIONS.items():
        if getattr(module, name, None) is None:
            setattr(module, name, fn)


# ------------------------------------------------------------------------------------------------
# Unpinned host memory
# ------------------------------------------------------------------------------------------------


def _force_unpinned(cls: type) -> None:
    original = cls.__init__
    if getattr(original, "_sglang_cpu_unpinned", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        kwargs["pin_memory"] = False  # pinning registers memory with a CUDA driver
        original(self, *args, **kwargs)

    __init__._sglang_cpu_unpinned = True
    cls.__init__ = __init__


def _unpin_host_kv_cache(module: ModuleType) -> None:
    _force_unpinned(module.HostKVCache)


def _unpin_mamba_pool_host(module: ModuleType) -> None:
    _force_unpinned(module.MambaPoolHost)


register(
    "host_unpinned",
    "HostKVCache / MambaPoolHost always allocate unpinned host memory",
    {
        "sglang.srt.mem_cache.pool_host.base": _unpin_host_kv_cache,
        "sglang.srt.mem_cache.pool_host.mamba": _unpin_mamba_pool_host,
    },
)

register(
    "kv_direct_io",
    "pure-torch transfer_kv_direct / *_direct_pf_lf / *_direct_lf_pf for --hicache-io-backend direct",
    dict.fromkeys(DIRECT_IO_MODULES, _inject_direct_io),
)
