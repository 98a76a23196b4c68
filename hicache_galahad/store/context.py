"""StoreContext: what every component of one open store shares, handed to each at construction.

One store's layout (its held directory descriptors), counters, rate-limited warnings, whether
it is read-only, and its options. Components take it in their constructor; none is wired by
setting attributes afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.options import StoreOptions
from ..telemetry.metrics import Counters, RateLimitedLog, count_bug
from .layout import StoreLayout


@dataclass(frozen=True)
class StoreContext:
    layout: StoreLayout
    counters: Counters
    warn: RateLimitedLog
    options: StoreOptions

    @property
    def root(self) -> str:
        return self.layout.root

    @property
    def read_only(self) -> bool:
        return self.options.read_only

    def unreadable_dir(self, path: str, error: OSError) -> None:
        """A directory a scan could not read: counted, warned about, skipped."""
        self.counters.add("unreadable_dirs")
        self.warn.warning("unreadable-dir", "galahad: skipping %s: %s", path, error)

    def bug(self, topic: str, what: str, error: Exception) -> None:
        """The store's one way to swallow an exception that is a bug (never damage or an
        I/O error): counted in unexpected_errors and logged with its traceback."""
        count_bug(
            self.counters, self.warn, topic, "galahad: unexpected %s failure: %r", what, error
        )
