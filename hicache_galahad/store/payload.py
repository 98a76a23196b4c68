"""A record file opened (`open_record`: never through a link, V0) and its bytes moved into
memory, once reader.py has decided what to read: a whole small record in one preadv (`read_exactly`), a plain payload hashed while each piece is
in cache, a sealed (AES-256-GCM) one decrypted in place or, for a small page of several pieces,
in a per-thread scratch buffer, and a payload streamed through its checks without being held
(`check_payload`). What a failure means is reader.py's; the rules are record/verifier.py's.
"""

from __future__ import annotations

import errno
import os
import threading

from ..record import compression, verifier
from ..record import format as fmt
from .safe_files import RECORD_OPEN_FLAGS, is_regular

READ_CHUNK_BYTES = 1 << 20
IOV_MAX = 1024  # the most buffers one preadv or writev takes (Linux's UIO_MAXIOV)
# What opening or reading something that is not a regular file fails with (O_NOFOLLOW on a
# symlink, a socket, a directory, a FIFO read with an offset).
NOT_REGULAR_ERRNOS = frozenset({errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ESPIPE})
# preadv2 flag: fail with EAGAIN instead of waiting for the disk (Linux 4.14+; 0 elsewhere).
# A hint, not a promise: on a fast virtual disk the readahead it starts sometimes completes
# and the read is served. Only where a read runs depends on it, never what it returns.
RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
# A sealed record of several small pieces (a page of many layers) is decrypted in a per-thread
# scratch buffer in one call and copied out after its tag verifies: each decrypt call has a
# fixed cost that outweighs a copy of a small piece. A compressed record of at most this is
# read whole into the same buffer, header and all.
SCRATCH_MAX_BYTES = 1 << 20
SCRATCH_MIN_PIECES = 2
_SCRATCH_BYTES = SCRATCH_MAX_BYTES + fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES + 64


def open_record(path: str, *, check_regular: bool = True, dir_fd: int | None = None) -> int:
    """A descriptor of the regular file at `path` (relative to `dir_fd` when given, as the
    store opens records: in a namespace directory held open, never by a path through it);
    never follows a symlink, never blocks on a FIFO. Raises FileNotFoundError, or
    NotARegularFileError (V0) for anything else there. Without `check_regular` (the read
    path, to save an fstat), a FIFO or a directory opens, and the caller's first read of it
    fails with one of NOT_REGULAR_ERRNOS."""
    try:
        fd = os.open(path, RECORD_OPEN_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as error:
        if error.errno in NOT_REGULAR_ERRNOS:
            raise fmt.NotARegularFileError(f"{path} is not a regular file") from error
        raise
    if not check_regular:
        return fd
    try:
        if not is_regular(fd):
            raise fmt.NotARegularFileError(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


class ScratchBuffers(threading.local):
    """One scratch buffer per thread, made on first use: SCRATCH_MAX_BYTES, a whole header
    and a tag, and the 15 bytes a decryption writes past its input."""

    def buffer(self) -> memoryview:
        scratch = getattr(self, "_buffer", None)
        if scratch is None:
            scratch = self._buffer = memoryview(bytearray(_SCRATCH_BYTES))
        return scratch


def read_exactly(fd: int, buffers: list, expected_bytes: int, flags: int = 0) -> bool:
    """One preadv from the file's start into `buffers`: True only if the file holds exactly
    `expected_bytes` and all of them were read (a one-byte sentinel after the buffers stays
    empty). `flags` go to preadv (RWF_NOWAIT: EAGAIN or a short read when some of it is not
    in the page cache). A FIFO or a directory raises NotARegularFileError (V0)."""
    sentinel = bytearray(1)
    try:
        return os.preadv(fd, [*buffers, sentinel], 0, flags) == expected_bytes
    except OSError as error:
        if error.errno in NOT_REGULAR_ERRNOS:  # a FIFO, a directory: never a record
            raise fmt.NotARegularFileError("the record is not a regular file") from error
        raise


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


def uses_scratch(segments, raw_len: int) -> bool:
    """Whether a sealed page in these buffers is decrypted in the scratch buffer."""
    return len(segments) >= SCRATCH_MIN_PIECES and raw_len <= SCRATCH_MAX_BYTES


def read_sealed_into(fd, header, header_bytes, segments, cipher, scratch) -> None:
    """An encrypted record (its header checked) into the caller's buffers, in batches: see
    open_sealed_into for where it is decrypted."""
    tag = bytearray(fmt.TAG_BYTES)
    body = [scratch.buffer()[: header.raw_len]] if uses_scratch(segments, header.raw_len) else None
    position = header.header_len
    for batch in read_batches(body or segments):
        expected = sum(len(piece) for piece in batch)
        if os.preadv(fd, batch, position) != expected:
            raise fmt.LengthMismatchError("record shrank while being read")
        position += expected
    if os.preadv(fd, [tag], position) != fmt.TAG_BYTES:
        raise fmt.LengthMismatchError("record shrank while being read")
    open_sealed_into(cipher, header, header_bytes, tag, segments, scratch)


def open_sealed_into(cipher, header, header_bytes, tag, segments, scratch) -> None:
    """Decrypts a sealed page whose ciphertext was read into the caller's buffers, or into
    the scratch buffer when uses_scratch; raises AuthenticationError (V14) unless its tag
    verifies. In the caller's buffers it is decrypted in place (no temporary, no second
    copy), so they hold unauthenticated bytes until the tag verifies, and on a failure the
    caller gets a miss. Through the scratch buffer, the caller's buffers are written only
    once the tag has verified."""
    decryptor = cipher.decryptor(header.nonce, bytes(tag), bytes(header_bytes))
    if not uses_scratch(segments, header.raw_len):
        for segment in segments:
            _decrypt_in_place(decryptor, segment)
        verifier.finish_tag(decryptor)
        return
    size = header.raw_len
    buffer = scratch.buffer()
    decryptor.update_into(buffer[:size], buffer[: size + 15])  # GCM writes what it reads
    verifier.finish_tag(decryptor)
    copy_into(buffer[:size], segments)


def copy_into(source, segments) -> None:
    """`source` (exactly as long as the buffers together) copied into the caller's buffers."""
    offset = 0
    for segment in segments:
        segment[:] = source[offset : offset + len(segment)]
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


def file_reader(fd: int):
    """read_at(size, offset) over a record file."""
    return lambda size, offset: os.pread(fd, size, offset)


def buffer_reader(view: memoryview):
    """read_at(size, offset) over a record file held whole in memory (views, no copy)."""
    return lambda size, offset: view[offset : offset + size]


def check_payload(read_at, header, header_bytes, cipher, decompress: bool = True) -> None:
    """V13-V15 over the payload, READ_CHUNK_BYTES at a time from `read_at(size, offset)` (the
    file's, or a buffer holding the whole file: one chunk for a small record), never holding
    it whole (V15 only with `decompress`; `cipher`: the tenant's, or None). A frame that
    fails to decode is named V15 only once the digest or the tag over the stored bytes has
    passed: damage to the stored bytes is V13 or V14, as on every other path."""
    digest = verifier.Digest.of(header, header_bytes)
    decryptor = None
    body_len = header.payload_len
    if header.encrypted:
        if cipher is None:
            raise verifier.no_key()
        body_len -= fmt.TAG_BYTES
        tag = bytes(read_at(fmt.TAG_BYTES, header.header_len + body_len))
        decryptor = cipher.decryptor(header.nonce, tag, bytes(header_bytes))
    source = _PayloadSource(read_at, header.header_len, body_len, digest, decryptor)
    decoded_len, undecodable = header.raw_len, None
    if header.compressed and decompress:
        try:
            decoded_len = compression.decoded_length(source, header.raw_len, READ_CHUNK_BYTES)
        except fmt.DecompressionError as error:
            undecodable = error
    elif not header.compressed:
        decoded_len = body_len
    source.drain()
    digest.finish()
    if decryptor is not None:
        verifier.finish_tag(decryptor)
    if undecodable is not None:
        raise undecodable
    verifier.check_decoded_length(decoded_len, header)


class _PayloadSource:
    """A record's payload as a file-like source that hashes and decrypts what it hands out."""

    def __init__(self, read_at, start: int, length: int, digest, decryptor):
        self._read_at, self._position, self._end = read_at, start, start + length
        self._digest, self._decryptor = digest, decryptor

    def read(self, size: int = -1) -> bytes:
        size = self._end - self._position if size < 0 else min(size, self._end - self._position)
        if size <= 0:
            return b""
        data = self._read_at(size, self._position)
        if len(data) != size:
            raise fmt.LengthMismatchError("record shrank while being read")
        self._position += size
        self._digest.update(data)
        return self._decryptor.update(data) if self._decryptor is not None else data

    def drain(self) -> None:
        while self.read(READ_CHUNK_BYTES):
            pass
