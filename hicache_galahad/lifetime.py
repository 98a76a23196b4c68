"""Lifetime counters, persisted in the store so that `galahad stats` shows them across restarts.

    <root>/stats/<token>.json   the counters of one open store process (rewritten atomically,
                                at most every FLUSH_INTERVAL_S, and at close)
    <root>/stats/lifetime.json  counters of processes that are gone, folded in by the next
                                process to open the store (under flock)

Totals are lifetime.json plus every per-process file. Pure file I/O, no torch or SGLang.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable

STATS_DIR = "stats"
LIFETIME_FILE = "lifetime.json"
FLUSH_INTERVAL_S = 2.0


def _read(path: str) -> dict:
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    counters = data.get("counters") if isinstance(data, dict) else None
    if not isinstance(counters, dict):
        return {}
    return {k: v for k, v in counters.items() if isinstance(v, int) and not isinstance(v, bool)}


def _write(path: str, counters: dict, settings: dict | None = None) -> None:
    temp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    document = {"counters": counters, "updated_s": time.time()}
    if settings is not None:
        document["settings"] = settings
    try:
        with open(temp, "w") as handle:
            json.dump(document, handle)
        os.replace(temp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _add(total: dict, more: dict) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def live_settings(root: str) -> list[dict]:
    """The settings (budget, floor, codecs) of every store process that wrote a counter file
    and has not been folded yet: the servers using the store now, or lately."""
    directory = os.path.join(root, STATS_DIR)
    found = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json") and name != LIFETIME_FILE:
                with contextlib.suppress(OSError, ValueError):
                    with open(os.path.join(directory, name)) as handle:
                        settings = json.load(handle).get("settings")
                    if isinstance(settings, dict):
                        found.append(settings)
    return found


def lifetime_totals(root: str) -> dict:
    """The counters of every process that ever had the store open (read-only)."""
    directory = os.path.join(root, STATS_DIR)
    total: dict = {}
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json"):
                _add(total, _read(os.path.join(directory, name)))
    return total


class CounterFile:
    """This process's counter file, and the folding of dead processes' files."""

    def __init__(self, root: str, token: str, is_alive: Callable[[str], bool], settings: dict):
        self.directory = os.path.join(root, STATS_DIR)
        self._settings = settings
        os.makedirs(self.directory, exist_ok=True)
        self._path = os.path.join(self.directory, f"{token}.json")
        self._last_flush_s = 0.0
        self._lock = threading.Lock()
        self._fold_dead(is_alive)

    def _fold_dead(self, is_alive: Callable[[str], bool]) -> None:
        lifetime = os.path.join(self.directory, LIFETIME_FILE)
        fd = os.open(lifetime + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            total = _read(lifetime)
            folded = []
            for name in os.listdir(self.directory):
                token = name[: -len(".json")]
                if not name.endswith(".json") or name == LIFETIME_FILE or is_alive(token):
                    continue
                _add(total, _read(os.path.join(self.directory, name)))
                folded.append(name)
            if folded:
                _write(lifetime, total)
                for name in folded:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.directory, name))
        finally:
            os.close(fd)

    def maybe_flush(self, snapshot: Callable[[], dict], force: bool = False) -> None:
        """Writes the counters if FLUSH_INTERVAL_S has passed (never raises)."""
        now_s = time.monotonic()
        if not force and now_s - self._last_flush_s < FLUSH_INTERVAL_S:
            return
        if not self._lock.acquire(blocking=force):
            return
        try:
            self._last_flush_s = now_s
            with contextlib.suppress(OSError):
                _write(self._path, {k: v for k, v in snapshot().items() if v}, self._settings)
        finally:
            self._lock.release()
