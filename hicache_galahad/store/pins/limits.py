"""The pin limit of a root: `max_pinned_bytes` bounds pinned bytes over every tenant of the
root, whoever pins.

Each store process records its settings, its pin limit among them, where every process on
the root reads them (lifetime.py: `stats/<token>.json`, written when it opens the store,
read through open_regular and bounded). A pin applies the smallest limit of this process and
of every live store process on the root, so a `galahad warm --pin` that could not read the
server's configuration still pins within the live server's limit. With no limit there at all
(no live store has one), the last one applied on this root holds: pins/state keeps it
(`limit_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .tree import is_count


class PinLimits:
    """This process's limit (None: none) and `live_limits()`: those of the live store
    processes of the root (any value; only counts are taken)."""

    def __init__(self, own_bytes: int | None, live_limits: Callable[[], Iterable] = tuple):
        self.own_bytes = own_bytes
        self._live_limits = live_limits

    def applied(self, state: dict) -> int | None:
        """The limit a pin applies now (the smallest one found), recorded in `state` (written
        with the pin's counts) for a later pin that finds none."""
        found = [value for value in self._live() if is_count(value)]
        if is_count(self.own_bytes):
            found.append(self.own_bytes)
        if not found:
            recorded = state.get("limit_bytes")
            return recorded if is_count(recorded) else None
        state["limit_bytes"] = min(found)
        return state["limit_bytes"]

    def _live(self) -> list:
        try:
            return list(self._live_limits())
        except (OSError, ValueError, TypeError):  # unreadable settings: this process's only
            return []
