"""The verifier: the rules of docs/FORMAT.md, written once, that every read path drives.

A path only moves bytes (one preadv into the caller's buffers, a stream of 1 MiB pieces, a
value held in memory); which rule holds, in which order, and which one a failure names, is
decided here:

- `check_header`: V1-V12, the header and its identity under the reader's policy (the
  structure, V1-V9, is `format.parse_header`);
- `check_page_size`: V16, after the stored bytes' own check (V13/V14) when that costs no more
  than the page asked for, so that damage to a header is told from another page size;
- `Digest`: V13, fed piece by piece; `finish_tag`: V14 at the end of a decryption;
- `check_decoded_length`: V15 (frames are decoded by compression.py, called from here);
- `decode_payload`, `decode_record`: all of them on a payload or a whole record in memory
  (a compressed page read whole, a Mooncake value, the tests).

The one-read paths compare a plain record's first bytes with `expected_plain_header` (through
codec.plain_page_digest): the only header of that size that `check_header` accepts for the
request, as bytes.

The verifier calls nothing above it (format.py, compression.py): the readers drive it.
Pure: no I/O, no torch, no SGLang.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidTag

from . import compression
from . import format as fmt


def check_identity(
    header: fmt.Header,
    *,
    key: bytes,
    namespace: bytes,
    require_encryption: bool,
    allow_unverified: bool = False,
) -> None:
    """V10-V12: the record is the one asked for, in the reader's namespace, and at least as
    protected as the reader's policy demands."""
    if header.key != key:
        raise fmt.KeyMismatchError("key echo differs from the requested key")
    if header.namespace != namespace:
        raise fmt.NamespaceMismatchError("record belongs to another namespace")
    if require_encryption and not header.encrypted:
        raise fmt.ProtectionPolicyError("plaintext record in an encrypted store")
    if not header.encrypted and header.digest_alg == fmt.DIGEST_NONE and not allow_unverified:
        raise fmt.ProtectionPolicyError("record carries neither a digest nor an AEAD tag")


def check_header(
    prefix,
    file_len: int,
    *,
    key: bytes,
    namespace: bytes,
    require_encryption: bool,
    allow_unverified: bool = False,
) -> fmt.Header:
    """V1-V12 on a record's first bytes (at least its header and key echo)."""
    header = fmt.parse_header(prefix, file_len)
    check_identity(
        header,
        key=key,
        namespace=namespace,
        require_encryption=require_encryption,
        allow_unverified=allow_unverified,
    )
    return header


def check_page_size(header: fmt.Header, expected_raw_len: int | None, check_stored) -> None:
    """V16: a record of another raw size than the page asked for. Before naming V16, the
    stored bytes' digest or tag is checked (`check_stored()`, raising V13 or V14) when they
    are no more than the page's (as cheap as the read asked for), so that a damaged header is
    quarantined, not left in place as "another page size". Nothing is decompressed."""
    if expected_raw_len is None or header.raw_len == expected_raw_len:
        return
    if header.payload_len <= expected_raw_len + fmt.TAG_BYTES:
        check_stored()
    raise fmt.RawSizeError(
        f"record holds {header.raw_len} bytes, reader expects {expected_raw_len}"
    )


class Digest:
    """V13 over a record's header (fed at once, its digest field read as zeros:
    format.hash_header) and payload (fed piece by piece); a record without a digest
    (encrypted, or `allow_unverified`) passes."""

    __slots__ = ("_hasher", "_expected")

    def __init__(self, digest_alg: int, expected: bytes, header_bytes):
        self._hasher = fmt.new_digest(digest_alg)
        self._expected = expected
        if self._hasher is not None:
            fmt.hash_header(self._hasher, header_bytes)

    @classmethod
    def of(cls, header: fmt.Header, header_bytes) -> Digest:
        """The digest check of a parsed record."""
        return cls(header.digest_alg, header.digest, header_bytes)

    @property
    def active(self) -> bool:
        return self._hasher is not None

    def update(self, piece) -> None:
        if self._hasher is not None:
            self._hasher.update(piece)

    def matches(self) -> bool:
        return self._hasher is None or self._hasher.digest() == self._expected

    def finish(self) -> None:
        if not self.matches():
            raise fmt.DigestMismatchError("digest mismatch")


def finish_tag(decryptor) -> None:
    """V14: the AES-GCM tag of a decryption that has seen every byte."""
    try:
        decryptor.finalize()
    except InvalidTag:
        raise fmt.AuthenticationError("AES-GCM tag does not verify") from None


def no_key() -> fmt.AuthenticationError:
    return fmt.AuthenticationError("encrypted record and no key for it")


def check_decoded_length(decoded_len: int, header: fmt.Header) -> None:
    """V15: the payload decodes to exactly the raw length the header states."""
    if decoded_len != header.raw_len:
        raise fmt.DecompressionError("payload does not decode to exactly its raw length")


def open_payload(header: fmt.Header, header_bytes, payload, *, cipher=None):
    """The stored body of a payload of verified length after V13 and V14 (digest, or tag and
    decryption): the page, or its zstd frame. cipher: open(nonce, payload, header) -> bytes
    or None."""
    digest = Digest.of(header, header_bytes)
    digest.update(payload)
    digest.finish()
    if not header.encrypted:
        return payload
    if cipher is None:
        raise no_key()
    body = cipher.open(header.nonce, payload, bytes(header_bytes))
    if body is None:
        raise fmt.AuthenticationError("AES-GCM tag does not verify")
    return body


def decode_payload(header: fmt.Header, header_bytes, payload, *, cipher=None):
    """The raw page from a payload of verified length: V13-V15."""
    body = open_payload(header, header_bytes, payload, cipher=cipher)
    if header.compressed:
        body = compression.decompress(body, header.raw_len)
    check_decoded_length(len(body), header)
    return body


def decode_record(
    data,
    *,
    key: bytes,
    namespace: bytes,
    expected_raw_len: int | None = None,
    cipher=None,
    require_encryption: bool = False,
    allow_unverified: bool = False,
):
    """Every rule (V1-V16) on a whole record in memory; the raw page."""
    data = memoryview(data).cast("B")
    header = check_header(
        data,
        len(data),
        key=key,
        namespace=namespace,
        require_encryption=require_encryption,
        allow_unverified=allow_unverified,
    )
    header_bytes, payload = data[: header.header_len], data[header.header_len :]
    check_page_size(
        header,
        expected_raw_len,
        lambda: open_payload(header, header_bytes, payload, cipher=cipher),
    )
    return decode_payload(header, header_bytes, payload, cipher=cipher)


def expected_plain_header(namespace: bytes, key_len: int, raw_len: int, digest_alg: int) -> bytes:
    """Bytes [0, 80) of the one plaintext, uncompressed record of `raw_len` bytes that
    `check_header` accepts for a key of `key_len` bytes in `namespace`: everything but the
    digest and the key echo is determined by the request, so one comparison (with the echo
    compared on its own) checks V1-V12."""
    return bytes(
        fmt.pack_header(
            flags=0,
            payload_len=raw_len,
            raw_len=raw_len,
            namespace=namespace,
            key=b"k" * key_len,
            digest_alg=digest_alg,
        )[: fmt.DIGEST_OFFSET]
    )
