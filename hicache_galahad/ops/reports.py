"""What the operator's commands compute, as data (cli.py prints it).

Everything goes through a store's operator verbs (store/admin.py's StoreAdmin): read-only
commands open the store read-only (nothing on disk changes, not even a modification time), and
deletions go through it so that the ledger and the eviction index stay right while servers use
the same root.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field

from ..record import format as fmt
from ..store import StoreAdmin
from ..store.layout import FileEntry

PIN_DROP_BATCH = 4096  # purged records whose pins are dropped in one locked change
DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration_s(text: str) -> float:
    """'90s', '15m', '12h', '7d', '2w' (or a plain number of seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(text))
    if not match:
        raise ValueError(f"expected a duration such as 12h, 7d or 2w, got {text!r}")
    return float(match.group(1)) * DURATION_UNITS_S[match.group(2) or "s"]


# ----------------------------------------------------------------------------- stats


@dataclass
class NamespaceStats:
    dirname: str
    tenant: str | None
    model_fingerprint: str | None
    pool: str | None
    rank: str | None = None
    records: int = 0
    disk_bytes: int = 0
    logical_bytes: int = 0
    unreadable_headers: int = 0
    oldest_s: float | None = None
    newest_s: float | None = None

    @property
    def compression_ratio(self) -> float | None:
        return self.logical_bytes / self.disk_bytes if self.disk_bytes else None

    def add(self, entry: FileEntry, raw_len: int | None) -> None:
        """A record file; `raw_len` is None when its header cannot be parsed (it holds no
        page this store could serve: 0 logical bytes)."""
        self.records += 1
        self.disk_bytes += entry.accounted_bytes  # as the ledger counts it (sparse files)
        if raw_len is None:
            self.unreadable_headers += 1
        else:
            self.logical_bytes += raw_len
        mtime_s = entry.mtime_ns / 1e9
        self.oldest_s = mtime_s if self.oldest_s is None else min(self.oldest_s, mtime_s)
        self.newest_s = mtime_s if self.newest_s is None else max(self.newest_s, mtime_s)

    def as_dict(self) -> dict:
        return {
            "namespace": self.dirname,
            "tenant": self.tenant,
            "model_fingerprint": self.model_fingerprint,
            "pool": self.pool,
            "rank": self.rank,
            "records": self.records,
            "disk_bytes": self.disk_bytes,
            "logical_bytes": self.logical_bytes,
            "unreadable_headers": self.unreadable_headers,
            "compression_ratio": self.compression_ratio,
            "oldest_record_s": self.oldest_s,
            "newest_record_s": self.newest_s,
        }


_KINDS = {
    stat.S_IFIFO: "fifo",
    stat.S_IFDIR: "directory",
    stat.S_IFLNK: "symbolic link",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
}


def not_a_record(entry: FileEntry) -> str | None:
    """What a scanned entry is when it is not a regular file (it is no record), else None."""
    try:
        mode = os.lstat(entry.path).st_mode
    except OSError:
        return None  # gone since the scan
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _raw_len(admin: StoreAdmin, entry: FileEntry) -> int | None:
    """The raw page size a record's header declares (its structural rules only)."""
    try:
        return admin.file_header(entry.path).raw_len
    except (OSError, fmt.FormatError):
        return None


def rank_of(namespace) -> str | None:
    """The parallel rank a namespace's description holds ("tp 3/8", "tp 0/2 pp 1/2"), "all"
    when its records are shared by every rank (MLA KV: tp_rank null), None when it names none."""
    parallel = namespace.geometry.get("parallel") if namespace is not None else None
    if not isinstance(parallel, dict):
        return None
    parts = []
    for axis in ("tp", "pp"):
        size = parallel.get(f"{axis}_size")
        if f"{axis}_rank" in parallel and isinstance(size, int) and size > 1:
            rank = parallel[f"{axis}_rank"]
            parts.append(f"{axis} {'all' if rank is None else rank}/{size}")
    if parts:
        return " ".join(parts)
    return "0" if "tp_rank" in parallel else None


def _namespace_stats(dirname: str, namespace) -> NamespaceStats:
    return NamespaceStats(
        dirname,
        namespace.tenant if namespace else None,
        namespace.model_fingerprint if namespace else None,
        namespace.pool if namespace else None,
        rank_of(namespace),
    )


def namespace_stats(
    admin: StoreAdmin, unreadable=None, not_records: list | None = None
) -> list[NamespaceStats]:
    """Per namespace: its record files (regular files only; anything else under a record's
    name is appended to `not_records` as (path, kind)). A walk of every record, reading each
    one's header: `galahad stats --exact` only."""
    found = []
    for dirname, namespace in admin.namespaces_on_disk(unreadable):
        stats = _namespace_stats(dirname, namespace)
        for entry in admin.record_files([dirname], unreadable):
            kind = not_a_record(entry)
            if kind is not None:
                if not_records is not None:
                    not_records.append((entry.path, kind))
                continue
            stats.add(entry, _raw_len(admin, entry))
        found.append(stats)
    return found


def ledger_namespace_stats(admin: StoreAdmin, unreadable=None) -> list[NamespaceStats] | None:
    """Per namespace, what the ledger keeps (store/ledger.py): no record directory is read,
    only the list of namespace directories and their descriptions. None when the ledger's
    counts are not complete (a ledger written before they existed, or found wrong)."""
    counts = admin.namespace_counts()
    if counts is None:
        return None
    found = []
    for dirname, namespace in admin.namespaces_on_disk(unreadable):
        stats = _namespace_stats(dirname, namespace)
        count = counts.get(dirname)
        if count is not None:
            stats.records = count.records
            stats.disk_bytes = count.disk_bytes
            stats.logical_bytes = count.logical_bytes
            stats.newest_s = count.newest_ns / 1e9 if count.newest_ns else None
        found.append(stats)
    return found


def stats_report(admin: StoreAdmin, *, exact: bool = False) -> dict:
    """What `galahad stats` shows. From the ledger's namespace counts (no record read, the
    same time at any size) unless `exact` or the counts are not complete: then a walk of
    every record (`counts`: "walk"), which also finds the oldest record of each namespace,
    unparsable headers and files that are no record. The eviction order's figures come from
    its logs and a fixed sample of their entries (RecordStore.eviction_order)."""
    unreadable_dirs, not_records = [], []

    def unreadable(path, error):
        unreadable_dirs.append(path)

    namespaces = None if exact else ledger_namespace_stats(admin, unreadable)
    source = "ledger"
    if namespaces is None:
        unreadable_dirs.clear()
        namespaces = namespace_stats(admin, unreadable, not_records)
        source = "walk"
    filesystem = os.statvfs(admin.store.root)
    settings = admin.live_settings()
    caps = [s["max_bytes"] for s in settings if isinstance(s.get("max_bytes"), int)]
    floors = [s["min_free_bytes"] for s in settings if isinstance(s.get("min_free_bytes"), int)]
    pin_caps = [
        s["max_pinned_bytes"] for s in settings if isinstance(s.get("max_pinned_bytes"), int)
    ]
    return {
        "root": admin.store.root,
        "counts": source,
        "namespaces": [ns.as_dict() for ns in namespaces],
        "unattributable_namespaces": [ns.dirname for ns in namespaces if ns.tenant is None],
        "unreadable_dirs": unreadable_dirs,
        "not_records": [{"path": path, "kind": kind} for path, kind in not_records],
        "records": sum(ns.records for ns in namespaces),
        "disk_bytes": sum(ns.disk_bytes for ns in namespaces),
        "logical_bytes": sum(ns.logical_bytes for ns in namespaces),
        "quarantined_files": admin.quarantined_files(),
        "budget": {
            "max_bytes": min(caps) if caps else None,
            "min_free_bytes": max(floors) if floors else None,
            "ledger_bytes": admin.store.usage_bytes(),
            "pinned_bytes_by_tenant": admin.store.pinned_bytes_by_tenant(),
            "max_pinned_bytes": min(pin_caps) if pin_caps else None,
            "filesystem_free_bytes": filesystem.f_bavail * filesystem.f_frsize,
            "filesystem_bytes": filesystem.f_blocks * filesystem.f_frsize,
            "servers": settings,
        },
        "lifetime_counters": admin.lifetime_counters(),
        "eviction_order": admin.eviction_order(),
    }


def bytes_to_verify(admin: StoreAdmin, dirnames=None) -> int | None:
    """The bytes `verify` will read, from the ledger (O(1)): the namespace counts of
    `dirnames` (all: the ledger's total when there are no counts), None when not known."""
    counts = admin.namespace_counts()
    if counts is None:
        return admin.store.usage_bytes() if dirnames is None else None
    wanted = counts if dirnames is None else {d: counts[d] for d in dirnames if d in counts}
    return sum(count.disk_bytes for count in wanted.values())


# ----------------------------------------------------------------------------- purge


@dataclass
class PurgeReport:
    removed_records: int = 0
    removed_bytes: int = 0
    kept_pinned_records: int = 0
    namespaces: list = field(default_factory=list)
    unattributable_namespaces: list = field(default_factory=list)
    dry_run: bool = False

    def as_dict(self) -> dict:
        return {
            "removed_records": self.removed_records,
            "removed_bytes": self.removed_bytes,
            "kept_pinned_records": self.kept_pinned_records,
            "namespaces": self.namespaces,
            "unattributable_namespaces": self.unattributable_namespaces,
            "dry_run": self.dry_run,
        }


def purge(
    admin: StoreAdmin,
    *,
    tenant: str | None = None,
    model_fingerprint: str | None = None,
    older_than_s: float | None = None,
    dry_run: bool = False,
) -> PurgeReport:
    """Removes the records matching every given filter. A namespace whose description is
    missing cannot be attributed to a tenant or model: it is reported, never touched, when
    one of those filters is given. A purge by age alone keeps pinned records (a pin is the
    operator's own word that a record stays; `galahad unpin` first); one by tenant or model
    removes them and their pins."""
    report = PurgeReport(dry_run=dry_run)
    cutoff_ns = None if older_than_s is None else (time.time() - older_than_s) * 1e9
    for dirname, namespace in admin.namespaces_on_disk():
        if tenant is not None or model_fingerprint is not None:
            if namespace is None:
                report.unattributable_namespaces.append(dirname)
                continue
            if tenant is not None and namespace.tenant != tenant:
                continue
            if model_fingerprint is not None and namespace.model_fingerprint != model_fingerprint:
                continue
        keep_pinned = tenant is None and model_fingerprint is None
        removed = 0
        deleted: list[str] = []  # their pins dropped in one locked change per batch
        try:
            for entry in admin.record_files([dirname]):
                if cutoff_ns is not None and entry.mtime_ns >= cutoff_ns:
                    continue
                if keep_pinned and entry.links > 1:
                    report.kept_pinned_records += 1
                    continue
                if dry_run:
                    freed = entry.accounted_bytes
                else:
                    freed = admin.delete_file(
                        dirname, entry.name, drop_pin=False, keep_pinned=keep_pinned
                    )
                    if freed is not None:  # (a record pinned since the scan is kept)
                        deleted.append(entry.name)
                    if len(deleted) >= PIN_DROP_BATCH:
                        admin.drop_pins(dirname, deleted)
                        deleted = []
                if freed is not None:
                    removed += 1
                    report.removed_bytes += freed
        finally:
            if deleted:
                admin.drop_pins(dirname, deleted)
        if removed:
            report.removed_records += removed
            report.namespaces.append(dirname)
    return report


# ----------------------------------------------------------------------------- inspect

_FLAG_NAMES = {fmt.FLAG_ZSTD: "zstd", fmt.FLAG_AES256_GCM: "aes-256-gcm"}


def find_record(admin: StoreAdmin, target: str) -> str | None:
    """A record file named by its path, or found by its key in any namespace."""
    if os.path.sep in target or target.endswith(".rec"):
        return target if os.path.lexists(target) else None
    for dirname, _ in admin.namespaces_on_disk():
        path = admin.record_file_path(dirname, target)
        if os.path.lexists(path):
            return path
    return None


def inspect_record(admin: StoreAdmin, path: str) -> dict:
    """One record's header in words, and whether it passes every rule for this reader."""
    path = os.path.abspath(path)
    dirname = os.path.basename(os.path.dirname(path))
    info = {"path": path, "size_bytes": os.lstat(path).st_size}
    entry = next((e for e in admin.record_files([dirname]) if e.path == path), None)
    try:
        header = admin.file_header(path)
    except fmt.FormatError as error:
        return info | {"valid": False, "problem": f"{error.rule}: {error}"}
    namespace = dict(admin.namespaces_on_disk()).get(dirname)
    info |= {
        "format_version": fmt.FORMAT_VERSION,
        "key": header.key.decode("utf-8", "replace"),
        "flags": [name for bit, name in _FLAG_NAMES.items() if header.flags & bit] or ["plain"],
        "header_bytes": header.header_len,
        "payload_bytes": header.payload_len,
        "page_bytes": header.raw_len,
        "digest": fmt.DIGEST_NAMES[header.digest_alg],
        "namespace_digest": header.namespace.hex(),
        "namespace": namespace.describe() if namespace else None,
        "modified_s": os.lstat(path).st_mtime,
    }
    if entry is None:
        return info | {"valid": False, "problem": "not in a namespace directory of this root"}
    try:
        admin.verify_file(entry, namespace)
    except (fmt.FormatError, OSError) as error:
        rule = getattr(error, "rule", "I/O")
        return info | {"valid": False, "problem": f"{rule}: {error}"}
    return info | {"valid": True, "problem": None}
