"""What is pinned: the namespaces with pins, and the pinned bytes per tenant (exact under
the lock, or as last written for eviction and metrics, which must never wait or raise)."""

from __future__ import annotations

import contextlib
import os

from ..context import StoreContext
from .state import locked, read_state
from .tree import (
    PINS_DIR,
    RECORDS_DIR,
    STATE_FILE,
    Dirs,
    PinsRoot,
    is_count,
    open_pins_dir,
    plain,
    read_json,
)


def pinned_dirnames(root: PinsRoot) -> list[str]:
    """The namespace directories that hold pins (a listing of pins/records)."""
    try:
        pins_fd = root.pins_fd(False)
    except OSError:
        return []
    if pins_fd is None:
        return []
    dirs = Dirs(pins_fd)
    try:
        records_fd = dirs.get(RECORDS_DIR)
        return sorted(n for n in os.listdir(records_fd) if plain(n)) if records_fd else []
    except OSError:
        return []
    finally:
        dirs.close()
        os.close(pins_fd)


def by_tenant(root: PinsRoot) -> dict[str, int]:
    """Pinned bytes per tenant (the state file: O(tenants), never a walk of records; a
    damaged one is counted again, and rewritten unless the store is read-only)."""
    if root.read_only:
        fd = root.pins_fd(False) if os.path.isdir(root.path) else None
        if fd is None:
            return {}
        try:
            state = read_state(root, fd)
        finally:
            os.close(fd)
    else:
        with locked(root, create=False) as (dirs, state):
            if dirs is None:
                return {}
    return {tenant: entry["bytes"] for tenant, entry in sorted(state["tenants"].items())}


class CachedCounts:
    """Pinned bytes per tenant as last written (no lock: one stat, and a read of the small
    state file only when it changed). A state file that is not what state.py writes is
    ignored (the last good counts stay), never raised: the next locked change repairs it.
    It needs only the store's root (not its ledger), so the accounting that evicts around
    the pinned bytes is built after it and before the `Pins`."""

    def __init__(self, context: StoreContext):
        self._store_root = context.root
        self._pins_path = os.path.join(self._store_root, PINS_DIR)
        self._identity: tuple = ()
        self._tenants: dict[str, int] = {}

    def by_tenant(self) -> dict[str, int]:
        path = os.path.join(self._pins_path, STATE_FILE)
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            self._identity, self._tenants = (), {}
            return {}
        identity = (info.st_ino, info.st_mtime_ns, info.st_size)
        if identity == self._identity:
            return self._tenants
        tenants = self._read()
        self._identity = identity  # a hostile file is read once, not on every call
        if tenants is not None:
            self._tenants = tenants
        return self._tenants

    def _read(self) -> dict[str, int] | None:
        data = None
        with contextlib.suppress(OSError):
            pins_fd = open_pins_dir(self._store_root, False)  # never through a link
            if pins_fd is None:
                return {}
            try:
                data = read_json(STATE_FILE, pins_fd)
            finally:
                os.close(pins_fd)
        tenants = data.get("tenants") if isinstance(data, dict) else None
        if not isinstance(tenants, dict):
            return None
        found = {}
        for tenant, entry in tenants.items():
            nbytes = entry.get("bytes") if isinstance(entry, dict) else None
            if not is_count(nbytes):
                return None
            found[tenant] = nbytes
        if sum(found.values()) > _disk_bytes(self._pins_path):
            return None  # more pinned than the filesystem holds: not a count
        return found

    def total_bytes(self) -> int:
        """Pinned bytes of every tenant: what eviction may not take."""
        return sum(self.by_tenant().values())


def _disk_bytes(path: str) -> int:
    try:
        info = os.statvfs(path)
    except OSError:
        return 0
    return info.f_blocks * info.f_frsize
