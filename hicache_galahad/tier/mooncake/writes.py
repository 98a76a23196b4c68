"""Write-behind puts to Mooncake: a byte-bounded queue and the thread that drains it.

`put` queues a value (a full queue drops it); `remove` queues a removal in the same order, so
a put of the same key after it lands after it. The writer takes a run of puts that fits the
registered write buffer, asks `batch_is_exist` (a key keeps its first writer's value, so an
existing key is not written), copies the rest into the buffer and calls `batch_put_from`.
The queue is guarded by the connection's `state`, so closing wakes the writer at once.
"""

from __future__ import annotations

import collections
import threading
import time

from ...telemetry.metrics import Counters, RateLimitedLog, count_bug
from .buffers import RegisteredBuffer, aligned
from .connection import BUG_MESSAGE, NO_SPACE, NOT_FOUND, RPC_FAIL, MooncakeConnection

_MAX_PUT_BATCH = 256


class WriteBehind:
    """The queue of puts and removes (under `connection.state`) and its writer thread."""

    def __init__(self, connection: MooncakeConnection, counts: Counters, warn: RateLimitedLog):
        self._connection = connection
        self._state = connection.state
        self._counts = counts
        self._warn = warn
        self._capacity = connection.options.transfer_buffer_bytes
        self._queue_max_bytes = connection.options.queue_max_bytes
        self.buffer: RegisteredBuffer | None = None  # made on the first connect (make_buffer)
        self._queue: collections.deque = collections.deque()
        self.queued_bytes = 0  # includes the batch the writer is putting
        self._writing = False  # the writer holds a batch taken from the queue
        self._thread = threading.Thread(target=self._loop, name="mooncake-write", daemon=True)

    def make_buffer(self) -> RegisteredBuffer:
        self.buffer = RegisteredBuffer(self._capacity)  # touched by its first use
        return self.buffer

    def start(self) -> None:
        self._thread.start()

    def _bug(self, where: str) -> None:
        """A bug caught in `where` (metrics.count_bug: counted, logged with its traceback)."""
        count_bug(self._counts, self._warn, f"bug-{where}", BUG_MESSAGE, where)

    def join(self, timeout_s: float) -> bool:
        """Waits for the thread (after `closed`); whether it has ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def put(self, key: str, value: bytes | memoryview) -> bool:
        """Queues value; False (counted, logged) when it cannot be."""
        data = value if isinstance(value, bytes) else bytes(value)
        if not 0 < len(data) <= self._capacity:
            return self._drop("value of %d bytes: outside 1..transfer_buffer_bytes", len(data))
        with self._state:
            if self.queued_bytes + len(data) > self._queue_max_bytes:
                full = True
            else:
                full = False
                self._queue.append((key, data))
                self.queued_bytes += len(data)
                self._state.notify_all()
        if full:
            return self._drop("write-behind queue full (%d bytes)", self._queue_max_bytes)
        self._counts.add("put_enqueued")
        return True

    def remove(self, key: str) -> None:
        with self._state:
            self._queue.append((key, None))
            self._state.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Waits until every queued put and remove has been tried; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._state:
            while self._queue or self.queued_bytes or self._writing:
                left = deadline - time.monotonic()
                if left <= 0 or self._connection.closed:
                    return False
                self._state.wait(left)
        return True

    def discard(self) -> int:
        """Empties the queue (the caller holds `state`, at close); how many puts it held."""
        discarded = sum(1 for _, data in self._queue if data is not None)
        self._queue.clear()
        self.queued_bytes = 0
        self._state.notify_all()
        return discarded

    # -- the writer -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._state:
                while not self._queue and not self._connection.closed:
                    self._state.wait()
                if self._connection.closed:
                    return
                batch = self._take_batch()
                self._writing = True
            try:
                self._write_batch(batch)
            except Exception:
                self._bug("writer")
            finally:
                with self._state:
                    self.queued_bytes -= sum(len(d) for _, d in batch if d is not None)
                    self.queued_bytes = max(0, self.queued_bytes)
                    self._writing = False
                    self._state.notify_all()

    def _take_batch(self) -> list:
        """A run of puts fitting the write buffer, or one remove (kept in queue order)."""
        batch: list = []
        used = 0
        while self._queue and len(batch) < _MAX_PUT_BATCH:
            key, data = self._queue[0]
            if data is None:
                if not batch:
                    batch.append(self._queue.popleft())
                break
            if batch and used + aligned(len(data)) > self._capacity:
                break
            batch.append(self._queue.popleft())
            used += aligned(len(data))
        return batch

    def _write_batch(self, batch: list) -> None:
        store, buffer = self._connection.store, self.buffer
        puts = [(key, data) for key, data in batch if data is not None]
        if store is None or buffer is None or not self._connection.is_up:
            self._counts.add("put_skipped", len(puts))
            return
        if not puts:
            self._remove_now(store, batch[0][0])
            return
        first: dict[str, bytes] = {}
        for key, data in puts:
            first.setdefault(
                key, data
            )  # a key queued twice keeps its first value, as Mooncake does
        unique = list(first.items())
        present = store.batch_is_exist([key for key, _ in unique])
        if RPC_FAIL in present:
            self._connection.mark_down("an existence check failed with RPC_FAIL")
            self._counts.add("put_skipped", len(puts))
            return
        todo = [item for item, code in zip(unique, present, strict=True) if code != 1]
        self._counts.add("put_exists", len(puts) - len(todo))  # a repeated key: its first value
        if todo:
            self._put_from(store, buffer, todo)

    def _put_from(self, store, buffer: RegisteredBuffer, todo: list) -> None:
        pointers = []
        offset = 0
        for _, data in todo:
            buffer.view[offset : offset + len(data)] = data
            pointers.append(buffer.address + offset)
            offset += aligned(len(data))
        codes = store.batch_put_from(
            [key for key, _ in todo], pointers, [len(data) for _, data in todo]
        )
        ok = sum(1 for code in codes if code == 0)
        put_bytes = sum(len(data) for (_, data), code in zip(todo, codes, strict=True) if code == 0)
        self._counts.add("put_ok", ok)
        self._counts.add("put_bytes", put_bytes)
        self._counts.add("put_failed", len(codes) - ok)
        self._counts.add("put_no_space", sum(1 for code in codes if code == NO_SPACE))
        if len(codes) != ok:
            self._warn.warning(
                "put",
                "mooncake: %d of %d puts failed (code %d)",
                len(codes) - ok,
                len(codes),
                min(codes),
            )
        if RPC_FAIL in codes:
            self._connection.mark_down("a put failed with RPC_FAIL")

    def _remove_now(self, store, key: str) -> None:
        self._counts.add("removes")
        code = store.remove(key, True)  # force: a recent read's lease would refuse it
        if code not in (0, NOT_FOUND):
            self._counts.add("remove_failed")
            if code == RPC_FAIL:
                self._connection.mark_down("a remove failed with RPC_FAIL")

    def _drop(self, why: str, *args) -> bool:
        self._counts.add("put_dropped")
        self._warn.warning("drop", "mooncake: put dropped: " + why, *args)
        return False
