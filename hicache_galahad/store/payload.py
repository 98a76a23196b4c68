"""A record's payload into the caller's buffers, once its header has passed: plain records
hashed while each piece is in cache, sealed (AES-256-GCM) records decrypted in place, or, for a
small page of several pieces, in a per-thread scratch buffer. reader.py decides what is read
and what a failure means, the rules are record/verifier.py's; this module only moves bytes
and feeds them to the verifier.
"""

from __future__ import annotations

import os
import threading

from ..record import format as fmt
from ..record import verifier

READ_CHUNK_BYTES = 1 << 20
IOV_MAX = 1024
# A sealed record of several small pieces (a page of many layers) is decrypted in a per-thread
# scratch buffer in one call and copied out after its tag verifies: each decrypt call has a
# fixed cost that outweighs a copy of a small piece.
SCRATCH_MAX_BYTES = 1 << 20
SCRATCH_MIN_PIECES = 2


class ScratchBuffers(threading.local):
    """One scratch buffer per thread, made on first use."""

    def buffer(self) -> memoryview:
        scratch = getattr(self, "_buffer", None)
        if scratch is None:
            scratch = self._buffer = memoryview(bytearray(SCRATCH_MAX_BYTES + 32))
        return scratch


def read_batches(segments):
    """Groups buffers into preadv calls of about READ_CHUNK_BYTES (large ones are split), so
    each batch is still in cache when it is hashed."""
    batch, batch_bytes = [], 0
    for segment in segments:
        for offset in range(0, len(segment), READ_CHUNK_BYTES):
            piece = segment[offset : offset + READ_CHUNK_BYTES]
            batch.append(piece)
            batch_bytes += len(piece)
            if batch_bytes >= READ_CHUNK_BYTES or len(batch) >= IOV_MAX:
                yield batch
                batch, batch_bytes = [], 0
    if batch:
        yield batch


def read_plain_into(fd, header, header_bytes, segments) -> None:
    """Reads straight into the caller's buffers, hashing each piece while it is in cache."""
    digest = verifier.Digest.of(header, header_bytes)
    position = header.header_len
    for batch in read_batches(segments):
        expected = sum(len(piece) for piece in batch)
        if os.preadv(fd, batch, position) != expected:
            raise fmt.LengthMismatchError("record shrank while being read")
        position += expected
        if digest.active:
            for piece in batch:
                digest.update(piece)
    digest.finish()


def read_sealed_into(fd, header, header_bytes, segments, cipher, scratch, flags=0) -> None:
    """An encrypted record into the caller's buffers. Large records are decrypted in place:
    the ciphertext is read straight into the buffers and decrypted there (no temporary, no
    second copy), so the buffers hold unauthenticated bytes until the tag verifies, and on a
    failure the caller gets a miss. A small record of several pieces goes through `scratch`
    (a ScratchBuffers) instead. `flags` go to preadv."""
    if len(segments) >= SCRATCH_MIN_PIECES and header.raw_len <= SCRATCH_MAX_BYTES:
        _read_sealed_via_scratch(fd, header, header_bytes, segments, cipher, scratch, flags)
        return
    tag = bytearray(fmt.TAG_BYTES)
    position = header.header_len
    for batch in read_batches(segments):
        expected = sum(len(piece) for piece in batch)
        if os.preadv(fd, batch, position, flags) != expected:
            raise fmt.LengthMismatchError("record shrank while being read")
        position += expected
    if os.preadv(fd, [tag], position, flags) != fmt.TAG_BYTES:
        raise fmt.LengthMismatchError("record shrank while being read")
    decryptor = cipher.decryptor(header.nonce, bytes(tag), bytes(header_bytes))
    for segment in segments:
        _decrypt_in_place(decryptor, segment)
    verifier.finish_tag(decryptor)


def _read_sealed_via_scratch(fd, header, header_bytes, segments, cipher, scratch, flags):
    """A small sealed record of several pieces: ciphertext and tag read in one call into
    this thread's scratch buffer, decrypted there in one call, and copied into the caller's
    buffers only after the tag verifies."""
    size = header.raw_len
    buffer = scratch.buffer()
    ciphertext = buffer[:size]
    tag = bytearray(fmt.TAG_BYTES)
    if os.preadv(fd, [ciphertext, tag], header.header_len, flags) != size + fmt.TAG_BYTES:
        raise fmt.LengthMismatchError("record shrank while being read")
    decryptor = cipher.decryptor(header.nonce, bytes(tag), bytes(header_bytes))
    decryptor.update_into(ciphertext, buffer[: size + 15])  # GCM writes what it reads
    verifier.finish_tag(decryptor)
    offset = 0
    for segment in segments:
        segment[:] = buffer[offset : offset + len(segment)]
        offset += len(segment)


def _decrypt_in_place(decryptor, segment: memoryview) -> None:
    """Decrypts `segment` in place. The library asks for an output buffer 15 bytes longer
    than its input, so all but the last 16 bytes are decrypted over themselves (the 15 bytes
    after them are ciphertext not yet read, and untouched: GCM writes exactly what it reads)
    and the last 16 through a small buffer."""
    size = len(segment)
    tail_start = max(0, size - 16)
    if tail_start:
        decryptor.update_into(segment[:tail_start], segment[: tail_start + 15])
    tail = bytearray(size - tail_start + 15)
    written = decryptor.update_into(bytes(segment[tail_start:]), tail)
    segment[tail_start:] = tail[:written]
