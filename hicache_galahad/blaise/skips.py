"""Records that failed their check (or are missing) and were not served: listed, and warned
about at most once per kind of record every WARN_INTERVAL_S."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

WARN_INTERVAL_S = 10.0  # at most one warning per kind of skipped record in this interval


@dataclass(frozen=True, slots=True)
class Skipped:
    """A record that failed its check (or is missing) and was not served."""

    doc_id: str
    what: str  # "section", "manifest" or "catalog entry"
    start: int = -1
    end: int = -1


class SkipLog(list):
    """Everything skipped since open (a list of Skipped). `add` counts one and warns, at most
    once per kind of record every WARN_INTERVAL_S (a root of forged or damaged records is not
    a stream of warnings); the next warning says how many were held back."""

    def __init__(self) -> None:
        super().__init__()
        self._warned: dict[str, tuple[float, int]] = {}  # kind -> (last warning, held back)

    def add(self, item: Skipped) -> Skipped:
        self.append(item)
        now_s = time.monotonic()
        last_s, held = self._warned.get(item.what, (None, 0))
        if last_s is not None and now_s - last_s < WARN_INTERVAL_S:
            self._warned[item.what] = (last_s, held + 1)
            return item
        self._warned[item.what] = (now_s, 0)
        log.warning(
            "blaise: %s %s of %r failed its check or is missing: not served%s",
            item.what,
            f"[{item.start}, {item.end})" if item.what == "section" else "",
            item.doc_id,
            f" ({held} more since the last warning)" if held else "",
        )
        return item
