"""The cluster integrity key: a keyed tag on every value that crosses the shared Mooncake tier.

Mooncake has no authentication, so anyone who reaches the cluster can write any value under any
key. A record's own checks do not stop a forger on a plaintext store: the namespace digest can
be copied from any honest value and the payload digest (xxh3, sha256) is unkeyed. So every value
a TieredStore puts is `record || nonce || tag`, under a key that every server of the cluster
holds (`integrity_key_file`, 32 random bytes, mode 0600, separate from the tenants' encryption
key). The tag is Poly1305 over the record with a one-time key, BLAKE2b-256 keyed with the
cluster key over the value's Mooncake key and a fresh random 16-byte nonce (the construction of
NaCl's one-time authenticator; 0.1-0.2 ms per MiB on the reference box, against 0.9 for keyed
BLAKE2b or 1.25 for HMAC-SHA256 over the record). A value without the right tag, or moved to another Mooncake key (whose one-time key
differs), fails rule M1 before a byte of it is parsed.

Pure apart from reading the key file (crypto.read_key_file, the loader of every key file).
"""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.hazmat.primitives.poly1305 import Poly1305

from ...record import format as fmt
from ...record.crypto import read_key_file

INTEGRITY_KEY_BYTES = 32
NONCE_BYTES = 16
MAC_BYTES = 16
TAG_BYTES = NONCE_BYTES + MAC_BYTES  # what a value carries after its record
_PERSON = b"galahad-mc-v1"  # BLAKE2b personalisation: this use of the key, and no other
_OPTION = "mooncake option 'integrity_key_file'"


class ValueTagError(fmt.FormatError):
    """M1: a Mooncake value whose integrity tag is missing or does not verify under its key."""

    rule = "M1"


def load_integrity_key(path: str) -> bytes:
    """The 32-byte cluster integrity key, with the checks of every key file
    (crypto.read_key_file: a regular file, owner-only, exactly 32 bytes; a FIFO is refused,
    never waited on)."""
    return read_key_file(path, _OPTION, INTEGRITY_KEY_BYTES)


class ValueTag:
    """Tags values for the shared tier and checks them, under one cluster integrity key."""

    def __init__(self, key: bytes):
        if len(key) != INTEGRITY_KEY_BYTES:
            raise ValueError(f"an integrity key is {INTEGRITY_KEY_BYTES} bytes")
        self._key = bytes(key)

    def tag(self, name: str, record, nonce: bytes | None = None) -> bytes:
        """The nonce and tag that follow `record` (bytes or a list of buffers) stored under
        Mooncake key `name`; a fresh random nonce unless one is given."""
        nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
        mac = Poly1305(self._one_time_key(name, nonce))
        for piece in record if isinstance(record, list | tuple) else [record]:
            mac.update(piece)
        return nonce + mac.finalize()

    def open(self, name: str, value) -> memoryview:
        """The record in a tagged value (a view of `value`); raises ValueTagError (M1)."""
        value = memoryview(value).cast("B")
        if len(value) <= TAG_BYTES:
            raise ValueTagError(f"value of {len(value)} bytes cannot hold an integrity tag")
        record = value[:-TAG_BYTES]
        nonce = bytes(value[-TAG_BYTES:-MAC_BYTES])
        if not hmac.compare_digest(self.tag(name, record, nonce), value[-TAG_BYTES:]):
            raise ValueTagError("integrity tag does not verify (no key, another key or damage)")
        return record

    def _one_time_key(self, name: str, nonce: bytes) -> bytes:
        hasher = hashlib.blake2b(key=self._key, digest_size=32, person=_PERSON)
        encoded = name.encode("utf-8", "surrogateescape")
        hasher.update(len(encoded).to_bytes(8, "little"))
        hasher.update(encoded)
        hasher.update(nonce)
        return hasher.digest()
