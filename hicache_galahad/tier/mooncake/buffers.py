"""Memory that Mooncake reads and writes: registered buffers, and values lent out of them.

Memory touched for the first time is what made reads slow on the 2-core reference box (a VM):
a page fault per 4 KiB page, 4.5-8 us each, so 1.2-2 ms per MiB, against 0.1-0.2 ms per MiB to
write memory already touched. Copying each value out into a new `bytes` paid that again on
every read (glibc hands large freed blocks back to the kernel): 2-2.8 ms per MiB. So the read
buffer is touched once, when it is made, and a value read into it is handed to the caller in
place, as a read-only memoryview:

- `ReadBuffer` lends each value a region of the buffer. The region is taken back when the last
  view of it is dropped (a weakref finalizer), so a region is never reused while anyone can
  still see it, and a read that finished after its caller gave up is taken back at once.
- A value that does not fit (the buffer is held by values still in use) is read into
  temporary memory instead, made for that read and freed with its views.

No torch, no SGLang, no Mooncake import: the client is passed in.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import mmap
import threading
import weakref

ALIGN = 64
_TOUCH_STEP = 1 << 20


def aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


def chunks(sizes: list[tuple[int, int]], capacity: int):
    """Groups (index, size) into runs whose aligned sizes fit `capacity`; yields (index, offset)."""
    run: list[tuple[int, int]] = []
    offset = 0
    for index, size in sizes:
        if run and offset + size > capacity:
            yield run
            run, offset = [], 0
        run.append((index, offset))
        offset += aligned(size)
    if run:
        yield run


class RegisteredBuffer:
    """Anonymous memory for Mooncake to register. Never freed while in use.

    touch=True touches every page now, one MiB at a time so that other threads get the GIL in
    between; else pages are touched by their first use.
    """

    def __init__(self, size: int, touch: bool = False):
        self.size = size
        self._map = mmap.mmap(-1, size)
        self.view = memoryview(self._map)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        if touch:
            self._touch()

    def _touch(self) -> None:
        zeros = bytes(_TOUCH_STEP)
        for offset in range(0, self.size, _TOUCH_STEP):
            end = min(self.size, offset + _TOUCH_STEP)
            self.view[offset:end] = zeros[: end - offset]

    def lend(self, offset: int, size: int):
        """A ctypes array over [offset, offset + size): the one object a lent region's views
        refer to, and the one the region's finalizer watches."""
        return (ctypes.c_char * size).from_buffer(self._map, offset)


def read_only(owner, size: int) -> memoryview:
    """The first `size` bytes of a lent region as a read-only memoryview of bytes."""
    return memoryview(owner).cast("B")[:size].toreadonly()


class ReadBuffer:
    """A registered buffer, touched once, lent out in regions (first fit, merged when freed).

    A region comes back through a finalizer, which may run in any thread at any moment (a
    garbage collection inside `lend` included), so it only queues the region; `lend` merges
    the queue into the free list under its lock.
    """

    def __init__(self, size: int):
        self.buffer = RegisteredBuffer(size, touch=True)
        self.size, self.address = size, self.buffer.address
        self._lock = threading.Lock()  # guards _free
        self._free: list[tuple[int, int]] = [(0, size)]  # (offset, size), sorted by offset
        self._returned: collections.deque = collections.deque()  # given back, not yet merged

    def lend(self, size: int):
        """A region of `size` bytes (aligned) as (address, owner), or None when none is free.
        The region comes back when `owner` (and every view of it) is gone."""
        size = aligned(size)
        with self._lock:
            self._merge_returned()
            for position, (offset, free) in enumerate(self._free):
                if free >= size:
                    if free == size:
                        del self._free[position]
                    else:
                        self._free[position] = (offset + size, free - size)
                    break
            else:
                return None
        owner = self.buffer.lend(offset, size)
        weakref.finalize(owner, self._returned.append, (offset, size))
        return self.address + offset, owner

    def free_bytes(self) -> int:
        with self._lock:
            self._merge_returned()
            return sum(size for _, size in self._free)

    def _merge_returned(self) -> None:
        while self._returned:
            offset, size = self._returned.popleft()
            position = bisect.bisect(self._free, (offset, size))
            self._free.insert(position, (offset, size))
            if position + 1 < len(self._free):  # merge with the next free region
                next_offset, next_size = self._free[position + 1]
                if offset + size == next_offset:
                    self._free[position] = (offset, size + next_size)
                    del self._free[position + 1]
            if position > 0:  # and with the previous one
                prev_offset, prev_size = self._free[position - 1]
                if prev_offset + prev_size == offset:
                    self._free[position - 1] = (prev_offset, prev_size + self._free[position][1])
                    del self._free[position]
