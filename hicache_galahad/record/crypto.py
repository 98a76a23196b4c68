"""Encryption at rest: AES-256-GCM with a per-tenant key derived from a master key file.

Pure code apart from reading key files (`read_key_file`, also the loader of Mooncake's
integrity key). The master key is 32 random bytes in a file that
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


# A key file is opened without blocking (a FIFO put at its path is refused, not waited on for a
# writer) and never becomes a controlling terminal. A symbolic link at its path is followed, as
# before: an operator's key is often mounted as one (a Kubernetes secret); the checks below are
# of the file it opens (fstat of the descriptor), so nothing is judged by one path and read by
# another.
_KEY_FILE_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def read_key_file(path: str, option: str, key_bytes: int = MASTER_KEY_BYTES) -> bytes:
    """The `key_bytes` random bytes of a key file: the one loader of every key file (the
    tenants' master key, Mooncake's integrity key). Opens the file, then checks that
    descriptor: a regular file, not readable or writable by group or others, holding exactly
    `key_bytes` bytes. Raises KeyFileError naming `option` (the configuration key) otherwise."""
    try:
        fd = os.open(path, _KEY_FILE_OPEN_FLAGS)
    except OSError as error:
        raise KeyFileError(f"{option} {path!r}: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"{option} {path!r} is not a regular file")
        if info.st_mode & 0o077:
            raise KeyFileError(
                f"{option} {path!r} has mode {oct(info.st_mode & 0o777)}: "
                "it must not be accessible by group or others (chmod 600)"
            )
        key = os.read(fd, key_bytes + 1)
    finally:
        os.close(fd)
    if len(key) != key_bytes:
        raise KeyFileError(
            f"{option} {path!r} must hold exactly {key_bytes} random bytes "
            f"(e.g. head -c {key_bytes} /dev/urandom > key; chmod 600 key), found {len(key)}"
        )
    return key


def load_master_key(path: str) -> bytes:
    """The 32-byte master key of `encryption_key_file` (read_key_file's checks)."""
    return read_key_file(path, "encryption_key_file")


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
