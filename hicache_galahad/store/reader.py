"""The verified read paths: the one place that decides whether a record may be served.

`RecordReader.read_into` serves a record into the caller's buffers; `verify_file` checks a
record found on disk (for `check`) with the same rules: a small one read whole in one pread, a
larger one streamed, without holding it whole.
Both raise a format.FormatError naming the broken rule; the store turns that into a miss.
The rules, their order and the rule a failure names are record/verifier.py's: this module
decides only how the bytes are read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time

from ..record import format as fmt
from ..record import verifier
from ..record.codec import RecordCodec
from ..record.namespace import Namespace
from .layout import RECORD_SUFFIX, FileEntry, StoreLayout, record_filename
from .payload import IOV_MAX, READ_CHUNK_BYTES, ScratchBuffers, read_plain_into, read_sealed_into
from .safe_files import RECORD_OPEN_FLAGS, is_regular

# What opening or reading something that is not a regular file fails with (O_NOFOLLOW on a
# symlink, a socket, a directory, a FIFO read with an offset).
NOT_REGULAR_ERRNOS = frozenset({errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ESPIPE})
FAST_READ_MAX_BYTES = 1 << 20
# `verify_file` reads a record file of at most this many bytes whole, in one pread, and checks
# it from that buffer; a larger one is streamed READ_CHUNK_BYTES at a time (never held whole).
VERIFY_WHOLE_MAX_BYTES = READ_CHUNK_BYTES
# verify_file(nowait=True) (`check` with threads: on the calling thread, from the page cache)
# takes a record of at most this: a larger one's digest, decryption or decompression is worth
# a thread of its own, where it runs beside the others.
VERIFY_CACHED_MAX_BYTES = 1 << 16
# The file name of a record of a 64-hex key (record_filename: the key, then the suffix).
_HEX_RECORD_NAME = re.compile("[0-9a-f]{64}" + re.escape(RECORD_SUFFIX))
_ZERO_DIGEST_FIELD = bytes(32)
# preadv2 flag: fail with EAGAIN instead of waiting for the disk (Linux 4.14+; 0 elsewhere).
# A hint, not a promise: on a fast virtual disk the readahead it starts sometimes completes
# and the read is served. Only where a read runs depends on it, never what it returns.
RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
# The records whose time of last use this process set within RECENCY_INTERVAL_S: bounded (about
# 210 bytes an entry, so at most ~14 MB), cleared when full, which costs at most one more
# futimens per record read again within the interval.
TOUCHED_LOCATIONS_MAX = 65_536
# A record's modification time is its time of last use (eviction order after a restart,
# `galahad purge --older-than`): a read sets it again when this process last set it more than
# this long ago, so it is never older than this (plus the time between two reads) while the
# record is read, at one futimens per record per interval (docs/OPERATIONS.md).
RECENCY_INTERVAL_S = 2.0


def expected_page_bytes(namespace: Namespace | None) -> int | None:
    """The raw size of every record of a namespace whose geometry names it (a pool's
    `page_bytes`); None for namespaces of records of many sizes (Blaise's)."""
    if namespace is None:
        return None
    page_bytes = namespace.geometry.get("page_bytes")
    if isinstance(page_bytes, int) and not isinstance(page_bytes, bool) and page_bytes >= 0:
        return page_bytes
    return None


def reader_may_be_wrong(error: fmt.FormatError, key_proven: bool) -> bool:
    """Failures that a wrong configuration of the reader would cause on a sound record: a
    plaintext or unprotected record in an encrypted store (V12), a page size the reader got
    wrong (V16), and a tag that fails before any record of the namespace opened with this
    reader's key (V14: most likely a wrong key). Such records are left in place; only proven
    damage is quarantined."""
    if isinstance(error, fmt.ProtectionPolicyError | fmt.RawSizeError):
        return True
    if isinstance(error, fmt.AuthenticationError):
        return not key_proven
    return False


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


class RecordReader:
    """Reads records of one store root, verifying every rule of docs/FORMAT.md."""

    verify_whole_max_bytes = VERIFY_WHOLE_MAX_BYTES  # (a test sets it on an instance)

    def __init__(self, layout: StoreLayout, codec: RecordCodec, *, read_only: bool = False):
        self.layout = layout
        self.codec = codec
        self.read_only = read_only
        self._key_proven: set[str] = set()  # namespaces where this reader's key opened a record
        self._used_s: dict = {}  # location -> when this process last set its time of last use
        self._nowait_works = bool(RWF_NOWAIT)
        self._scratch = ScratchBuffers()

    def key_proven(self, dirname: str) -> bool:
        return dirname in self._key_proven

    # ------------------------------------------------------------- serving reads

    def read_into(
        self,
        namespace: Namespace,
        key: str,
        out,
        filename: str | None = None,
        note_use: bool = True,
    ):
        """Fills `out` (a buffer, or a list of buffers filled in order) with the record's
        verified raw bytes, whose size must be exactly the record's. Raises
        FileNotFoundError, format.FormatError (with `.inode` set) or OSError. `filename` is
        record_filename(key), when the caller has it already; without `note_use` (a check,
        not a use) the record's time of last use is left as it was."""
        segments = fmt.as_segments(out)
        key_bytes = fmt.encode_key(key)
        raw_len = sum(len(segment) for segment in segments)
        filename = filename or record_filename(key)
        fd = open_record(
            filename, check_regular=False, dir_fd=self.layout.namespace_fd(namespace.dirname)
        )
        try:
            if not (
                raw_len <= FAST_READ_MAX_BYTES
                and len(segments) < IOV_MAX - 2
                and self._read_fast(fd, namespace, key_bytes, segments, raw_len)
            ):
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise fmt.NotARegularFileError(f"{filename} is not a regular file")
                try:
                    self._read_verified(fd, info.st_size, namespace, key_bytes, segments)
                except fmt.FormatError as error:
                    error.inode = info.st_ino
                    raise
            if note_use and not self.read_only:
                self._note_use(fd, (namespace.dirname, filename))
        finally:
            os.close(fd)

    def read_cached_into(self, namespace: Namespace, key: str, out, filename: str) -> bool:
        """read_into for a small record of a store without compression (plain or sealed)
        whose bytes are all in the page cache, on the caller's thread, never waiting for the
        disk (RWF_NOWAIT). False when it cannot serve it so (not all cached, too large,
        missing, any doubt): the caller then reads it with read_into, which decides and names
        any broken rule. A batch of warm small pages is served without handing each page to a
        thread."""
        if not self._nowait_works or self.codec.compression != "none":
            return False  # (a compressed record would be read here only to be read again)
        segments = fmt.as_segments(out)
        raw_len = sum(len(segment) for segment in segments)
        if raw_len > FAST_READ_MAX_BYTES or len(segments) >= IOV_MAX - 2:
            return False
        try:
            fd = open_record(
                filename, check_regular=False, dir_fd=self.layout.namespace_fd(namespace.dirname)
            )
        except (OSError, fmt.FormatError):
            return False
        try:
            key_bytes = fmt.encode_key(key)
            if self.codec.encrypted:
                header, header_bytes = self.read_header(
                    fd, os.fstat(fd).st_size, namespace, key_bytes, RWF_NOWAIT
                )
                if not header.encrypted or header.compressed or header.raw_len != raw_len:
                    return False
                self._read_sealed_into(fd, header, header_bytes, segments, namespace, RWF_NOWAIT)
            elif not self._read_fast(fd, namespace, key_bytes, segments, raw_len, RWF_NOWAIT):
                return False
            if not self.read_only:
                self._note_use(fd, (namespace.dirname, filename))
            return True
        except (OSError, fmt.FormatError) as error:
            if getattr(error, "errno", None) in (errno.EOPNOTSUPP, errno.EINVAL):
                self._nowait_works = False  # a kernel or filesystem without RWF_NOWAIT reads
            return False
        finally:
            os.close(fd)

    def raw_len(self, namespace: Namespace, key: str) -> int:
        """The raw size a record declares, after its header checks (V0-V12)."""
        fd = self.open_record(namespace.dirname, record_filename(key))
        try:
            header, _ = self.read_header(fd, os.fstat(fd).st_size, namespace, fmt.encode_key(key))
            return header.raw_len
        finally:
            os.close(fd)

    def open_record(self, dirname: str, filename: str) -> int:
        """open_record of a record of a namespace, through its held directory descriptor."""
        return open_record(filename, dir_fd=self.layout.namespace_fd(dirname))

    def _note_use(self, fd: int, location: tuple[str, str]) -> None:
        """Sets the record's modification time, its time of last use, unless this process
        set it less than RECENCY_INTERVAL_S ago: eviction after a restart and `purge
        --older-than` then see what was used (a read-only reader changes nothing)."""
        now_s = time.monotonic()
        last_s = self._used_s.get(location)
        if last_s is not None and now_s - last_s < RECENCY_INTERVAL_S:
            return
        with contextlib.suppress(OSError):  # e.g. a read-only mount
            os.utime(fd)
        if len(self._used_s) > TOUCHED_LOCATIONS_MAX:
            self._used_s.clear()
        self._used_s[location] = now_s

    def _read_fast(self, fd, namespace, key_bytes, segments, raw_len: int, flags: int = 0):
        """One preadv for header, key echo and payload, straight into the caller's buffers.
        True only if the record passes every rule; on any doubt the caller re-reads it on the
        full path, which names the rule that failed. `flags` go to preadv (RWF_NOWAIT: a
        short read or EAGAIN when some of it is not in the page cache)."""
        codec = self.codec
        if codec.encrypted:
            return False
        head = bytearray(fmt.FIXED_HEADER_BYTES + len(key_bytes))
        sentinel = bytearray(1)  # stays empty only if the file ends where it should
        try:
            if os.preadv(fd, [head, *segments, sentinel], 0, flags) != len(head) + raw_len:
                return False
        except OSError as error:
            if error.errno in NOT_REGULAR_ERRNOS:  # a FIFO, a directory: never a record
                raise fmt.NotARegularFileError("the record is not a regular file") from error
            raise
        digest_end = fmt.DIGEST_OFFSET + codec.digest_bytes
        if (
            head[: fmt.DIGEST_OFFSET]
            != codec.expected_plain_header(namespace, len(key_bytes), raw_len)
            or head[fmt.FIXED_HEADER_BYTES :] != key_bytes
            or head[digest_end : fmt.FIXED_HEADER_BYTES] != codec.digest_padding
        ):
            return False
        digest = verifier.Digest(codec.digest_alg, bytes(head[fmt.DIGEST_OFFSET : digest_end]))
        if not digest.active:
            return codec.allow_unverified
        head[fmt.DIGEST_OFFSET : digest_end] = codec.digest_zeros  # hashed as zeros
        digest.update(head)
        for segment in segments:
            digest.update(segment)
        return digest.matches()

    def read_header(self, fd, file_len: int, namespace: Namespace, key_bytes: bytes, flags=0):
        """(header, its bytes) of the record open at fd, after V1-V12; `flags` go to preadv."""
        if flags:
            prefix = bytearray(fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES)
            del prefix[os.preadv(fd, [prefix], 0, flags) :]
        else:
            prefix = os.pread(fd, fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES, 0)
        header = self.codec.check_header(prefix, file_len, key_bytes, namespace.digest)
        return header, prefix[: header.header_len]

    def _read_sealed_into(self, fd, header, header_bytes, segments, namespace, flags=0) -> None:
        cipher = self.codec.cipher(namespace.tenant)
        if cipher is None:
            raise verifier.no_key()
        read_sealed_into(fd, header, header_bytes, segments, cipher, self._scratch, flags)
        self._key_proven.add(namespace.dirname)

    def _read_verified(self, fd, file_len, namespace, key_bytes, segments) -> None:
        header, header_bytes = self.read_header(fd, file_len, namespace, key_bytes)
        # Every length the record claims is bounded by the page before a payload byte is read
        # or decoded: raw_len here (V16, verifier.check_page_size), the stored length by V9
        # (at most raw_len, plus the tag), the file's by V8.
        verifier.check_page_size(
            header,
            sum(len(segment) for segment in segments),
            lambda: self._verify_payload(
                _file_reader(fd), header, header_bytes, namespace.tenant, decompress=False
            ),
        )
        if not header.compressed and not header.encrypted:
            read_plain_into(fd, header, header_bytes, segments)
            return
        if header.encrypted and not header.compressed:
            self._read_sealed_into(fd, header, header_bytes, segments, namespace)
            return
        body = memoryview(self._read_decoded(fd, header, header_bytes, namespace)).cast("B")
        offset = 0
        for segment in segments:
            segment[:] = body[offset : offset + len(segment)]
            offset += len(segment)

    def _read_decoded(self, fd, header, header_bytes, namespace: Namespace):
        """The raw page of a record read whole: digest or tag, decryption, decompression."""
        payload = bytearray(header.payload_len)
        if os.preadv(fd, [payload], header.header_len) != header.payload_len:
            raise fmt.LengthMismatchError("record shrank while being read")
        body = self.codec.decode_payload(header, header_bytes, payload, namespace.tenant)
        if header.encrypted:
            self._key_proven.add(namespace.dirname)
        return body

    def decode_value(self, namespace: Namespace, key: str, value, expected_raw_len: int):
        """The raw page of a whole record held in memory (a value from a shared tier), after
        the same rules as a record on disk (V1-V16); raises format.FormatError."""
        raw = self.codec.decode_record(value, fmt.encode_key(key), namespace, expected_raw_len)
        if self.codec.encrypted:
            self._key_proven.add(namespace.dirname)
        return memoryview(raw).cast("B")

    # ------------------------------------------------------------- checking files on disk

    def verify_file(
        self, entry: FileEntry, namespace: Namespace | None, nowait: bool = False
    ) -> bool:
        """Applies every rule to a record file found by a scan; raises format.FormatError
        or OSError. `namespace` is what the directory's namespace.json describes (None if
        unreadable); the key is the record's own echo, which must match the file name (V10).
        A file of at most `verify_whole_max_bytes` is read whole in one pread and checked
        from that buffer; a larger one piece by piece, never held whole. Both name the same
        rule. True once checked. With `nowait`, only a file read whole, of at most
        VERIFY_CACHED_MAX_BYTES, whose bytes are all in the page cache is checked (read with
        RWF_NOWAIT, never waiting for the disk): False, nothing decided, for any other (the
        caller checks it again without `nowait`, on a thread that may wait)."""
        if nowait and not self._nowait_works:
            return False
        fd = open_record(
            entry.name, check_regular=False, dir_fd=self.layout.namespace_fd(entry.dirname)
        )
        try:
            info = os.fstat(fd)  # the only one: V0 and the file's length
            if not stat.S_ISREG(info.st_mode):
                raise fmt.NotARegularFileError(f"{entry.name} is not a regular file")
            file_len = info.st_size
            if nowait and file_len > min(VERIFY_CACHED_MAX_BYTES, self.verify_whole_max_bytes):
                return False
            if file_len > self.verify_whole_max_bytes:
                self._verify_streamed(fd, file_len, entry, namespace)
                return True
            if nowait:
                data = bytearray(file_len)
                try:
                    if os.preadv(fd, [data], 0, RWF_NOWAIT) != file_len:
                        return False  # (not all cached, or it changed: read it again)
                except OSError as error:
                    if error.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                        self._nowait_works = False  # a kernel or filesystem without it
                    elif error.errno != errno.EAGAIN:
                        raise
                    return False
            else:
                data = os.pread(fd, file_len, 0)
                if len(data) != file_len:
                    raise fmt.LengthMismatchError("record shrank while being read")
            if not self._is_sound_plain_page(entry, namespace, data):
                self._verify_whole(entry, namespace, data)
            return True
        finally:
            os.close(fd)

    def _is_sound_plain_page(self, entry: FileEntry, namespace, data) -> bool:
        """True only if `data`, a whole record file, passes every rule as a plain,
        uncompressed record of a 64-hex key (SGLang's page hashes) of the directory's
        namespace, in a store without encryption: its first bytes are then the one header
        check_header accepts (expected_plain_header, as on the page-cache read path), its
        echo the file name's key and its digest matches. On any doubt False: the caller
        applies the rules one by one, which name the one that failed (or pass a sound
        record of another form)."""
        codec = self.codec
        name = entry.name
        if (
            namespace is None
            or codec.encrypted
            or not codec.digest_bytes  # (a record without a digest: the policy decides)
            or namespace.dirname != entry.dirname
            or not _HEX_RECORD_NAME.fullmatch(name)  # record_filename(name[:64]) is name
        ):
            return False
        header_len = fmt.FIXED_HEADER_BYTES + 64
        raw_len = len(data) - header_len
        page_bytes = expected_page_bytes(namespace)
        if raw_len < 0 or (page_bytes is not None and raw_len != page_bytes):
            return False
        digest_end = fmt.DIGEST_OFFSET + codec.digest_bytes
        if not (
            data.startswith(codec.expected_plain_header(namespace, 64, raw_len))
            and data.startswith(name[:64].encode("ascii"), fmt.FIXED_HEADER_BYTES)
            and data.startswith(codec.digest_padding, digest_end)
        ):
            return False
        view = memoryview(data)
        digest = verifier.Digest(codec.digest_alg, data[fmt.DIGEST_OFFSET : digest_end])
        digest.update(view[: fmt.DIGEST_OFFSET])
        digest.update(_ZERO_DIGEST_FIELD)  # hashed as zeros; then the key echo and payload
        digest.update(view[fmt.FIXED_HEADER_BYTES :])
        return digest.matches()

    def _check_found(self, header: fmt.Header, entry: FileEntry, namespace) -> None:
        """V10-V12 for a record found by a scan: the key asked for is the one the file name
        stands for (V10); the namespace, the directory's (V11); then the reader's policy."""
        if record_filename(header.key.decode("utf-8", "surrogateescape")) != entry.name:
            raise fmt.KeyMismatchError("file name does not match the record's key")
        if header.namespace.hex()[:32] != entry.dirname:
            raise fmt.NamespaceMismatchError("record is not of its directory's namespace")
        expected_namespace = header.namespace if namespace is None else namespace.digest
        self.codec.check_identity(header, header.key, expected_namespace)

    def _verify_whole(self, entry: FileEntry, namespace, data) -> None:
        """verify_file on a record file read whole into `data`: the same rules in the same
        order as _verify_streamed, over views of the one buffer (no copy of the payload)."""
        view = memoryview(data)
        header = fmt.parse_header(view, len(data))
        self._check_found(header, entry, namespace)
        header_bytes = view[: header.header_len]
        self._verify_found(header, header_bytes, _buffer_reader(view), entry, namespace)

    def _verify_streamed(self, fd, file_len: int, entry: FileEntry, namespace) -> None:
        """verify_file on a record file read piece by piece (one larger than a read)."""
        prefix = os.pread(fd, fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES, 0)
        header = fmt.parse_header(prefix, file_len)
        self._check_found(header, entry, namespace)
        header_bytes = prefix[: header.header_len]
        self._verify_found(header, header_bytes, _file_reader(fd), entry, namespace)

    def _verify_found(self, header, header_bytes, read_at, entry: FileEntry, namespace) -> None:
        """V16 then V13-V15 of a record found by a scan, whichever way its bytes are read."""
        tenant = namespace.tenant if namespace is not None else None
        verifier.check_page_size(
            header,
            expected_page_bytes(namespace),
            lambda: self._verify_payload(read_at, header, header_bytes, tenant, decompress=False),
        )
        self._verify_payload(read_at, header, header_bytes, tenant)
        if header.encrypted:
            self._key_proven.add(entry.dirname)

    def _verify_payload(
        self, read_at, header, header_bytes, tenant: str | None, decompress: bool = True
    ) -> None:
        """V13-V15 over the payload, READ_CHUNK_BYTES at a time from `read_at(size, offset)`
        (the file's, or a buffer holding the whole file: one chunk for a small record) (V15
        only with `decompress`). A frame that fails to decode is named V15 only once the digest or the
        tag over the stored bytes has passed: damage to the stored bytes is V13 or V14, as on
        every other path."""
        digest = verifier.Digest.of(header, header_bytes)
        decryptor = None
        body_len = header.payload_len
        if header.encrypted:
            cipher = self.codec.cipher(tenant) if tenant is not None else None
            if cipher is None:
                raise verifier.no_key()
            body_len -= fmt.TAG_BYTES
            tag = bytes(read_at(fmt.TAG_BYTES, header.header_len + body_len))
            decryptor = cipher.decryptor(header.nonce, tag, bytes(header_bytes))
        source = _PayloadSource(read_at, header.header_len, body_len, digest, decryptor)
        decoded_len, undecodable = header.raw_len, None
        if header.compressed and decompress:
            try:
                decoded_len = _decoded_length(source, header.raw_len)
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


def _file_reader(fd: int):
    """read_at(size, offset) over a record file."""
    return lambda size, offset: os.pread(fd, size, offset)


def _buffer_reader(view: memoryview):
    """read_at(size, offset) over a record file held whole in memory (views, no copy)."""
    return lambda size, offset: view[offset : offset + size]


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


def _decoded_length(source: _PayloadSource, raw_len: int) -> int:
    """What a zstd frame decodes to, counted piece by piece, never past raw_len + 1 bytes."""
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(
            source, read_size=READ_CHUNK_BYTES, closefd=False
        ) as frames:
            decoded = 0
            while chunk := frames.read(min(READ_CHUNK_BYTES, raw_len + 1 - decoded) or 1):
                decoded += len(chunk)
                if decoded > raw_len:
                    break
            return decoded
    except zstandard.ZstdError as error:
        raise fmt.DecompressionError(str(error)) from error
