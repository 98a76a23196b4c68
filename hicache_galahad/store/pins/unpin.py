"""Unpinning: a document's links removed (by document, by tenant, or everything); a record's
pin and record link go with its last document, journaled, its bytes uncounted."""

from __future__ import annotations

import contextlib
import os

from .pin import replace_manifest
from .state import count, journal, locked, settle, state_total
from .tree import (
    BATCH,
    DOCS_DIR,
    MANIFEST,
    RECORDS_DIR,
    REFS_DIR,
    Dirs,
    PinsRoot,
    document_id,
    is_doc_id,
    plain,
    read_json,
    read_pin,
    remove_temps,
    stat_at,
    unlink_at,
)


def unpin(
    root: PinsRoot, *, document: str | None = None, tenant: str | None = None, everything=False
) -> int:
    """Bytes no longer pinned. By document (its label), by tenant (every document's
    namespaces of that tenant), or everything; document and tenant together: that
    document's namespaces of that tenant."""
    if not everything and document is None and tenant is None:
        raise ValueError("unpin needs a document, a tenant or everything")
    with locked(root, create=False) as (dirs, state):
        if dirs is None:
            return 0
        if everything:
            released = state_total(state)
            journal(root, dirs, state, {"op": "all"})
            dirs.remove_everything()
            state["tenants"] = {}
            settle(root, dirs, state, [()])
            return released
        docs_fd = dirs.get(DOCS_DIR)
        if docs_fd is None:
            return 0
        docs = [document_id(document)] if document is not None else sorted(os.listdir(docs_fd))
        return sum(
            _unpin_document(root, dirs, state, doc, tenant) for doc in docs if is_doc_id(doc)
        )


def _unpin_document(root: PinsRoot, dirs: Dirs, state: dict, doc: str, tenant) -> int:
    doc_fd = dirs.get(DOCS_DIR, doc)
    if doc_fd is None:
        return 0
    manifest = read_json(MANIFEST, doc_fd)
    namespaces = manifest.get("namespaces", {}) if isinstance(manifest, dict) else {}
    namespaces = namespaces if isinstance(namespaces, dict) else {}
    released = 0
    for dirname in sorted(os.listdir(doc_fd)):
        if dirname == MANIFEST or dirname.startswith(MANIFEST + "."):
            continue
        if tenant is not None and namespaces.get(dirname) != tenant:
            continue
        released += _unpin_namespace(root, dirs, state, doc, dirname)
        with contextlib.suppress(OSError):
            os.rmdir(dirname, dir_fd=doc_fd)
        namespaces.pop(dirname, None)
    left = [name for name in os.listdir(doc_fd) if not name.startswith(MANIFEST)]
    if not left:
        for name in os.listdir(doc_fd):  # the manifest, and temps of processes that died
            unlink_at(name, doc_fd)
        dirs.forget(DOCS_DIR, doc)
        with contextlib.suppress(OSError):
            os.rmdir(doc, dir_fd=dirs.get(DOCS_DIR))
    elif isinstance(manifest, dict):
        remove_temps(f"{MANIFEST}.", doc_fd)
        manifest["namespaces"] = namespaces
        replace_manifest(root, doc_fd, manifest)
    if root.durable:
        dirs.touched.add((DOCS_DIR,))
        dirs.fsync_touched()
    return released


def _unpin_namespace(root: PinsRoot, dirs: Dirs, state: dict, doc: str, dirname: str) -> int:
    if not plain(dirname):
        return 0
    links_fd = dirs.get(DOCS_DIR, doc, dirname)
    if links_fd is None:
        return 0
    refs_fd = dirs.get(REFS_DIR, dirname)
    records_fd = dirs.get(RECORDS_DIR, dirname)
    names = sorted(os.listdir(links_fd))
    released = 0
    for start in range(0, len(names), BATCH):
        last, other = [], []
        for filename in names[start : start + BATCH]:
            link = stat_at(filename, links_fd)
            ref = stat_at(filename, refs_fd)
            if link is None:
                continue
            if ref is None or ref.st_ino != link.st_ino or ref.st_nlink > 2:
                other.append(filename)  # another document keeps it, or a dropped pin
                continue
            last.append((filename, read_pin(filename, refs_fd, stat_at(filename, records_fd))))
        if last:
            items = [[dirname, f, "last", pin.nbytes, pin.tenant] for f, pin in last]
            journal(root, dirs, state, {"op": "unpin", "doc": doc, "items": items})
        for filename in other:
            unlink_at(filename, links_fd)
        for filename, pin in last:
            unlink_at(filename, links_fd)
            unlink_at(filename, records_fd)
            unlink_at(filename, refs_fd)
            count(state, pin.tenant, -pin.nbytes, -1)
            released += pin.nbytes
        if last:
            changed = [(DOCS_DIR, doc, dirname), (RECORDS_DIR, dirname), (REFS_DIR, dirname)]
            settle(root, dirs, state, changed)
    return released
