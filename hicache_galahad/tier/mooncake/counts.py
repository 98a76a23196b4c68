"""The Mooncake tier's counters, and its log of unexpected errors (pure: no Mooncake, no torch).

Every part of the tier (connection, reads, write-behind) counts what happened here; the counts
are what `MooncakeTier.counters()` and `galahad stats` show (as `mooncake_tier_<name>`).
"""

from __future__ import annotations

import logging
import threading

COUNTER_NAMES = (
    "gets",  # keys asked for by get_many
    "hits",
    "misses",  # absent, empty, or larger than the caller's max_bytes
    "get_errors",  # keys a Mooncake read failed for (any other negative code)
    "get_skipped",  # keys not asked for: the tier was unavailable
    "get_spilled",  # keys read into temporary memory: the read buffer was held by earlier values
    "timeouts",  # calls that ran past timeout_s
    "exists_calls",
    "put_enqueued",
    "put_dropped",  # queue full, or value larger than the transfer buffer
    "put_skipped",  # tier unavailable when enqueued or when the writer got to it
    "put_ok",
    "put_exists",  # key already held a value (first writer wins): nothing written
    "put_failed",
    "put_no_space",  # subset of put_failed: Mooncake's memory is full
    "put_bytes",
    "removes",
    "remove_failed",
    "connects",  # successful setup() calls
    "connect_failures",
    "disconnects",  # transitions to down
    "reconnects",  # transitions back to up
    "unexpected_errors",
)


class TierCounts:
    """Thread-safe counters over COUNTER_NAMES; an unexpected error's traceback is logged once
    per call site (then only counted)."""

    def __init__(self, logger: logging.Logger):
        self._log = logger
        self._lock = threading.Lock()  # guards _counts and _reported
        self._counts = dict.fromkeys(COUNTER_NAMES, 0)
        self._reported: set[str] = set()  # call sites whose unexpected error was logged

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._counts)

    def unexpected(self, where: str) -> None:
        """Counts the exception being handled; logs its traceback once per call site."""
        with self._lock:
            self._counts["unexpected_errors"] += 1
            first = where not in self._reported
            self._reported.add(where)
        if first:
            self._log.error("mooncake tier: unexpected error in %s", where, exc_info=True)
