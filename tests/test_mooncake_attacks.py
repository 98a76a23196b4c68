"""A hostile Mooncake peer against GalahadStorage's shared tier (issue 20, items 1, 2, 11, 16).

One real cluster (a master and a store daemon on loopback) for the module, and two servers on
it: `keyed` (plaintext records, the cluster's integrity key) and `sealed` (encrypted records, no
integrity key). The peer is a plain Mooncake client (RawClient) that writes anything under any
key; a peer's write into a server's registered read buffer, which Mooncake's transfer engine
allows but which cannot be timed from outside, is injected at the one moment it matters.
"""

from __future__ import annotations

import ctypes
import os
import time

import pytest
import zstandard
from support.records import chain_keys, pool_records, zstd_record
from support.sglang_pools import create_galahad, mha_pool, page_bytes, slots_of

from bench.mooncake_cluster import RawClient, mooncake_cluster_fixture
from hicache_galahad.config.options import StoreOptions, parse_options
from hicache_galahad.errors import ConfigError, KeyFileError
from hicache_galahad.record import compression
from hicache_galahad.record import format as fmt
from hicache_galahad.store import RecordStore
from hicache_galahad.tier.mooncake.integrity import ValueTag, ValueTagError
from hicache_galahad.tier.mooncake.tier import MooncakeOptions, MooncakeTier
from hicache_galahad.tier.tiered import TieredStore, shared_key

cluster = mooncake_cluster_fixture(scope="module", segment_bytes=64 << 20)
REFERENCE = mha_pool(seed=1)  # what honest servers hold: page i at token slot 4 * i


def honest_page(index: int = 0) -> bytes:
    return bytes(page_bytes(REFERENCE, index * 4).numpy())


def plain_record(namespace, key: str, raw: bytes) -> bytes:
    """A sound plaintext record, as anyone can make one: the namespace digest is public (in
    every value's header) and the payload digest is unkeyed."""
    header, chunks = fmt.encode_record(
        raw, key=key.encode(), namespace=namespace.digest, digest_alg=fmt.DIGEST_XXH3_128
    )
    return bytes(header) + b"".join(bytes(chunk) for chunk in chunks)


def gib_of_zeros_frame() -> bytes:
    """A sound zstd frame of 1 GiB of zeros (32 KiB), its content size in its header."""
    compressor = zstandard.ZstdCompressor().compressobj(size=1 << 30)
    zeros = bytes(1 << 20)
    return b"".join([*(compressor.compress(zeros) for _ in range(1024)), compressor.flush()])


class Server:
    def __init__(self, root, cluster_, **options):
        self.kv = mha_pool(seed=2)
        self.backend = create_galahad(root, self.kv, **options)
        self.root = root
        deadline = time.monotonic() + 30
        while not self.backend.store.tier.available:
            assert time.monotonic() < deadline, "the Mooncake tier never connected"
            time.sleep(0.1)
        self.namespace = self.backend.binder.kv().namespace
        self.page_size = len(honest_page())

    @property
    def store(self):
        return self.backend.store

    def name(self, key: str) -> str:
        return shared_key(self.namespace, key)

    def read(self, keys: list, first_slot_page: int = 8) -> list:
        pages = range(first_slot_page, first_slot_page + len(keys))
        return self.backend.batch_get_v1(keys, slots_of(pages, 4))

    def served(self, position: int, first_slot_page: int = 8) -> bytes:
        return bytes(page_bytes(self.kv, (first_slot_page + position) * 4).numpy())

    def on_disk(self, key: str) -> bytes | None:
        """What this server's own disk serves for key (what it serves without Mooncake)."""
        assert self.store.flush_write_through(10)
        return self.store.local.get(self.namespace, key, self.page_size)

    def count(self, name: str) -> int:
        return self.backend.stats().counter(name)


@pytest.fixture(scope="module")
def peer(cluster):
    client = RawClient(cluster)
    yield client
    client.close()


@pytest.fixture(scope="module")
def keyed(cluster, tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("keyed"), cluster, mooncake=cluster.tier_config())
    yield server
    server.backend.close()


@pytest.fixture(scope="module")
def sealed(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("sealed")
    key_file = root.parent / f"{root.name}.key"
    key_file.write_bytes(os.urandom(32))
    key_file.chmod(0o600)
    mooncake = cluster.tier_config(integrity_key_file=None)
    server = Server(root, cluster, mooncake=mooncake, encryption_key_file=str(key_file))
    yield server
    server.backend.close()


def wait_gone(peer, names: list, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(peer.exists(name) for name in names):
        assert time.monotonic() < deadline, [peer.exists(name) for name in names]
        time.sleep(0.1)


# -- keys: a shared tier never starts without one (no cluster needed) ---------------------------

MOONCAKE = {"master_server_address": "127.0.0.1:9", "local_hostname": "127.0.0.1"}


def test_a_shared_tier_without_any_key_is_refused_at_start(tmp_path):
    with pytest.raises(ConfigError, match="'integrity_key_file' is required"):
        parse_options({"root": str(tmp_path), "mooncake": MOONCAKE})
    local = RecordStore(StoreOptions(root=str(tmp_path / "root")))  # nor built by hand
    try:
        with pytest.raises(ConfigError, match="'integrity_key_file' is required"):
            TieredStore(local, MooncakeTier(MooncakeOptions.from_config(MOONCAKE)))
    finally:
        local.close()
    key_file = tmp_path / "encryption.key"
    parse_options({"root": str(tmp_path), "mooncake": MOONCAKE, "encryption_key_file": "k"})
    integrity = dict(MOONCAKE, integrity_key_file=str(key_file))
    parse_options({"root": str(tmp_path), "mooncake": integrity})
    key_file.write_bytes(os.urandom(32))
    key_file.chmod(0o644)
    with pytest.raises(KeyFileError, match="integrity_key_file.*chmod 600"):
        MooncakeTier(MooncakeOptions.from_config(integrity))
    key_file.chmod(0o600)
    key_file.write_bytes(os.urandom(16))
    with pytest.raises(KeyFileError, match="integrity_key_file.*exactly 32"):
        MooncakeTier(MooncakeOptions.from_config(integrity))
    os.mkfifo(tmp_path / "fifo", 0o600)  # refused, not waited on for a writer
    with pytest.raises(KeyFileError, match="not a regular file"):
        MooncakeTier(
            MooncakeOptions.from_config(dict(MOONCAKE, integrity_key_file=str(tmp_path / "fifo")))
        )


def test_the_integrity_tag_binds_the_record_and_its_mooncake_key():
    tag = ValueTag(os.urandom(32))
    record = os.urandom(4096)
    value = record + tag.tag("galahad/ns/a", record)
    assert bytes(tag.open("galahad/ns/a", value)) == record
    assert tag.tag("galahad/ns/a", [record[:7], record[7:]], b"n" * 16) == tag.tag(
        "galahad/ns/a", record, b"n" * 16
    )
    flipped = bytearray(value)
    flipped[100] ^= 1
    refused = [
        ("galahad/ns/b", value),  # moved to another key
        ("galahad/ns/a", bytes(flipped)),  # one bit of the record
        ("galahad/ns/a", value[:-1] + bytes([value[-1] ^ 1])),  # one bit of the tag
        ("galahad/ns/a", record + os.urandom(32)),  # a guess
        ("galahad/ns/a", value[:32]),  # too short to hold a tag
    ]
    other = ValueTag(os.urandom(32))
    for name, candidate in refused:
        with pytest.raises(ValueTagError):
            tag.open(name, candidate)
    with pytest.raises(ValueTagError):
        other.open("galahad/ns/a", value)  # another cluster's key


# -- item 1: forged values on a plaintext tier ----------------------------------------------------


@pytest.mark.slow
def test_forged_values_are_misses_removed_and_never_written_through(keyed, peer, cluster):
    keys = chain_keys(5, "forged")
    forged = os.urandom(keyed.page_size)
    honest = plain_record(keyed.namespace, keys[4], honest_page(4))
    values = {
        keys[0]: plain_record(keyed.namespace, keys[0], forged),  # no tag: any peer
        keys[1]: plain_record(keyed.namespace, keys[1], forged) + os.urandom(32),  # a guess
        keys[2]: cluster.tagged(keyed.name(keys[4]), honest),  # honest value of another key
        keys[3]: cluster.tagged(keyed.name(keys[3]), honest),  # ... and with its name changed
        keys[4]: cluster.tagged(keyed.name(keys[4]), honest),  # honest: a hit
    }
    for key, value in values.items():
        assert peer.replace(keyed.name(key), value) == 0
    failed = keyed.count("failed_M1"), keyed.count("failed_V10")
    assert keyed.read(keys) == [False, False, False, False, True]
    assert keyed.served(4) == honest_page(4)
    assert (keyed.count("failed_M1"), keyed.count("failed_V10")) == (failed[0] + 3, failed[1] + 1)
    assert [keyed.on_disk(key) for key in keys] == [None, None, None, None, honest_page(4)]
    wait_gone(peer, [keyed.name(key) for key in keys[:4]])
    assert peer.exists(keyed.name(keys[4]))


# -- item 2: a peer writing into our registered read buffer ---------------------------------------


def scribble(view) -> None:
    view[:] = b"\xee" * len(view)


@pytest.mark.slow
def test_a_peer_writing_into_the_read_buffer_after_the_check_changes_no_byte(keyed, peer, cluster):
    """Every value checked is scribbled over in the registered buffer right after its check,
    as a peer's transfer into it would: the pages served and written through are the bytes
    checked (a private copy), never the scribble."""
    keys = chain_keys(4, "scribbled-after")
    for index, key in enumerate(keys):
        record = plain_record(keyed.namespace, key, honest_page(index))
        assert peer.replace(keyed.name(key), cluster.tagged(keyed.name(key), record)) == 0
    registered = keyed.store.tier._reads.buffer.buffer.view
    checked = keyed.store._open

    def check_then_scribble(*args):
        result = checked(*args)
        scribble(registered)
        return result

    keyed.store._open = check_then_scribble
    try:
        hits = keyed.read(keys)
    finally:
        del keyed.store._open
    wrong_served = [i for i, hit in enumerate(hits) if hit and keyed.served(i) != honest_page(i)]
    on_disk = [keyed.on_disk(key) for key in keys]
    wrong_on_disk = [i for i, page in enumerate(on_disk) if page not in (None, honest_page(i))]
    assert (wrong_served, wrong_on_disk) == ([], [])
    assert hits == [True] * 4 and on_disk == [honest_page(i) for i in range(4)]


class ScribblingStore:
    """The tier's Mooncake client, but a peer writes into the first value's place in the
    registered read buffer once, between Mooncake's transfer and the tier's copy."""

    def __init__(self, store):
        self._store = store
        self.scribbles = 1

    def batch_get_into(self, keys, addresses, sizes):
        codes = self._store.batch_get_into(keys, addresses, sizes)
        if self.scribbles and codes and codes[0] > 0:
            self.scribbles -= 1
            ctypes.memset(addresses[0], 0xEE, codes[0])
        return codes

    def __getattr__(self, name):
        return getattr(self._store, name)


@pytest.mark.slow
def test_a_peer_writing_into_the_read_buffer_before_the_copy_removes_no_honest_value(
    keyed, peer, cluster
):
    key = chain_keys(1, "scribbled-before")[0]
    record = plain_record(keyed.namespace, key, honest_page(0))
    assert peer.replace(keyed.name(key), cluster.tagged(keyed.name(key), record)) == 0
    connection = keyed.store.tier._connection
    real = connection.store
    connection.store = scribbling = ScribblingStore(real)
    bad = keyed.count("mooncake_bad_values")
    try:
        hits = keyed.read([key])
    finally:
        connection.store = real
    assert scribbling.scribbles == 0 and keyed.store.tier.flush(10)
    assert peer.exists(keyed.name(key))  # not removed
    assert hits == [True] and keyed.served(0) == honest_page(0)  # looked at again, served
    assert keyed.count("mooncake_good_when_read_again") >= 1
    assert keyed.count("mooncake_bad_values") == bad
    assert keyed.on_disk(key) == honest_page(0)


# -- item 11: a decompression bomb ----------------------------------------------------------------


@pytest.mark.slow
def test_a_zstd_bomb_is_refused_before_decompressing_and_removed(keyed, peer, cluster):
    """Sound zstd records of 1 GiB of zeros (tagged: a buggy peer holding the key), one whose
    header claims 1 GiB, one whose header claims the page but whose frame claims 1 GiB."""
    keys = chain_keys(2, "bomb")
    frame = gib_of_zeros_frame()
    records = [
        zstd_record(keyed.namespace, keys[0], frame, 1 << 30),
        zstd_record(keyed.namespace, keys[1], frame, keyed.page_size),
    ]
    for key, record in zip(keys, records, strict=True):
        assert peer.replace(keyed.name(key), cluster.tagged(keyed.name(key), record)) == 0
    decompressed = []
    real = compression.decompress
    compression.decompress = lambda payload, raw_len: (
        decompressed.append(raw_len) or real(payload, raw_len)
    )
    started = time.monotonic()
    try:
        assert keyed.read(keys) == [False, False]
    finally:
        compression.decompress = real
    assert time.monotonic() - started < 2.0
    assert decompressed == []  # refused on the lengths claimed, before a byte was inflated
    wait_gone(peer, [keyed.name(key) for key in keys])


# -- item 16: squatting -----------------------------------------------------------------------------


def sealed_record_in_mooncake(peer, server, key: str) -> fmt.Header:
    value = peer.get(server.name(key))
    return fmt.parse_header(value, len(value))


@pytest.mark.slow
def test_squatted_keys_are_removed_so_the_honest_value_lands(keyed, sealed, peer, cluster):
    # a plaintext tier: another page size (a keyed peer), and a value without a tag
    keys = chain_keys(2, "squat-plain")
    other_size = plain_record(keyed.namespace, keys[0], honest_page(0) * 2)
    assert peer.replace(keyed.name(keys[0]), cluster.tagged(keyed.name(keys[0]), other_size)) == 0
    assert peer.replace(keyed.name(keys[1]), plain_record(keyed.namespace, keys[1], b"x")) == 0
    # an encrypted tier: a sound plaintext record
    squatted = chain_keys(1, "squat-sealed")[0]
    assert (
        peer.replace(
            sealed.name(squatted), plain_record(sealed.namespace, squatted, honest_page(0))
        )
        == 0
    )

    assert keyed.read(keys) == [False, False]
    assert sealed.read([squatted]) == [False]
    # the honest servers store the pages they computed: their shares land
    assert keyed.backend.batch_set_v1(keys, slots_of([0, 1], 4)) == [True, True]
    assert sealed.backend.batch_set_v1([squatted], slots_of([0], 4)) == [True]
    assert keyed.store.tier.flush(10) and sealed.store.tier.flush(10)
    tag = ValueTag(cluster.integrity_key_file.read_bytes())
    for index, key in enumerate(keys):
        value = tag.open(keyed.name(key), peer.get(keyed.name(key)))
        assert bytes(
            keyed.store.local.decode_value(keyed.namespace, key, value, keyed.page_size)
        ) == bytes(page_bytes(keyed.kv, index * 4).numpy())
    assert sealed_record_in_mooncake(peer, sealed, squatted).encrypted


@pytest.mark.slow
def test_a_sealed_value_replayed_under_another_key_is_refused_and_removed(sealed, peer):
    """The AES-GCM tag covers the header, key echo and namespace digest included: a sealed
    value of key X under key Y fails V10 (its echo) and cannot be re-echoed without the key."""
    keys = chain_keys(2, "replay-sealed")
    assert sealed.backend.batch_set_v1(keys[:1], slots_of([2], 4)) == [True]
    assert sealed.store.tier.flush(10)
    assert sealed.read(keys[:1]) == [True]  # from its disk: this server's key opens records
    value = peer.get(sealed.name(keys[0]))
    assert peer.replace(sealed.name(keys[1]), value) == 0
    echo = bytearray(value)
    offset = fmt.FIXED_HEADER_BYTES
    echo[offset : offset + len(keys[1])] = keys[1].encode()  # the echo rewritten to match
    replays = [sealed.name(keys[1])]
    third = chain_keys(3, "replay-sealed")[2]
    echo[offset : offset + len(third)] = third.encode()
    assert peer.replace(sealed.name(third), bytes(echo)) == 0
    replays.append(sealed.name(third))
    failed = sealed.count("failed_V10"), sealed.count("failed_V14")
    assert sealed.read([keys[1], third]) == [False, False]
    assert (sealed.count("failed_V10"), sealed.count("failed_V14")) == (
        failed[0] + 1,
        failed[1] + 1,
    )
    wait_gone(peer, replays)
    assert pool_records(sealed.root, "kv") and sealed.on_disk(keys[1]) is None
