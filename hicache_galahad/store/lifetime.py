"""Lifetime counters, persisted in the store so that `galahad stats` shows them across restarts.

    <root>/stats/<token>.json   the counters, settings and identity (pid namespace, pid, start
                                time) of one open store process: written when it opens the
                                store, rewritten atomically within FLUSH_INTERVAL_S of a
                                change (by a thread of its own, idle or not), and folded into
                                lifetime.json when it closes the store
    <root>/stats/lifetime.json  counters of processes that are gone, folded in by the next
                                process to open the store (under flock)

Totals are lifetime.json plus every per-process file. A file belongs to a live process only
while that process's token is alive (liveness.token_alive: its lock, never a pid alone), so the
settings of a run that ended, in this pid namespace or a container's, are never applied.

Every file is reached through a descriptor of `stats` opened without following links, opened
with safe_files.open_regular (never a FIFO, a device or a link) and read at most
STATS_FILE_MAX_BYTES: a hostile file is a miss, never a hang or a read of gigabytes.
Pure file I/O, no torch or SGLang.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
import time
import weakref
from collections.abc import Callable

from ..errors import NotARegularFileError
from .layout import STATS_DIR, is_token
from .liveness import IDENTITY_FIELD, process_identity
from .safe_files import open_dir, open_regular, read_small_file, replace_file

LIFETIME_FILE = "lifetime.json"
LOCK_FILE = LIFETIME_FILE + ".lock"
FLUSH_INTERVAL_S = 2.0
STATS_FILE_MAX_BYTES = 1 << 20
TEMP_SUFFIX = ".tmp"
STALE_TEMP_AGE_S = 600.0

# The counter files this process has open, by path (so that closing the store retires its own).
_open_files: weakref.WeakValueDictionary[str, CounterFile] = weakref.WeakValueDictionary()
_open_files_lock = threading.Lock()


def _load(dir_fd: int, name: str) -> dict | None:
    """The JSON object in `name`: {} when it is missing, not a regular file, too large or not
    a JSON object (it can be rewritten from scratch); None when it could not be read now."""
    try:
        data = json.loads(read_small_file(name, STATS_FILE_MAX_BYTES, dir_fd=dir_fd))
    except (FileNotFoundError, NotARegularFileError, ValueError):
        return {}
    except OSError as error:
        return {} if error.errno == errno.EFBIG else None
    return data if isinstance(data, dict) else {}


def _counters(document: dict | None) -> dict:
    counters = (document or {}).get("counters")
    if not isinstance(counters, dict):
        return {}
    return {
        k: v
        for k, v in counters.items()
        if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
    }


def _write(dir_fd: int, name: str, document: dict) -> None:
    """Replaces `name` atomically (safe_files.replace_file: `name.<random>.tmp` renamed over
    it; counters are a hint, never fsynced)."""
    data = json.dumps(document).encode()
    replace_file(name, data, dir_fd=dir_fd, temp_suffix=TEMP_SUFFIX, durable=False)


def _is_temp(name: str) -> bool:
    """A writer's temp file: `<name>.<random>.tmp`, or `.<name>.<random>.tmp` as versions
    before replace_file named them."""
    return name.endswith(TEMP_SUFFIX)


def _add(total: dict, more: dict) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def _listing(dir_fd: int) -> list[str]:
    list_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return sorted(os.listdir(list_fd))
    finally:
        os.close(list_fd)


def _process_files(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith(".json") and n != LIFETIME_FILE and n[0] != "."]


@contextlib.contextmanager
def _stats_dir(root_or_dir: str, *, is_dir: bool = False):
    directory = root_or_dir if is_dir else os.path.join(root_or_dir, STATS_DIR)
    dir_fd = open_dir(directory)
    try:
        yield dir_fd
    finally:
        os.close(dir_fd)


def live_settings(root: str, is_alive: Callable[[str], bool]) -> list[dict]:
    """The settings (budget, floor, codecs) of every store process that is alive now
    (`is_alive(token)`, see liveness.token_alive): the servers using the store."""
    found = []
    with contextlib.suppress(OSError), _stats_dir(root) as dir_fd:
        for name in _process_files(_listing(dir_fd)):
            token = name[: -len(".json")]
            if not is_token(token) or not is_alive(token):
                continue
            settings = (_load(dir_fd, name) or {}).get("settings")
            if isinstance(settings, dict):
                found.append(settings)
    return found


def lifetime_totals(root: str) -> dict:
    """The counters of every process that ever had the store open (read-only)."""
    total: dict = {}
    with contextlib.suppress(OSError), _stats_dir(root) as dir_fd:
        for name in _listing(dir_fd):
            if name.endswith(".json") and name[0] != ".":
                _add(total, _counters(_load(dir_fd, name)))
    return total


def _fold(dir_fd: int, should_fold: Callable[[str], bool]) -> None:
    """Adds the per-process files `should_fold(name)` picks to lifetime.json and removes them,
    under the lifetime lock (and removes temp files writers left behind)."""
    try:
        fd = open_regular(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644, dir_fd=dir_fd)
    except NotARegularFileError:  # something else put at its name: it is ours to replace
        os.unlink(LOCK_FILE, dir_fd=dir_fd)
        fd = open_regular(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        lifetime = _load(dir_fd, LIFETIME_FILE)
        if lifetime is None:
            return  # unreadable now: fold next time rather than lose its totals
        total = _counters(lifetime)
        names = _listing(dir_fd)
        folded = [name for name in _process_files(names) if should_fold(name)]
        for name in folded:
            _add(total, _counters(_load(dir_fd, name)))
        if folded:
            _write(dir_fd, LIFETIME_FILE, {"counters": total, "updated_s": time.time()})
            for name in folded:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
        now_s = time.time()
        for name in names:
            if _is_temp(name):
                with contextlib.suppress(OSError):
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if now_s - info.st_mtime > STALE_TEMP_AGE_S:
                        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(fd)


def retire(root: str, token: str) -> None:
    """The process holding `token` closes the store: its counter file stops being written and
    is folded into lifetime.json (its settings are no live server's any more)."""
    path = os.path.join(root, STATS_DIR, token + ".json")
    with _open_files_lock:
        counter_file = _open_files.pop(path, None)
    if counter_file is not None:
        counter_file.close()
        return
    with contextlib.suppress(OSError), _stats_dir(root) as dir_fd:
        _fold(dir_fd, lambda name: name == token + ".json")


class CounterFile:
    """This process's counter file, written from a thread of its own within FLUSH_INTERVAL_S
    of any change (an idle server's last counts reach the disk too: a SIGKILL loses at most
    that interval), and the folding of dead processes' files. No read or write of the store
    waits for it."""

    def __init__(
        self,
        root: str,
        token: str,
        is_alive: Callable[[str], bool],
        settings: dict,
        snapshot: Callable[[], dict],
    ):
        self.directory = os.path.join(root, STATS_DIR)
        self._settings = settings
        self._snapshot = snapshot
        self._identity = process_identity()
        self._name = token + ".json"
        self._path = os.path.join(self.directory, self._name)
        self._written: dict = {}  # the counters the file holds
        self._closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        with contextlib.suppress(OSError):
            os.makedirs(self.directory, exist_ok=True)
        with _open_files_lock:
            _open_files[self._path] = self
        # Written at once: its identity tells this process alive if its lock file is deleted.
        self._write_now({})
        with contextlib.suppress(OSError), _stats_dir(self.directory, is_dir=True) as dir_fd:
            _fold(dir_fd, lambda name: not self._is_live(name, token, is_alive))
        self._thread = threading.Thread(
            target=_flush_every_interval,
            args=(weakref.ref(self), self._stop),
            name="galahad-counters",
            daemon=True,
        )
        self._thread.start()

    @staticmethod
    def _is_live(name: str, token: str, is_alive: Callable[[str], bool]) -> bool:
        other = name[: -len(".json")]
        return other == token or (is_token(other) and is_alive(other))

    def _write_now(self, counters: dict) -> bool:
        document = {"counters": counters, "updated_s": time.time(), "settings": self._settings}
        if self._identity is not None:
            document[IDENTITY_FIELD] = self._identity
        with contextlib.suppress(OSError), _stats_dir(self.directory, is_dir=True) as dir_fd:
            _write(dir_fd, self._name, document)
            return True
        return False

    def _flush_locked(self) -> None:
        counters = {k: v for k, v in self._snapshot().items() if v}
        if counters != self._written and self._write_now(counters):
            self._written = counters

    def flush(self) -> None:
        """Writes the counters if they changed since they were written (never raises)."""
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def close(self) -> None:
        """Writes the last counts and stops writing; the file is folded into lifetime.json
        (never raises)."""
        self._stop.set()
        with self._lock:
            if self._closed:
                return
            self._flush_locked()
            self._closed = True
            with contextlib.suppress(OSError), _stats_dir(self.directory, is_dir=True) as dir_fd:
                _fold(dir_fd, lambda name: name == self._name)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=FLUSH_INTERVAL_S)


def _flush_every_interval(counter_file_ref: weakref.ref, stop: threading.Event) -> None:
    """The writing thread of one CounterFile (held weakly: a store dropped unclosed lets it go)."""
    while not stop.wait(FLUSH_INTERVAL_S):
        counter_file = counter_file_ref()
        if counter_file is None:
            return
        counter_file.flush()
        del counter_file
