"""Zero-copy access to the pages of an SGLang host pool (torch, no sglang import).

A page of a host pool is a strided view of the pool's buffer (or, for the Mamba pool, several
views: temporal state, then each conv state). `PageLayout` works out once, from the pool itself,
which contiguous byte ranges of the pool's memory make up a page, in exactly the byte order of
`pool.get_data_page(index, flat=True)`. Reads and writes then go straight between the records
and host memory (preadv/writev on memoryviews), for every layout, with no staging copy; and a
record written through one path (generic flat pages, v1 zero-copy, v2 pools) reads back
identically through any other.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def _storage_bytes(tensor: torch.Tensor) -> memoryview:
    storage = tensor.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
    return memoryview(flat.numpy())


def _byte_runs(view: torch.Tensor) -> list[tuple[int, int]]:
    """(offset, length) ranges of the view's storage, in C order, merged where adjacent."""
    itemsize = view.element_size()
    dims = [
        (size, stride) for size, stride in zip(view.shape, view.stride(), strict=True) if size != 1
    ]
    block = 1
    while dims and dims[-1][1] == block:
        block *= dims[-1][0]
        dims.pop()
    offsets = [view.storage_offset()]
    for size, stride in dims:
        offsets = [offset + index * stride for offset in offsets for index in range(size)]
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        start, length = offset * itemsize, block * itemsize
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1] = (runs[-1][0], runs[-1][1] + length)
        else:
            runs.append((start, length))
    return runs


def _page_views(pool, index: int) -> list[torch.Tensor]:
    iterate = getattr(pool, "_iter_page_tensors", None)
    if iterate is not None:
        return list(iterate(index))
    return [pool.get_data_page(index, flat=False)]


class PageLayout:
    """Byte ranges of host-pool memory that make up the page starting at a slot index.

    The ranges of page p are those of page 0 shifted by p times a per-page stride per range;
    this is checked on construction against pages 1 and 2, and `supported` is False for a pool
    whose pages do not follow that rule (callers then copy through flat pages).
    """

    def __init__(self, pool):
        self.page_size = int(getattr(pool, "page_size", 1) or 1)
        dummy = pool.get_dummy_flat_data_page()
        self.page_bytes = int(dummy.numel() * dummy.element_size())
        self.supported = False
        self._memories: list[memoryview] = []
        self._base: list[tuple[int, int, int]] = []  # (memory index, offset, length)
        self._stride: list[int] = []
        try:
            self._derive(pool)
        except ValueError:  # a pool this map cannot describe (not in CPU memory): flat copies
            self.supported = False
        except Exception:  # a bug, or a pool of a kind not foreseen: flat copies, said once
            self.supported = False
            log.warning(
                "galahad: no zero-copy page map for %s; its pages are copied through flat pages",
                type(pool).__name__,
                exc_info=True,
            )

    def _runs(self, pool, page: int) -> list[tuple[int, int, int]]:
        runs = []
        for view in _page_views(pool, page * self.page_size):
            if view.device.type != "cpu":
                raise ValueError("host pool is not in CPU memory")
            memory_index = self._memory_index(view)
            runs.extend((memory_index, offset, length) for offset, length in _byte_runs(view))
        return runs

    def _memory_index(self, view: torch.Tensor) -> int:
        pointer = view.untyped_storage().data_ptr()
        for index, (known_pointer, _) in enumerate(self._pointers):
            if known_pointer == pointer:
                return index
        self._pointers.append((pointer, view))
        self._memories.append(_storage_bytes(view))
        return len(self._memories) - 1

    def _derive(self, pool) -> None:
        self._pointers: list = []
        capacity_pages = int(getattr(pool, "size", 0) or 0) // self.page_size
        first = self._runs(pool, 0)
        if sum(length for _, _, length in first) != self.page_bytes:
            return
        if capacity_pages < 3:
            return
        second, third = self._runs(pool, 1), self._runs(pool, 2)
        if not len(first) == len(second) == len(third):
            return
        strides = []
        for (m0, o0, l0), (m1, o1, l1), (m2, o2, l2) in zip(first, second, third, strict=True):
            if not (m0 == m1 == m2 and l0 == l1 == l2 and o2 - o1 == o1 - o0):
                return
            strides.append(o1 - o0)
        self._base, self._stride = first, strides
        self.supported = True

    def segments(self, slot_index: int) -> list[memoryview]:
        """Writable memoryviews over host memory for the page starting at `slot_index`."""
        page = int(slot_index) // self.page_size
        return [
            self._memories[memory][offset + page * stride : offset + page * stride + length]
            for (memory, offset, length), stride in zip(self._base, self._stride, strict=True)
        ]


# The order of the elements in a pool's flat page (get_data_page(flat=True)), per pool class
# and host memory layout, read off SGLang 0.5.23's init_kv_buffer and get_data_page. Layouts
# with the same order hold identical page bytes for the same KV, so their records are shared
# (as SGLang's own file backend shares them); an unknown pair keys on its layout name.
PAGE_BYTE_ORDERS = {
    ("MHATokenToKVPoolHost", "layer_first"): "kv,layer,token,head,dim",
    ("MHATokenToKVPoolHost", "page_first"): "kv,token,layer,head,dim",
    ("MHATokenToKVPoolHost", "page_first_direct"): "kv,layer,token,head,dim",
    ("MHATokenToKVPoolHost", "page_head"): "kv,head,token,layer,dim",
    ("MLATokenToKVPoolHost", "layer_first"): "layer,token,head,dim",
    ("MLATokenToKVPoolHost", "page_first"): "token,layer,head,dim",
    ("MLATokenToKVPoolHost", "page_first_direct"): "layer,token,head,dim",
    ("MambaPoolHost", "page_first"): "slot:temporal,conv...,side...",
    ("MambaPoolHost", "page_first_direct"): "slot:temporal,conv...,side...",
}


def page_byte_order(pool) -> str:
    layout = getattr(pool, "layout", None)
    return PAGE_BYTE_ORDERS.get((type(pool).__name__, layout), f"layout:{layout}")


def describe_pool(pool) -> dict:
    """The geometry that decides a page's bytes: any difference must be another namespace.
    The host memory layout itself is not part of it, only the byte order it gives a page."""
    dummy = pool.get_dummy_flat_data_page()
    geometry = {
        "class": type(pool).__name__,
        "page_byte_order": page_byte_order(pool),
        "page_size": int(getattr(pool, "page_size", 1) or 1),
        "page_bytes": int(dummy.numel() * dummy.element_size()),
        "dtype": str(getattr(pool, "dtype", dummy.dtype)),
    }
    for name in (
        "layer_num",
        "start_layer",
        "end_layer",
        "head_num",
        "head_dim",
        "v_head_dim",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "num_mamba_layers",
        "dcp_size",
        "dcp_rank",
    ):
        value = getattr(pool, name, None)
        if isinstance(value, int | float | str | bool):
            geometry[name] = value
    iterate = getattr(pool, "_iter_page_tensors", None)
    if iterate is not None:
        geometry["components"] = [
            {"dtype": str(view.dtype), "shape": list(view.shape)} for view in iterate(0)
        ]
    return geometry
