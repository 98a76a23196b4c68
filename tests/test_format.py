"""docs/FORMAT.md, rule by rule: each V-rule has a test here named test_V<n>_..."""

from __future__ import annotations

import os
import random
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache_galahad.record import format as fmt
from hicache_galahad.record import verifier
from hicache_galahad.record.crypto import RecordCipher, derive_tenant_key
from hicache_galahad.record.namespace import Namespace

DOC = Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md"
NAMESPACE = Namespace("example-tenant", "example-model", "kv", {"page_size": 4})
KEY = b"example-key"
PAYLOAD = b"hello, galahad!\n"
CIPHER = RecordCipher(derive_tenant_key(bytes(range(32)), "example-tenant"))


def record(raw=PAYLOAD, *, digest_alg=fmt.DIGEST_XXH3_128, compress=False, cipher=None) -> bytes:
    header, chunks = fmt.encode_record(
        raw,
        key=KEY,
        namespace=NAMESPACE.digest,
        digest_alg=digest_alg,
        compress=zstandard.ZstdCompressor().compress if compress else None,
        cipher=cipher,
    )
    return bytes(header) + b"".join(bytes(chunk) for chunk in chunks)


def decode(data, **overrides):
    arguments = dict(
        key=KEY,
        namespace=NAMESPACE.digest,
        cipher=CIPHER,
    )
    arguments.update(overrides)
    return verifier.decode_record(data, **arguments)


def patched(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value) :]


def resealed(data: bytes) -> bytes:
    """Recomputes the digest so that a test reaches the rule after the digest check's."""
    header_len = struct.unpack_from("<I", data, 12)[0]
    header = bytearray(data[:header_len])
    header[80:112] = bytes(32)
    fmt.seal_digest(header, [data[header_len:]], header[66])
    return bytes(header) + data[header_len:]


def test_round_trip_plain():
    assert bytes(decode(record())) == PAYLOAD


def test_V1_truncated_header():
    with pytest.raises(fmt.TruncatedHeaderError):
        decode(record()[:100])


def test_V2_bad_magic():
    with pytest.raises(fmt.BadMagicError):
        decode(patched(record(), 0, b"GALAHAX\x00"))


def test_V3_unsupported_version():
    with pytest.raises(fmt.UnsupportedVersionError):
        decode(patched(record(), 8, struct.pack("<H", 2)))


def test_V4_unknown_flags_and_digest_algorithm():
    with pytest.raises(fmt.UnknownFlagsError):
        decode(patched(record(), 10, struct.pack("<H", 0x8)))
    with pytest.raises(fmt.UnknownFlagsError):
        decode(patched(record(), 66, bytes([7])))


def test_V5_nonzero_reserved_bytes():
    with pytest.raises(fmt.NonZeroReservedError):
        decode(patched(record(), 67, b"\x01"))
    with pytest.raises(fmt.NonZeroReservedError):  # xxh3-128 digest padding
        decode(patched(record(), 80 + 20, b"\x01"))
    with pytest.raises(fmt.NonZeroReservedError):  # nonce of a plaintext record
        decode(patched(record(), 70, b"\x01"))


def test_V6_bad_header_length():
    with pytest.raises(fmt.BadHeaderLengthError):
        decode(patched(record(), 12, struct.pack("<I", 200)))
    with pytest.raises(fmt.BadHeaderLengthError):
        decode(patched(record(), 64, struct.pack("<H", 0)))


def test_V7_size_caps():
    data = patched(record(), 24, struct.pack("<Q", fmt.MAX_RAW_BYTES + 1))
    with pytest.raises(fmt.SizeCapError):
        decode(data)


def test_V8_length_mismatch_truncated_or_trailing():
    with pytest.raises(fmt.LengthMismatchError):
        decode(record()[:-1])
    with pytest.raises(fmt.LengthMismatchError):
        decode(record() + b"\x00")


def test_V9_payload_size():
    data = record()
    raw_len = struct.unpack_from("<Q", data, 24)[0]
    with pytest.raises(fmt.PayloadSizeError):
        decode(patched(data, 24, struct.pack("<Q", raw_len + 1)))


def test_V10_key_mismatch():
    with pytest.raises(fmt.KeyMismatchError):
        decode(record(), key=b"example-kez")


def test_V11_namespace_mismatch():
    other = Namespace("other-tenant", "example-model", "kv", {"page_size": 4})
    with pytest.raises(fmt.NamespaceMismatchError):
        decode(record(), namespace=other.digest)


def test_V12_protection_policy():
    with pytest.raises(fmt.ProtectionPolicyError):
        decode(record(), require_encryption=True)
    unverified = record(digest_alg=fmt.DIGEST_NONE)
    with pytest.raises(fmt.ProtectionPolicyError):
        decode(unverified)
    assert bytes(decode(unverified, allow_unverified=True)) == PAYLOAD


@pytest.mark.parametrize("offset", [0x50, 0x6F, 0x7B, 0x80, 0x8A])
def test_V13_digest_mismatch(offset):
    """Flips in the digest field or anywhere in the payload; flips elsewhere in the header
    break an identity or structural rule first (test_any_single_byte_change_is_rejected)."""
    data = record(digest_alg=fmt.DIGEST_SHA256)
    flipped = patched(data, offset, bytes([data[offset] ^ 0x01]))
    with pytest.raises(fmt.DigestMismatchError):
        decode(flipped)


def test_V13_digest_covers_header_fields_that_no_other_rule_checks():
    data = record(digest_alg=fmt.DIGEST_SHA256)
    raw_len = struct.unpack_from("<Q", data, 24)[0]
    # a consistent change of raw_len and payload_len together passes V8 and V9 ...
    longer = patched(
        patched(data, 16, struct.pack("<Q", raw_len + 1)), 24, struct.pack("<Q", raw_len + 1)
    )
    with pytest.raises(fmt.DigestMismatchError):  # ... but not the digest
        decode(longer + b"!")


def test_V14_authentication():
    sealed = record(cipher=CIPHER)
    assert bytes(decode(sealed)) == PAYLOAD
    wrong_tenant = RecordCipher(derive_tenant_key(bytes(range(32)), "other-tenant"))
    with pytest.raises(fmt.AuthenticationError):
        decode(sealed, cipher=wrong_tenant)
    with pytest.raises(fmt.AuthenticationError):
        decode(sealed, cipher=None)


def test_V14_tag_covers_header_fields():
    sealed = record(cipher=CIPHER)
    tampered = patched(sealed, 70, bytes([sealed[70] ^ 1]))  # nonce byte
    with pytest.raises(fmt.AuthenticationError):
        decode(tampered)


def test_V15_decompression():
    compressible = bytes(4096)
    data = record(compressible, compress=True)
    assert data[10] & fmt.FLAG_ZSTD
    assert bytes(decode(data)) == compressible
    header_len = struct.unpack_from("<I", data, 12)[0]
    garbage = data[:header_len] + b"\x28\xb5\x2f\xfd" + bytes(len(data) - header_len - 4)
    with pytest.raises(fmt.DecompressionError):
        decode(resealed(garbage))


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_V0_only_regular_files_are_records(tmp_path, kind):
    from hicache_galahad.store.reader import open_record

    path = tmp_path / "0".zfill(64)
    target = tmp_path / "elsewhere"
    target.write_bytes(record())
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)  # opening it must neither block nor succeed
    else:
        path.mkdir()
    with pytest.raises(fmt.NotARegularFileError):
        os.close(open_record(str(path)))
    os.close(open_record(str(target)))


def test_V16_raw_size_expected_by_reader():
    with pytest.raises(fmt.RawSizeError):
        decode(record(), expected_raw_len=len(PAYLOAD) + 1)
    assert bytes(decode(record(), expected_raw_len=len(PAYLOAD))) == PAYLOAD


def test_every_documented_rule_has_an_error_class_and_a_test():
    documented = dict(re.findall(r"^\| (V\d+) \| `(\w+)` \|", DOC.read_text(), re.MULTILINE))
    implemented = {error.rule: error.__name__ for error in fmt.ALL_ERRORS}
    assert documented == implemented
    tested = {name.split("_")[1] for name in globals() if re.match(r"test_V\d+_", name)}
    assert tested == set(documented)


def test_incompressible_pages_are_stored_plain():
    noise = random.Random(0).randbytes(4096)
    assert not record(noise, compress=True)[10] & fmt.FLAG_ZSTD


@pytest.mark.parametrize("digest_alg", [fmt.DIGEST_XXH3_128, fmt.DIGEST_SHA256])
@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("encrypt", [False, True])
@settings(max_examples=25, deadline=None)
@given(raw=st.binary(min_size=0, max_size=3000))
def test_round_trip_every_flag_combination(digest_alg, compress, encrypt, raw):
    data = record(raw, digest_alg=digest_alg, compress=compress, cipher=CIPHER if encrypt else None)
    assert bytes(decode(data, expected_raw_len=len(raw))) == raw


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_only_raise_format_errors(data):
    with pytest.raises(fmt.FormatError):
        decode(data)


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(min_value=0, max_value=10_000),
    value=st.integers(min_value=0, max_value=255),
    encrypt=st.booleans(),
)
def test_any_single_byte_change_is_rejected(position, value, encrypt):
    data = record(PAYLOAD * 4, cipher=CIPHER if encrypt else None)
    position %= len(data)
    if data[position] == value:
        return
    with pytest.raises(fmt.FormatError):
        decode(patched(data, position, bytes([value])))


def test_worked_example_and_stdlib_reader(tmp_path):
    data = record(digest_alg=fmt.DIGEST_SHA256)
    text = DOC.read_text()
    dump = re.search(r"## Worked example.*?```\n(.*?)```", text, re.DOTALL).group(1)
    documented = bytes.fromhex(
        "".join(line[10:58].replace(" ", "") for line in dump.strip().splitlines())
    )
    assert documented == data
    assert NAMESPACE.digest.hex().startswith("bb12867d")

    reader = re.search(r"## Reference reader.*?```python\n(.*?)```", text, re.DOTALL).group(1)
    (tmp_path / "reader.py").write_text(reader)
    (tmp_path / "example.rec").write_bytes(data)
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(tmp_path / "reader.py"),
            str(tmp_path / "example.rec"),
            KEY.decode(),
            NAMESPACE.digest.hex(),
        ],
        capture_output=True,
        check=True,
    )
    assert result.stdout == PAYLOAD
    (tmp_path / "bad.rec").write_bytes(patched(data, 0x7B, b"J"))
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(tmp_path / "reader.py"),
            str(tmp_path / "bad.rec"),
            KEY.decode(),
            NAMESPACE.digest.hex(),
        ],
        capture_output=True,
    )
    assert result.returncode != 0 and b"V13" in result.stderr
