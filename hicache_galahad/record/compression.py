"""zstd for record payloads: a page compressed, and a frame decoded, the one place that does
either. Decoding is bounded by the raw length the record's header states, whether the frame is
decoded whole (`decompress`) or only counted piece by piece from a stream (`decoded_length`);
a frame that fails to decode, or claims another length, raises format.DecompressionError (V15).

Pure apart from the zstandard library (imported on first use): no file I/O.
"""

from __future__ import annotations

import threading

from . import format as fmt


class _ThreadCodecs(threading.local):
    """This thread's zstd contexts (they are not thread-safe), made on first use."""

    def __init__(self):
        self.compressors: dict = {}  # level -> compressor
        self.decompressor = None


_codecs = _ThreadCodecs()


def compress(raw, level: int) -> bytes:
    """One zstd frame holding `raw` (a buffer), at `level`."""
    compressor = _codecs.compressors.get(level)
    if compressor is None:
        import zstandard

        compressor = _codecs.compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor.compress(raw)


def decompress(frame, raw_len: int) -> bytes:
    """The page a zstd frame holds, never more than `raw_len` bytes of it."""
    import zstandard

    if _codecs.decompressor is None:
        _codecs.decompressor = zstandard.ZstdDecompressor()
    try:
        # python-zstandard ignores max_output_size when the frame states its content size: a
        # frame claiming 64 MiB under a header saying one page would be inflated whole.
        claimed_bytes = zstandard.frame_content_size(frame)
        if claimed_bytes not in (-1, raw_len):
            raise fmt.DecompressionError(
                f"zstd frame claims {claimed_bytes} bytes, the header {raw_len}"
            )
        return _codecs.decompressor.decompress(frame, max_output_size=raw_len)
    except zstandard.ZstdError as error:
        raise fmt.DecompressionError(str(error)) from error


def decoded_length(source, raw_len: int, chunk_bytes: int) -> int:
    """What the zstd frame read from `source` (a file-like object: read(size)) decodes to,
    counted `chunk_bytes` at a time and never past raw_len + 1 bytes: a frame checked without
    holding the page it decodes to."""
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(
            source, read_size=chunk_bytes, closefd=False
        ) as frames:
            decoded = 0
            while chunk := frames.read(min(chunk_bytes, raw_len + 1 - decoded) or 1):
                decoded += len(chunk)
                if decoded > raw_len:
                    break
            return decoded
    except zstandard.ZstdError as error:
        raise fmt.DecompressionError(str(error)) from error
