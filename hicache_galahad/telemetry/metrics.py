"""Counters and rate-limited warnings (no I/O beyond logging).

Two registries declare every counter, each with what it counts: COUNTERS (and failed_<rule>)
for the store, the adapter and the tier over them, which share one `Counters`; TIER_COUNTERS
for the Mooncake client's own (`MooncakeTier.counters()`, shown as `mooncake_tier_<name>`).
tests/test_counters.py checks that the code counts under declared names only. A bug caught
and not raised is counted and logged by one rule, `count_bug`.
"""

from __future__ import annotations

import logging
import threading
import time

# The registry: every counter the store, the adapter and the tier over it keep in one
# `Counters`, with what it counts.
COUNTERS = {
    "puts": "records published",
    "puts_existing": "puts skipped: a sound record of that key was already there",
    "puts_failed": "records that could not be stored",
    "put_bytes": "record bytes written",
    "gets": "records asked for by a read (not by verify)",
    "hits": "records read and verified",
    "misses": "reads that found no usable record",
    "get_bytes": "page bytes served",
    "corrupt": "records that failed a check (damage)",
    "foreign": "records of another key or namespace (V10, V11)",
    "io_errors": "I/O errors (EIO and the like)",
    "no_space": "writes refused for lack of budget or space",
    "no_space_pinned": "reservations refused: only evicting pinned records would make room",
    "pins_refused": "records not pinned: max_pinned_bytes would have been passed",
    "pins_dropped_bytes": "pinned bytes dropped because their record was deleted or quarantined",
    "evictions": "records evicted by the budget",
    "evicted_bytes": "bytes evicted by the budget",
    "eviction_misses": "records the budget chose that were already gone",
    "quarantined": "damaged records moved to quarantine",
    "stale_temp_removed": "temp files of dead writers removed",
    "reclaimed_bytes": "reserved bytes of dead processes given back",
    "ledger_rebuilds": "ledger recounts from disk",
    "budget_unreconciled": "evictions that found too little to evict for what the ledger claims",
    "unreadable_dirs": "directories a scan could not read",
    "namespace_write_failures": "namespace.json files that could not be written",
    "flushes": "deferred-durability flushes",
    "flushed_records": "records fsynced by the flusher",
    "flush_errors": "flushes that failed",
    "unexpected_errors": "bugs caught (never raised): nothing else is counted here",
    "adapter_errors": "SGLang calls that failed or were refused, answered with a miss",
    "mooncake_hits": "pages served from Mooncake",
    "mooncake_misses": "pages Mooncake did not serve",
    "mooncake_bad_values": "Mooncake values that failed a check",
    "mooncake_values_read_again": "failed Mooncake values read once more",
    "mooncake_good_when_read_again": "of those, values that verified the second time",
    "mooncake_written_through": "Mooncake pages written to the local disk",
    "mooncake_puts_queued": "records queued to Mooncake",
    "mooncake_puts_dropped": "records not queued to Mooncake (queue full)",
}
# The rules a record or a Mooncake value can fail (docs/FORMAT.md's V0-V16, and M1: the
# integrity tag of a shared value); each has its counter, failed_<rule>.
RULES = (*(f"V{number}" for number in range(17)), "M1")
RULE_COUNTERS = {f"failed_{rule}": rule for rule in RULES}
# The counters a store reports from its start, at zero until counted (the others appear when
# first counted).
COUNTER_NAMES = (
    "puts",
    "puts_existing",
    "puts_failed",
    "put_bytes",
    "gets",
    "hits",
    "misses",
    "get_bytes",
    "corrupt",
    "foreign",
    "io_errors",
    "no_space",
    "evictions",
    "evicted_bytes",
    "quarantined",
    "stale_temp_removed",
    "unexpected_errors",
)
assert set(COUNTER_NAMES) <= set(COUNTERS)

# The Mooncake client's own counters (tier/mooncake/), all reported from its start.
TIER_COUNTERS = {
    "gets": "keys asked for by get_many",
    "hits": "keys whose value was read",
    "misses": "keys absent, empty, or larger than the caller's max_bytes",
    "get_errors": "keys a Mooncake read failed for (any other negative code)",
    "get_skipped": "keys not asked for: the tier was unavailable",
    "get_spilled": "keys read into temporary memory: the read buffer was held by earlier values",
    "timeouts": "calls that ran past timeout_s",
    "exists_calls": "calls of exists_many",
    "put_enqueued": "values queued for a put",
    "put_dropped": "values not queued: the queue full, or larger than the transfer buffer",
    "put_skipped": "puts not made: the tier unavailable when queued or when the writer got to it",
    "put_ok": "values put",
    "put_exists": "puts of a key that already held a value (first writer wins): nothing written",
    "put_failed": "puts Mooncake refused",
    "put_no_space": "of those, puts refused because Mooncake's memory is full",
    "put_bytes": "bytes put",
    "removes": "removes asked for",
    "remove_failed": "removes Mooncake refused",
    "connects": "successful setup() calls",
    "connect_failures": "setup() calls that failed",
    "disconnects": "transitions to down",
    "reconnects": "transitions back to up",
    "unexpected_errors": "bugs caught (never raised): nothing else is counted here",
}


def failed(rule: str) -> str:
    """The counter of records that broke `rule` (a KeyError for a rule that does not exist)."""
    name = f"failed_{rule}"
    if name not in RULE_COUNTERS:
        raise KeyError(f"no counter for rule {rule!r}")
    return name


class Counters:
    """Thread-safe monotonically increasing counters; `reported` are there from the start, at
    zero (the store's COUNTER_NAMES, or a registry such as TIER_COUNTERS)."""

    def __init__(self, reported=COUNTER_NAMES):
        self._lock = threading.Lock()
        self._values = dict.fromkeys(reported, 0)

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + amount

    def add_many(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                if amount:
                    self._values[name] = self._values.get(name, 0) + amount

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._values)


def count_bug(counters: Counters, warn: RateLimitedLog, topic: str, message: str, *args) -> None:
    """The one rule for a bug caught and not raised (never damage, an I/O error or a refused
    argument; called in its `except` block): counted in unexpected_errors, and logged as a
    warning with its traceback at most once per topic in `warn`'s interval (the next line
    says how many were held back)."""
    counters.add("unexpected_errors")
    warn.warning(topic, message, *args, exc_info=True)


class RateLimitedLog:
    """Logs a warning per topic at most once every `interval_s`, counting what it held back."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0):
        self._logger = logger
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last_s: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, topic: str, message: str, *args, exc_info: bool = False) -> None:
        now_s = time.monotonic()
        with self._lock:
            last_s = self._last_s.get(topic)
            if last_s is not None and now_s - last_s < self._interval_s:
                self._suppressed[topic] = self._suppressed.get(topic, 0) + 1
                return
            self._last_s[topic] = now_s
            suppressed = self._suppressed.pop(topic, 0)
        if suppressed:
            message += f" ({suppressed} similar warnings suppressed)"
        self._logger.warning(message, *args, exc_info=exc_info)
