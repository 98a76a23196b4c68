"""Mayhem: every way a record file can be damaged, misplaced or left half-written on disk.

Each damage must come back from get_into as a miss (never wrong bytes, never an exception),
be counted under the right counter, and `check(fix=True)` must leave a clean store. The
records are real files written by the store; the damage is done to those files.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from support.records import quarantine_files, record_path, temp_files, write_key_file
from support.store_helpers import NS_A, checked_get, content, dead_pid, header_of, hex_key

from hicache_galahad.record import format as fmt
from hicache_galahad.record.crypto import KeyFileError
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.layout import record_filename

MODES = {
    "plain": {"compression": "none", "encrypted": False},
    "zstd": {"compression": "zstd", "encrypted": False},
    "aes": {"compression": "none", "encrypted": True},
    "aes-zstd": {"compression": "zstd", "encrypted": True},
}
# Same tenant (so the same AES key), another pool: another namespace.
NS_B = Namespace(NS_A.tenant, NS_A.model_fingerprint, "kv-other", NS_A.geometry)


def item_key(index: int) -> str:
    return hex_key(f"page-{index}") if index % 2 == 0 else f"page/{index}"


LARGE_SIZE = 5 * 2**19 + 7  # 2.5 MiB: past the store's 1 MiB single-read fast path


def item_size(index: int, large: bool = False) -> int:
    if large and index == 3:
        return LARGE_SIZE
    return 3000 + (index * 7919) % 60000


@dataclass
class World:
    root: str
    mode: str
    key_file: str | None
    store: RecordStore
    open_with: Callable  # conftest's store_factory
    items: dict = field(default_factory=dict)  # key -> bytes put

    def open_store(self, *, check: bool = True, **overrides) -> RecordStore:
        options = {
            "compression": MODES[self.mode]["compression"],
            "encryption_key_file": self.key_file,
            "durability": "none",
        }
        return self.open_with(self.root, check=check, **(options | overrides))

    def path(self, key: str, namespace: Namespace = NS_A) -> str:
        return record_path(self.root, namespace, key)

    def data(self, key: str) -> bytearray:
        with open(self.path(key), "rb") as record:
            return bytearray(record.read())

    def write(self, key: str, data) -> None:
        with open(self.path(key), "r+b") as record:
            record.truncate(0)
            record.write(data)


def make_world(
    store_factory, tmp_path, mode: str, count: int = 4, large: bool = False, check: bool = True
) -> World:
    key_file = None
    if MODES[mode]["encrypted"]:
        key_file = write_key_file(tmp_path / "master.key", os.urandom(32))
    root = str(tmp_path / "store")
    world = World(root, mode, key_file, store=None, open_with=store_factory)
    world.store = world.open_store(check=check)
    world.store.register_namespace(NS_A)
    world.store.register_namespace(NS_B)
    for index in range(count):
        key = item_key(index)
        data = content(key, item_size(index, large), compressible=True)
        assert world.store.put(NS_A, key, data)
        world.items[key] = data
    for key in world.items:  # the records really are in the mode asked for
        header = header_of(world.path(key))
        assert header.compressed == (MODES[mode]["compression"] == "zstd")
        assert header.encrypted == MODES[mode]["encrypted"]
    return world


@pytest.fixture(params=sorted(MODES))
def mode(request):
    return request.param


@pytest.fixture
def world(store_factory, tmp_path, mode):
    return make_world(store_factory, tmp_path, mode)


def counters(store: RecordStore) -> dict:
    return store.counters.snapshot()


def delta(before: dict, after: dict, name: str) -> int:
    return after[name] - before[name]


# ----------------------------------------------------------------------------- mutations
#
# A mutation damages the store's files around `target` (and `other`, another stored key) and
# returns what the store must say: which keys now miss and under which counter ("corrupt",
# "foreign", or None for a plain miss), which files `check()` must call damaged, and which
# FORMAT.md rule the read must report (None when several rules may apply).


@dataclass
class Expect:
    affected: dict  # key -> "corrupt" | "foreign" | None
    damaged_paths: list
    rule: str | None = None
    stray_temps: list = field(default_factory=list)


def _truncate(size_of):
    def mutate(world: World, target: str, other: str) -> Expect:
        data = world.data(target)
        header_len = fmt.FIXED_HEADER_BYTES + len(target.encode())
        size = size_of(len(data), header_len)
        assert 0 <= size < len(data)
        world.write(target, data[:size])
        rule = "V1" if size < fmt.FIXED_HEADER_BYTES else "V8"
        return Expect({target: "corrupt"}, [world.path(target)], rule)

    return mutate


def _flip(offset_of, bits=(0, 7), counter="corrupt"):
    """Flips each bit in turn (re-putting the record in between, see test_header_flip)."""

    def mutate(world: World, target: str, other: str, bit: int) -> Expect:
        data = world.data(target)
        header = fmt.parse_header(data, len(data))
        offset = offset_of(header, len(data))
        data[offset] ^= 1 << bit
        world.write(target, data)
        return Expect({target: counter}, [world.path(target)])

    mutate.bits = bits
    return mutate


def _zero(range_of, rule=None):
    def mutate(world: World, target: str, other: str) -> Expect:
        data = world.data(target)
        header = fmt.parse_header(data, len(data))
        start, end = range_of(header, len(data))
        assert 0 <= start < end <= len(data)
        assert any(data[start:end]), "zeroing must change the record"
        data[start:end] = bytes(end - start)
        world.write(target, data)
        return Expect({target: "corrupt"}, [world.path(target)], rule)

    return mutate


def _append(count):
    def mutate(world: World, target: str, other: str) -> Expect:
        with open(world.path(target), "ab") as record:
            record.write(os.urandom(count))
        return Expect({target: "corrupt"}, [world.path(target)], "V8")

    return mutate


def _swap(world: World, target: str, other: str) -> Expect:
    first, second = world.path(target), world.path(other)
    parked = first + ".parked"
    os.rename(first, parked)
    os.rename(second, first)
    os.rename(parked, second)
    return Expect({target: "foreign", other: "foreign"}, [first, second], "V10")


def _copy_over(world: World, target: str, other: str) -> Expect:
    shutil.copyfile(world.path(other), world.path(target))
    return Expect({target: "foreign"}, [world.path(target)], "V10")


def _copy_over_same_size(world: World, target: str, other: str) -> Expect:
    """A record of another key with the same key length and page size (as every KV page of
    a pool has): only the key echo tells it apart from the record asked for."""
    twin = "twin" + target[4:]
    assert twin != target and len(twin) == len(target)
    data = content(twin, len(world.items[target]), compressible=True)
    assert world.store.put(NS_A, twin, data)
    world.items[twin] = data
    shutil.copyfile(world.path(twin), world.path(target))
    return Expect({target: "foreign"}, [world.path(target)], "V10")


def _copy_to_other_namespace(world: World, target: str, other: str) -> Expect:
    foreign_path = world.path(target, NS_B)
    shutil.copyfile(world.path(target), foreign_path)
    # The copy is a miss in B (checked by the test through `foreign_reads`); A is untouched.
    expect = Expect({}, [foreign_path], "V11")
    expect.foreign_reads = {target: "foreign"}
    return expect


def _delete(world: World, target: str, other: str) -> Expect:
    size = os.path.getsize(world.path(target))
    os.unlink(world.path(target))
    expect = Expect({target: None}, [])
    expect.drift = size  # the ledger still counts the file removed behind the store's back
    return expect


def _stray_temps(world: World, target: str, other: str) -> Expect:
    """Temp files of a dead writer: a partial write, a complete one (killed between link and
    unlink) and one for a key that was never published. None of them is ever read."""
    pid = dead_pid()
    directory = os.path.dirname(world.path(target))
    data = world.data(target)
    never = "never-published"
    made = []
    for suffix, body in (
        (record_filename(target), data[: len(data) // 2]),
        (record_filename(target), data),
        (record_filename(never), os.urandom(5000)),
    ):
        path = os.path.join(directory, f".tmp-{pid}-{os.urandom(4).hex()}-{suffix}")
        with open(path, "wb") as temp:
            temp.write(body)
        made.append(path)
    world.items[never] = content(never, 5000)  # asked for below: a plain miss
    return Expect({never: None}, [], stray_temps=made)


def _payload_offset(fraction):
    def offset(header, file_len):
        body_len = header.payload_len - (fmt.TAG_BYTES if header.encrypted else 0)
        return header.header_len + min(body_len - 1, int(body_len * fraction))

    return offset


def _middle_block(start: int, end: int, size: int) -> tuple[int, int]:
    middle = (start + end) // 2
    return max(start, middle - size // 2), min(end, middle + size // 2)


TRUNCATIONS = {
    "to-zero": _truncate(lambda n, h: 0),
    "inside-magic": _truncate(lambda n, h: 5),
    "inside-namespace": _truncate(lambda n, h: 50),
    "inside-digest": _truncate(lambda n, h: 100),
    "fixed-header-minus-1": _truncate(lambda n, h: fmt.FIXED_HEADER_BYTES - 1),
    "inside-key-echo": _truncate(lambda n, h: h - 3),
    "header-only": _truncate(lambda n, h: h),
    "half-payload": _truncate(lambda n, h: (n + h) // 2),
    "by-1-byte": _truncate(lambda n, h: n - 1),
}

# (field region of the header) -> first byte offset; the last byte of wide fields too.
HEADER_REGIONS = {
    "magic": (0, 7),
    "version": (8, 9),
    "flags": (10, 11),
    "header_len": (12, 15),
    "payload_len": (16, 23),
    "raw_len": (24, 31),
    "namespace": (32, 63),
    "key_len": (64, 65),
    "digest_alg": (66, 66),
    "reserved": (67, 67),
    "nonce": (68, 79),
    "digest": (80, 111),
    "key_echo": (112, -1),  # -1: the header's last byte
}
# A flipped bit in the identity fields makes the record name another key or namespace; the
# store checks identity (V10/V11) before the digest, so it counts these as foreign.
IDENTITY_REGIONS = {"namespace", "key_echo"}

OTHER_MUTATIONS = {
    "payload-flip-first": _flip(_payload_offset(0.0)),
    "payload-flip-middle": _flip(_payload_offset(0.5)),
    "payload-flip-last": _flip(_payload_offset(1.0)),
    "zero-whole-file": _zero(lambda h, n: (0, n), "V2"),
    "zero-header": _zero(lambda h, n: (0, fmt.FIXED_HEADER_BYTES), "V2"),
    "zero-payload": _zero(lambda h, n: (h.header_len, n)),
    "zero-1k-block": _zero(lambda h, n: _middle_block(h.header_len, n, 1024)),
    "append-1-byte": _append(1),
    "append-4k": _append(4096),
    "swap-two-records": _swap,
    "copy-over-another": _copy_over,
    "copy-over-same-size-record": _copy_over_same_size,
    "copy-into-other-namespace": _copy_to_other_namespace,
    "delete": _delete,
    "stray-temps-of-dead-writer": _stray_temps,
}
TAG_MUTATIONS = {
    "aes-tag-flip-first": _flip(lambda h, n: n - fmt.TAG_BYTES),
    "aes-tag-flip-last": _flip(lambda h, n: n - 1, bits=(0, 3, 7)),
}


# ----------------------------------------------------------------------------- the flow


def assert_reads(world: World, expect: Expect, caplog) -> None:
    """Reads every key: affected keys miss under their counter, the others hit exactly."""
    store = world.store
    before = counters(store)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hicache_galahad.store"):
        for key, data in world.items.items():
            ok = checked_get(store, NS_A, key, data)
            assert ok == (key not in expect.affected), key
        for key in getattr(expect, "foreign_reads", {}):
            assert not checked_get(store, NS_B, key, world.items[key])
    after = counters(store)
    wanted = list(expect.affected.values()) + list(getattr(expect, "foreign_reads", {}).values())
    assert delta(before, after, "corrupt") == wanted.count("corrupt")
    assert delta(before, after, "foreign") == wanted.count("foreign")
    assert delta(before, after, "misses") == len(wanted)
    assert delta(before, after, "hits") == len(world.items) - len(expect.affected)
    assert delta(before, after, "io_errors") == 0
    assert delta(before, after, "quarantined") == len(wanted) - wanted.count(None)
    if expect.rule is not None:
        assert f"failed {expect.rule} " in caplog.text, caplog.text
    # Quarantined records are gone from the namespace: a second read is a plain miss.
    before = counters(store)
    for key in expect.affected:
        assert not checked_get(store, NS_A, key, world.items[key])
    after = counters(store)
    assert delta(before, after, "corrupt") + delta(before, after, "foreign") == 0
    assert delta(before, after, "misses") == len(expect.affected)


def assert_check_sees(world: World, expect: Expect) -> None:
    report = StoreAdmin(world.store).check()
    assert sorted(path for path, _ in report.damaged) == sorted(expect.damaged_paths)
    assert sorted(report.stray_temp_files) == sorted(expect.stray_temps)
    if expect.damaged_paths or expect.stray_temps:
        assert not report.clean
    if hasattr(expect, "drift"):
        assert report.ledger_drift_bytes == expect.drift


def assert_fixed_and_reput(world: World) -> None:
    store = world.store
    fixed = StoreAdmin(store).check(fix=True)
    assert fixed.fixed
    report = StoreAdmin(store).check()
    assert report.clean, report.as_dict()
    assert report.damaged == [] and report.stray_temp_files == []
    assert report.ledger_drift_bytes == 0
    assert temp_files(world.root) == []
    # A re-put of each lost key stores a fresh, good record.
    for key, data in world.items.items():
        assert store.put(NS_A, key, data)
        assert checked_get(store, NS_A, key, data)
    report = StoreAdmin(store).check()
    assert report.clean, report.as_dict()
    assert report.records == len(world.items)


def run_mutation(world: World, mutate, caplog, *extra, target_index: int = 1) -> None:
    target, other = item_key(target_index), item_key(0)
    expect = mutate(world, target, other, *extra)
    assert_check_sees(world, expect)
    assert_reads(world, expect, caplog)
    assert_fixed_and_reput(world)


@pytest.mark.parametrize("name", sorted(TRUNCATIONS))
def test_truncation_is_a_corrupt_miss(world, name, caplog):
    run_mutation(world, TRUNCATIONS[name], caplog)


@pytest.mark.parametrize("region", sorted(HEADER_REGIONS))
def test_header_flip_is_a_miss(world, region, caplog):
    first, last = HEADER_REGIONS[region]
    counter = "foreign" if region in IDENTITY_REGIONS else "corrupt"
    offsets = {first, last}
    for offset in sorted(offsets):
        for bit in (0, 7):

            def offset_of(header, file_len, offset=offset):
                return header.header_len - 1 if offset == -1 else offset

            run_mutation(world, _flip(offset_of, counter=counter), caplog, bit)


@pytest.mark.parametrize("name", sorted(OTHER_MUTATIONS))
def test_damage_is_a_miss(world, name, caplog):
    mutate = OTHER_MUTATIONS[name]
    for bit in getattr(mutate, "bits", (None,)):
        run_mutation(world, mutate, caplog, *(() if bit is None else (bit,)))


@pytest.mark.parametrize("name", sorted(TAG_MUTATIONS))
@pytest.mark.parametrize("mode", ["aes", "aes-zstd"])
def test_aes_tag_flip_is_a_miss(world, name, caplog):
    bits = TAG_MUTATIONS[name].bits
    for bit in bits:
        run_mutation(world, TAG_MUTATIONS[name], caplog, bit)
        if bit == bits[0]:  # later warnings of the same rule are rate-limited
            assert "failed V14 " in caplog.text


LARGE_RECORD_MUTATIONS = {
    "trunc-by-1-byte": TRUNCATIONS["by-1-byte"],
    "trunc-half-payload": TRUNCATIONS["half-payload"],
    "payload-flip-first": OTHER_MUTATIONS["payload-flip-first"],
    "payload-flip-middle": OTHER_MUTATIONS["payload-flip-middle"],
    "payload-flip-last": OTHER_MUTATIONS["payload-flip-last"],
    "zero-1k-block": OTHER_MUTATIONS["zero-1k-block"],
    "append-1-byte": OTHER_MUTATIONS["append-1-byte"],
    "copy-over-another": OTHER_MUTATIONS["copy-over-another"],
    "copy-over-same-size-record": OTHER_MUTATIONS["copy-over-same-size-record"],
}


@pytest.mark.parametrize("name", sorted(LARGE_RECORD_MUTATIONS))
def test_large_record_damage_is_a_miss(store_factory, tmp_path, mode, name, caplog):
    """A record too big for the single-read path: read and hashed in chunks."""
    world = make_world(store_factory, tmp_path, mode, large=True)
    assert len(world.items[item_key(3)]) == LARGE_SIZE
    mutate = LARGE_RECORD_MUTATIONS[name]
    for bit in getattr(mutate, "bits", (None,)):
        extra = () if bit is None else (bit,)
        run_mutation(world, mutate, caplog, *extra, target_index=3)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_all_damage_at_once_fixed_by_check_before_any_read(store_factory, tmp_path, mode):
    """Every mutation on its own records, then check(fix=True) with no read in between:
    check alone finds and quarantines all of it, and the store serves nothing wrong."""
    mutations = {**{f"trunc-{k}": v for k, v in TRUNCATIONS.items()}, **OTHER_MUTATIONS}
    if MODES[mode]["encrypted"]:
        mutations |= TAG_MUTATIONS
    world = make_world(store_factory, tmp_path, mode, count=2 * len(mutations))
    expected_damaged = []
    expected_strays = []
    affected = set()
    for index, (_name, mutate) in enumerate(sorted(mutations.items())):
        target, other = item_key(2 * index + 1), item_key(2 * index)
        args = (7,) if hasattr(mutate, "bits") else ()
        expect = mutate(world, target, other, *args)
        expected_damaged += expect.damaged_paths
        expected_strays += expect.stray_temps
        affected |= set(expect.affected)
    report = StoreAdmin(world.store).check(fix=True)
    assert sorted(p for p, _ in report.damaged) == sorted(expected_damaged)
    assert sorted(report.stray_temp_files) == sorted(expected_strays)
    # Quarantine keeps only the newest few damaged files; the ledger counts what stays.
    assert len(quarantine_files(world.root)) == report.quarantined_files
    after = StoreAdmin(world.store).check()
    assert after.clean, after.as_dict()
    assert after.damaged == []
    outs = [bytearray(len(data)) for data in world.items.values()]
    results = world.store.get_many_into(NS_A, list(world.items), outs)
    for ok, out, data in zip(results, outs, world.items.values(), strict=True):
        assert not ok or bytes(out) == data
    assert results == [key not in affected for key in world.items]
    snapshot = world.store.counters.snapshot()
    assert snapshot["corrupt"] == snapshot["foreign"] == 0  # check took them all
    assert world.store.put_many(NS_A, list(world.items), list(world.items.values()))
    for key, data in world.items.items():
        assert checked_get(world.store, NS_A, key, data)
    assert StoreAdmin(world.store).check().clean


# ----------------------------------------------------------------------------- re-puts


REPUT_HEADER_DAMAGE = {
    "by-1-byte": TRUNCATIONS["by-1-byte"],
    "inside-key-echo": TRUNCATIONS["inside-key-echo"],
    "zero-header": OTHER_MUTATIONS["zero-header"],
    "append-1-byte": OTHER_MUTATIONS["append-1-byte"],
    "copy-over-another": OTHER_MUTATIONS["copy-over-another"],
}


@pytest.mark.parametrize("name", sorted(REPUT_HEADER_DAMAGE))
def test_reput_replaces_a_record_with_damage_visible_in_its_header(world, name):
    """No read in between: put itself sees the bad header and writes a fresh record."""
    target, other = item_key(1), item_key(0)
    REPUT_HEADER_DAMAGE[name](world, target, other)
    before = counters(world.store)
    assert world.store.put(NS_A, target, world.items[target])
    after = counters(world.store)
    assert delta(before, after, "puts") == 1  # written anew, not "already there"
    assert delta(before, after, "quarantined") == 1
    assert checked_get(world.store, NS_A, target, world.items[target])
    assert StoreAdmin(world.store).check(fix=True).damaged == []
    assert StoreAdmin(world.store).check().clean


@pytest.mark.parametrize("mode", ["plain"])
def test_reput_after_payload_damage_then_read_stores_a_good_record(world):
    target = item_key(1)
    _flip(_payload_offset(0.5))(world, target, item_key(0), 0)
    assert not checked_get(world.store, NS_A, target, world.items[target])
    assert world.store.put(NS_A, target, world.items[target])
    assert checked_get(world.store, NS_A, target, world.items[target])


@pytest.mark.xfail(
    strict=True,
    reason="put's existence check reads only the header: a record whose payload rotted is "
    "reported as already stored until a read quarantines it (design limitation)",
)
@pytest.mark.parametrize("mode", ["plain"])
def test_reput_right_after_payload_damage_stores_a_good_record(world):
    target = item_key(1)
    _flip(_payload_offset(0.5))(world, target, item_key(0), 0)
    assert world.store.put(NS_A, target, world.items[target])
    assert checked_get(world.store, NS_A, target, world.items[target])


# ----------------------------------------------------------------------------- encryption


def test_wrong_key_gives_misses_never_garbage(store_factory, tmp_path, caplog):
    world = make_world(store_factory, tmp_path, "aes-zstd")
    world.store.close()
    other_key = write_key_file(tmp_path / "other.key", os.urandom(32))
    with (
        world.open_store(encryption_key_file=other_key) as wrong,
        caplog.at_level(logging.WARNING, logger="hicache_galahad.store"),
    ):
        for key, data in world.items.items():
            assert not checked_get(wrong, NS_A, key, data)
        snapshot = counters(wrong)
        assert snapshot["corrupt"] == len(world.items)
        assert snapshot["misses"] == len(world.items) and snapshot["hits"] == 0
        assert "failed V14 " in caplog.text


def test_other_tenant_key_cannot_open_a_record_moved_across_tenants(store_factory, tmp_path):
    """A record copied from tenant A's namespace into tenant B's directory is foreign (its
    namespace echo) and could not be opened anyway (per-tenant key)."""
    # check=False: the copy came in behind the store's back, so the ledger never counted it
    world = make_world(store_factory, tmp_path, "aes", check=False)
    ns_t2 = Namespace("tenant-b", NS_A.model_fingerprint, NS_A.pool, NS_A.geometry)
    world.store.register_namespace(ns_t2)
    key = item_key(0)
    shutil.copyfile(world.path(key), world.path(key, ns_t2))
    assert not checked_get(world.store, ns_t2, key, world.items[key])
    assert counters(world.store)["foreign"] == 1
    assert checked_get(world.store, NS_A, key, world.items[key])


def test_encrypted_store_refuses_plaintext_records(store_factory, tmp_path, caplog):
    world = make_world(store_factory, tmp_path, "plain")
    world.store.close()
    key_file = write_key_file(tmp_path / "master.key", os.urandom(32))
    with (
        # check=False: plaintext and sealed records left side by side; no one key checks both
        world.open_store(check=False, encryption_key_file=key_file) as sealed,
        caplog.at_level(logging.WARNING, logger="hicache_galahad.store"),
    ):
        for key, data in world.items.items():
            assert not checked_get(sealed, NS_A, key, data)
        assert counters(sealed)["corrupt"] == len(world.items)
        assert "failed V12 " in caplog.text
        # A re-put through the encrypted store replaces the plaintext record with a sealed one.
        key, data = next(iter(world.items.items()))
        assert sealed.put(NS_A, key, data)
        assert header_of(world.path(key)).encrypted
        assert checked_get(sealed, NS_A, key, data)


def test_plaintext_store_cannot_read_encrypted_records(store_factory, tmp_path, caplog):
    world = make_world(store_factory, tmp_path, "aes")
    world.store.close()
    with world.open_store(encryption_key_file=None) as plain:
        report = StoreAdmin(plain).check()
        assert report.damaged == []
        assert len(report.unverifiable) == len(world.items)  # sealed: cannot verify, not damage
        with caplog.at_level(logging.WARNING, logger="hicache_galahad.store"):
            for key, data in world.items.items():
                assert not checked_get(plain, NS_A, key, data)
        assert counters(plain)["misses"] == len(world.items)
        assert counters(plain)["hits"] == 0
        assert "failed V14 " in caplog.text


@pytest.mark.parametrize("file_mode", [0o640, 0o604, 0o660, 0o644, 0o602, 0o620])
def test_key_file_readable_or_writable_by_others_is_refused(tmp_path, file_mode):
    key_file = write_key_file(tmp_path / "master.key", os.urandom(32), file_mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        RecordStore(str(tmp_path / "store"), encryption_key_file=key_file)


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_key_file_of_wrong_length_is_refused(tmp_path, length):
    key_file = write_key_file(tmp_path / "master.key", os.urandom(length))
    with pytest.raises(KeyFileError, match="exactly 32"):
        RecordStore(str(tmp_path / "store"), encryption_key_file=key_file)


def test_key_file_missing_or_not_a_file_is_refused(tmp_path):
    with pytest.raises(KeyFileError):
        RecordStore(str(tmp_path / "store"), encryption_key_file=str(tmp_path / "absent"))
    directory = tmp_path / "key-dir"
    directory.mkdir(mode=0o700)
    with pytest.raises(KeyFileError, match="not a regular file"):
        RecordStore(str(tmp_path / "store"), encryption_key_file=str(directory))


def test_owner_only_key_file_is_accepted(store_factory, tmp_path):
    for file_mode in (0o600, 0o400):
        key_file = write_key_file(tmp_path / f"key-{file_mode:o}", os.urandom(32), file_mode)
        with store_factory(encryption_key_file=key_file) as store:
            store.register_namespace(NS_A)
            assert store.put(NS_A, "k", b"x" * 100)
            assert checked_get(store, NS_A, "k", b"x" * 100)
            assert store.delete(NS_A, "k")


# ----------------------------------------------------------------------------- temp files


def test_live_writers_temp_files_are_kept_dead_writers_removed(store_factory, tmp_path):
    """check(fix=True) removes only temp files whose writer is gone: a writer is the store
    token in the name, alive while that store holds its lock."""
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(NS_A)
        assert store.put(NS_A, "k", b"k" * 1000)
        directory = os.path.dirname(record_path(root, NS_A, "k"))
        with store_factory(root, durability="none") as writer:  # a live writer on the root
            token = writer.accounting.token
            live = os.path.join(directory, f".tmp-{token}-00000000-{record_filename('x')}")
            dead = os.path.join(directory, f".tmp-{'f' * 16}-11111111-{record_filename('y')}")
            for path in (live, dead):
                with open(path, "wb") as temp:
                    temp.write(b"partial")
            report = StoreAdmin(store).check(fix=True)
            assert report.stray_temp_files == [dead]
            assert os.path.exists(live) and not os.path.exists(dead)
            assert StoreAdmin(store).check().clean
            # A store opened while the writer is open must not remove its file.
            with store_factory(root, durability="none") as second:
                assert second.counters.snapshot()["stale_temp_removed"] == 0
            assert os.path.exists(live)
        if os.path.exists(live):  # the writer gone: its file is stray
            assert StoreAdmin(store).check(fix=True).stray_temp_files == [live]
        assert temp_files(root) == []
        assert StoreAdmin(store).check().clean
