"""Pins: records that eviction keeps, shared by every process on a root (issue 23).

A record is pinned when its file has a second link (the one under `pins/records/`, tree.py
has the layout): eviction's sample reads `st_nlink` from the stat it already makes, so a pin
costs eviction no system call, and no process reads a list of pins. The pin file's link
count, not the record's, is the reference count across documents: the record's own count
also holds a writer's temp file for the instant between its link(2) and its unlink
(writer.py), or for longer when that writer was killed, so it cannot count documents; the
pin file is linked by this package only, under the lock. A transient second link of the
record only keeps it from eviction for that instant (the safe side).

    tree.py      the tree of pins/, its names, the directories opened without links
    state.py     the JSON state (bytes per tenant), its journal, the lock and recovery
    pin.py       pinning a document's records (PinResult)
    limits.py    the pin limit of the root (the smallest of the live stores')
    unpin.py     unpinning by document, tenant or everything
    stale.py     dropping the pins of records that left (deferred when the lock is busy)
    queries.py   what is pinned: namespaces, bytes per tenant (cached for eviction)

`Pins` is the store's handle on them (RecordStore.pins).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable

from ...errors import ConfigError, PinsDirError
from ...record.namespace import Namespace
from ..context import StoreContext
from . import queries
from .limits import PinLimits
from .pin import PinResult, pin
from .queries import CachedCounts
from .stale import DeferredDrops, drop_stale
from .tree import PINS_DIR, PinsRoot, document_id
from .unpin import unpin

__all__ = ["PINS_DIR", "CachedCounts", "PinResult", "Pins", "PinsDirError", "document_id"]


class Pins:
    """The pins of one store root (see the package's docstring)."""

    def __init__(
        self,
        context: StoreContext,
        ledger,
        *,
        token: str,
        counts: queries.CachedCounts,
        live_limits: Callable[[], Iterable] = tuple,
    ):
        """`ledger` and `token`: the store's ledger and this process's token (pins link
        records under the ledger's journal); `counts`: the pinned bytes as last written (built
        first: the accounting needs them); `live_limits`: the pin limits of the live stores
        on the root (this store's own: its options' pin_limit_bytes)."""
        self.root = PinsRoot(context, ledger, token)
        self.path = self.root.path
        self.limits = PinLimits(context.options.pin_limit_bytes, live_limits)
        self.deferred = DeferredDrops(self.root)
        self._cached = counts
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as error:
            raise ConfigError(
                f"hicache_galahad option 'root': {self.path!r} cannot be read ({error}); "
                "expected a real directory"
            ) from error
        if not stat.S_ISDIR(info.st_mode):
            raise ConfigError(
                f"hicache_galahad option 'root': {self.path!r} is a symbolic link or not a "
                "directory; expected a real directory"
            )

    @property
    def max_pinned_bytes(self) -> int | None:
        """This process's own limit (a pin also applies the live stores' limits)."""
        return self.limits.own_bytes

    def pin(self, namespace: Namespace, keys: list[str], document: str) -> PinResult:
        return pin(self.root, namespace, keys, document, self.limits)

    def unpin(
        self, *, document: str | None = None, tenant: str | None = None, everything: bool = False
    ) -> int:
        """Bytes no longer pinned (unpin.unpin)."""
        return unpin(self.root, document=document, tenant=tenant, everything=everything)

    def drop_stale(self, dirname: str, filenames=None, *, wait: bool = True) -> int:
        """Drops the pins of records that left namespace `dirname` (stale.drop_stale); without
        `wait` (SGLang's read path) it never waits for the pins lock: deferred when busy."""
        if not wait:
            return self.deferred.drop(dirname, filenames)
        return drop_stale(self.root, dirname, filenames)

    def pinned_dirnames(self) -> list[str]:
        return queries.pinned_dirnames(self.root)

    def by_tenant(self) -> dict[str, int]:
        return queries.by_tenant(self.root)

    def cached_by_tenant(self) -> dict[str, int]:
        """Pinned bytes per tenant as last written, without the lock (for metrics)."""
        return self._cached.by_tenant()

    def total_bytes(self) -> int:
        """Pinned bytes of every tenant, as last written: what eviction may not take."""
        return self._cached.total_bytes()

    def close(self) -> None:
        """Stops the deferred drops (one last try without waiting)."""
        self.deferred.close()
