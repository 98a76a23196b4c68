"""One stat of a record file, through its namespace's held descriptor: there, which, pinned.

What eviction, deletions and the ledger's journal recovery ask of a record file without
opening it. A name that is no regular file (or an empty one) is no record here.
"""

from __future__ import annotations

import os

from .layout import StoreLayout, accounted_bytes
from .pins.tree import PINS_DIR, RECORDS_DIR


def stat_record(layout: StoreLayout, dirname: str, filename: str) -> os.stat_result | None:
    try:
        info = os.stat(filename, dir_fd=layout.namespace_fd(dirname), follow_symlinks=False)
    except OSError:
        return None
    return info if accounted_bytes(info) or info.st_size == 0 else None


def record_inode(layout: StoreLayout, dirname: str | None, filename: str) -> int | None:
    """The inode at a record's name (dirname None: a quarantined file), or None."""
    try:
        if dirname is None:
            info = os.stat(os.path.join(layout.quarantine_dir, filename), follow_symlinks=False)
        else:
            info = os.stat(filename, dir_fd=layout.namespace_fd(dirname), follow_symlinks=False)
    except OSError:
        return None
    return info.st_ino if accounted_bytes(info) or info.st_size == 0 else None


def is_pinned(root: str, dirname: str, filename: str, info: os.stat_result) -> bool:
    """Whether pins/ pins this record file: its link under pins/records (one stat, only
    for a file with a second link). A link made elsewhere (a `cp -al` backup, a
    writer's temp name) is no pin."""
    if info.st_nlink < 2:
        return False
    path = os.path.join(root, PINS_DIR, RECORDS_DIR, dirname, filename)
    try:
        pin = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return pin.st_ino == info.st_ino and pin.st_dev == info.st_dev
