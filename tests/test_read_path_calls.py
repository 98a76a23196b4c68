"""The read path goes one way and costs what it must: a record is opened once per read (the
page-cache attempt hands what it opened to the full read), and a small record, compressed or
sealed, is read whole in one preadv with no fstat and no second header read. Every count here
was higher before (issue 29): two opens of a record not in the page cache (and of a missing
one), and a compressed record read three times with an fstat. The write path's flusher follows
the directory it was handed, never a path; and both key files are judged on the file read.
Real stores and files; the system calls are counted by wrapping `os` functions.
"""

from __future__ import annotations

import errno
import os
import threading

import pytest
from support.records import write_key_file
from support.store_helpers import content

from hicache_galahad.errors import KeyFileError
from hicache_galahad.record.crypto import load_master_key
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import reader as reader_module
from hicache_galahad.tier.mooncake.integrity import load_integrity_key

PAGE = 32768
NS = Namespace("tenant", "model", "kv", {"page_bytes": PAGE})
KEYS = [f"{index:064x}" for index in range(6)]
MODES = {"plain": ("none", False), "zstd": ("zstd", False), "aes": ("none", True)}
MODES["aes-zstd"] = ("zstd", True)


def _is_record(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").endswith(".rec")
    except OSError:
        return False


class Calls:
    """Counts os.open of record names and preadv/pread/fstat of record descriptors, from
    every thread."""

    def __init__(self, monkeypatch, not_cached: bool = False):
        self.counts = {"open": 0, "preadv": 0, "pread": 0, "fstat": 0}
        self._lock = threading.Lock()
        real = {name: getattr(os, name) for name in self.counts}

        def counted_open(path, *args, **kwargs):
            if str(path).endswith(".rec"):
                self._add("open")
            return real["open"](path, *args, **kwargs)

        def counted(name):
            def call(fd, *args, **kwargs):
                if isinstance(fd, int) and _is_record(fd):
                    self._add(name)
                    if name == "preadv" and not_cached and len(args) > 2 and args[2]:
                        raise BlockingIOError(errno.EAGAIN, "not in the page cache")
                return real[name](fd, *args, **kwargs)

            return call

        monkeypatch.setattr(os, "open", counted_open)
        for name in ("preadv", "pread", "fstat"):
            monkeypatch.setattr(os, name, counted(name))

    def _add(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1


@pytest.fixture(params=sorted(MODES))
def store(request, store_factory, tmp_path):
    compression, encrypted = MODES[request.param]
    key_file = write_key_file(tmp_path / "master.key") if encrypted else None
    store = store_factory(
        compression=compression,
        encryption_key_file=key_file,
        durability="none",
    )
    store.register_namespace(NS)
    pages = [content(key, PAGE, compressible=True) for key in KEYS]
    assert all(store.put_many(NS, KEYS, pages))
    return store, pages


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("cached", [True, False], ids=["warm", "cold"])
def test_a_small_record_is_opened_once_and_read_in_one_preadv(store, monkeypatch, cached):
    """Warm or not in the page cache (every RWF_NOWAIT read answering EAGAIN, as a slow disk
    makes it), plain, compressed or sealed: one open and one whole read per record, plus the
    failed page-cache attempt's preadv for a record not in the page cache; no fstat, no
    pread. Before: a record not in the page cache was opened twice, a sealed one read its
    header apart with an fstat, and a compressed one was read three times with an fstat."""
    store, pages = store
    fds_before = _open_fds()
    calls = Calls(monkeypatch, not_cached=not cached)
    outs = [bytearray(PAGE) for _ in KEYS]
    assert store.get_many_into(NS, KEYS, outs) == [True] * len(KEYS)
    monkeypatch.undo()
    assert outs == [bytearray(page) for page in pages]
    attempts = 2 if reader_module.RWF_NOWAIT and store.codec.compression == "none" else 1
    per_record = {name: count / len(KEYS) for name, count in calls.counts.items()}
    assert per_record == {
        "open": 1,
        "preadv": attempts if not cached else 1,
        "pread": 0,
        "fstat": 0,
    }, per_record
    assert _open_fds() == fds_before  # every descriptor the page-cache attempt kept is closed


def test_a_missing_record_is_looked_up_once(store, monkeypatch):
    store, _ = store
    calls = Calls(monkeypatch)
    absent = [f"{index:064x}" for index in range(100, 104)]
    assert store.get_many_into(NS, absent, [bytearray(PAGE) for _ in absent]) == [False] * 4
    monkeypatch.undo()
    assert calls.counts["open"] == len(absent)
    assert store.stats().counter("misses") == len(absent)


def test_damage_found_after_the_page_cache_attempt_is_named_and_quarantined(store):
    """The full read going on from what the page-cache attempt opened still names the rule
    and quarantines the record (the fast read declines; the rule-by-rule path decides)."""
    store, pages = store
    directory = store.layout.namespace_dir(NS.dirname)
    victim = os.path.join(directory, KEYS[2] + ".rec")
    with open(victim, "r+b") as record:
        record.seek(-3, os.SEEK_END)
        byte = record.read(1)
        record.seek(-3, os.SEEK_END)
        record.write(bytes([byte[0] ^ 0x40]))
    outs = [bytearray(PAGE) for _ in KEYS]
    results = store.get_many_into(NS, KEYS, outs)
    assert results == [index != 2 for index in range(len(KEYS))]
    assert not os.path.exists(victim) and store.stats().counter("quarantined") == 1
    counters = store.counters.snapshot()
    assert counters.get("failed_V13", 0) + counters.get("failed_V14", 0) == 1, counters


def test_the_writers_existence_check_costs_one_fstat(store, monkeypatch):
    """A put of a record already stored reads its header: one open, one fstat, one pread
    (before: two fstats)."""
    store, pages = store
    calls = Calls(monkeypatch)
    assert store.put_many(NS, KEYS, pages) == [True] * len(KEYS)
    monkeypatch.undo()
    assert calls.counts == {"open": 6, "preadv": 0, "pread": 6, "fstat": 6}, calls.counts


def test_the_flusher_fsyncs_through_the_directory_it_was_handed(store_factory):
    """Deferred durability: the records of a window are fsynced through a descriptor of the
    directory they were published in, not its path. A directory moved before the flush
    (here: renamed, a decoy directory of the same name holding nothing) still has its
    records fsynced; by path they were not found (0 flushed)."""
    # check=False: the records stay in the ".moved" directory, foreign to its name (V11)
    store = store_factory(check=False, durability="deferred", flush_interval_s=3600)
    store.register_namespace(NS)
    assert store.put_many(NS, KEYS[:3], [content(key, PAGE) for key in KEYS[:3]])
    directory = store.layout.namespace_dir(NS.dirname)
    os.rename(directory, directory + ".moved")
    os.mkdir(directory)
    assert store.flusher.flush() == 3
    assert store.counters.snapshot().get("flush_errors", 0) == 0


@pytest.mark.parametrize("load", [load_master_key, load_integrity_key])
def test_a_key_file_is_judged_on_the_file_it_reads(tmp_path, monkeypatch, load):
    """One loader for both key files: it opens, then checks the descriptor it reads. A key
    file swapped for a world-readable one between a check by path and the open (injected:
    a race cannot be won on demand) is refused; the encryption key's loader stat-ed the path
    and then opened it again, and read the swapped file."""
    path = write_key_file(tmp_path / "key", os.urandom(32))
    swapped = write_key_file(tmp_path / "swapped", os.urandom(32), 0o644)
    real_open = os.open

    def swapping_open(name, *args, **kwargs):
        if str(name) == str(path):
            os.replace(swapped, path)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", swapping_open)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load(str(path))


@pytest.mark.parametrize("load", [load_master_key, load_integrity_key])
def test_key_files_behind_a_symbolic_link_and_fifos(tmp_path, load):
    """A key mounted as a symbolic link (a Kubernetes secret) is read as before; a FIFO is
    refused at once, never waited on for a writer."""
    key = os.urandom(32)
    target = write_key_file(tmp_path / "real.key", key)
    (tmp_path / "link.key").symlink_to(target)
    assert load(str(tmp_path / "link.key")) == key
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load(str(tmp_path / "fifo"))


def test_a_huge_batch_of_cold_pages_never_holds_a_descriptor_each(store_factory, monkeypatch):
    """What the page-cache attempts hand on is bounded (HANDED_ON_MAX, here 2): past it a
    declined record is closed and the full read opens it again; every page is still served
    and every descriptor closed."""
    monkeypatch.setattr(reader_module, "HANDED_ON_MAX", 2)
    store = store_factory(durability="none")
    store.register_namespace(NS)
    pages = [content(key, PAGE) for key in KEYS]
    assert all(store.put_many(NS, KEYS, pages))
    fds_before = _open_fds()
    calls = Calls(monkeypatch, not_cached=True)
    outs = [bytearray(PAGE) for _ in KEYS]
    assert store.get_many_into(NS, KEYS, outs) == [True] * len(KEYS)
    assert outs == [bytearray(page) for page in pages]
    if reader_module.RWF_NOWAIT:
        assert calls.counts["open"] == 2 + 2 * (len(KEYS) - 2)
    assert _open_fds() == fds_before
    slots = store.reader._handed_on
    assert all(slots.acquire(blocking=False) for _ in range(2))  # every slot given back


def test_a_key_with_no_file_name_fails_only_its_own_put(store_factory):
    """File names are computed once per put, before the batch: a key that has none (not a
    string) still fails only its own record, never the put."""
    with store_factory(durability="none") as store:
        store.register_namespace(NS)
        page = content(KEYS[0], PAGE)
        assert store.put_many(NS, [None, KEYS[0]], [page, page]) == [False, True]
        assert store.get(NS, KEYS[0], PAGE) == page
