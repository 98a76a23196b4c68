"""One verdict per record, whichever path reads it: every read path of the product runs the
same corpus of sound, damaged and foreign records and must agree on the verdict and on the
rule of docs/FORMAT.md it names.

The paths: the page-cache read (`RecordReader.read_cached_into`, which only serves or
declines), the full read (`read_into`, on the I/O threads), the check of `galahad verify`
(`reader.files.verify`, every way it reads: a small file whole in one read, checked by one comparison
when it is a plain page or else rule by rule, and a larger one streamed piece by piece), a
Mooncake value (`decode_value`: the record held in memory), the
store's silent check (`RecordStore.verify`) and the writer's "already stored?" check (which
reads only the header: it must agree whenever the damage shows in the header or the size).
The records are real files written by a real store; the damage is done to their bytes.
"""

from __future__ import annotations

import os
import stat

import pytest
from support.records import write_key_file
from support.store_helpers import content

from hicache_galahad.errors import FormatError
from hicache_galahad.record import format as fmt
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.layout import record_filename
from hicache_galahad.store.payload import READ_CHUNK_BYTES

PAGE = 24_576
GEOMETRY = {"page_bytes": PAGE, "layers": 2}
NS = Namespace("tenant-a", "model-fp-1", "kv", GEOMETRY)
NS_OTHER = Namespace("tenant-a", "model-fp-1", "kv-other", GEOMETRY)
KEY, OTHER_KEY = "a" * 64, "b" * 64  # one key length: a swapped record differs in its echo
MODES = {
    "plain": ("none", False),
    "zstd": ("zstd", False),
    "aes": ("none", True),
    "aes-zstd": ("zstd", True),
}
HEADER_RULES = {f"V{number}" for number in range(0, 13)} | {"V16"}  # seen by the header alone


def _flip(data: bytearray, offset: int, mask: int = 0x01) -> bytearray:
    data = bytearray(data)
    data[offset] ^= mask
    return data


def corpus(sound: bytes, other_key: bytes, other_namespace: bytes, plain: bytes | None, small):
    """name -> (record bytes, the rule every path must name; None: several may apply, the
    paths must still agree; "ok": sound)."""
    header = fmt.parse_header(sound, len(sound))
    end, start = len(sound), header.header_len
    body_end = end - (fmt.TAG_BYTES if header.encrypted else 0)
    items = {
        "sound": (sound, "ok"),
        "to-zero": (b"", "V1"),
        "inside-fixed-header": (sound[:50], "V1"),
        "header-only": (sound[:start], "V8"),
        "by-1-byte": (sound[:-1], "V8"),
        "append-1-byte": (sound + b"\x00", "V8"),
        "cut-in-key-echo": (sound[: fmt.FIXED_HEADER_BYTES + 3], "V8"),
        "cut-in-payload": (sound[: (start + end) // 2], "V8"),
        # longer than any file verify reads whole: it streams it, and still names V8
        "append-a-read": (sound + bytes(READ_CHUNK_BYTES), "V8"),
        "zero-header": (bytes(fmt.FIXED_HEADER_BYTES) + sound[fmt.FIXED_HEADER_BYTES :], "V2"),
        "magic": (_flip(sound, 0), "V2"),
        "version": (_flip(sound, 8), "V3"),
        "flags-unknown": (_flip(sound, 11, 0x80), "V4"),
        "reserved": (_flip(sound, 67), "V5"),
        "header_len": (_flip(sound, 12), None),
        "payload_len": (_flip(sound, 16), None),
        "raw_len-high": (_flip(sound, 31, 0x80), "V7"),
        "raw_len": (_flip(sound, 24), None),
        "namespace": (_flip(sound, 40), "V11"),
        "key_echo": (_flip(sound, start - 1), "V10"),
        "digest-or-nonce": (_flip(sound, 70 if header.encrypted else 90), None),
        "payload-first": (_flip(sound, start), None),
        "payload-middle": (_flip(sound, (start + body_end) // 2), None),
        "payload-last": (_flip(sound, body_end - 1), None),
        "other-key": (other_key, "V10"),
        "other-namespace": (other_namespace, "V11"),
        "other-page-size": (small, "V16"),
    }
    if header.encrypted:
        items["tag-first"] = (_flip(sound, end - fmt.TAG_BYTES), "V14")
        items["tag-last"] = (_flip(sound, end - 1, 0x80), "V14")
        items["tag-middle"] = (_flip(sound, end - fmt.TAG_BYTES // 2), "V14")
        items["tag-zeroed"] = (sound[: end - fmt.TAG_BYTES] + bytes(fmt.TAG_BYTES), "V14")
        items["cut-in-tag"] = (sound[: end - fmt.TAG_BYTES // 2], "V8")
    if plain is not None:
        items["plaintext-in-encrypted-store"] = (plain, "V12")
    return items


def _rule(call) -> str:
    try:
        call()
    except FormatError as error:
        return error.rule
    return "ok"


class Paths:
    """Every path, over the record file of KEY in NS of one store."""

    def __init__(self, store: RecordStore):
        self.store = store
        self.reader = store.reader
        self.writer = store.writer

    def full_read(self) -> tuple[str, bytes | None]:
        out = bytearray(PAGE)
        rule = _rule(lambda: self.reader.read_into(NS, KEY, out))
        return rule, bytes(out) if rule == "ok" else None

    def cached_read(self) -> tuple[bool, bytes]:
        out = bytearray(PAGE)
        served = self.reader.read_cached_into(NS, KEY, out, record_filename(KEY))
        if served is not True and served is not None:
            served.close()  # (what it opened, for the full read)
        return served is True, bytes(out)

    def entry(self):
        return next(
            entry
            for entry in self.store.layout.records([NS.dirname])
            if entry.name == record_filename(KEY)
        )

    def whole_check(self) -> str:
        """verify_file as it reads a record of a page: the file whole, in one read."""
        return _rule(lambda: self.reader.files.verify(self.entry(), NS))

    def rules_check(self, data: bytes) -> str:
        """What verify_file does with a file read whole when the one-comparison check of a
        plain page (a 64-hex key, like KEY) declines it: every rule, one by one."""
        return _rule(lambda: self.reader.files._verify_whole(self.entry(), NS, data))

    def streaming_check(self) -> str:
        """verify_file as it reads a record larger than a read: piece by piece."""
        self.reader.files.verify_whole_max_bytes = 0
        try:
            return _rule(lambda: self.reader.files.verify(self.entry(), NS))
        finally:
            del self.reader.files.verify_whole_max_bytes

    def mooncake_value(self, data: bytes) -> tuple[str, bytes | None]:
        result = []
        rule = _rule(lambda: result.append(bytes(self.reader.decode_value(NS, KEY, data, PAGE))))
        return rule, result[0] if result else None

    def writer_says_sound(self) -> bool | None:
        dir_fd = self.store.layout.namespace_fd(NS.dirname)
        return self.writer._existing_is_sound(
            NS, dir_fd, fmt.encode_key(KEY), record_filename(KEY), PAGE
        )


@pytest.fixture(params=sorted(MODES))
def world(request, store_factory, tmp_path):
    compression, encrypted = MODES[request.param]
    key_file = write_key_file(tmp_path / "master.key") if encrypted else None

    def open_store(root, key=key_file, check=True):
        store = store_factory(
            tmp_path / root,
            check=check,
            compression=compression,
            encryption_key_file=key,
            durability="none",
        )
        store.register_namespace(NS)
        store.register_namespace(NS_OTHER)
        return store

    # check=False: the tests write records, damaged ones among them, behind the store's back
    store = open_store("store", check=False)
    page = content(KEY, PAGE, compressible=True)
    assert store.put(NS, KEY, page)
    assert store.put(NS, OTHER_KEY, content(OTHER_KEY, PAGE, compressible=True))
    assert store.put(NS_OTHER, KEY, page)
    # a sound record of KEY, of half a page: V16 to the check (the geometry names page_bytes)
    other_size = open_store("other-size", check=False)
    assert other_size.put(NS, KEY, content(KEY, PAGE // 2, compressible=True))
    small = _read(other_size, NS, KEY)
    other_size.close()
    plain = None
    if encrypted:
        plain_store = open_store("plain", key=None)
        assert plain_store.put(NS, KEY, page)
        plain = _read(plain_store, NS, KEY)
        plain_store.close()
    sound = _read(store, NS, KEY)
    items = corpus(sound, _read(store, NS, OTHER_KEY), _read(store, NS_OTHER, KEY), plain, small)
    return store, page, items


def _read(store, namespace, key) -> bytes:
    path = os.path.join(store.layout.namespace_dir(namespace.dirname), record_filename(key))
    with open(path, "rb") as record:
        return record.read()


def _write(store, data: bytes) -> None:
    path = os.path.join(store.layout.namespace_dir(NS.dirname), record_filename(KEY))
    with open(path, "wb") as record:
        record.write(data)


def test_every_read_path_gives_the_same_verdict_and_rule(world):
    store, page, items = world
    paths = Paths(store)
    disagreements = []
    for name, (data, expected) in items.items():
        _write(store, data)
        full, full_bytes = paths.full_read()
        _write(store, data)  # (a read may have moved a damaged record to quarantine)
        whole = paths.whole_check()
        rules = paths.rules_check(data)
        streaming = paths.streaming_check()
        value, value_bytes = paths.mooncake_value(data)
        served, cached_bytes = paths.cached_read()
        writer = paths.writer_says_sound()
        verdicts = {
            "read_into": full,
            "verify_file whole": whole,
            "verify_file rules": rules,
            "verify_file streamed": streaming,
            "decode_value": value,
        }
        if len(set(verdicts.values())) != 1 or (expected and full != expected):
            disagreements.append(f"{name}: expected {expected}, got {verdicts}")
            continue
        if full == "ok":
            assert full_bytes == page and value_bytes == page, name
        if served:  # the page-cache path serves only what the full path serves, exactly
            assert full == "ok" and cached_bytes == page, name
        if full == "ok" or full in HEADER_RULES:
            assert writer is (full == "ok"), f"{name}: the writer's check says {writer}"
        _write(store, data)
        assert store.verify(NS, KEY, PAGE) is (full == "ok"), name
    assert not disagreements, "paths disagree:\n" + "\n".join(disagreements)


def test_verify_reads_a_record_of_a_page_in_one_read(world, monkeypatch):
    """`galahad verify` reads a record file no larger than a read whole: one fstat and one
    pread (the plain read it is held to is one read), in every mode; a file one byte larger
    than that limit is streamed. Before: two fstats and two preads a record (three when
    encrypted) whatever its size, at 0.54-0.87x of a plain read of every file."""
    store, _, _ = world
    paths = Paths(store)
    entry = paths.entry()
    calls = {"fstat": 0, "pread": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            # (the held namespace directory is fstat-ed now and then: not the record's cost)
            if name != "fstat" or stat.S_ISREG(result.st_mode):
                calls[name] += 1
            return result

        return call

    monkeypatch.setattr(os, "fstat", counted("fstat", os.fstat))
    monkeypatch.setattr(os, "pread", counted("pread", os.pread))
    for limit, whole in ((entry.size_bytes, True), (entry.size_bytes - 1, False)):
        paths.reader.files.verify_whole_max_bytes = limit
        calls.update(fstat=0, pread=0)
        paths.reader.files.verify(entry, NS)  # sound: no error
        assert calls["fstat"] == 1, calls
        assert (calls["pread"] == 1) is whole, (limit, calls)


def test_verify_is_silent(store_factory):
    """RecordStore.verify (the hybrid trailing-state check) checks a record in full but is not
    a use of it: no get, hit or miss is counted and its time of last use stays as it was.
    Damage it finds is still counted and quarantined. Before: every verify counted a get (and
    a hit or a miss) and set the record's time of last use."""
    store = store_factory(durability="none")
    store.register_namespace(NS)
    assert store.put(NS, KEY, content(KEY, PAGE))
    path = os.path.join(store.layout.namespace_dir(NS.dirname), record_filename(KEY))
    old_s = 1_000_000_000
    os.utime(path, (old_s, old_s))
    before = store.counters.snapshot()
    assert store.verify(NS, KEY, PAGE)
    assert not store.verify(NS, OTHER_KEY, PAGE)  # missing
    after = store.counters.snapshot()
    for name in ("gets", "hits", "misses", "get_bytes"):
        assert after.get(name, 0) == before.get(name, 0), name
    assert os.stat(path).st_mtime == old_s
    _write(store, _flip(bytearray(_read(store, NS, KEY)), -1))  # damage is still found
    assert not store.verify(NS, KEY, PAGE)
    assert store.counters.snapshot()["corrupt"] == before.get("corrupt", 0) + 1
    assert store.stats().counter("quarantined") == 1
    store.close()


def test_a_bug_in_the_page_cache_path_is_counted_and_the_record_still_served(
    store_factory, monkeypatch
):
    """The page-cache path declines what it cannot serve; an exception from it is a bug
    (injected: one cannot be made on purpose). It used to be swallowed without a count, so a
    broken fast path would have sent every page to the threads unseen. Now it is counted in
    unexpected_errors and the record is still served by the full path."""
    store = store_factory(durability="none")
    store.register_namespace(NS)
    page = content(KEY, PAGE)
    assert store.put(NS, KEY, page)

    def broken(*args, **kwargs):
        raise RuntimeError("injected bug")

    monkeypatch.setattr(store.reader, "read_cached_into", broken)
    out = bytearray(PAGE)
    assert store.get_into(NS, KEY, out) and out == page
    assert store.counters.snapshot()["unexpected_errors"] == 1
    store.close()


def test_check_with_threads_gives_the_same_report(store_factory):
    """`galahad verify` with threads checks a small record whose bytes are in the page cache
    on its own thread (RWF_NOWAIT) and hands the others to the pool: the report is the one
    a single thread makes, damage and all, whichever way each record went. Records here are
    of two sizes with the whole-read limit between them (the larger always go to the pool),
    and some are dropped from the page cache (posix_fadvise, where the kernel honours it)."""
    namespace = Namespace("tenant-a", "model-fp-1", "kv-sizes", {"layers": 2})
    store = store_factory(check=False, durability="none")  # check=False: damage left to report
    store.register_namespace(namespace)
    keys = [f"{index:064x}" for index in range(300)]
    sizes = [4096 if index % 3 else 65_536 for index in range(300)]
    pages = [content(key, size) for key, size in zip(keys, sizes, strict=True)]
    assert all(store.put_many(namespace, keys, pages))
    directory = store.layout.namespace_dir(namespace.dirname)
    for index in range(0, 300, 7):  # damaged: the last payload byte, or the magic
        path = os.path.join(directory, record_filename(keys[index]))
        with open(path, "rb") as record:
            data = bytearray(record.read())
        data[-1 if index % 2 else 0] ^= 0x01
        with open(path, "wb") as record:
            record.write(data)
    for index in range(0, 300, 5):
        fd = os.open(os.path.join(directory, record_filename(keys[index])), os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    store.reader.files.verify_whole_max_bytes = 32_768
    reports = [StoreAdmin(store).check(threads=threads).as_dict() for threads in (1, 4, 1)]
    for report in reports:
        for name in ("elapsed_s", "records_per_s", "mb_per_s"):
            del report[name]
    assert reports[0] == reports[1] == reports[2]
    damaged = reports[0]["damaged"]
    assert len(damaged) == len(range(0, 300, 7)) and reports[0]["records"] == 300 - len(damaged)
    assert {problem.split(":")[0] for _, problem in damaged} == {"V2", "V13"}
    store.close()
