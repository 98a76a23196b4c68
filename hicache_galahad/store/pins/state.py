"""The JSON state of the pins (`pins/state`: pinned bytes and records per tenant) and its
journal, under the `pins/lock` flock.

    {"tenants": {"<tenant>": {"bytes": B, "records": N}, ...},
     "journal": null | {"op": "pin" | "unpin" | "drop" | "all", "doc": D,
                        "items": [[dirname, filename, kind, bytes, tenant], ...]},
     "limit_bytes": L}                    the last pin limit applied on this root (limits.py)

Every change is journaled in `state` first (an atomic replace of a temp file created
exclusively under a random name), done, then counted with the same replace that clears the
journal. A process killed in between leaves the journal, and the next one to take the lock
finishes or undoes what it names from what the disk shows, so the counts stay exact across
SIGKILL. The file is hostile input: a value that is not what this module writes (a float, a
count past MAX_COUNT, deep nesting, a journal item of the wrong types, a FIFO or a link at its
name), or counts above the ledger's committed bytes, make it damaged, and the counts are taken
again from the pin files and the disk (`recount`), never raised.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from typing import NamedTuple

from ..layout import accounted_bytes, is_record_name
from ..safe_files import open_regular, replace_file
from .tree import (
    DOCS_DIR,
    LOCK_FILE,
    RECORDS_DIR,
    REFS_DIR,
    STATE_FILE,
    TEMP_SUFFIX,
    Dirs,
    PinsRoot,
    is_count,
    plain,
    read_json,
    read_pin,
    remove_temps,
    stat_at,
    unlink_at,
)

JOURNAL_KINDS = ("new", "last", "drop")


class JournalItem(NamedTuple):
    """One record a journaled change names (on disk: a 5-element list, in this order)."""

    dirname: str
    filename: str
    kind: str  # "new" (being pinned), "last" (its last document unpinned), "drop" (stale)
    nbytes: int
    tenant: str

    @classmethod
    def parse(cls, raw) -> JournalItem | None:
        """The item, or None when it is not one this package writes."""
        if not isinstance(raw, list) or len(raw) != 5:
            return None
        item = cls(*raw)
        valid = (
            plain(item.dirname)
            and isinstance(item.filename, str)
            and is_record_name(item.filename)
            and item.kind in JOURNAL_KINDS
            and is_count(item.nbytes)
            and isinstance(item.tenant, str)
        )
        return item if valid else None


def _valid_tenants(tenants) -> bool:
    return isinstance(tenants, dict) and all(
        isinstance(entry, dict) and is_count(entry.get("bytes")) and is_count(entry.get("records"))
        for entry in tenants.values()
    )


def read_state(root: PinsRoot, pins_fd: int, repair: bool = False) -> dict:
    """The state file; when it is missing or damaged, counted again from the pin files
    (see recount), so the counts are never lost with it."""
    data = read_json(STATE_FILE, pins_fd)
    valid = isinstance(data, dict) and _valid_tenants(data.get("tenants"))
    if valid and not repair and state_total(data) > root.ledger.committed():
        valid = False  # (under the lock, _take_over checks it after the journal)
    if not valid:
        data = recount(root, pins_fd, repair)
    journal = data.get("journal")
    data["journal"] = journal if isinstance(journal, dict) else None
    if not is_count(data.get("limit_bytes")):
        data.pop("limit_bytes", None)
    return data


def recount(root: PinsRoot, pins_fd: int, repair: bool) -> dict:
    """The counts from the pin files themselves: a walk of pins/refs, only when the state
    file is missing or damaged (never on a put, an eviction or at open). A pin file that no
    document links, or that has no record link, is a change killed midway, and a pin whose
    record left its namespace is stale: with `repair` (under the lock) each is finished as
    the journal or drop_stale would have (removed, with its record link); neither is
    counted then. Each pin counts its record link's bytes on disk at most."""
    tenants: dict = {}
    dirs = Dirs(pins_fd)
    try:
        for top in (REFS_DIR, RECORDS_DIR):
            top_fd = dirs.get(top)
            for dirname in os.listdir(top_fd) if top_fd is not None else []:
                if plain(dirname):
                    _recount_namespace(root, dirs, top, dirname, tenants, repair)
    finally:
        dirs.close()
    return {"tenants": tenants, "journal": None, "recounted": True}


def _recount_namespace(root, dirs: Dirs, top: str, dirname: str, tenants: dict, repair: bool):
    refs_fd, records_fd = dirs.get(REFS_DIR, dirname), dirs.get(RECORDS_DIR, dirname)
    own_fd = refs_fd if top == REFS_DIR else records_fd
    ns_fd = None
    if repair:
        with contextlib.suppress(OSError):
            ns_fd = root.layout.namespace_fd(dirname)
    for name in os.listdir(own_fd) if own_fd is not None else []:
        ref, link = stat_at(name, refs_fd), stat_at(name, records_fd)
        whole = ref is not None and ref.st_nlink >= 2 and link is not None
        if whole and repair and top == REFS_DIR:
            there = stat_at(name, ns_fd)
            whole = there is not None and there.st_ino == link.st_ino  # else stale
        if not whole:
            if repair:
                unlink_at(name, records_fd)
                unlink_at(name, refs_fd)
            continue
        if top == RECORDS_DIR:
            continue  # counted from refs
        pin = read_pin(name, refs_fd, link)
        entry = tenants.setdefault(pin.tenant, {"bytes": 0, "records": 0})
        entry["bytes"] += pin.nbytes
        entry["records"] += 1


def write_state(root: PinsRoot, dirs: Dirs, state: dict) -> None:
    """Replaces pins/state atomically: a temp file created exclusively under a random name
    (a planted link at any name is never written through), renamed over it."""
    pins_fd = dirs.pins_fd
    raw = json.dumps(state, sort_keys=True).encode()
    replace_file(STATE_FILE, raw, dir_fd=pins_fd, temp_suffix=TEMP_SUFFIX, durable=root.durable)
    if root.durable:
        os.fsync(pins_fd)


def count(state: dict, tenant: str, nbytes: int, records: int) -> None:
    entry = state["tenants"].setdefault(tenant, {"bytes": 0, "records": 0})
    entry["bytes"] = max(0, entry["bytes"] + nbytes)
    entry["records"] = max(0, entry["records"] + records)
    if not entry["records"]:
        del state["tenants"][tenant]


def state_total(state: dict) -> int:
    return sum(entry["bytes"] for entry in state["tenants"].values())


def journal(root: PinsRoot, dirs: Dirs, state: dict, change: dict) -> None:
    """Writes the change about to be made (recover() finishes or undoes it after a kill)."""
    state["journal"] = change
    write_state(root, dirs, state)


def settle(root: PinsRoot, dirs: Dirs, state: dict, changed: list[tuple]) -> None:
    """Clears the journal with the new counts, once the links of `changed` directories
    are durable (a power loss then finds the journal, or links and counts that agree)."""
    if root.durable:
        dirs.fsync(changed)
    state["journal"] = None
    write_state(root, dirs, state)


def recover(dirs: Dirs, state: dict) -> bool:
    """Finishes (or undoes) the journaled change from what the disk shows. False when the
    journal is not one this package writes (its valid items are still applied): the caller
    then counts again from the disk."""
    change, state["journal"] = state.get("journal"), None
    if not isinstance(change, dict):
        return change is None
    if change.get("op") == "all":
        dirs.remove_everything()
        state["tenants"] = {}
        return True
    doc, items = change.get("doc"), change.get("items")
    whole = change.get("op") in ("pin", "unpin", "drop") and isinstance(items, list)
    whole = whole and (doc is None or plain(doc))
    for raw in items if isinstance(items, list) else []:
        item = JournalItem.parse(raw)
        if item is None:
            whole = False
        else:
            _recover_item(dirs, state, item, doc if plain(doc) else None)
    return whole


def _recover_item(dirs: Dirs, state: dict, item: JournalItem, doc: str | None) -> None:
    refs_fd = dirs.get(REFS_DIR, item.dirname)
    records_fd = dirs.get(RECORDS_DIR, item.dirname)
    doc_fd = dirs.get(DOCS_DIR, doc, item.dirname) if doc else None
    if item.kind == "new":
        ref, link = stat_at(item.filename, refs_fd), stat_at(item.filename, doc_fd)
        if ref is not None and link is not None and link.st_ino == ref.st_ino:
            record = stat_at(item.filename, records_fd)
            nbytes = item.nbytes if record is None else min(item.nbytes, accounted_bytes(record))
            count(state, item.tenant, nbytes, 1)  # it was pinned: count it
        else:  # never pinned: undo
            unlink_at(item.filename, records_fd)
            unlink_at(item.filename, refs_fd)
        return
    if item.kind == "last":
        unlink_at(item.filename, doc_fd)
    unlink_at(item.filename, records_fd)
    unlink_at(item.filename, refs_fd)
    count(state, item.tenant, -item.nbytes, -1)


class LockBusy(Exception):
    """The pins lock is held elsewhere and the caller asked not to wait for it."""


@contextlib.contextmanager
def locked(root: PinsRoot, create: bool = True, wait: bool = True):
    """(dirs, state) under the pins lock, after finishing a dead process's change; (None,
    None) when pins/ is not there and not `create`d. Without `wait`, LockBusy at once when
    another thread or process holds it (a read's pin drop never waits: stale.py)."""
    if root.read_only:
        raise OSError(errno.EROFS, "the store is open read-only", root.path)
    if not root.thread_lock.acquire(blocking=wait):
        raise LockBusy()
    try:
        pins_fd = root.pins_fd(create)
        if pins_fd is None:
            yield None, None
            return
        dirs = Dirs(pins_fd)
        lock_fd = None
        try:
            lock_fd = open_regular(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644, dir_fd=pins_fd)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise LockBusy() from None
            state = _take_over(root, dirs)
            try:
                yield dirs, state
            finally:
                if state.get("journal"):  # an exception in the middle: undone or done now
                    with contextlib.suppress(OSError):
                        recover(dirs, state)
                        write_state(root, dirs, state)
        finally:
            if lock_fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
                os.close(lock_fd)
            dirs.close()
            os.close(pins_fd)
    finally:
        root.thread_lock.release()


def _take_over(root: PinsRoot, dirs: Dirs) -> dict:
    """The state as the lock's new holder finds it: temp files of processes that died
    removed, a journal finished, a recount written."""
    remove_temps(f"{STATE_FILE}.", dirs.pins_fd)
    state = read_state(root, dirs.pins_fd, repair=True)
    changed = state.pop("recounted", False)
    whole = True
    if state["journal"]:
        whole = recover(dirs, state)
        changed = True
    if not whole or state_total(state) > root.ledger.committed():  # what the disk says
        limit = state.get("limit_bytes")
        state = recount(root, dirs.pins_fd, repair=True)  # (stale pins dropped on the way)
        changed = state.pop("recounted")
        if limit is not None:
            state["limit_bytes"] = limit
    if changed:
        write_state(root, dirs, state)
    return state
