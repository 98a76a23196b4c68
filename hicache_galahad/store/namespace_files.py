"""namespace.json: what each namespace directory holds (tenant, model, pool, geometry), read
and written atomically through the held directory descriptors, never through a link."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time

from ..record.namespace import Namespace
from .directories import HeldDirectories
from .safe_files import RECORD_OPEN_FLAGS, replace_file

NAMESPACE_FILE = "namespace.json"
NAMESPACE_TEMP_SUFFIX = ".tmp"
NAMESPACE_TEMP_STALE_S = 60.0
DESCRIPTION_CACHE_S = 5.0


class NamespaceFiles(HeldDirectories):
    """The held directories, and the namespace.json in each."""

    def __init__(self, root: str):
        super().__init__(root)
        self._descriptions: dict[str, tuple[float, Namespace | None]] = {}

    def load_namespace(self, dirname: str) -> Namespace | None:
        """The namespace a directory's namespace.json describes, if it is intact and matches
        the directory's name; None otherwise."""
        try:
            with self._namespace_dir_fd(dirname) as dir_fd:
                fd = os.open(NAMESPACE_FILE, RECORD_OPEN_FLAGS, dir_fd=dir_fd)
            with os.fdopen(fd, "rb") as description:
                if not stat.S_ISREG(os.fstat(description.fileno()).st_mode):
                    return None
                data = json.loads(description.read(1 << 20))
            namespace = Namespace(
                data["tenant"], data["model_fingerprint"], data["pool"], data.get("geometry", {})
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return namespace if namespace.dirname == dirname else None

    def load_namespace_cached(self, dirname: str) -> Namespace | None:
        """load_namespace, remembered for a few seconds (scans ask once per record)."""
        now_s = time.monotonic()
        cached = self._descriptions.get(dirname)
        if cached is None or now_s - cached[0] > DESCRIPTION_CACHE_S:
            cached = self._descriptions[dirname] = (now_s, self.load_namespace(dirname))
        return cached[1]

    def write_namespace(self, namespace: Namespace, durable: bool) -> None:
        """Creates the namespace's directory (and `ns`, if it went) and (re)writes its
        namespace.json atomically when it is missing or does not describe this namespace,
        all through descriptors opened without following links (NotADirectoryError when
        `ns` or the namespace's directory is a link)."""
        dirname = namespace.dirname
        try:
            ns_fd = self.ns_fd()
        except FileNotFoundError:  # `ns` was removed: made again in the root opened at first
            with contextlib.suppress(FileExistsError):
                os.mkdir("ns", dir_fd=self._root_fd)
            ns_fd = self.ns_fd()
        with contextlib.suppress(FileExistsError):
            os.mkdir(dirname, dir_fd=ns_fd)
        dir_fd = self.namespace_fd(dirname, recheck=True)  # a directory made again is taken
        if self.load_namespace(dirname) == namespace:
            return
        description = namespace.describe() | {"digest": namespace.digest.hex()}
        replace_file(
            NAMESPACE_FILE,
            json.dumps(description).encode(),
            dir_fd=dir_fd,
            temp_suffix=NAMESPACE_TEMP_SUFFIX,
            durable=durable,
            mode=0o666,
        )
        if durable:
            os.fsync(dir_fd)
            os.fsync(ns_fd)

    def remove_stale_description_temps(self, dirname: str) -> int:
        """Removes namespace.json temp files left by writers that are gone (e.g. a full disk).
        Writing one takes milliseconds, so one older than NAMESPACE_TEMP_STALE_S is abandoned;
        its name says nothing of its writer (a pid would not name a process of another pid
        namespace)."""
        removed = 0
        try:
            with self._namespace_dir_fd(dirname) as dir_fd:
                # a descriptor of its own: listing moves a directory descriptor's offset
                list_fd = os.open(".", self.DIR_OPEN_FLAGS, dir_fd=dir_fd)
                try:
                    names = os.listdir(list_fd)
                finally:
                    os.close(list_fd)
                for name in names:
                    if not (
                        name.startswith(NAMESPACE_FILE + ".")
                        and name.endswith(NAMESPACE_TEMP_SUFFIX)
                    ):
                        continue
                    with contextlib.suppress(OSError):
                        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                        if time.time() - info.st_mtime < NAMESPACE_TEMP_STALE_S:
                            continue
                        os.unlink(name, dir_fd=dir_fd)
                        removed += 1
        except OSError:
            return removed
        return removed
