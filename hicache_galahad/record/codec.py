"""How one store turns pages into records and back: digest, zstd and AES-GCM settings.

Records are encoded here (format.encode_record, compression.compress); the read paths check
them with the verifier under this store's policy and keys, through the methods below. Calls go
one way: codec to verifier (and format, compression), never back.

Pure apart from the zstandard and cryptography libraries: no file I/O.
"""

from __future__ import annotations

import threading

from . import compression, verifier
from . import format as fmt
from .crypto import RecordCipher, derive_tenant_key
from .namespace import Namespace

# A page that does not shrink by at least 1/16 is stored uncompressed (format.encode_record).
HEADER_TEMPLATE_CACHE_ENTRIES = 4096


class RecordCodec:
    """Encodes records for one store and decodes their payloads.

    digest_alg: format.DIGEST_* for plaintext records. compression: "none" or "zstd".
    master_key: 32 bytes, or None for a plaintext store; with a key every record is sealed
    under its tenant's key and plaintext records are refused on read (V12).
    """

    def __init__(
        self,
        *,
        digest_alg: int,
        compression: str,
        zstd_level: int,
        master_key: bytes | None,
        allow_unverified: bool,
    ):
        self.digest_alg = digest_alg
        self.digest_bytes = fmt.DIGEST_SIZES[digest_alg]
        self.digest_padding = bytes(32 - self.digest_bytes)
        self.compression = compression
        self.zstd_level = zstd_level
        self.allow_unverified = allow_unverified
        self._master_key = master_key
        self._ciphers: dict[str, RecordCipher] = {}
        self._ciphers_lock = threading.Lock()
        self._templates: dict = {}

    @property
    def encrypted(self) -> bool:
        return self._master_key is not None

    def cipher(self, tenant: str) -> RecordCipher | None:
        if self._master_key is None:
            return None
        cipher = self._ciphers.get(tenant)
        if cipher is None:
            with self._ciphers_lock:
                cipher = self._ciphers.get(tenant)
                if cipher is None:
                    cipher = RecordCipher(derive_tenant_key(self._master_key, tenant))
                    self._ciphers[tenant] = cipher
        return cipher

    def encode(self, namespace: Namespace, key_bytes: bytes, raw):
        """(header, payload chunks) of a record holding `raw` (a buffer or list of buffers)."""
        return fmt.encode_record(
            raw,
            key=key_bytes,
            namespace=namespace.digest,
            digest_alg=self.digest_alg,
            compress=self._compress if self.compression == "zstd" else None,
            cipher=self.cipher(namespace.tenant),
        )

    def _compress(self, raw) -> bytes:
        return compression.compress(raw, self.zstd_level)

    def check_header(self, prefix, file_len: int, key_bytes: bytes, namespace_digest: bytes):
        """V1-V12 (verifier.check_header) under this store's protection policy."""
        return verifier.check_header(
            prefix,
            file_len,
            key=key_bytes,
            namespace=namespace_digest,
            require_encryption=self.encrypted,
            allow_unverified=self.allow_unverified,
        )

    def check_identity(self, header: fmt.Header, key_bytes: bytes, namespace_digest: bytes):
        """V10-V12 (verifier.check_identity) under this store's protection policy."""
        verifier.check_identity(
            header,
            key=key_bytes,
            namespace=namespace_digest,
            require_encryption=self.encrypted,
            allow_unverified=self.allow_unverified,
        )

    def decode_record(self, data, key_bytes: bytes, namespace: Namespace, expected_raw_len):
        """V1-V16 on a whole record in memory under this store's settings; the raw page."""
        return verifier.decode_record(
            data,
            key=key_bytes,
            namespace=namespace.digest,
            expected_raw_len=expected_raw_len,
            cipher=self.cipher(namespace.tenant),
            require_encryption=self.encrypted,
            allow_unverified=self.allow_unverified,
        )

    def decode_payload(self, header: fmt.Header, header_bytes, payload, tenant: str | None):
        """V13-V15 on a whole payload in memory; the raw page."""
        return verifier.decode_payload(
            header,
            header_bytes,
            payload,
            cipher=self.cipher(tenant) if header.encrypted and tenant is not None else None,
        )

    def plain_page_digest(self, head, namespace: Namespace, key_bytes: bytes, raw_len: int):
        """The digest check (verifier.Digest, its header fed) of a plain record of `raw_len`
        bytes whose first bytes `head` (header and key echo) are the one header check_header
        accepts for the request: V1-V12 by one comparison (expected_plain_header, the echo,
        the digest's padding). None when they are not: the caller then applies the rules one
        by one. The payload is still to be fed and the digest matched (V13)."""
        head = bytes(head)  # (slices of bytes compare in half the time of a memoryview's)
        digest_end = fmt.DIGEST_OFFSET + self.digest_bytes
        if (
            head[: fmt.DIGEST_OFFSET]
            != self.expected_plain_header(namespace, len(key_bytes), raw_len)
            or head[fmt.FIXED_HEADER_BYTES :] != key_bytes
            or head[digest_end : fmt.FIXED_HEADER_BYTES] != self.digest_padding
        ):
            return None
        return verifier.Digest(self.digest_alg, head[fmt.DIGEST_OFFSET : digest_end], head)

    def expected_plain_header(self, namespace: Namespace, key_len: int, raw_len: int) -> bytes:
        """verifier.expected_plain_header for this store's digest, cached."""
        cache_key = (namespace.digest, key_len, raw_len)
        template = self._templates.get(cache_key)
        if template is None:
            template = verifier.expected_plain_header(
                namespace.digest, key_len, raw_len, self.digest_alg
            )
            if len(self._templates) > HEADER_TEMPLATE_CACHE_ENTRIES:
                self._templates.clear()
            self._templates[cache_key] = template
        return template
