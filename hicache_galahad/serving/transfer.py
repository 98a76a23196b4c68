"""Moving pages between SGLang's host pools and the store.

Zero-copy where the pool's pages are plain strided memory (pages.PageLayout): records go
straight between disk and host memory. Otherwise pages are copied through SGLang's own flat
page accessors. Host indices are checked against the pool first: a page is only ever read
from, or written to, the slots that really are that page.
"""

from __future__ import annotations

import time

import torch

from ..errors import RefusedRequest
from .binding import PoolBinding


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a CPU tensor (a flat page), without a copy when it is contiguous."""
    return memoryview(tensor.detach().contiguous().view(torch.uint8).reshape(-1).numpy())


def exact_page_bytes(binding: PoolBinding, tensor: torch.Tensor) -> memoryview:
    """The bytes of a flat page given by the caller, refused unless it is exactly one page of
    the pool: a record of another size is never published, and never read into it."""
    data = tensor_bytes(tensor)
    if data.nbytes != binding.page_bytes:
        raise RefusedRequest(
            f"a flat page of {data.nbytes} bytes for pool {binding.name}, whose pages are "
            f"{binding.page_bytes} bytes"
        )
    return data


def flat_target(binding: PoolBinding, target):
    if target is None:
        return binding.pool.get_dummy_flat_data_page()
    if (
        not isinstance(target, torch.Tensor)
        or not target.is_contiguous()
        or (target.device.type != "cpu")
    ):
        raise RefusedRequest("target page must be a contiguous CPU tensor")
    return target


def page_starts(binding: PoolBinding, host_indices, num_pages: int) -> list[int] | None:
    """The first slot of each page named by `host_indices`, or None unless they are exactly
    `num_pages` whole, aligned pages inside the pool."""
    page_size = binding.page_size
    if not isinstance(host_indices, torch.Tensor) or host_indices.numel() != num_pages * page_size:
        return None
    if num_pages == 0:
        return []
    slots = host_indices.reshape(num_pages, page_size).to(torch.int64)
    starts = slots[:, 0]
    if page_size > 1 and not torch.equal(
        slots - starts[:, None], torch.arange(page_size, dtype=torch.int64).expand_as(slots)
    ):
        return None
    low, high = int(starts.min()), int(starts.max())
    if low < 0 or high + page_size > binding.capacity_slots:
        return None
    if page_size > 1 and bool((starts % page_size).any()):
        return None
    return starts.tolist()


class PageTransfer:
    """Reads and writes the pages of bound pools; reports each batch to `on_batch`."""

    def __init__(self, store, warn, on_batch):
        self.store = store
        self.warn = warn
        self.on_batch = on_batch  # (direction, results, page_bytes, start_s)

    def pages_io(self, binding: PoolBinding, keys: list, host_indices, *, write: bool):
        """Moves pages between records and the host pool slots named by host_indices."""
        starts = page_starts(binding, host_indices, len(keys))
        if starts is None:
            self.warn.warning(
                "indices",
                "galahad: host indices %s do not name %d whole pages of %d slots inside pool "
                "%s: refused",
                _describe(host_indices),
                len(keys),
                binding.page_size,
                binding.name,
            )
            return [False] * len(keys)
        start_s = time.perf_counter()
        if binding.layout.supported:
            buffers = [binding.layout.segments(start) for start in starts]
            if write:
                results = self.store.put_many(binding.namespace, keys, buffers)
            else:
                results = self.store.get_many_into(binding.namespace, keys, buffers)
        elif write:
            pages = [tensor_bytes(binding.pool.get_data_page(start, flat=True)) for start in starts]
            results = self.store.put_many(binding.namespace, keys, pages)
        else:
            targets = [binding.pool.get_dummy_flat_data_page() for _ in starts]
            results = self.store.get_many_into(
                binding.namespace, keys, [tensor_bytes(target) for target in targets]
            )
            for start, target, ok in zip(starts, targets, results, strict=True):
                if ok:
                    binding.pool.set_from_flat_data_page(start, target)
        self.on_batch("backup" if write else "prefetch", results, binding.page_bytes, start_s)
        return results


def _describe(host_indices) -> str:
    if isinstance(host_indices, torch.Tensor):
        return f"({host_indices.numel()} indices)"
    return repr(type(host_indices).__name__)
