"""Reads of small records whose bytes are in the page cache are served on the caller's thread
with RWF_NOWAIT reads (no hand-off to the I/O threads); everything else, and every doubt, goes
to the full read path, which decides. Both paths must give the same answers."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import time

import pytest
from support.records import flip_byte, record_path, write_key_file

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store import reader as reader_module

NS = Namespace("tenant", "model", "kv", {"page_bytes": 32768})
PAGES = [bytes([index]) * 32768 for index in range(8)]
KEYS = [f"{index:064x}" for index in range(8)]

needs_nowait = pytest.mark.skipif(
    not reader_module.RWF_NOWAIT, reason="os.RWF_NOWAIT is not available on this platform"
)


def cached_pages(path: str) -> int:
    """How many of the file's pages are in the page cache (mincore(2) on a mapping that is
    never touched, so mapping it reads nothing)."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        view = (ctypes.c_char * size).from_buffer(mapping)
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        assert libc.mincore(ctypes.addressof(view), size, vector) == 0, ctypes.get_errno()
        del view
        return sum(byte & 1 for byte in vector)
    finally:
        mapping.close()


def drop_from_page_cache(path: str) -> None:
    """Evicts the file's pages, checked with mincore (the kernel may skip pages it still holds
    in a CPU's LRU batch), so a dropped file is verified, not assumed."""
    for _ in range(50):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if cached_pages(path) == 0:
            return
        time.sleep(0.02)
    pytest.skip(f"the kernel kept {path} in the page cache")


def check_cold_read(store: RecordStore, path: str, index: int, monkeypatch) -> None:
    """The record dropped from the page cache, then asked of the page-cache path: for real, it
    may decline or serve (RWF_NOWAIT starts the kernel's readahead, and on this fast virtual
    disk the read sometimes completes without blocking; seen in CI), and if it serves, the
    bytes must be right. Then with every RWF_NOWAIT read answering EAGAIN, as a disk that is
    really slow makes it, it must decline."""
    drop_from_page_cache(path)
    out = bytearray(32768)
    if store.reader.read_cached_into(NS, KEYS[index], out, os.path.basename(path)):
        assert out == PAGES[index]
    real_preadv = os.preadv

    def not_cached(fd, buffers, offset, flags=0):
        if flags & reader_module.RWF_NOWAIT:
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real_preadv(fd, buffers, offset, flags)

    with monkeypatch.context() as patched:
        patched.setattr(os, "preadv", not_cached)
        assert not store.reader.read_cached_into(
            NS, KEYS[index], bytearray(32768), os.path.basename(path)
        )
    drop_from_page_cache(path)


def stored(store_factory, tmp_path, **options) -> RecordStore:
    store = store_factory(tmp_path / "s", durability="fsync", **options)
    store.register_namespace(NS)
    assert all(store.put_many(NS, KEYS, PAGES))
    return store


class NoThreads:
    """An I/O pool that fails the test if anything is handed to it."""

    def map(self, *args, **kwargs):
        raise AssertionError("a warm small page was handed to the I/O threads")


@needs_nowait
def test_a_warm_record_is_served_on_the_callers_thread(store_factory, tmp_path, monkeypatch):
    with stored(store_factory, tmp_path) as store:
        out = bytearray(32768)
        assert store.reader.read_cached_into(NS, KEYS[3], out, os.path.basename(
            record_path(tmp_path / "s", NS, KEYS[3])))  # fmt: skip
        assert out == PAGES[3]
        monkeypatch.setattr(store.parts, "pool", NoThreads())
        outs = [bytearray(32768) for _ in KEYS]
        assert store.get_many_into(NS, KEYS, outs) == [True] * len(KEYS)
        assert outs == [bytearray(page) for page in PAGES]
        monkeypatch.undo()


@needs_nowait
def test_a_record_not_in_the_page_cache_goes_to_the_full_path(store_factory, tmp_path, monkeypatch):
    with stored(store_factory, tmp_path) as store:
        path = record_path(tmp_path / "s", NS, KEYS[5])
        check_cold_read(store, path, 5, monkeypatch)
        outs = [bytearray(32768) for _ in KEYS]
        assert store.get_many_into(NS, KEYS, outs) == [True] * len(KEYS)
        assert outs == [bytearray(page) for page in PAGES]
        stats = store.stats()
        assert stats.counter("hits") == len(KEYS) and stats.counter("misses") == 0


def test_a_damaged_warm_record_is_a_miss_and_quarantined(store_factory, tmp_path):
    with stored(store_factory, tmp_path) as store:
        path = record_path(tmp_path / "s", NS, KEYS[2])
        flip_byte(path, offset=-100)  # in the payload, still in the page cache
        assert not store.reader.read_cached_into(
            NS, KEYS[2], bytearray(32768), os.path.basename(path)
        )
        outs = [bytearray(32768) for _ in KEYS]
        results = store.get_many_into(NS, KEYS, outs)
        assert results == [index != 2 for index in range(len(KEYS))]
        assert not os.path.exists(path) and store.stats().counter("quarantined") == 1
        assert all(outs[index] == PAGES[index] for index in range(len(KEYS)) if index != 2)


def test_missing_and_wrong_size_records_take_the_full_path(store_factory, tmp_path):
    with stored(store_factory, tmp_path) as store:
        name = os.path.basename(record_path(tmp_path / "s", NS, "absent"))
        assert not store.reader.read_cached_into(NS, "absent", bytearray(32768), name)
        name = os.path.basename(record_path(tmp_path / "s", NS, KEYS[0]))
        assert not store.reader.read_cached_into(NS, KEYS[0], bytearray(16384), name)
        results = store.get_many_into(NS, ["absent", KEYS[0]], [bytearray(32768)] * 2)
        assert results == [False, True]


@needs_nowait
def test_sealed_records_warm_and_cold_tampered_and_under_a_wrong_key(
    store_factory, tmp_path, monkeypatch
):
    good = write_key_file(tmp_path / "good.key", bytes(range(32)))
    with stored(store_factory, tmp_path, encryption_key_file=good) as store:
        names = [os.path.basename(record_path(tmp_path / "s", NS, key)) for key in KEYS]
        out = bytearray(32768)
        assert store.reader.read_cached_into(NS, KEYS[1], out, names[1]) and out == PAGES[1]
        path = record_path(tmp_path / "s", NS, KEYS[4])
        check_cold_read(store, path, 4, monkeypatch)
        flip_byte(record_path(tmp_path / "s", NS, KEYS[6]), offset=-40)  # ciphertext
        assert not store.reader.read_cached_into(NS, KEYS[6], bytearray(32768), names[6])
        outs = [bytearray(32768) for _ in KEYS]
        assert store.get_many_into(NS, KEYS, outs) == [index != 6 for index in range(len(KEYS))]
        assert all(outs[index] == PAGES[index] for index in range(len(KEYS)) if index != 6)
        assert store.stats().counter("quarantined") == 1
    wrong = write_key_file(tmp_path / "wrong.key", bytes(range(1, 33)))
    with store_factory(tmp_path / "s", encryption_key_file=wrong) as store:
        assert not store.reader.read_cached_into(NS, KEYS[1], bytearray(32768), names[1])
        assert store.get_many_into(NS, KEYS[:2], [bytearray(32768)] * 2) == [False, False]
        assert os.path.exists(record_path(tmp_path / "s", NS, KEYS[1]))  # a wrong key: kept


@pytest.mark.parametrize("cached", [True, False])
def test_a_sealed_page_of_many_pieces_is_written_only_once_its_tag_verifies(
    store_factory, tmp_path, cached
):
    """A page split over layers (several buffers) is decrypted in a scratch buffer and copied
    into the caller's buffers after the tag verifies: a tampered record leaves them as they
    were, and a sound one fills them exactly, warm or cold."""
    key_file = write_key_file(tmp_path / "k", bytes(range(32)))
    with stored(store_factory, tmp_path, encryption_key_file=key_file) as store:
        for index in (2, 3):
            if not cached:
                drop_from_page_cache(record_path(tmp_path / "s", NS, KEYS[index]))
        pieces = [bytearray(b"\xee" * 4096) for _ in range(8)]
        assert store.get_many_into(NS, [KEYS[2]], [pieces]) == [True]
        assert b"".join(pieces) == PAGES[2]
        flip_byte(record_path(tmp_path / "s", NS, KEYS[3]), offset=-4000)
        if not cached:
            drop_from_page_cache(record_path(tmp_path / "s", NS, KEYS[3]))
        pieces = [bytearray(b"\xee" * 4096) for _ in range(8)]
        assert store.get_many_into(NS, [KEYS[3]], [pieces]) == [False]
        assert all(piece == b"\xee" * 4096 for piece in pieces)


def test_a_destination_the_cached_path_cannot_use_is_a_miss_not_an_exception(
    store_factory, tmp_path
):
    with stored(store_factory, tmp_path) as store:
        assert store.get_many_into(NS, [KEYS[0], KEYS[1]], [object(), bytearray(32768)]) == [
            False,
            True,
        ]
        assert store.stats().counter("unexpected_errors") == 1
