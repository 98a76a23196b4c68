"""The Mooncake client's connection: opened safely, watched, marked down and up, closed.

Mooncake's `setup()` blocks *while holding the GIL*, ~90 s against a dead master (4.5 s with
MC_STORE_CLIENT_SETUP_RETRIES=1, which the connection sets unless the environment does) and
~30 s against a hung one, so it must not be called blind. `MooncakeConnection`'s thread calls it
only once the master's TCP port answers and a child process's `setup()` has just completed. It
then registers the tier's buffers and watches the master: a TCP probe every second, an RPC probe
after trouble, marking the connection down or up again. Mooncake's `health_check()` still
reports 0 with the master dead (0.3.13), so it is not used.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading

from ...config.mooncake import MooncakeOptions
from ...telemetry.metrics import Counters, RateLimitedLog, count_bug

RPC_FAIL = -900  # Mooncake: the master is unreachable
NO_SPACE = -200  # Mooncake: no segment has room
NOT_FOUND = -704
BUG_MESSAGE = "galahad: unexpected failure in the Mooncake tier's %s"  # count_bug's line
_PROBE_INTERVAL_S = 1.0
_BACKOFF_MIN_S = 0.25
_BACKOFF_MAX_S = 4.0
_PROBE_KEY = "__galahad_mooncake_probe__"
_PREFLIGHT_TIMEOUT_S = 15.0
# setup() retries a refused master 20 times, ~4.5 s each, holding the GIL; 1 retry: ~4.5 s
SETUP_RETRIES_ENV = "MC_STORE_CLIENT_SETUP_RETRIES"
_PREFLIGHT = """
import os, sys
from mooncake.store import MooncakeDistributedStore
host, metadata, protocol, devices, master = sys.argv[1:]
store = MooncakeDistributedStore()  # kept: its destructor would close() for ~1 s
code = store.setup(host, metadata, 0, 0, protocol, devices, master)
os._exit(0 if code == 0 else 3)
"""


def setup_completes(options: MooncakeOptions) -> bool:
    """Whether a pure-client setup() completes in a child process within a bound.

    setup() holds the GIL while it waits for a master, so a master that accepts connections
    but does not answer (hung, overloaded) would stall this whole process; a child takes that.
    """
    if not sys.executable:
        return True
    args = [options.local_hostname, options.metadata_server, options.protocol]
    args += [options.rdma_devices, options.master_server_address]
    try:
        child = subprocess.run(
            [sys.executable, "-c", _PREFLIGHT, *args],
            env=dict(os.environ, **{SETUP_RETRIES_ENV: "1"}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=_PREFLIGHT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return child.returncode == 0


def open_store(options: MooncakeOptions):
    """A set-up MooncakeDistributedStore and "", or None and why not. Never calls setup() blind."""
    if not reachable(options.endpoints(), min(1.0, options.timeout_s)):
        return None, f"master {options.master_server_address} unreachable"
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as error:
        return None, f"cannot import mooncake.store: {error}"
    if not setup_completes(options):
        return None, f"master {options.master_server_address} accepts, but setup() fails or hangs"
    store = MooncakeDistributedStore()
    # setup() holds the GIL: only called once a child's setup() has just completed.
    code = store.setup(
        options.local_hostname,
        options.metadata_server,
        options.global_segment_size,
        options.local_buffer_size,
        options.protocol,
        options.rdma_devices,
        options.master_server_address,
    )
    if code != 0:
        close_store(store, [])
        return None, f"setup() failed with code {code}"
    return store, ""


def close_store(store, buffers: list) -> None:
    """Unregisters the buffers and closes the client (which holds the GIL for about 1 s)."""
    try:
        for buffer in buffers:
            if buffer is not None:
                store.unregister_buffer(buffer.address)
        store.close()
    except Exception:
        logging.getLogger(__name__).warning("mooncake: closing a client failed", exc_info=True)


def reachable(endpoints: list[tuple[str, int]], timeout_s: float) -> bool:
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                pass
        except OSError:
            return False
    return True


class MooncakeConnection:
    """The client (`store`) and whether it may be used (`is_up`), kept by a daemon thread.

    `state` guards `store`, `is_up` and `closed`; the write-behind queue shares it, so that
    closing wakes every thread at once. `make_buffers()` returns the buffers to register with
    each new client (made once, on the first connect, off the caller's path).
    """

    def __init__(self, options: MooncakeOptions, logger, counts: Counters, make_buffers):
        self.options = options
        self._log = logger
        self._warn = RateLimitedLog(logger, interval_s=30.0)
        self._counts = counts
        self._make_buffers = make_buffers
        self._buffers: list | None = None
        self.state = threading.Condition()
        self.store = None
        self.is_up = False
        self.closed = False
        self._thread = threading.Thread(target=self._loop, name="mooncake-connect", daemon=True)
        os.environ.setdefault(SETUP_RETRIES_ENV, "1")

    def start(self) -> None:
        self._thread.start()

    def _bug(self, where: str) -> None:
        """A bug caught in `where` (metrics.count_bug: counted, logged with its traceback)."""
        count_bug(self._counts, self._warn, f"bug-{where}", BUG_MESSAGE, where)

    def join(self, timeout_s: float) -> bool:
        """Waits for the thread (after `closed`); whether it has ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def mark_down(self, why: str) -> None:
        with self.state:
            was_up, self.is_up = self.is_up, False
        if was_up:
            self._counts.add("disconnects")
            self._log.warning("mooncake: tier unavailable: %s", why)

    def take_store(self):
        """The client, which the connection forgets (at close)."""
        with self.state:
            store, self.store = self.store, None
        return store

    def release(self, store) -> None:
        close_store(store, self._buffers or [])

    # -- the thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        backoff_s = _BACKOFF_MIN_S
        while not self.closed:
            try:
                if self.store is None:
                    if self._connect():
                        backoff_s = _BACKOFF_MIN_S
                        continue
                    self._sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)
                else:
                    self._watch()
                    self._sleep(_PROBE_INTERVAL_S if self.is_up else backoff_s)
                    backoff_s = _BACKOFF_MIN_S if self.is_up else min(backoff_s * 2, _BACKOFF_MAX_S)
            except Exception:
                self._bug("connector")
                self._sleep(_BACKOFF_MAX_S)

    def _sleep(self, seconds: float) -> None:
        with self.state:
            if not self.closed:
                self.state.wait(seconds)

    def _connect(self) -> bool:
        store, why = open_store(self.options)
        if store is None:
            self._counts.add("connect_failures")
            self._warn.warning("connect", "mooncake: %s; retrying", why)
            return False
        if not self._register_buffers(store):
            close_store(store, [])
            return False
        with self.state:
            closing = self.closed
            if not closing:
                self.store, self.is_up = store, True
        if closing:
            self.release(store)
            return False
        self._counts.add("connects")
        options = self.options
        self._log.info(
            "mooncake tier connected: master %s, metadata %s, protocol %s, timeout %.1f s",
            options.master_server_address,
            options.metadata_server,
            options.protocol,
            options.timeout_s,
        )
        return True

    def _register_buffers(self, store) -> bool:
        if self._buffers is None:
            self._buffers = list(self._make_buffers())
        for buffer in self._buffers:
            code = store.register_buffer(buffer.address, buffer.size)
            if code != 0:
                self._counts.add("connect_failures")
                self._log.error("mooncake: register_buffer failed with code %d", code)
                return False
        return True

    def _watch(self) -> None:
        """Down when the master's port stops answering; up again once an RPC succeeds."""
        if not reachable(self.options.endpoints()[:1], min(1.0, self.options.timeout_s)):
            self.mark_down("master unreachable")
            return
        if self.is_up:
            return
        if self.store.batch_is_exist([_PROBE_KEY])[0] not in (0, 1):
            return
        with self.state:
            came_back = not self.closed and not self.is_up
            self.is_up = self.is_up or came_back
        if came_back:
            self._counts.add("reconnects")
            self._log.info("mooncake: master %s answers again", self.options.master_server_address)
