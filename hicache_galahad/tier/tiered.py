"""Local disk first, then a shared Mooncake Store cluster: one memory for many servers.

`TieredStore` offers the RecordStore verbs the adapter uses. Reads try the local store, then
Mooncake for what it missed. A Mooncake value is our full record (header, key echo, digest or
AES-GCM tag) followed, with `integrity_key_file`, by a keyed tag over its Mooncake key and the
record (mooncake_integrity.py). Anyone who reaches the cluster can write any value, and a
record's digest is unkeyed, so the shared tier starts only with a key that a forger lacks: the
integrity key, or the tenants' encryption key (a sealed record's AES-GCM tag covers its header,
key echo and namespace digest included). Without either, construction raises ConfigError.

A value is checked in private memory (the tier copies it out of its registered read buffer,
which peers can write, before anyone looks at it), in this order: the integrity tag (M1), then
the header's lengths against the page this namespace expects (before a byte is decompressed),
then every rule of docs/FORMAT.md (the local reader's own decision). A value that fails is a
miss; one that cannot be this namespace's (no or a bad tag, another size, plaintext in an
encrypted store, damage) is read once more and, if it fails again, removed from Mooncake so a
good value can take its place; only an AES-GCM tag that fails before this reader's key has
opened any record of the namespace (most likely this server's key is the wrong one) is left.
A verified value is copied into the caller's page and written through to the local disk, from
exactly the private bytes that were verified. Writes go to the local disk, then asynchronously
to Mooncake through the tier's bounded queue: the value holds the bytes the local writer encoded
and published (its publish hook), so a page is encoded (compressed, sealed) once, and a record
the writer found already stored is not shared again.

Mooncake is a cache that can lose anything at any time, and its failures are misses or skipped
writes: the tier never raises and never blocks past its timeout (mooncake_tier.py).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..config.mooncake import NO_SHARED_KEY
from ..errors import ConfigError
from ..record import format as fmt
from ..record.namespace import Namespace
from ..store import RecordStore
from ..store.kvstore import StoreStats
from ..store.pins import PinResult
from ..telemetry.metrics import RateLimitedLog, failed
from .mooncake.integrity import TAG_BYTES

log = logging.getLogger("hicache_galahad")
KEY_PREFIX = "galahad"
RECORD_OVERHEAD_BYTES = fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES + fmt.TAG_BYTES + (1 << 16)


# Failures a file on the local disk is kept for (reader.reader_may_be_wrong) but that a shared
# value under this namespace's Mooncake key cannot honestly have: removed (TieredStore._removable).
SQUATTER_ERRORS = (fmt.RawSizeError, fmt.ProtectionPolicyError)


def shared_key(namespace: Namespace, key: str) -> str:
    """The Mooncake key of a record: its namespace (tenant, model, pool geometry, rank) and
    its own key. Only a naming convention: the value itself is verified on every read."""
    return f"{KEY_PREFIX}/{namespace.dirname}/{key}"


@dataclass(frozen=True)
class TieredStats(StoreStats):
    """The local store's stats and the Mooncake client's own counters (`shared`: the names
    of telemetry/metrics.py TIER_COUNTERS, `queued_bytes` and `available`), which as_dict() names
    `mooncake_tier_<name>`."""

    shared: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "shared", MappingProxyType(dict(self.shared)))

    def as_dict(self) -> dict:
        return super().as_dict() | {
            f"mooncake_tier_{name}": value for name, value in self.shared.items()
        }


def _value_bound(raw_len: int) -> int:
    return raw_len + (raw_len >> 7) + RECORD_OVERHEAD_BYTES + TAG_BYTES


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
        if tier.value_tag is None and not local.encrypted:
            tier.close(timeout_s=2.0)
            raise ConfigError(f"hicache_galahad option 'mooncake': {NO_SHARED_KEY}")
        self.local = local
        self.tier = tier
        self.counters = local.counters
        self._tag = tier.value_tag  # None: an encrypted store, whose AES-GCM tags vouch
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

    # ------------------------------------------------------------- pins: local only

    def pin(self, namespace: Namespace, keys: list[str], document: str) -> PinResult:
        """RecordStore.pin on the local store: pins are local (this root's eviction keeps the
        records), Mooncake is a cache that evicts what it likes; a key with no local record
        is missing_keys even when Mooncake holds its value."""
        return self.local.pin(namespace, keys, document)

    def unpin(
        self, *, document: str | None = None, tenant: str | None = None, everything: bool = False
    ) -> int:
        """RecordStore.unpin on the local store (pins are local)."""
        return self.local.unpin(document=document, tenant=tenant, everything=everything)

    def pinned_bytes_by_tenant(self, *, cached: bool = False) -> dict[str, int]:
        """The local store's pinned bytes per tenant (pins are local)."""
        return self.local.pinned_bytes_by_tenant(cached=cached)

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
        """Whether the record can be served, checked in full and silently: the local store's
        verify (RecordStore.verify), else the Mooncake value, verified in private memory as
        a read would (the tag, V1-V16) but counted as no get or hit, never written through
        and never removed (the read that serves it decides that)."""
        if self.local.verify(namespace, key, expected_size):
            return True
        if not self.tier.available:
            return False
        name = shared_key(namespace, key)
        value = self.tier.get_many([name], [_value_bound(expected_size)])[0]
        if value is None:
            return False
        _, error = self._open(namespace, key, name, value, expected_size)
        if error is not None:
            self._refused(key, error, removed=False)
        return error is None

    def _fetch(self, namespace: Namespace, keys: list, outs: list) -> list[bool]:
        """Reads `keys` from Mooncake into `outs`; verifies, copies, writes through."""
        segments = [fmt.as_segments(out) for out in outs]
        sizes = [sum(len(piece) for piece in pieces) for pieces in segments]
        names = [shared_key(namespace, key) for key in keys]
        bounds = [_value_bound(size) for size in sizes]
        raws = [None] * len(keys)
        suspects = []  # failed values a peer's write into our read buffer could explain
        for index, value in enumerate(self.tier.get_many(names, bounds)):
            if value is None:
                continue
            raw, error = self._open(namespace, keys[index], names[index], value, sizes[index])
            if error is None:
                raws[index] = raw
            elif self._removable(namespace, error):
                suspects.append(index)
            else:
                self._refused(keys[index], error, removed=False)
        value = None
        if suspects:
            self._look_again(namespace, keys, names, bounds, sizes, suspects, raws)
        results, through_keys, through_raws = [], [], []
        for key, pieces, raw in zip(keys, segments, raws, strict=True):
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

    def _look_again(self, namespace, keys, names, bounds, sizes, suspects, raws) -> None:
        """Reads once more the values that failed in a way that would have them removed.

        Mooncake writes a value into a registered buffer, which any peer can write too: a
        value that failed may be an honest one a peer scribbled over between its transfer and
        our copy. It is removed only if a fresh read (a fresh copy) fails as well; one that
        verifies now is served.
        """
        again = self.tier.get_many([names[i] for i in suspects], [bounds[i] for i in suspects])
        self.counters.add("mooncake_values_read_again", len(suspects))
        for index, value in zip(suspects, again, strict=True):
            if value is None:
                continue  # gone meanwhile: a miss
            raw, error = self._open(namespace, keys[index], names[index], value, sizes[index])
            value = None
            if error is None:
                raws[index] = raw
                self.counters.add("mooncake_good_when_read_again")
                self._warn.warning(
                    "mooncake-read-again",
                    "galahad: a Mooncake value of %s failed, then verified when read again: "
                    "something wrote into this process's registered read buffer",
                    keys[index],
                )
                continue
            removed = self._removable(namespace, error)
            self._refused(keys[index], error, removed=removed)
            if removed:
                self.tier.remove(names[index])

    def flush_write_through(self, timeout_s: float = 30.0) -> bool:
        """Waits until every verified Mooncake value read so far is on the local disk."""
        return self._through.flush(timeout_s)

    def _open(self, namespace: Namespace, key: str, name: str, value, size: int):
        """(the raw page, None) from a Mooncake value in private memory, or (None, the
        FormatError it broke): the integrity tag (M1), then V1-V16 by the local reader, as for
        a record on disk (record/verifier.py: the page size before anything is decompressed,
        a zstd frame's stated size before it is inflated)."""
        try:
            record = self._tag.open(name, value) if self._tag is not None else value
            return self.local.decode_value(namespace, key, record, size), None
        except fmt.FormatError as error:
            return None, error

    def _removable(self, namespace: Namespace, error: fmt.FormatError) -> bool:
        """Whether a value that failed cannot be this namespace's: what the local store would
        quarantine (RecordStore.config_may_explain says no), and also a value of another page
        size (V16) or unsealed in an encrypted store (V12), which a file on the local disk is
        kept for (the reader's settings may differ) but which, under a Mooncake key that names
        this namespace and that any peer can write, is a squatter keeping the honest share out.
        So only an AES-GCM tag that fails before this reader's key opened any record of the
        namespace is left (the key is more likely wrong than the value: it is left for the
        servers whose key it is)."""
        if isinstance(error, SQUATTER_ERRORS):
            return True
        return not self.local.config_may_explain(namespace, error)

    def _refused(self, key: str, error: fmt.FormatError, removed: bool) -> None:
        self.counters.add_many(mooncake_bad_values=1, **{failed(error.rule): 1})
        self._warn.warning(
            f"mooncake-{error.rule}",
            "galahad: Mooncake value of %s failed %s (%s): a miss%s",
            key,
            error.rule,
            error,
            ", removed from Mooncake" if removed else ", left for the servers it may suit",
        )

    # ------------------------------------------------------------- writes

    def put_many(self, namespace: Namespace, keys: list, datas: list) -> list[bool]:
        """The local put; each record it publishes is then shared, from the bytes the writer
        encoded and wrote to its file (writer.py's publish hook). A record found already
        stored is not shared again, nor is a page written through from Mooncake."""
        share = self._share if self.tier.available else None
        return self.local.publish_many(namespace, keys, datas, share)

    def put(self, namespace: Namespace, key: str, data) -> bool:
        return self.put_many(namespace, [key], [data])[0]

    def _share(self, namespace: Namespace, records: list) -> None:
        """The publish hook: queues `record || nonce || tag` (or the sealed record alone) for
        each (key, record pieces) the local writer has just published."""
        for key, pieces in records:
            name = shared_key(namespace, key)
            if self._tag is not None:
                pieces = [*pieces, self._tag.tag(name, pieces)]
            if self.tier.put_async(name, b"".join(pieces)):
                self.counters.add("mooncake_puts_queued")
            else:
                self.counters.add("mooncake_puts_dropped")

    # ------------------------------------------------------------- admin

    def stats(self) -> TieredStats:
        disk = self.local.stats()
        return TieredStats(
            counters=disk.counters,
            ledger_bytes=disk.ledger_bytes,
            indexed_records=disk.indexed_records,
            shared=self.tier.counters(),
        )

    def close(self) -> None:
        try:
            self._through.close(timeout_s=30.0)
            self.tier.close()
        finally:
            self.local.close()
