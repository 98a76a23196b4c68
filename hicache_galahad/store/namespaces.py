"""The namespaces a store serves, and their descriptions on disk.

Registering a namespace creates its directory and its namespace.json, which is how operators'
tools know whose records a directory holds. A filesystem that refuses (full, read-only,
permissions) is not a reason to stop a server: the namespace is still served, and its reads and
writes miss until the filesystem accepts them. A description deleted or edited while the store
runs is put back (checked at most once a minute, on writes).
"""

from __future__ import annotations

import os
import threading
import time

from ..errors import ConfigError
from ..record.namespace import Namespace
from .context import StoreContext

DESCRIPTION_CHECK_INTERVAL_S = 60.0


class NamespaceRegistry:
    def __init__(self, context: StoreContext):
        self.layout = context.layout
        self.durable = context.options.durable
        self.read_only = context.read_only
        self._counters = context.counters
        self._warn = context.warn
        self._namespaces: dict[str, Namespace] = {}
        self._described_s: dict[str, float] = {}
        self._lock = threading.Lock()

    def register(self, namespace: Namespace) -> Namespace:
        """Creates the namespace's directory and description (idempotent) and returns it."""
        with self._lock:
            known = self._namespaces.get(namespace.dirname)
            if known is not None:
                return known
            if not self.read_only:
                self._describe(namespace, at_start=True)
            self._namespaces[namespace.dirname] = namespace
            return namespace

    def refresh(self, namespace: Namespace, interval_s: float | None = None) -> None:
        """Puts back a namespace.json that was deleted or edited (at most once an interval)."""
        interval_s = DESCRIPTION_CHECK_INTERVAL_S if interval_s is None else interval_s
        if time.monotonic() - self._described_s.get(namespace.dirname, 0.0) < interval_s:
            return
        self._described_s[namespace.dirname] = time.monotonic()
        if self.layout.load_namespace(namespace.dirname) != namespace:
            with self._lock:
                self._describe(namespace)

    def _describe(self, namespace: Namespace, at_start: bool = False) -> None:
        """Writes the description. A namespace directory that is a link is a ConfigError when
        the namespace is registered; found later (replaced while the store runs), it is
        counted and warned about, and the namespace's reads and writes miss (never followed)."""
        directory = self.layout.namespace_dir(namespace.dirname)
        if os.path.islink(directory):
            if at_start:
                raise ConfigError(
                    f"hicache_galahad option 'root': namespace directory {directory!r} is a "
                    "symbolic link; expected a real directory"
                )
            self._counters.add("namespace_write_failures")
            self._warn.warning(
                "namespace-link",
                "galahad: namespace directory %s was replaced by a symbolic link: never "
                "followed, its reads and writes miss until it is a real directory again",
                directory,
            )
            self._described_s[namespace.dirname] = time.monotonic()
            return
        try:
            self.layout.remove_stale_description_temps(namespace.dirname)
            self.layout.write_namespace(namespace, durable=self.durable)
        except OSError as error:
            self._counters.add("namespace_write_failures")
            self._warn.warning(
                "namespace-write",
                "galahad: cannot write the description of namespace %s (%s): its records miss "
                "until the filesystem accepts writes again",
                namespace.dirname,
                error,
            )
        self._described_s[namespace.dirname] = time.monotonic()
