"""Fault injection: I/O errors a test cannot cause for real (ENOSPC, EIO) are injected into
the system calls the store makes; everything else (files, ledger, directory) is real."""

from __future__ import annotations

import errno
import os
import threading

import pytest
from support.records import (
    quarantine_files,
    record_files,
    record_path,
    store_disk_bytes,
    temp_files,
    write_key_file,
)
from support.store_helpers import NS_A, checked_get, content

from hicache_galahad.store import RecordStore
from hicache_galahad.store import reader as reader_module
from hicache_galahad.store.admin import StoreAdmin

MODES = {
    "plain": {},
    "zstd": {"compression": "zstd"},
    "aes": {"encrypted": True},
}


@pytest.fixture(params=sorted(MODES))
def store(request, tmp_path):
    options = dict(MODES[request.param])
    if options.pop("encrypted", False):
        options["encryption_key_file"] = write_key_file(tmp_path / "key", os.urandom(32))
    opened = RecordStore(str(tmp_path / "store"), durability="fsync", **options)
    opened.register_namespace(NS_A)
    # Some records already there, so that a failure has something to disturb.
    for index in range(3):
        key = f"existing-{index}"
        assert opened.put(NS_A, key, content(key, 20_000, compressible=True))
    yield opened
    opened.close()


class Fault:
    """Replaces os.<name> with a version that raises OSError(errno) on chosen calls.

    `when(args)` decides per call (default: every call); `partial` lets a failing os.writev
    first really write part of its buffers, as a disk that fills up mid-write does."""

    def __init__(self, monkeypatch, name, error, when=None, partial=False, times=None):
        self.name = name
        self.error = error
        self.real = getattr(os, name)
        self.when = when or (lambda args: True)
        self.partial = partial
        self.times = times
        self.calls = 0
        self.raised = 0
        self._lock = threading.Lock()
        monkeypatch.setattr(os, name, self)

    def __call__(self, *args, **kwargs):
        with self._lock:
            self.calls += 1
            fire = self.when(args) and (self.times is None or self.raised < self.times)
            if fire:
                self.raised += 1
        if not fire:
            return self.real(*args, **kwargs)
        if self.partial:
            fd, buffers = args[0], args[1]
            first = memoryview(buffers[0]).cast("B")
            self.real(fd, [first[: max(1, len(first) // 2)]])
        raise OSError(self.error, os.strerror(self.error))


def _is_temp_link(args) -> bool:
    return os.path.basename(str(args[0])).startswith(".tmp-")


def _is_file_fsync(args) -> bool:
    """A regular file's fsync (the temp record), not the directory's."""
    import stat

    return stat.S_ISREG(os.fstat(args[0]).st_mode)


WRITE_STEPS = {
    # step -> (os function, filter on its arguments, partial write first)
    "write": ("writev", None, True),
    "fsync": ("fsync", _is_file_fsync, False),
    "publish": ("link", _is_temp_link, False),
}


def snapshot(store: RecordStore) -> dict:
    return store.counters.snapshot()


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("step", sorted(WRITE_STEPS))
def test_write_fault_fails_cleanly_and_the_next_put_succeeds(store, monkeypatch, step, error):
    root = store.root
    name, when, partial = WRITE_STEPS[step]
    key = "victim"
    data = content(key, 300_000, compressible=True)
    ledger_before = store.usage_bytes()
    files_before = sorted(record_files(root))
    before = snapshot(store)

    fault = Fault(monkeypatch, name, error, when=when, partial=partial)
    assert store.put(NS_A, key, data) is False
    assert fault.raised >= 1
    monkeypatch.undo()

    after = snapshot(store)
    assert temp_files(root) == []
    assert not os.path.exists(record_path(root, NS_A, key))
    assert sorted(record_files(root)) == files_before
    assert store.usage_bytes() == ledger_before == store_disk_bytes(root)
    counter = "no_space" if error == errno.ENOSPC else "io_errors"
    assert after[counter] - before[counter] == 1
    assert after["puts_failed"] - before["puts_failed"] == 1
    assert after["puts"] == before["puts"]
    assert not checked_get(store, NS_A, key, data)

    # Without the fault the same put succeeds and the record reads back exactly.
    assert store.put(NS_A, key, data) is True
    assert checked_get(store, NS_A, key, data)
    assert store.usage_bytes() == store_disk_bytes(root) > ledger_before
    report = StoreAdmin(store).check()
    assert report.clean, report.as_dict()


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_temp_file_creation_fault(store, monkeypatch, error):
    """The directory entry for the temp file cannot be made (a full or failing disk)."""
    ledger_before = store.usage_bytes()
    Fault(monkeypatch, "open", error, when=lambda args: bool(args[1] & os.O_CREAT))
    assert store.put(NS_A, "victim", b"v" * 5000) is False
    monkeypatch.undo()
    assert temp_files(store.root) == []
    assert store.usage_bytes() == ledger_before
    assert store.put(NS_A, "victim", b"v" * 5000)
    assert checked_get(store, NS_A, "victim", b"v" * 5000)


@pytest.mark.parametrize("step", sorted(WRITE_STEPS))
def test_put_many_with_one_failing_record(store, monkeypatch, step):
    """One record of a batch hits the fault: only it fails; the ledger matches the disk."""
    name, when, partial = WRITE_STEPS[step]
    keys = [f"batch-{index}" for index in range(8)]
    datas = [content(key, 40_000 + index) for index, key in enumerate(keys)]
    fault = Fault(monkeypatch, name, errno.EIO, when=when, partial=partial, times=1)
    results = store.put_many(NS_A, keys, datas)
    monkeypatch.undo()
    assert fault.raised == 1
    assert results.count(False) == 1
    for key, data, ok in zip(keys, datas, results, strict=True):
        assert os.path.exists(record_path(store.root, NS_A, key)) == ok
        assert checked_get(store, NS_A, key, data) == ok
    assert temp_files(store.root) == []
    assert store.usage_bytes() == store_disk_bytes(store.root)
    assert store.put_many(NS_A, keys, datas) == [True] * len(keys)
    assert StoreAdmin(store).check().clean


def test_directory_fsync_fault_leaves_no_partial_record(store, monkeypatch):
    """If only the directory fsync fails the put reports False; whatever stays is complete
    (a read hits exactly) and the ledger still matches the disk."""
    import stat

    Fault(monkeypatch, "fsync", errno.EIO, when=lambda a: stat.S_ISDIR(os.fstat(a[0]).st_mode))
    before = snapshot(store)
    data = content("dir-victim", 10_000)
    assert store.put(NS_A, "dir-victim", data) is False
    monkeypatch.undo()
    assert snapshot(store)["io_errors"] - before["io_errors"] == 1
    assert temp_files(store.root) == []
    assert store.usage_bytes() == store_disk_bytes(store.root)
    if os.path.exists(record_path(store.root, NS_A, "dir-victim")):
        assert checked_get(store, NS_A, "dir-victim", data)
    assert store.put(NS_A, "dir-victim", data)
    assert checked_get(store, NS_A, "dir-victim", data)
    assert StoreAdmin(store).check().clean


def _is_record_fd(args) -> bool:
    """The call reads a record file (not the ledger, which is read with pread too)."""
    return os.readlink(f"/proc/self/fd/{args[0]}").endswith(".rec")


@pytest.mark.parametrize("calls", [("preadv",), ("pread", "preadv")], ids=["preadv", "any-read"])
@pytest.mark.parametrize("size", [20_000, 3 * 2**20 + 5], ids=["small", "large"])
def test_read_fault_is_a_transient_miss(store, monkeypatch, calls, size):
    key = "read-victim"
    data = content(key, size, compressible=True)
    assert store.put(NS_A, key, data)
    path = record_path(store.root, NS_A, key)
    inode = os.stat(path).st_ino
    before = snapshot(store)
    faults = [Fault(monkeypatch, call, errno.EIO, when=_is_record_fd) for call in calls]
    out = bytearray(len(data))
    assert store.get_into(NS_A, key, out) is False
    outs = [bytearray(len(data))]
    assert store.get_many_into(NS_A, [key], outs) == [False]
    monkeypatch.undo()
    # A small record of a store without compression is tried on the page-cache path first (a
    # read error there only sends it to the full path), then on the full path: two failed
    # reads per get, one miss.
    cached_path = store.codec.compression == "none" and reader_module.RWF_NOWAIT
    attempts = 2 if cached_path and size <= reader_module.FAST_READ_MAX_BYTES else 1
    assert sum(fault.raised for fault in faults) == 2 * attempts
    after = snapshot(store)
    assert after["io_errors"] - before["io_errors"] == 2
    assert after["misses"] - before["misses"] == 2
    assert after["corrupt"] == before["corrupt"] and after["quarantined"] == before["quarantined"]
    # Not quarantined: the same file is still there and serves once the disk recovers.
    assert os.stat(path).st_ino == inode
    assert quarantine_files(store.root) == []
    assert checked_get(store, NS_A, key, data)
    assert StoreAdmin(store).check().clean


def test_statvfs_failure_with_min_free_fails_the_put_cleanly(tmp_path, monkeypatch, store_factory):
    with store_factory(tmp_path / "store", min_free_bytes=1, durability="none") as store:
        store.register_namespace(NS_A)
        Fault(monkeypatch, "statvfs", errno.EIO)
        assert store.put(NS_A, "k", b"k" * 100) is False
        monkeypatch.undo()
        assert store.usage_bytes() == 0 and temp_files(store.root) == []
        assert store.put(NS_A, "k", b"k" * 100)
        assert store.usage_bytes() == store_disk_bytes(store.root)


def _is_ledger_write(args) -> bool:
    return os.readlink(f"/proc/self/fd/{args[0]}").endswith("/ledger")


def test_ledger_refusing_the_settle_over_counts_then_comes_right(store, monkeypatch):
    """The batch's records are published but the ledger cannot be written to end their
    reservations: the puts still succeed (the records are sound), the ledger keeps counting
    their bytes as reserved meanwhile (never under-counts: a failed update changes nothing,
    in memory either), and the next batch's settle commits them."""
    root = store.root
    keys = [f"settle-{index}" for index in range(4)]
    datas = [content(key, 30_000) for key in keys]
    real_link = os.link
    fault = None

    def link_then_fail_ledger(*args, **kwargs):
        nonlocal fault
        real_link(*args, **kwargs)
        if fault is None:  # from now on the ledger cannot be written
            fault = Fault(monkeypatch, "pwrite", errno.EIO, when=_is_ledger_write)

    monkeypatch.setattr(os, "link", link_then_fail_ledger)
    before = snapshot(store)
    assert store.put_many(NS_A, keys, datas) == [True] * len(keys)
    monkeypatch.undo()
    assert fault is not None and fault.raised >= 1
    assert snapshot(store)["io_errors"] - before["io_errors"] == 1
    assert all(checked_get(store, NS_A, key, data) for key, data in zip(keys, datas, strict=True))
    assert store.usage_bytes() >= store_disk_bytes(root)

    assert store.put(NS_A, "after", content("after", 30_000))
    assert store.usage_bytes() == store_disk_bytes(root)
    assert StoreAdmin(store).check().clean
