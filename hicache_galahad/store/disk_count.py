"""What the records on disk add up to: the recount a damaged or new ledger is set from.

`DiskCount.counts` walks every record (a stat each, under the ledger's lock when the ledger
asks: exact) and reads a bounded sample of headers for the logical bytes; `logical_of` reads
one record's declared page bytes (also what a dead writer's journal adds to its namespace).
"""

from __future__ import annotations

import os

from ..record import format as fmt
from .context import StoreContext
from .layout import QUARANTINE_DIRNAME, is_namespace_dirname
from .ledger_state import NamespaceCount

LOGICAL_SAMPLE_RECORDS = 1024  # headers a recount reads per namespace (the rest: their ratio)


class DiskCount:
    def __init__(self, context: StoreContext):
        self._context = context

    def counts(self) -> tuple[int, dict[str, NamespaceCount] | None]:
        """The bytes the ledger should count as committed (records plus quarantined files),
        and the namespace counts it keeps (records, bytes, logical bytes, newest
        modification): a walk of every record, a stat each (it runs
        under the ledger's lock). Logical bytes are read from the headers of the first
        LOGICAL_SAMPLE_RECORDS records of each namespace (hashed names: an unbiased sample),
        the rest taken at the sample's ratio, so a recount reads a bounded number of headers
        (at 10^7 cold records, reading every one would add minutes of the lock). The counts
        are None when a directory could not be read or records lie in a directory that is no
        namespace's."""
        counts: dict[str, NamespaceCount] = {}
        sampled: dict[str, list[int]] = {}  # dirname: [disk bytes, logical bytes] read
        complete = True

        def unreadable(path, error):
            nonlocal complete
            complete = False
            self._context.unreadable_dir(path, error)

        total = 0
        for dirname in self._context.layout.namespace_dirnames(unreadable):
            for entry in self._context.layout.records([dirname], unreadable):
                total += entry.accounted_bytes
                if not entry.accounted_bytes:
                    continue  # no regular file, or an empty one: no record to count
                if not is_namespace_dirname(dirname) or dirname == QUARANTINE_DIRNAME:
                    complete = False
                    continue
                count = counts.get(dirname)
                if count is None:
                    count = counts[dirname] = NamespaceCount()
                count.records += 1
                count.disk_bytes += entry.accounted_bytes
                if count.records <= LOGICAL_SAMPLE_RECORDS:
                    sample = sampled.setdefault(dirname, [0, 0])
                    sample[0] += entry.accounted_bytes
                    sample[1] += self.logical_of(dirname, entry.name)
                count.newest_ns = max(count.newest_ns, entry.mtime_ns)
        for dirname, (sample_disk, sample_logical) in sampled.items():
            count = counts[dirname]
            rest = count.disk_bytes - sample_disk
            count.logical_bytes = sample_logical + (
                rest * sample_logical // sample_disk if sample_disk else 0
            )
        quarantined = self._context.layout.quarantined()
        quarantine_bytes = sum(entry.accounted_bytes for entry in quarantined)
        total += quarantine_bytes
        if quarantined:
            counts[QUARANTINE_DIRNAME] = NamespaceCount(len(quarantined), quarantine_bytes)
        return total, (counts if complete else None)

    def logical_of(self, dirname: str, filename: str) -> int:
        """The page bytes a record's header declares (0 when it has no readable header)."""
        try:
            fd = os.open(
                filename,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=self._context.layout.namespace_fd(dirname),
            )
        except OSError:
            return 0
        try:
            return fmt.declared_raw_len(os.pread(fd, fmt.FIXED_HEADER_BYTES, 0))
        except OSError:
            return 0
        finally:
            os.close(fd)
