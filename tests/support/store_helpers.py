"""Shared helpers for the record store tests (tests/test_store_*.py): deterministic content,
verified reads, and the child processes the tests start.

Import-only. The children's roles (crash writer, budget writer, concurrent writer, reader, open
measurement) are tests/store_child.py, started by `spawn` with the venv's python and PYTHONPATH
set to the repository root, so that every process runs this repository's code. The store's files
on disk: support/records.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys

from hicache_galahad.record import format as fmt
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
REPO_ROOT = os.path.dirname(TESTS_DIR)
PYTHON = sys.executable
CHILD = os.path.join(TESTS_DIR, "store_child.py")

GEOMETRY = {"dtype": "bfloat16", "layout": "layer_first", "page_size": 64, "tp_rank": 0}
NS_A = Namespace("tenant-a", "model-fp-1", "kv", GEOMETRY)

# A table that keeps the low 4 bits of every byte: random bytes through it carry 4 bits of
# entropy per byte, which zstd roughly halves (well past the store's 1/16 threshold).
_LOW_NIBBLE = bytes(value & 0x0F for value in range(256))


# ----------------------------------------------------------------------------- consistency


def assert_store_consistent(root: str, encryption_key_file: str | None = None) -> None:
    """The store's own check of a root no process has open any more (conftest's
    store_factory runs it after every test): every record sound, no temp file left, no
    reservation left in the ledger, and the ledger's committed bytes equal to the disk."""
    with RecordStore(root, read_only=True, encryption_key_file=encryption_key_file) as store:
        report = StoreAdmin(store).check()
        reservations = store.accounting.ledger.reservations()
    assert not report.damaged, report.damaged
    assert not report.unverifiable, report.unverifiable
    assert not report.stray_temp_files, report.stray_temp_files
    assert not reservations, f"reservations left in the ledger: {reservations}"
    assert report.ledger_drift_bytes == 0, (report.ledger_bytes, report.actual_bytes)


# ----------------------------------------------------------------------------- content


def content(key: str, size: int, compressible: bool = False) -> bytes:
    """Deterministic bytes for a key (the same in every process and every run)."""
    data = random.Random(f"galahad-test:{key}:{size}").randbytes(size)
    return data.translate(_LOW_NIBBLE) if compressible else data


def hex_key(label: str) -> str:
    """A 64-hex key, as SGLang names its pages (stored under its own name)."""
    return hashlib.sha256(label.encode()).hexdigest()


def crash_keyspace(count: int = 160) -> list[tuple[str, int, bool]]:
    """(key, size, compressible) for the crash test: sizes log-uniform in 1 KiB..1 MiB,
    every third key compressible, even keys 64-hex and odd keys free-form."""
    space = []
    for index in range(count):
        rng = random.Random(f"crash-size:{index}")
        size = int(1024 * 1024 ** rng.random())
        key = hex_key(f"crash-{index}") if index % 2 == 0 else f"crash-key/{index}"
        space.append((key, size, index % 3 == 0))
    return space


# ----------------------------------------------------------------------------- reads


def checked_get(store: RecordStore, namespace: Namespace, key: str, expected: bytes) -> bool:
    """get_into that fails the test if the store ever reports a hit with wrong bytes."""
    out = bytearray(b"\xa5" * len(expected))  # a sentinel that differs from any real page
    ok = store.get_into(namespace, key, out)
    assert ok in (True, False)
    if ok:
        assert bytes(out) == expected, f"store served wrong bytes for {key!r}"
    return ok


def verify_all(store: RecordStore, namespace: Namespace, items) -> dict:
    """Reads every (key, expected bytes); returns counts; any wrong byte fails."""
    hits = misses = 0
    for key, expected in items:
        if checked_get(store, namespace, key, expected):
            hits += 1
        else:
            misses += 1
    return {"hits": hits, "misses": misses}


# ----------------------------------------------------------------------------- files


def header_of(path: str) -> fmt.Header:
    with open(path, "rb") as record:
        data = record.read()
    return fmt.parse_header(data, len(data))


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped (so it is not alive)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, 0)
        raise AssertionError("pid was reused at once; cannot build a dead-writer temp file")
    return child.pid


# ----------------------------------------------------------------------------- processes


def helper_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def spawn(*args, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    """Starts `python tests/store_child.py ARGS` with stdout as a text pipe."""
    return subprocess.Popen(
        [PYTHON, CHILD, *map(str, args)],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=helper_env(),
        cwd=REPO_ROOT,
    )


def read_line(process: subprocess.Popen, timeout_s: float) -> str:
    """One line of the child's stdout, failing the test on timeout or early exit."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        raise AssertionError(f"child {process.pid} said nothing in {timeout_s} s")
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=10)
        raise AssertionError(f"child exited with {process.returncode}: {process.stderr.read()}")
    return line.strip()


def stop(process: subprocess.Popen) -> None:
    """Kills (by pid) a child of ours if it still runs, and reaps it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


@contextlib.contextmanager
def children():
    """Collects the processes a test starts and always kills and reaps them."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        for process in started:
            stop(process)


def run_json(*args, timeout_s: float = 120) -> dict:
    """Runs a child role to completion and returns the JSON of its last stdout line."""
    process = spawn(*args)
    try:
        out, err = process.communicate(timeout=timeout_s)
    finally:
        stop(process)
    assert process.returncode == 0, f"child {args} failed ({process.returncode}): {err}"
    return json.loads(out.strip().splitlines()[-1])


class _CountingListing:
    """An os.scandir iterator that counts the entries it hands out."""

    def __init__(self, listing, counter: list):
        self._listing, self._counter = listing, counter

    def __iter__(self):
        return self

    def __next__(self):
        entry = next(self._listing)
        self._counter[0] += 1
        return entry

    def close(self):
        self._listing.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def count_directory_entries(monkeypatch) -> list:
    """[count]: the directory entries read through os.scandir and os.listdir from now on (a
    measurement of what code reads, not of how long it takes); reset by assigning [0]."""
    counter = [0]
    real_scandir, real_listdir = os.scandir, os.listdir

    def listdir(*args, **kwargs):
        names = real_listdir(*args, **kwargs)
        counter[0] += len(names)
        return names

    monkeypatch.setattr(
        os, "scandir", lambda *a, **k: _CountingListing(real_scandir(*a, **k), counter)
    )
    monkeypatch.setattr(os, "listdir", listdir)
    return counter
