"""Encryption at rest: AES-256-GCM with a per-tenant key derived from a master key file.

Pure code apart from reading the key file. The master key is 32 random bytes in a file that
only its owner may read; each tenant's key is HKDF-SHA256(master, salt, info="tenant:<name>"),
so one tenant's records can never be opened with another tenant's key.
"""

from __future__ import annotations

import os
import stat

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import KeyFileError

MASTER_KEY_BYTES = 32
_HKDF_SALT = b"hicache-galahad/record-key/v1"


def load_master_key(path: str) -> bytes:
    """Reads a 32-byte master key; refuses a file that group or others can read or write."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise KeyFileError(f"encryption_key_file {path!r}: {error.strerror}") from error
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"encryption_key_file {path!r} is not a regular file")
    if info.st_mode & 0o077:
        raise KeyFileError(
            f"encryption_key_file {path!r} has mode {oct(info.st_mode & 0o777)}: "
            "it must not be accessible by group or others (chmod 600)"
        )
    with open(path, "rb") as key_file:
        key = key_file.read(MASTER_KEY_BYTES + 1)
    if len(key) != MASTER_KEY_BYTES:
        raise KeyFileError(
            f"encryption_key_file {path!r} must hold exactly {MASTER_KEY_BYTES} random bytes "
            f"(e.g. head -c 32 /dev/urandom > key), found {len(key)}"
        )
    return key


def derive_tenant_key(master_key: bytes, tenant: str) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=_HKDF_SALT,
        info=b"tenant:" + tenant.encode("utf-8"),
    ).derive(master_key)


class RecordCipher:
    """Seals and opens record payloads; the record header is the associated data."""

    def __init__(self, key: bytes):
        self._key = key
        self._aead = AESGCM(key)

    @staticmethod
    def new_nonce() -> bytes:
        return os.urandom(12)

    def seal(self, nonce: bytes, plaintext, header: bytes) -> bytes:
        return self._aead.encrypt(nonce, plaintext, header)

    def decryptor(self, nonce: bytes, tag: bytes, header: bytes):
        """A streaming decryptor (update / update_into / finalize, which raises InvalidTag):
        for verifying or decrypting a record piece by piece, without holding it whole."""
        decryptor = Cipher(algorithms.AES(self._key), modes.GCM(nonce, tag)).decryptor()
        decryptor.authenticate_additional_data(header)
        return decryptor

    def open(self, nonce: bytes, ciphertext_and_tag, header: bytes) -> bytes | None:
        """The plaintext, or None when the tag does not verify (wrong key, damage, tampering)."""
        try:
            return self._aead.decrypt(nonce, ciphertext_and_tag, header)
        except InvalidTag:
            return None
