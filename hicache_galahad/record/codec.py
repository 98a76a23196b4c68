"""How one store turns pages into records and back: digest, zstd and AES-GCM settings.

Pure apart from the zstandard and cryptography libraries: no file I/O.
"""

from __future__ import annotations

import threading

from . import format as fmt
from . import verifier
from .crypto import RecordCipher, derive_tenant_key
from .namespace import Namespace

# A page that does not shrink by at least 1/16 is stored uncompressed (format.encode_record).
HEADER_TEMPLATE_CACHE_ENTRIES = 4096


class _ThreadCodecs(threading.local):
    compressor = None
    decompressor = None


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
        self.digest_zeros = bytes(self.digest_bytes)
        self.compression = compression
        self.zstd_level = zstd_level
        self.allow_unverified = allow_unverified
        self._master_key = master_key
        self._ciphers: dict[str, RecordCipher] = {}
        self._ciphers_lock = threading.Lock()
        self._codecs = _ThreadCodecs()
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
        import zstandard

        if self._codecs.compressor is None:
            self._codecs.compressor = zstandard.ZstdCompressor(level=self.zstd_level)
        return self._codecs.compressor.compress(raw)

    def decompress(self, payload, raw_len: int) -> bytes:
        import zstandard

        if self._codecs.decompressor is None:
            self._codecs.decompressor = zstandard.ZstdDecompressor()
        try:
            # python-zstandard ignores max_output_size when the frame states its content size:
            # a frame claiming 64 MiB under a header saying one page would be inflated whole.
            claimed_bytes = zstandard.frame_content_size(payload)
            if claimed_bytes not in (-1, raw_len):
                raise fmt.DecompressionError(
                    f"zstd frame claims {claimed_bytes} bytes, the header {raw_len}"
                )
            return self._codecs.decompressor.decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError as error:
            raise fmt.DecompressionError(str(error)) from error

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
            decompress=self.decompress,
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
            decompress=self.decompress,
        )

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
