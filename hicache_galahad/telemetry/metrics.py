"""Counters and rate-limited warnings (no I/O beyond logging)."""

from __future__ import annotations

import logging
import threading
import time

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


class Counters:
    """Thread-safe monotonically increasing counters."""

    def __init__(self):
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTER_NAMES, 0)

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
