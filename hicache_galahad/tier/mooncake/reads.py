"""Bounded reads from Mooncake: each call on one worker thread, waited for at most timeout_s.

A call that overruns its deadline marks the tier unavailable until it returns; no second call
is started behind it. Values are read with `batch_get_into` into regions of the registered
read buffer (mooncake_buffers.py), then copied at once into regions of a private buffer of the
same size, which Mooncake never hears of, and handed over from there as read-only memoryviews.
Registered memory is memory a peer can write (Mooncake's transfer engine lets any client of
the cluster write into another's registered segments), so nothing is ever checked or used in
place there: what a caller verifies is exactly what it serves. A region is lent to one call
and comes back only when the last view of it is gone, so a late call never writes into memory
the caller sees, and a value is never overwritten while it is seen.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait

from ...telemetry.metrics import Counters, RateLimitedLog
from .buffers import ReadBuffer, RegisteredBuffer, aligned, chunks, read_only
from .connection import NOT_FOUND, RPC_FAIL, MooncakeConnection


class Worker:
    """One daemon thread running calls in order: a stuck call never holds up interpreter exit.
    A finished call is not referred to by the thread (its result belongs to its future)."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            job = None
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as error:
                    future.set_exception(error)
            future = fn = args = None


class BoundedReads:
    """The tier's reads: `values` (get_many) and `exists` (exists_many), never past timeout_s."""

    def __init__(
        self, connection: MooncakeConnection, counts: Counters, warn: RateLimitedLog, available
    ):
        self._connection = connection
        self._counts = counts
        self._warn = warn
        self._available = available  # the tier's: connected, up, not closed, not stuck
        self._timeout_s = connection.options.timeout_s
        self.buffer: ReadBuffer | None = None  # registered; made on the first connect
        self.private: ReadBuffer | None = None  # never registered: values are lent from here
        self.call_lock = threading.Lock()  # guards _overdue and _reads
        self._overdue: Future | None = None  # a call that ran past its caller's deadline
        self._reads: set[Future] = set()  # calls submitted and not finished
        self._worker = Worker("mooncake-read")

    def make_buffer(self) -> ReadBuffer:
        """The buffer to register (and the private one values are copied into, not registered)."""
        size = self._connection.options.transfer_buffer_bytes
        self.private = ReadBuffer(size)
        self.buffer = ReadBuffer(size)
        return self.buffer

    @property
    def stuck(self) -> bool:
        with self.call_lock:
            return self._overdue is not None and not self._overdue.done()

    def values(self, keys: list[str], max_bytes: list[int]):
        """Each key's value (a read-only memoryview) or None; None when not run or late."""
        return self._bounded(self._read_values, keys, max_bytes)

    def exists(self, keys: list[str]):
        """Whether Mooncake holds each key; None when not run or late."""
        return self._bounded(self._read_exists, keys)

    def stop(self, deadline: float) -> list[Future]:
        """Stops the worker, cancels queued calls, waits for running ones until `deadline`;
        returns the ones that were running (done or not)."""
        self._worker.stop()
        with self.call_lock:
            reads = list(self._reads)
        reads = [read for read in reads if not read.cancel()]  # (callbacks take call_lock)
        futures_wait(reads, timeout=max(0.0, deadline - time.monotonic()))
        return reads

    # -- one call -----------------------------------------------------------------------------

    def _bounded(self, work, *args):
        """Runs work(store, deadline, *args) on the worker; None if not run or late."""
        store, buffer = self._connection.store, self.buffer
        if store is None or buffer is None or not self._available():
            return None
        deadline = time.monotonic() + self._timeout_s
        with self.call_lock:
            if self._connection.closed or (self._overdue is not None and not self._overdue.done()):
                return None
            future = self._worker.submit(work, store, deadline, *args)
            self._reads.add(future)
        future.add_done_callback(self._read_done)
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            self._counts.add("timeouts")
            if not future.cancel():  # running, not queued behind another caller: it is stuck
                with self.call_lock:
                    if not future.done():  # (once done, _read_done forgets it)
                        self._overdue = future
                self._warn.warning("timeout", "mooncake: a read ran past %.1f s", self._timeout_s)
            return None

    def _read_done(self, future: Future) -> None:
        with self.call_lock:
            self._reads.discard(future)
            if self._overdue is future:  # its values, never seen, go back to the buffer
                self._overdue = None

    def _read_values(self, store, deadline: float, keys, max_bytes):
        results: list[memoryview | None] = [None] * len(keys)
        capacity = self.buffer.size
        wanted = []
        for index, size in enumerate(max_bytes):
            if isinstance(size, int) and 0 < size <= capacity:
                wanted.append((index, size))
            else:
                self._counts.add("misses")
        for run in chunks(wanted, capacity):
            if time.monotonic() >= deadline:
                self._counts.add("get_skipped", len(run))
                continue
            sizes = [max_bytes[index] for index, _ in run]
            places, spill = self._places(store, sizes)
            try:
                codes = store.batch_get_into(
                    [keys[index] for index, _ in run], [address for address, _ in places], sizes
                )
            finally:
                if spill is not None:
                    store.unregister_buffer(spill.address)
            for (index, _), (_, owner), code in zip(run, places, codes, strict=True):
                if code > 0:
                    results[index] = self._copied(owner, code)
            places = owner = spill = None  # the registered regions come back now
            self._tally(codes)
        return results

    def _copied(self, owner, size: int) -> memoryview:
        """A value read into registered memory, copied into memory no peer can write: a region
        of the private buffer, or temporary memory when it is held by earlier values."""
        source = memoryview(owner).cast("B")[:size]
        place = self.private.lend(size)
        if place is None:
            self._counts.add("get_spilled")
            return memoryview(bytes(source)).toreadonly()
        _, private = place
        memoryview(private).cast("B")[:size] = source
        return read_only(private, size)

    def _places(self, store, sizes: list[int]):
        """Where each value of a run is read to: [(address, owner)], and the temporary buffer
        (registered here) holding those the read buffer had no room for, or None."""
        places = [self.buffer.lend(size) for size in sizes]
        homeless = [position for position, place in enumerate(places) if place is None]
        if not homeless:
            return places, None
        self._counts.add("get_spilled", len(homeless))
        spill = RegisteredBuffer(sum(aligned(sizes[position]) for position in homeless))
        code = store.register_buffer(spill.address, spill.size)
        if code != 0:
            raise RuntimeError(f"register_buffer of {spill.size} bytes failed with code {code}")
        offset = 0
        for position in homeless:
            size = aligned(sizes[position])
            places[position] = (spill.address + offset, spill.lend(offset, size))
            offset += size
        return places, spill

    def _tally(self, codes: list[int]) -> None:
        hits = sum(1 for code in codes if code > 0)
        misses = sum(1 for code in codes if code == 0 or code in (NOT_FOUND, -600))
        self._counts.add("hits", hits)
        self._counts.add("misses", misses)
        self._counts.add("get_errors", len(codes) - hits - misses)
        if RPC_FAIL in codes:
            self._connection.mark_down("a read failed with RPC_FAIL")

    def _read_exists(self, store, _deadline, keys):
        codes = store.batch_is_exist(keys)
        if RPC_FAIL in codes:
            self._connection.mark_down("an existence check failed with RPC_FAIL")
        return [code == 1 for code in codes]
