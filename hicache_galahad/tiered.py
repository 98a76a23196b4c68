"""Local disk first, then a shared Mooncake Store cluster: one memory for many servers.

`TieredStore` offers the RecordStore verbs the adapter uses. Reads try the local store, then
Mooncake for what it missed. A Mooncake value is our full record (header, key echo, digest or
AES-GCM tag), so it is verified with exactly the rules of a record on disk: a value written by
a buggy or hostile client, a stale one, or one of another tenant, model, layout, dtype or rank
is a miss (and removed from Mooncake, so that a good value can take its place). A verified
value is copied into the caller's page and written through to the local disk. Writes go to the
local disk, then asynchronously to Mooncake through the tier's bounded queue.

Mooncake is a cache that can lose anything at any time, and its failures are misses or skipped
writes: the tier never raises and never blocks past its timeout (mooncake_tier.py).
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from . import format as fmt
from .metrics import RateLimitedLog
from .namespace import Namespace
from .reader import reader_may_be_wrong
from .store import RecordStore

log = logging.getLogger("hicache_galahad")
KEY_PREFIX = "galahad"
RECORD_OVERHEAD_BYTES = fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES + fmt.TAG_BYTES + (1 << 16)


def shared_key(namespace: Namespace, key: str) -> str:
    """The Mooncake key of a record: its namespace (tenant, model, pool geometry, rank) and
    its own key. Only a naming convention: the value itself is verified on every read."""
    return f"{KEY_PREFIX}/{namespace.dirname}/{key}"


def _value_bound(raw_len: int) -> int:
    return raw_len + (raw_len >> 7) + RECORD_OVERHEAD_BYTES


class _WriteThrough:
    """Verified Mooncake values written to the local disk by a background thread, so that a
    read returns as soon as its pages are in host memory. The values (read-only views lent by
    the tier) are held until written; a batch that would take them past `max_bytes` is
    refused, and the caller writes it itself."""

    def __init__(self, local: RecordStore, max_bytes: int):
        self._local = local
        self._max_bytes = max_bytes
        self._state = threading.Condition()  # guards the fields below
        self._queue: collections.deque = collections.deque()
        self._bytes = 0  # queued or being written
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="galahad-write-through")
        self._thread.daemon = True
        self._thread.start()

    def submit(self, namespace: Namespace, keys: list, raws: list) -> bool:
        """Queues the batch; False (nothing queued) when it does not fit or at close."""
        size = sum(len(raw) for raw in raws)
        with self._state:
            if self._closed or self._bytes + size > self._max_bytes:
                return False
            self._queue.append((namespace, keys, raws, size))
            self._bytes += size
            self._state.notify_all()
        return True

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._state:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._state.wait(left)
        return True

    def close(self, timeout_s: float) -> None:
        self.flush(timeout_s)
        with self._state:
            self._closed = True
            self._queue.clear()
            self._state.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._state:
                while not self._queue and not self._closed:
                    self._state.wait()
                if self._closed:
                    return
                namespace, keys, raws, size = self._queue.popleft()
                self._busy = True
            try:
                written = self._local.put_many(namespace, keys, raws)
                self._local.counters.add("mooncake_written_through", written.count(True))
            except Exception:
                log.exception("galahad: writing Mooncake values through to the local disk")
            finally:
                del raws  # the tier's read buffer gets these regions back
                with self._state:
                    self._bytes -= size
                    self._busy = False
                    self._state.notify_all()


class TieredStore:
    def __init__(self, local: RecordStore, tier):
        self.local = local
        self.tier = tier
        self.counters = local.counters
        self._warn = RateLimitedLog(log)
        self._through = _WriteThrough(local, tier.options.transfer_buffer_bytes)

    # What the adapter uses of the store that involves no shared page: the local store's.
    @property
    def root(self) -> str:
        return self.local.root

    @property
    def max_bytes(self) -> int | None:
        return self.local.max_bytes

    def register_namespace(self, namespace: Namespace) -> Namespace:
        return self.local.register_namespace(namespace)

    def clear_namespace(self, namespace: Namespace) -> int:
        """Clears the local records only: Mooncake cannot list a namespace's keys (its values
        age out; a value no one reads is evicted first)."""
        return self.local.clear_namespace(namespace)

    # ------------------------------------------------------------- lookups

    def contains(self, namespace: Namespace, key: str) -> bool:
        if self.local.contains(namespace, key):
            return True
        return self.tier.exists_many([shared_key(namespace, key)])[0]

    def leading_run(self, namespace: Namespace, keys: list) -> int:
        present = self.local.leading_run(namespace, keys)
        if present == len(keys) or not self.tier.available:
            return present
        shared = self.tier.exists_many([shared_key(namespace, key) for key in keys[present:]])
        for found in shared:
            if not found:
                break
            present += 1
        return present

    # ------------------------------------------------------------- reads

    def get_many_into(self, namespace: Namespace, keys: list, outs: list) -> list[bool]:
        results = self.local.get_many_into(namespace, keys, outs)
        missing = [index for index, ok in enumerate(results) if not ok]
        if missing and self.tier.available:
            fetched = self._fetch(namespace, [keys[i] for i in missing], [outs[i] for i in missing])
            for index, ok in zip(missing, fetched, strict=True):
                results[index] = ok
        return results

    def get_into(self, namespace: Namespace, key: str, out) -> bool:
        return self.get_many_into(namespace, [key], [out])[0]

    def get(self, namespace: Namespace, key: str, expected_size: int) -> bytes | None:
        buffer = bytearray(expected_size)
        return bytes(buffer) if self.get_into(namespace, key, buffer) else None

    def verify(self, namespace: Namespace, key: str, expected_size: int) -> bool:
        return self.get_into(namespace, key, bytearray(expected_size))

    def _fetch(self, namespace: Namespace, keys: list, outs: list) -> list[bool]:
        """Reads `keys` from Mooncake into `outs`; verifies, copies, writes through."""
        segments = [fmt.as_segments(out) for out in outs]
        sizes = [sum(len(piece) for piece in pieces) for pieces in segments]
        values = self.tier.get_many(
            [shared_key(namespace, key) for key in keys], [_value_bound(size) for size in sizes]
        )
        results, through_keys, through_raws = [], [], []
        for key, pieces, size, value in zip(keys, segments, sizes, values, strict=True):
            raw = self._verified(namespace, key, value, size) if value else None
            if raw is None:
                results.append(False)
                continue
            offset = 0
            for piece in pieces:
                piece[:] = raw[offset : offset + len(piece)]
                offset += len(piece)
            results.append(True)
            through_keys.append(key)
            through_raws.append(raw)
        hits = len(through_keys)
        self.counters.add_many(mooncake_hits=hits, mooncake_misses=len(keys) - hits)
        if through_keys and not self._through.submit(namespace, through_keys, through_raws):
            written = self.local.put_many(namespace, through_keys, through_raws)  # backlog full
            self.counters.add("mooncake_written_through", written.count(True))
        return results

    def flush_write_through(self, timeout_s: float = 30.0) -> bool:
        """Waits until every verified Mooncake value read so far is on the local disk."""
        return self._through.flush(timeout_s)

    def _verified(self, namespace: Namespace, key: str, value, size: int):
        """The raw page in a Mooncake value, after every rule of docs/FORMAT.md (the local
        reader's own decision); None if it breaks any. A value that is surely bad is removed
        from Mooncake, so a good one can take its place; one that only this reader's settings
        may refuse (another key, plaintext in an encrypted store, another page size) is left
        for the readers it suits."""
        reader = self.local.reader
        try:
            return reader.decode_value(namespace, key, value, size)
        except fmt.FormatError as error:
            self.counters.add_many(mooncake_bad_values=1, **{f"failed_{error.rule}": 1})
            keep = reader_may_be_wrong(error, reader.key_proven(namespace.dirname))
            self._warn.warning(
                f"mooncake-{error.rule}",
                "galahad: Mooncake value of %s failed %s (%s): a miss%s",
                key,
                error.rule,
                error,
                "" if keep else ", removed from Mooncake",
            )
            if not keep:
                self.tier.remove(shared_key(namespace, key))
            return None

    # ------------------------------------------------------------- writes

    def put_many(self, namespace: Namespace, keys: list, datas: list) -> list[bool]:
        results = self.local.put_many(namespace, keys, datas)
        if self.tier.available:
            for key, data, ok in zip(keys, datas, results, strict=True):
                if ok:
                    self._share(namespace, key, data)
        return results

    def put(self, namespace: Namespace, key: str, data) -> bool:
        return self.put_many(namespace, [key], [data])[0]

    def _share(self, namespace: Namespace, key: str, data) -> None:
        header, chunks = self.local.codec.encode(namespace, fmt.encode_key(key), data)
        value = b"".join([header, *chunks])
        if self.tier.put_async(shared_key(namespace, key), value):
            self.counters.add("mooncake_puts_queued")
        else:
            self.counters.add("mooncake_puts_dropped")

    # ------------------------------------------------------------- admin

    def stats(self) -> dict:
        shared = {f"mooncake_tier_{name}": value for name, value in self.tier.counters().items()}
        return self.local.stats() | shared

    def close(self) -> None:
        try:
            self._through.close(timeout_s=30.0)
            self.tier.close()
        finally:
            self.local.close()
