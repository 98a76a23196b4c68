"""Mooncake Store as a shared, lossy tier: bounded reads, write-behind puts (no torch, no SGLang).

`MooncakeTier` holds opaque values under the caller's keys in a Mooncake Store cluster. It never
raises into the caller and never blocks it past `timeout_s`. It is a thin class over its parts:

- connection.py: a thread calls Mooncake's `setup()` only once the master's TCP port
  answers and a child process's `setup()` has just completed (`setup()` blocks holding the GIL),
  then watches the master and marks the tier down or up again.
- reads.py: reads run on one worker thread, each call waited for at most `timeout_s`;
  a call that overruns marks the tier unavailable until it returns. Values are read with
  `batch_get_into` into the registered read buffer, copied at once into a private buffer no
  peer can write, and handed over from there, read-only (buffers.py), so neither a
  late call nor a peer ever writes into memory the caller sees.
- writes.py: writes go through a byte-bounded queue to a writer thread
  (`batch_is_exist`, then `batch_put_from` from a registered buffer). A full queue drops the
  value.
- what happened is counted in a `Counters` over telemetry/metrics.py TIER_COUNTERS, and a bug
  caught by metrics.count_bug, the store's rule.
- integrity.py: the cluster integrity key (`integrity_key_file`), read first, before
  any thread starts (a bad key file is a KeyFileError from the constructor); `value_tag` is
  what the TieredStore tags and checks values with (None without the option).

Mooncake is a cache: a value may vanish at any time, and a key keeps its first writer's value
(a put of an existing key is a no-op). `remove()` is how a caller clears a bad value so that a
fresh put can land.
"""

from __future__ import annotations

import logging
import time

from ...config.mooncake import MooncakeOptions
from ...errors import MooncakeConfigError
from ...telemetry.metrics import TIER_COUNTERS, Counters, RateLimitedLog, count_bug
from .connection import BUG_MESSAGE, MooncakeConnection
from .integrity import ValueTag, load_integrity_key
from .reads import BoundedReads
from .writes import WriteBehind

__all__ = ["MooncakeConfigError", "MooncakeOptions", "MooncakeTier"]

log = logging.getLogger(__name__)


class MooncakeTier:
    """A Mooncake Store client that never raises into its caller and never stalls it."""

    def __init__(self, options: MooncakeOptions, logger: logging.Logger | None = None):
        self.options = options
        path = options.integrity_key_file
        self.value_tag = ValueTag(load_integrity_key(path)) if path is not None else None
        self._log = logger or log
        self._warn = RateLimitedLog(self._log, interval_s=30.0)
        self._counts = Counters(TIER_COUNTERS)  # telemetry/metrics.py: the tier's registry
        self._connection = MooncakeConnection(options, self._log, self._counts, self._buffers)
        self._reads = BoundedReads(
            self._connection, self._counts, self._warn, lambda: self.available
        )
        self._writes = WriteBehind(self._connection, self._counts, self._warn)
        self._connection.start()
        self._writes.start()

    def _bug(self, where: str) -> None:
        """A bug caught in `where` (metrics.count_bug: counted, logged with its traceback)."""
        count_bug(self._counts, self._warn, f"bug-{where}", BUG_MESSAGE, where)

    def _buffers(self) -> list:
        """What each new client registers (made on the first connect, in the connector)."""
        return [self._reads.make_buffer(), self._writes.make_buffer()]

    # -- public -----------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """Connected, the master answering, and no read call stuck past its deadline."""
        stuck = self._reads.stuck
        return self._connection.is_up and not self._connection.closed and not stuck

    def counters(self) -> dict:
        snapshot = self._counts.snapshot()
        with self._connection.state:
            snapshot["queued_bytes"] = self._writes.queued_bytes
        snapshot["available"] = int(self.available)
        return snapshot

    def get_many(self, keys: list[str], max_bytes: list[int]) -> list[memoryview | None]:
        """Each key's value, or None (absent, failed, timed out, empty, above its max_bytes).

        A value is a read-only memoryview of the tier's private buffer (a copy made as soon as
        Mooncake wrote it into the registered one: no peer can write it), lent to the caller
        until it drops the view (compare it, hash it or `bytes()` it like bytes); holding
        values long makes later reads use temporary memory (counted as get_spilled).
        """
        results: list[memoryview | None] = [None] * len(keys)
        try:
            if len(max_bytes) != len(keys):
                self._warn.warning(
                    "args", "get_many: %d keys but %d sizes", len(keys), len(max_bytes)
                )
                return results
            self._counts.add("gets", len(keys))
            if keys:
                done = self._reads.values(list(keys), list(max_bytes))
                if done is None:
                    self._counts.add("get_skipped", len(keys))
                else:
                    results = done
        except Exception:
            self._bug("get_many")
        return results

    def exists_many(self, keys: list[str]) -> list[bool]:
        """Whether Mooncake holds each key now (False when unknown); bounded like get_many."""
        try:
            self._counts.add("exists_calls")
            found = self._reads.exists(list(keys)) if keys else None
            if found is not None:
                return found
        except Exception:
            self._bug("exists_many")
        return [False] * len(keys)

    def put_async(self, key: str, value: bytes | memoryview) -> bool:
        """Queues value for a background put; False when dropped or the tier is unavailable."""
        try:
            if not self.available:
                self._counts.add("put_skipped")
                return False
            return self._writes.put(key, value)
        except Exception:
            self._bug("put_async")
            return False

    def remove(self, key: str) -> None:
        """Best effort, in queue order: a put_async of the same key after this lands after it."""
        try:
            if self.available:
                self._writes.remove(key)
        except Exception:
            self._bug("remove")

    def flush(self, timeout_s: float) -> bool:
        """Waits until every queued put and remove has been tried; False on timeout."""
        return self._writes.flush(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the threads and closes the client; waits at most about timeout_s (+ close())."""
        connection = self._connection
        with connection.state, self._reads.call_lock:
            if connection.closed:
                return
            connection.closed = True
            connection.is_up = False
            discarded = self._writes.discard()
        self._counts.add("put_skipped", discarded)
        deadline = time.monotonic() + timeout_s
        reads = self._reads.stop(deadline)
        idle = self._writes.join(max(0.0, deadline - time.monotonic()))
        idle = connection.join(max(0.0, deadline - time.monotonic())) and idle
        idle = idle and all(read.done() for read in reads)
        store = connection.take_store()
        if store is not None and idle:
            connection.release(store)
        elif store is not None:
            self._log.warning("mooncake: a call is still running at close; the client is leaked")
        self._log.info("mooncake tier closed: %s", self.counters())
