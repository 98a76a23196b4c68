"""Pinning: a document's records linked under `pins/`, journaled, within the pin limit.

For each batch of keys: the pin files first (nothing protects the record yet), then the
record links under the ledger's lock (eviction holds it from the check of a victim to its
unlink, so a record is either evicted before it is linked, then reported missing, or kept),
then the document's links of the pin files, then the counts with the journal cleared.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from ...record.namespace import Namespace
from ..layout import accounted_bytes, record_filename
from ..safe_files import OPEN_FLAGS, replace_file
from .limits import PinLimits
from .state import count, journal, locked, settle, state_total
from .tree import (
    BATCH,
    DOCS_DIR,
    MANIFEST,
    RECORDS_DIR,
    REFS_DIR,
    TEMP_SUFFIX,
    Dirs,
    PinsRoot,
    document_id,
    read_json,
    remove_temps,
    stat_at,
    unlink_at,
)


@dataclass
class PinResult:
    """What `RecordStore.pin` did for one document.

    pinned_records: keys this call pinned for the document (a record another document
        already pinned counts here too; its bytes were counted already).
    already_pinned_records: keys the document had pinned already.
    missing_keys: keys with no record in the namespace (never stored, or evicted before).
    refused_keys: keys not pinned because `max_pinned_bytes` would have been passed.
    pinned_bytes: bytes newly counted as pinned (records no document pinned before).
    """

    pinned_records: int = 0
    already_pinned_records: int = 0
    missing_keys: list[str] = field(default_factory=list)
    refused_keys: list[str] = field(default_factory=list)
    pinned_bytes: int = 0

    @property
    def complete(self) -> bool:
        return not self.missing_keys and not self.refused_keys

    def as_dict(self) -> dict:
        return {
            "pinned_records": self.pinned_records,
            "already_pinned_records": self.already_pinned_records,
            "missing_keys": list(self.missing_keys),
            "refused_keys": list(self.refused_keys),
            "pinned_bytes": self.pinned_bytes,
        }


class _NewPin(NamedTuple):
    """A record no document pins yet: its pin file and record link are made."""

    key: str
    filename: str
    inode: int  # the record's, when it was found (a record replaced since is missing)
    nbytes: int
    stale_doc_link: bool  # the document still links a pin since dropped


class _MorePin(NamedTuple):
    """A record another document pins: one more link of its pin file."""

    key: str
    filename: str
    stale_doc_link: bool


class _BatchDirs(NamedTuple):
    refs_fd: int
    records_fd: int
    doc_fd: int
    ns_fd: int


def pin(root: PinsRoot, namespace: Namespace, keys: list[str], document: str, limits: PinLimits):
    """Pins the records of `keys` (namespace `namespace`) for `document` (its label)."""
    result = PinResult()
    doc = document_id(document)
    with locked(root) as (dirs, state):
        limit_bytes = limits.applied(state)
        write_manifest(root, dirs, doc, document, namespace.dirname, namespace.tenant)
        for start in range(0, len(keys), BATCH):
            batch = keys[start : start + BATCH]
            _pin_batch(root, dirs, state, namespace, batch, doc, result, limit_bytes)
        if root.durable:
            dirs.fsync_touched()
    if result.refused_keys:
        root.counters.add("pins_refused", len(result.refused_keys))
    return result


def write_manifest(root: PinsRoot, dirs: Dirs, doc: str, label: str, dirname: str, tenant: str):
    """Adds namespace `dirname` (of `tenant`) to the document's manifest."""
    doc_fd = dirs.get(DOCS_DIR, doc, create=True)
    remove_temps(f"{MANIFEST}.", doc_fd)
    manifest = read_json(MANIFEST, doc_fd)
    now_s = time.time()
    if not isinstance(manifest, dict) or not isinstance(manifest.get("namespaces"), dict):
        manifest = {"label": label, "namespaces": {}, "pinned_s": now_s}
    if manifest["namespaces"].get(dirname) == tenant:
        return
    manifest["namespaces"][dirname] = tenant
    manifest["updated_s"] = now_s
    replace_manifest(root, doc_fd, manifest)
    dirs.touched.add((DOCS_DIR, doc))


def replace_manifest(root: PinsRoot, doc_fd: int, manifest: dict) -> None:
    """Replaces a document's manifest atomically, through a temp file created exclusively
    under a random name (renamed before the pins lock is released: one found there was left
    by a process that died, and is removed by write_manifest or unpin)."""
    raw = json.dumps(manifest, sort_keys=True).encode()
    replace_file(MANIFEST, raw, dir_fd=doc_fd, temp_suffix=TEMP_SUFFIX, durable=root.durable)


def _pin_batch(root, dirs, state, namespace, keys, doc, result: PinResult, limit_bytes):
    dirname, tenant = namespace.dirname, namespace.tenant
    refs_fd = dirs.get(REFS_DIR, dirname, create=True)
    records_fd = dirs.get(RECORDS_DIR, dirname, create=True)
    doc_fd = dirs.get(DOCS_DIR, doc, dirname, create=True)
    try:
        ns_fd = root.layout.namespace_fd(dirname)
    except OSError:
        result.missing_keys.extend(keys)
        return
    fds = _BatchDirs(refs_fd, records_fd, doc_fd, ns_fd)
    new, more = _sort_keys(keys, fds, state_total(state), limit_bytes, result)
    if new:
        items = [[dirname, pin.filename, "new", pin.nbytes, tenant] for pin in new]
        journal(root, dirs, state, {"op": "pin", "doc": doc, "items": items})
    made = [_make_pin_file(pin, refs_fd, tenant) for pin in new]
    linked = _link_records(root, made, fds)
    for pin in made:
        if pin not in linked:
            result.missing_keys.append(pin.key)
            unlink_at(pin.filename, refs_fd)
    for pin in more:
        _link_document(pin, fds)
        result.pinned_records += 1
    for pin in linked:
        _link_document(pin, fds)
        result.pinned_records += 1
        result.pinned_bytes += pin.nbytes
        count(state, tenant, pin.nbytes, 1)
    if new:
        changed = [(REFS_DIR, dirname), (RECORDS_DIR, dirname), (DOCS_DIR, doc, dirname)]
        settle(root, dirs, state, changed)
    dirs.touched.add((DOCS_DIR, doc, dirname))


def _sort_keys(keys, fds: _BatchDirs, total_bytes: int, limit_bytes, result: PinResult):
    """(new pins, more references) of a batch; the rest goes to `result` (already pinned,
    missing, refused past `limit_bytes` of pinned bytes in all)."""
    new: list[_NewPin] = []
    more: list[_MorePin] = []
    seen = set()
    for key in keys:
        filename = record_filename(key)
        if filename in seen:
            result.already_pinned_records += 1
            continue
        seen.add(filename)
        ref, link = stat_at(filename, fds.refs_fd), stat_at(filename, fds.doc_fd)
        if ref is not None and link is not None and link.st_ino == ref.st_ino:
            result.already_pinned_records += 1
            continue
        if ref is not None:  # pinned by another document: one more reference
            there, pinned = stat_at(filename, fds.ns_fd), stat_at(filename, fds.records_fd)
            if there is None or pinned is None or there.st_ino != pinned.st_ino:
                result.missing_keys.append(key)  # its record left (dropped soon)
            else:
                more.append(_MorePin(key, filename, link is not None))
            continue
        info = stat_at(filename, fds.ns_fd)
        if info is None or not stat.S_ISREG(info.st_mode):
            result.missing_keys.append(key)
            continue
        size = accounted_bytes(info)
        if limit_bytes is not None and total_bytes + size > limit_bytes:
            result.refused_keys.append(key)
            continue
        total_bytes += size
        new.append(_NewPin(key, filename, info.st_ino, size, link is not None))
    return new, more


def _make_pin_file(pin: _NewPin, refs_fd: int, tenant: str) -> _NewPin:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS
    try:
        fd = os.open(pin.filename, flags, 0o644, dir_fd=refs_fd)
    except FileExistsError:  # left by an undo that could not finish: made again
        unlink_at(pin.filename, refs_fd)
        fd = os.open(pin.filename, flags, 0o644, dir_fd=refs_fd)
    try:
        os.write(fd, json.dumps({"b": pin.nbytes, "t": tenant}).encode())
    finally:
        os.close(fd)
    return pin


def _link_records(root: PinsRoot, made: list[_NewPin], fds: _BatchDirs) -> list[_NewPin]:
    """Links each record under pins/records/, under the ledger's lock (eviction waits);
    the pins whose record is still the one found."""
    linked: list[_NewPin] = []

    def link_all(_journal) -> int:
        for pin in made:
            info = stat_at(pin.filename, fds.ns_fd)
            if info is None or info.st_ino != pin.inode or not stat.S_ISREG(info.st_mode):
                continue  # evicted or replaced since: missing
            unlink_at(pin.filename, fds.records_fd)  # a stale link of an older record
            try:
                os.link(
                    pin.filename,
                    pin.filename,
                    src_dir_fd=fds.ns_fd,
                    dst_dir_fd=fds.records_fd,
                    follow_symlinks=False,
                )
            except OSError:
                continue
            linked.append(pin)
        return 0

    if made:
        root.ledger.apply(link_all)
    return linked


def _link_document(pin: _NewPin | _MorePin, fds: _BatchDirs) -> None:
    if pin.stale_doc_link:
        unlink_at(pin.filename, fds.doc_fd)  # a document's link to a pin since dropped
    os.link(pin.filename, pin.filename, src_dir_fd=fds.refs_fd, dst_dir_fd=fds.doc_fd)
