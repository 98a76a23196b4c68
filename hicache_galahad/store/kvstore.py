"""`KVStore`: the verbs the SGLang backend, the CLI and Blaise use of a store, which both the
local `RecordStore` and the `TieredStore` over it implement (tests/test_kvstore.py checks
that both have every verb, with the same parameters).

Every verb is safe to call from SGLang's prefetch and backup threads at once, and none raises
on a data error: a record that fails a check is a miss (False, None), counted by the store.
Pins (`pin`, `unpin`, `pinned_bytes_by_tenant`) are the local store's in both, so a caller of
them (`galahad warm --pin`, the pin commands) may hold either store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from ..record.namespace import Namespace
from ..telemetry.metrics import COUNTERS, RULE_COUNTERS, Counters
from .pins import PinResult


@dataclass(frozen=True)
class StoreStats:
    """What `KVStore.stats()` returns: a snapshot of the store's counters and sizes.

    `counters` holds the counters counted so far (telemetry/metrics.py declares every name:
    COUNTERS, and failed_<rule> for each rule); `counter(name)` reads one, 0 for a declared
    counter not counted yet and a KeyError for a name that is not declared (a typo fails
    instead of reading 0). `as_dict()` is the flat JSON shape: the counters, then the sizes.
    """

    counters: Mapping[str, int] = field(default_factory=dict)
    ledger_bytes: int = 0  # record bytes the root's shared ledger counts (every process's)
    indexed_records: int = 0  # records in this process's LRU index

    def __post_init__(self):
        object.__setattr__(self, "counters", MappingProxyType(dict(self.counters)))

    def counter(self, name: str) -> int:
        if name not in COUNTERS and name not in RULE_COUNTERS:
            raise KeyError(f"no counter {name!r} (telemetry/metrics.py declares them)")
        return self.counters.get(name, 0)

    def as_dict(self) -> dict:
        return dict(self.counters) | {
            "ledger_bytes": self.ledger_bytes,
            "indexed_records": self.indexed_records,
        }


@runtime_checkable
class KVStore(Protocol):
    counters: Counters  # one set for the store and what is built over it (persisted, exported)

    @property
    def root(self) -> str:
        """The local store's root directory."""

    @property
    def max_bytes(self) -> int | None:
        """The local byte cap (None: the disk's free-space floor only)."""

    def register_namespace(self, namespace: Namespace) -> Namespace:
        """Makes the namespace's directory and description (idempotent)."""

    def contains(self, namespace: Namespace, key: str) -> bool:
        """Whether a record exists (cheap: the read still checks everything)."""

    def leading_run(self, namespace: Namespace, keys: list) -> int:
        """How many keys, from the first, have a record."""

    def get_into(self, namespace: Namespace, key: str, out) -> bool:
        """Fills `out` (a buffer, or a list of buffers in order) with the verified page."""

    def get_many_into(self, namespace: Namespace, keys: list, outs: list) -> list[bool]:
        """get_into for many keys at once."""

    def get(self, namespace: Namespace, key: str, expected_size: int) -> bytes | None:
        """The verified page of `expected_size` bytes, or None."""

    def verify(self, namespace: Namespace, key: str, expected_size: int) -> bool:
        """Whether the record could be served, checked in full; silent (no get counted, no
        recency changed, nothing written through)."""

    def put(self, namespace: Namespace, key: str, data) -> bool:
        """Publishes a page under `key` (a no-op when a sound record is there already)."""

    def put_many(self, namespace: Namespace, keys: list, datas: list) -> list[bool]:
        """put for many keys at once."""

    def clear_namespace(self, namespace: Namespace) -> int:
        """Removes the namespace's local records; how many."""

    def pin(self, namespace: Namespace, keys: list[str], document: str) -> PinResult:
        """Pins the local records of `keys` for `document`: eviction keeps them until unpinned
        (pins are local: a shared tier holds no pins, and a key with no local record is
        missing_keys)."""

    def unpin(
        self, *, document: str | None = None, tenant: str | None = None, everything: bool = False
    ) -> int:
        """Unpins a document's records, a tenant's, or all; the bytes no longer pinned."""

    def pinned_bytes_by_tenant(self, *, cached: bool = False) -> dict[str, int]:
        """The local store's pinned bytes per tenant (`cached`: as last written, one stat)."""

    def stats(self) -> StoreStats:
        """The store's counters and sizes (a tier adds its own: a subclass of StoreStats)."""

    def close(self) -> None:
        """Flushes what is pending and releases every file and thread."""
