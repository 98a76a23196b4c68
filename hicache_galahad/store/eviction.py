"""Least-recently-used order over the records of a store (pure, thread-safe)."""

from __future__ import annotations

import threading
from collections import OrderedDict


class LruIndex:
    """Maps a record's location to its size on disk, oldest access first.

    A location is any hashable (the store uses (namespace dirname, file name)). `touch` moves
    an entry to the most-recent end; `pop_oldest` hands out eviction victims.
    """

    def __init__(self):
        self._entries: OrderedDict[object, int] = OrderedDict()
        self._lock = threading.Lock()
        self._total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, location) -> bool:
        return location in self._entries

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of the indexed entries."""
        return self._total_bytes

    def load(self, entries_oldest_first) -> None:
        """Adds (location, size) pairs, oldest first, behind nothing already indexed."""
        with self._lock:
            fresh = OrderedDict()
            for location, size in entries_oldest_first:
                if location not in self._entries and location not in fresh:
                    fresh[location] = size
                    self._total_bytes += size
            fresh.update(self._entries)
            self._entries = fresh

    def add(self, location, size: int) -> None:
        with self._lock:
            self._total_bytes += size - self._entries.pop(location, 0)
            self._entries[location] = size

    def touch(self, location) -> None:
        with self._lock:
            if location in self._entries:
                self._entries.move_to_end(location)

    def touch_many_head_last(self, locations) -> None:
        """Marks a chain of pages as used so that its head ends up most recent.

        Pages of a prefix chain arrive head first; evicting the head would make every deeper
        page useless, so eviction must take the tail first.
        """
        with self._lock:
            for location in reversed(locations):
                if location in self._entries:
                    self._entries.move_to_end(location)

    def discard(self, location) -> int | None:
        with self._lock:
            size = self._entries.pop(location, None)
            if size is not None:
                self._total_bytes -= size
            return size

    def pop_oldest(self):
        """(location, size) of the least recently used entry, or None when empty."""
        with self._lock:
            if not self._entries:
                return None
            location, size = self._entries.popitem(last=False)
            self._total_bytes -= size
            return location, size
