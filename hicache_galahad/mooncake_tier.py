"""Mooncake Store as a shared, lossy tier: bounded reads, write-behind puts (no torch, no SGLang).

`MooncakeTier` holds opaque values under the caller's keys in a Mooncake Store cluster. It never
raises into the caller and never blocks it past `timeout_s`:

- A connector thread calls Mooncake's `setup()` only once the master's TCP port answers and a
  child process's `setup()` has just completed: `setup()` blocks *while holding the GIL*, ~90 s
  against a dead master (4.5 s with MC_STORE_CLIENT_SETUP_RETRIES=1, which the tier sets unless
  the environment does) and ~30 s against a hung one, so it must not be called blind. It then
  watches the master (TCP probe every second, an RPC probe after trouble) and marks the tier
  down or up again. Mooncake's `health_check()` still reports 0 with the master dead (0.3.13).
- Reads run on one worker thread, each call waited for at most `timeout_s`. A call that
  overruns its deadline marks the tier unavailable until it returns; no second thread is
  started behind it. Values are read with `batch_get_into` into a registered buffer and copied
  out on the worker, so a late call never writes into memory the caller sees.
- Writes go through a byte-bounded queue to a writer thread (`batch_is_exist`, then
  `batch_put_from` from a second registered buffer). A full queue drops the value.

Mooncake is a cache: a value may vanish at any time, and a key keeps its first writer's value
(a put of an existing key is a no-op). `remove()` is how a caller clears a bad value so that a
fresh put can land.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import mmap
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait

from .metrics import RateLimitedLog
from .mooncake_options import MooncakeConfigError, MooncakeOptions

__all__ = ["MooncakeConfigError", "MooncakeOptions", "MooncakeTier", "COUNTER_NAMES"]

log = logging.getLogger(__name__)

RPC_FAIL = -900  # Mooncake: the master is unreachable
NO_SPACE = -200  # Mooncake: no segment has room
NOT_FOUND = -704
_ALIGN = 64
_PROBE_INTERVAL_S = 1.0
_BACKOFF_MIN_S = 0.25
_BACKOFF_MAX_S = 4.0
_PROBE_KEY = "__galahad_mooncake_probe__"
_MAX_PUT_BATCH = 256
_PREFLIGHT_TIMEOUT_S = 15.0
# setup() retries a refused master 20 times, ~4.5 s each, holding the GIL; 1 retry: ~4.5 s
_SETUP_RETRIES_ENV = "MC_STORE_CLIENT_SETUP_RETRIES"
_PREFLIGHT = """
import os, sys
from mooncake.store import MooncakeDistributedStore
host, metadata, protocol, devices, master = sys.argv[1:]
store = MooncakeDistributedStore()  # kept: its destructor would close() for ~1 s
code = store.setup(host, metadata, 0, 0, protocol, devices, master)
os._exit(0 if code == 0 else 3)
"""

COUNTER_NAMES = (
    "gets",  # keys asked for by get_many
    "hits",
    "misses",  # absent, empty, or larger than the caller's max_bytes
    "get_errors",  # keys a Mooncake read failed for (any other negative code)
    "get_skipped",  # keys not asked for: the tier was unavailable
    "timeouts",  # calls that ran past timeout_s
    "exists_calls",
    "put_enqueued",
    "put_dropped",  # queue full, or value larger than the transfer buffer
    "put_skipped",  # tier unavailable when enqueued or when the writer got to it
    "put_ok",
    "put_exists",  # key already held a value (first writer wins): nothing written
    "put_failed",
    "put_no_space",  # subset of put_failed: Mooncake's memory is full
    "put_bytes",
    "removes",
    "remove_failed",
    "connects",  # successful setup() calls
    "connect_failures",
    "disconnects",  # transitions to down
    "reconnects",  # transitions back to up
    "unexpected_errors",
)


def _setup_completes(options: MooncakeOptions) -> bool:
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
            env=dict(os.environ, **{_SETUP_RETRIES_ENV: "1"}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=_PREFLIGHT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return child.returncode == 0


def _open_store(options: MooncakeOptions):
    """A set-up MooncakeDistributedStore and "", or None and why not. Never calls setup() blind."""
    if not _reachable(options.endpoints(), min(1.0, options.timeout_s)):
        return None, f"master {options.master_server_address} unreachable"
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as error:
        return None, f"cannot import mooncake.store: {error}"
    if not _setup_completes(options):
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
        _close_store(store, [])
        return None, f"setup() failed with code {code}"
    return store, ""


def _close_store(store, buffers: list) -> None:
    """Unregisters the buffers and closes the client (which holds the GIL for about 1 s)."""
    try:
        for buffer in buffers:
            if buffer is not None:
                store.unregister_buffer(buffer.address)
        store.close()
    except Exception:
        log.warning("mooncake: closing a client failed", exc_info=True)


def _reachable(endpoints: list[tuple[str, int]], timeout_s: float) -> bool:
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                pass
        except OSError:
            return False
    return True


class _Buffer:
    """Anonymous memory registered with Mooncake (touched lazily). Never freed while in use."""

    def __init__(self, size: int):
        self.size = size
        self._map = mmap.mmap(-1, size)
        self.view = memoryview(self._map)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))


def _chunks(sizes: list[tuple[int, int]], capacity: int):
    """Groups (index, size) into runs whose aligned sizes fit `capacity`; yields (index, offset)."""
    run: list[tuple[int, int]] = []
    offset = 0
    for index, size in sizes:
        if run and offset + size > capacity:
            yield run
            run, offset = [], 0
        run.append((index, offset))
        offset += (size + _ALIGN - 1) // _ALIGN * _ALIGN
    if run:
        yield run


class _Worker:
    """One daemon thread running calls in order: a stuck call never holds up interpreter exit."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as error:
                    future.set_exception(error)


class MooncakeTier:
    """A Mooncake Store client that never raises into its caller and never stalls it."""

    def __init__(self, options: MooncakeOptions, logger: logging.Logger | None = None):
        self.options = options
        self._log = logger or log
        self._warn = RateLimitedLog(self._log, interval_s=30.0)
        self._counts = dict.fromkeys(COUNTER_NAMES, 0)
        self._counts_lock = threading.Lock()  # guards _counts
        self._state = threading.Condition()  # guards _store, _is_up, _closed, the queue
        self._store = None
        self._is_up = False
        self._closed = False
        self._queue: collections.deque = collections.deque()
        self._queued_bytes = 0  # includes the batch the writer is putting
        self._writing = False  # the writer holds a batch taken from the queue
        self._read_buffer: _Buffer | None = None
        self._write_buffer: _Buffer | None = None
        self._call_lock = threading.Lock()  # guards _overdue and _reads
        self._overdue: Future | None = None  # a read call that ran past its caller's deadline
        self._reads: set[Future] = set()  # read calls submitted and not finished
        self._reported: set[str] = set()  # call sites whose unexpected error was logged
        self._reader = _Worker("mooncake-read")
        self._connector = threading.Thread(target=self._connect_loop, name="mooncake-connect")
        self._writer = threading.Thread(target=self._write_loop, name="mooncake-write")
        self._connector.daemon = self._writer.daemon = True
        os.environ.setdefault(_SETUP_RETRIES_ENV, "1")
        self._connector.start()
        self._writer.start()

    # -- public -----------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """Connected, the master answering, and no read call stuck past its deadline."""
        with self._call_lock:
            stuck = self._overdue is not None and not self._overdue.done()
        return self._is_up and not self._closed and not stuck

    def counters(self) -> dict:
        with self._counts_lock:
            snapshot = dict(self._counts)
        with self._state:
            snapshot["queued_bytes"] = self._queued_bytes
        snapshot["available"] = int(self.available)
        return snapshot

    def get_many(self, keys: list[str], max_bytes: list[int]) -> list[bytes | None]:
        """Each key's value, or None (absent, failed, timed out, empty, above its max_bytes)."""
        results: list[bytes | None] = [None] * len(keys)
        try:
            if len(max_bytes) != len(keys):
                self._warn.warning(
                    "args", "get_many: %d keys but %d sizes", len(keys), len(max_bytes)
                )
                return results
            self._count("gets", len(keys))
            if keys:
                done = self._bounded(self._read_values, list(keys), list(max_bytes))
                if done is None:
                    self._count("get_skipped", len(keys))
                else:
                    results = done
        except Exception:
            self._unexpected("get_many")
        return results

    def exists_many(self, keys: list[str]) -> list[bool]:
        """Whether Mooncake holds each key now (False when unknown); bounded like get_many."""
        try:
            self._count("exists_calls")
            found = self._bounded(self._read_exists, list(keys)) if keys else None
            if found is not None:
                return found
        except Exception:
            self._unexpected("exists_many")
        return [False] * len(keys)

    def put_async(self, key: str, value: bytes | memoryview) -> bool:
        """Queues value for a background put; False when dropped or the tier is unavailable."""
        try:
            if not self.available:
                self._count("put_skipped")
                return False
            data = value if isinstance(value, bytes) else bytes(value)
            if not 0 < len(data) <= self.options.transfer_buffer_bytes:
                return self._drop("value of %d bytes: outside 1..transfer_buffer_bytes", len(data))
            with self._state:
                if self._queued_bytes + len(data) > self.options.queue_max_bytes:
                    full = True
                else:
                    full = False
                    self._queue.append((key, data))
                    self._queued_bytes += len(data)
                    self._state.notify_all()
            if full:
                return self._drop(
                    "write-behind queue full (%d bytes)", self.options.queue_max_bytes
                )
            self._count("put_enqueued")
            return True
        except Exception:
            self._unexpected("put_async")
            return False

    def remove(self, key: str) -> None:
        """Best effort, in queue order: a put_async of the same key after this lands after it."""
        try:
            if self.available:
                with self._state:
                    self._queue.append((key, None))
                    self._state.notify_all()
        except Exception:
            self._unexpected("remove")

    def flush(self, timeout_s: float) -> bool:
        """Waits until every queued put and remove has been tried; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._state:
            while self._queue or self._queued_bytes or self._writing:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._state.wait(left)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the threads and closes the client; waits at most about timeout_s (+ close())."""
        with self._state, self._call_lock:
            if self._closed:
                return
            self._closed = True
            self._is_up = False
            discarded = sum(1 for _, data in self._queue if data is not None)
            self._queue.clear()
            self._queued_bytes = 0
            self._state.notify_all()
        self._count("put_skipped", discarded)
        deadline = time.monotonic() + timeout_s
        self._reader.stop()
        with self._call_lock:
            reads = list(self._reads)
        reads = [read for read in reads if not read.cancel()]  # (callbacks take _call_lock)
        futures_wait(reads, timeout=max(0.0, deadline - time.monotonic()))
        for thread in (self._writer, self._connector):
            thread.join(max(0.0, deadline - time.monotonic()))
        idle = not (self._writer.is_alive() or self._connector.is_alive())
        idle = idle and all(read.done() for read in reads)
        with self._state:
            store, self._store = self._store, None
        if store is not None and idle:
            self._release(store)
        elif store is not None:
            self._log.warning("mooncake: a call is still running at close; the client is leaked")
        self._log.info("mooncake tier closed: %s", self.counters())

    # -- reads --------------------------------------------------------------------------------

    def _bounded(self, work, *args):
        """Runs work(store, buffer, deadline, *args) on the read thread; None if not run or late."""
        store, buffer = self._store, self._read_buffer
        if store is None or buffer is None or not self.available:
            return None
        deadline = time.monotonic() + self.options.timeout_s
        with self._call_lock:
            if self._closed or (self._overdue is not None and not self._overdue.done()):
                return None
            future = self._reader.submit(work, store, buffer, deadline, *args)
            self._reads.add(future)
        future.add_done_callback(self._read_done)
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            self._count("timeouts")
            if not future.cancel():  # running, not queued behind another caller: it is stuck
                with self._call_lock:
                    self._overdue = future
                self._warn.warning(
                    "timeout", "mooncake: a read ran past %.1f s", self.options.timeout_s
                )
            return None

    def _read_done(self, future: Future) -> None:
        with self._call_lock:
            self._reads.discard(future)

    def _read_values(self, store, buffer: _Buffer, deadline: float, keys, max_bytes):
        results: list[bytes | None] = [None] * len(keys)
        wanted = []
        for index, size in enumerate(max_bytes):
            if isinstance(size, int) and 0 < size <= buffer.size:
                wanted.append((index, size))
            else:
                self._count("misses")
        for run in _chunks(wanted, buffer.size):
            if time.monotonic() >= deadline:
                self._count("get_skipped", len(run))
                continue
            codes = store.batch_get_into(
                [keys[i] for i, _ in run],
                [buffer.address + offset for _, offset in run],
                [max_bytes[i] for i, _ in run],
            )
            for (index, offset), code in zip(run, codes, strict=True):
                if code > 0:
                    results[index] = bytes(buffer.view[offset : offset + code])
            self._tally_reads(codes)
        return results

    def _tally_reads(self, codes: list[int]) -> None:
        hits = sum(1 for code in codes if code > 0)
        misses = sum(1 for code in codes if code == 0 or code in (NOT_FOUND, -600))
        self._count("hits", hits)
        self._count("misses", misses)
        self._count("get_errors", len(codes) - hits - misses)
        if RPC_FAIL in codes:
            self._mark_down("a read failed with RPC_FAIL")

    def _read_exists(self, store, _buffer, _deadline, keys):
        codes = store.batch_is_exist(keys)
        if RPC_FAIL in codes:
            self._mark_down("an existence check failed with RPC_FAIL")
        return [code == 1 for code in codes]

    # -- writes -------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._state:
                while not self._queue and not self._closed:
                    self._state.wait()
                if self._closed:
                    return
                batch = self._take_batch()
                self._writing = True
            try:
                self._write_batch(batch)
            except Exception:
                self._unexpected("writer")
            finally:
                with self._state:
                    self._queued_bytes -= sum(len(d) for _, d in batch if d is not None)
                    self._queued_bytes = max(0, self._queued_bytes)
                    self._writing = False
                    self._state.notify_all()

    def _take_batch(self) -> list:
        """A run of puts fitting the write buffer, or one remove (kept in queue order)."""
        batch: list = []
        used = 0
        capacity = self.options.transfer_buffer_bytes
        while self._queue and len(batch) < _MAX_PUT_BATCH:
            key, data = self._queue[0]
            if data is None:
                if not batch:
                    batch.append(self._queue.popleft())
                break
            aligned = (len(data) + _ALIGN - 1) // _ALIGN * _ALIGN
            if batch and used + aligned > capacity:
                break
            batch.append(self._queue.popleft())
            used += aligned
        return batch

    def _write_batch(self, batch: list) -> None:
        store, buffer = self._store, self._write_buffer
        puts = [(key, data) for key, data in batch if data is not None]
        if store is None or buffer is None or not self._is_up:
            self._count("put_skipped", len(puts))
            return
        if not puts:
            self._remove_now(store, batch[0][0])
            return
        first: dict[str, bytes] = {}
        for key, data in puts:
            first.setdefault(
                key, data
            )  # a key queued twice keeps its first value, as Mooncake does
        unique = list(first.items())
        present = store.batch_is_exist([key for key, _ in unique])
        if RPC_FAIL in present:
            self._mark_down("an existence check failed with RPC_FAIL")
            self._count("put_skipped", len(puts))
            return
        todo = [item for item, code in zip(unique, present, strict=True) if code != 1]
        self._count("put_exists", len(puts) - len(todo))  # a repeated key: its first value
        if todo:
            self._put_from(store, buffer, todo)

    def _put_from(self, store, buffer: _Buffer, todo: list) -> None:
        pointers = []
        offset = 0
        for _, data in todo:
            buffer.view[offset : offset + len(data)] = data
            pointers.append(buffer.address + offset)
            offset += (len(data) + _ALIGN - 1) // _ALIGN * _ALIGN
        codes = store.batch_put_from(
            [key for key, _ in todo], pointers, [len(data) for _, data in todo]
        )
        ok = [code == 0 for code in codes]
        self._count("put_ok", sum(ok))
        self._count(
            "put_bytes", sum(len(data) for (_, data), good in zip(todo, ok, strict=True) if good)
        )
        self._count("put_failed", len(codes) - sum(ok))
        self._count("put_no_space", sum(1 for code in codes if code == NO_SPACE))
        if len(codes) != sum(ok):
            worst = min(codes)
            self._warn.warning(
                "put",
                "mooncake: %d of %d puts failed (code %d)",
                len(codes) - sum(ok),
                len(codes),
                worst,
            )
        if RPC_FAIL in codes:
            self._mark_down("a put failed with RPC_FAIL")

    def _remove_now(self, store, key: str) -> None:
        self._count("removes")
        code = store.remove(key, True)  # force: a recent read's lease would refuse it
        if code not in (0, NOT_FOUND):
            self._count("remove_failed")
            if code == RPC_FAIL:
                self._mark_down("a remove failed with RPC_FAIL")

    def _drop(self, why: str, *args) -> bool:
        self._count("put_dropped")
        self._warn.warning("drop", "mooncake: put dropped: " + why, *args)
        return False

    # -- connection -----------------------------------------------------------------------------

    def _connect_loop(self) -> None:
        backoff_s = _BACKOFF_MIN_S
        while not self._closed:
            try:
                if self._store is None:
                    if self._connect():
                        backoff_s = _BACKOFF_MIN_S
                        continue
                    self._sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)
                else:
                    self._watch()
                    self._sleep(_PROBE_INTERVAL_S if self._is_up else backoff_s)
                    backoff_s = (
                        _BACKOFF_MIN_S if self._is_up else min(backoff_s * 2, _BACKOFF_MAX_S)
                    )
            except Exception:
                self._unexpected("connector")
                self._sleep(_BACKOFF_MAX_S)

    def _sleep(self, seconds: float) -> None:
        with self._state:
            if not self._closed:
                self._state.wait(seconds)

    def _connect(self) -> bool:
        store, why = _open_store(self.options)
        if store is None:
            self._count("connect_failures")
            self._warn.warning("connect", "mooncake: %s; retrying", why)
            return False
        if not self._register_buffers(store):
            _close_store(store, [])
            return False
        with self._state:
            closing = self._closed
            if not closing:
                self._store, self._is_up = store, True
        if closing:
            self._release(store)
            return False
        self._count("connects")
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
        if self._read_buffer is None:
            self._read_buffer = _Buffer(self.options.transfer_buffer_bytes)
            self._write_buffer = _Buffer(self.options.transfer_buffer_bytes)
        for buffer in (self._read_buffer, self._write_buffer):
            code = store.register_buffer(buffer.address, buffer.size)
            if code != 0:
                self._count("connect_failures")
                self._log.error("mooncake: register_buffer failed with code %d", code)
                return False
        return True

    def _watch(self) -> None:
        """Down when the master's port stops answering; up again once an RPC succeeds."""
        if not _reachable(self.options.endpoints()[:1], min(1.0, self.options.timeout_s)):
            self._mark_down("master unreachable")
            return
        if self._is_up:
            return
        if self._store.batch_is_exist([_PROBE_KEY])[0] not in (0, 1):
            return
        with self._state:
            came_back = not self._closed and not self._is_up
            self._is_up = self._is_up or came_back
        if came_back:
            self._count("reconnects")
            self._log.info("mooncake: master %s answers again", self.options.master_server_address)

    def _mark_down(self, why: str) -> None:
        with self._state:
            was_up, self._is_up = self._is_up, False
        if was_up:
            self._count("disconnects")
            self._log.warning("mooncake: tier unavailable: %s", why)

    def _release(self, store) -> None:
        _close_store(store, [self._read_buffer, self._write_buffer])

    # -- bookkeeping ------------------------------------------------------------------------------

    def _count(self, name: str, amount: int = 1) -> None:
        with self._counts_lock:
            self._counts[name] += amount

    def _unexpected(self, where: str) -> None:
        """Counts an exception; logs its traceback once per call site."""
        self._count("unexpected_errors")
        with self._counts_lock:
            first = where not in self._reported
            self._reported.add(where)
        if first:
            self._log.error("mooncake tier: unexpected error in %s", where, exc_info=True)
