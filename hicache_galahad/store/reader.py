"""The verified read paths: the one place that decides whether a record may be served.

A read goes one way. `RecordReader.read_cached_into` (on the caller's thread, never waiting for
the disk) opens a small record and either serves it or hands what it opened (an
`OpenedRecord`: the descriptor, or why the open failed, and the encoded key) to
`RecordReader.read_into` (on an I/O thread), which goes on from there: a record is opened once.
Both read a small record whole in one preadv (header, key echo, payload and tag; a compressed
one into a scratch buffer) and accept it only if it passes every rule; on any doubt the full
path (`_read_checked`: fstat, header, payload) applies the rules one by one and raises a
format.FormatError naming the broken one; the store turns that into a miss. The rules, their
order and the rule a failure names are record/verifier.py's (through the store's codec); this
module decides only how the bytes are read (payload.py moves them). Records found on disk by a
scan are checked by file_verifier.py with the same rules.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time

from ..record import format as fmt
from ..record import verifier
from ..record.codec import RecordCodec
from ..record.namespace import Namespace
from . import payload
from .context import StoreContext
from .eviction import RecentReads
from .file_verifier import FileVerifier
from .layout import record_filename
from .payload import IOV_MAX, NOT_REGULAR_ERRNOS, RWF_NOWAIT, ScratchBuffers, open_record

__all__ = ["OpenedRecord", "RWF_NOWAIT", "RecordReader", "open_record", "reader_may_be_wrong"]

# A record of at most this many raw bytes is read whole in one preadv (a compressed one into
# the per-thread scratch buffer, which holds this much).
FAST_READ_MAX_BYTES = payload.SCRATCH_MAX_BYTES
# The records whose time of last use this process set within RECENCY_INTERVAL_S: bounded (about
# 210 bytes an entry, so at most ~14 MB), cleared when full, which costs at most one more
# futimens per record read again within the interval.
TOUCHED_LOCATIONS_MAX = 65_536
# A record's modification time is its time of last use (eviction order after a restart,
# `galahad purge --older-than`): a read sets it again when this process last set it more than
# this long ago, so it is never older than this (plus the time between two reads) while the
# record is read, at one futimens per record per interval (docs/OPERATIONS.md).
RECENCY_INTERVAL_S = 2.0
# Records the page-cache attempts may hand on to the full read at once, open (SGLang asks 128
# pages a batch): past it a declined record is closed, and the full read opens it again, so a
# huge batch of cold pages never holds a descriptor each.
HANDED_ON_MAX = 512


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


class OpenedRecord:
    """A record the page-cache attempt opened and did not serve, for read_into to go on
    with: its descriptor (or the error its open raised: a missing record is not looked up
    twice) and its encoded key. False as a truth value (it was not served). read_into closes
    it; one dropped unread (a batch abandoned by an exception) is closed when collected.
    `slot` (one of the reader's HANDED_ON_MAX) is released once the descriptor leaves it."""

    __slots__ = ("fd", "error", "key_bytes", "slot")

    def __init__(self, fd: int | None, error: Exception | None, key_bytes: bytes, slot=None):
        self.fd, self.error, self.key_bytes, self.slot = fd, error, key_bytes, slot

    def __bool__(self) -> bool:
        return False

    def take(self) -> int:
        """The descriptor, now the caller's to close; raises the open's error if it failed."""
        if self.error is not None:
            raise self.error
        fd, self.fd = self.fd, None
        self._release()
        return fd

    def close(self) -> None:
        fd, self.fd = self.fd, None
        self._release()
        if fd is not None:
            os.close(fd)

    def _release(self) -> None:
        slot, self.slot = self.slot, None
        if slot is not None:
            slot.release()

    __del__ = close


class RecordReader:
    """Reads records of one store root, verifying every rule of docs/FORMAT.md."""

    def __init__(
        self, context: StoreContext, codec: RecordCodec, *, recent_reads: RecentReads | None = None
    ):
        """`recent_reads`: where every read is noted (the store's shared eviction order)."""
        self.layout = context.layout
        self.codec = codec
        self.read_only = context.read_only  # never sets a record's time of last use
        self._recent_reads = recent_reads if recent_reads is not None else RecentReads()
        self._key_proven: set[str] = set()  # namespaces where this reader's key opened a record
        self._used_s: dict = {}  # location -> when this process last set its time of last use
        self._nowait_works = bool(RWF_NOWAIT)
        self._scratch = ScratchBuffers()
        self._handed_on = threading.BoundedSemaphore(HANDED_ON_MAX)
        self.files = FileVerifier(context, codec, self._key_proven)

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
        opened: OpenedRecord | None = None,
    ):
        """Fills `out` (a buffer, or a list of buffers filled in order) with the record's
        verified raw bytes, whose size must be exactly the record's. Raises
        FileNotFoundError, format.FormatError (with `.inode` set) or OSError. `filename` is
        record_filename(key), when the caller has it already; `opened`, what read_cached_into
        opened (closed here); without `note_use` (a check, not a use) the record's time of
        last use is left as it was."""
        try:
            segments = fmt.as_segments(out)
            key_bytes = opened.key_bytes if opened is not None else fmt.encode_key(key)
            filename = filename or record_filename(key)
            if opened is not None:
                fd = opened.take()
            else:
                dir_fd = self.layout.namespace_fd(namespace.dirname)
                fd = open_record(filename, check_regular=False, dir_fd=dir_fd)
        finally:
            if opened is not None:
                opened.close()
        try:
            raw_len = sum(len(segment) for segment in segments)
            if not (
                self._fits_one_read(segments, raw_len)
                and self._read_at_once(fd, namespace, key_bytes, segments, raw_len)
            ):
                self._read_checked(fd, filename, namespace, key_bytes, segments)
            if note_use and not self.read_only:
                self._note_use(fd, (namespace.dirname, filename))
        finally:
            os.close(fd)

    def read_cached_into(self, namespace: Namespace, key: str, out, filename: str):
        """read_into for a small record of a store without compression (plain or sealed)
        whose bytes are all in the page cache, on the caller's thread, never waiting for the
        disk (RWF_NOWAIT). True when served; else something false: None (not opened: too
        large, a compressed store) or the OpenedRecord to hand to read_into, which decides
        and names any broken rule. A batch of warm small pages is served without handing each
        page to a thread, and a page that is not is opened once."""
        if not self._nowait_works or self.codec.compression != "none":
            return None  # (a compressed record would be read here only to be read again)
        segments = fmt.as_segments(out)
        raw_len = sum(len(segment) for segment in segments)
        if not self._fits_one_read(segments, raw_len):
            return None
        key_bytes = fmt.encode_key(key)
        try:
            dir_fd = self.layout.namespace_fd(namespace.dirname)
            fd = open_record(filename, check_regular=False, dir_fd=dir_fd)
        except (FileNotFoundError, fmt.NotARegularFileError) as error:
            return OpenedRecord(None, error, key_bytes)  # (the full read's answer too)
        except OSError:
            return None  # (the full read tries again)
        try:
            if self._read_at_once(fd, namespace, key_bytes, segments, raw_len, RWF_NOWAIT):
                if not self.read_only:
                    self._note_use(fd, (namespace.dirname, filename))
                os.close(fd)  # (served: no OpenedRecord is built, the hot path's cost)
                return True
        except (OSError, fmt.FormatError) as error:
            if getattr(error, "errno", None) in (errno.EOPNOTSUPP, errno.EINVAL):
                self._nowait_works = False  # a kernel or filesystem without RWF_NOWAIT reads
        except BaseException:
            os.close(fd)
            raise
        if not self._handed_on.acquire(blocking=False):
            os.close(fd)  # (HANDED_ON_MAX held already: the full read opens it again)
            return None
        return OpenedRecord(fd, None, key_bytes, self._handed_on)

    def raw_len(self, namespace: Namespace, key: str) -> int:
        """The raw size a record declares, after its header checks (V0-V12)."""
        dir_fd = self.layout.namespace_fd(namespace.dirname)
        filename, key_bytes = record_filename(key), fmt.encode_key(key)
        header, _ = self.stored_header(dir_fd, filename, namespace, key_bytes)
        return header.raw_len

    def stored_header(self, dir_fd: int, filename: str, namespace: Namespace, key_bytes: bytes):
        """(header, its bytes) of the record `filename` in the directory `dir_fd`, after
        V0-V12: one open, one fstat, one pread. Raises FileNotFoundError, FormatError or
        OSError."""
        fd = open_record(filename, check_regular=False, dir_fd=dir_fd)
        try:
            return self._checked_header(fd, filename, namespace, key_bytes)[:2]
        finally:
            os.close(fd)

    def open_record(self, dirname: str, filename: str) -> int:
        """open_record of a record of a namespace, through its held directory descriptor."""
        return open_record(filename, dir_fd=self.layout.namespace_fd(dirname))

    def decode_value(self, namespace: Namespace, key: str, value, expected_raw_len: int):
        """The raw page of a whole record held in memory (a value from a shared tier), after
        the same rules as a record on disk (V1-V16); raises format.FormatError."""
        raw = self.codec.decode_record(value, fmt.encode_key(key), namespace, expected_raw_len)
        if self.codec.encrypted:
            self._key_proven.add(namespace.dirname)
        return memoryview(raw).cast("B")

    def _note_use(self, fd: int, location: tuple[str, str]) -> None:
        """Sets the record's modification time, its time of last use, unless this process
        set it less than RECENCY_INTERVAL_S ago: eviction after a restart and `purge
        --older-than` then see what was used (a read-only reader changes nothing)."""
        self._recent_reads.note(location[1])
        now_s = time.monotonic()
        last_s = self._used_s.get(location)
        if last_s is not None and now_s - last_s < RECENCY_INTERVAL_S:
            return
        with contextlib.suppress(OSError):  # e.g. a read-only mount
            os.utime(fd)
        if len(self._used_s) > TOUCHED_LOCATIONS_MAX:
            self._used_s.clear()
        self._used_s[location] = now_s

    # ------------------------------------------------------------- one read: the fast path

    @staticmethod
    def _fits_one_read(segments, raw_len: int) -> bool:
        # header, the buffers, a tag and a sentinel in one preadv
        return raw_len <= FAST_READ_MAX_BYTES and len(segments) <= IOV_MAX - 3

    def _read_at_once(self, fd, namespace, key_bytes, segments, raw_len: int, flags: int = 0):
        """The whole record in one preadv, checked: True only if it passes every rule and
        `segments` hold its page. On any doubt False, and the caller reads it again on the
        full path, which names the rule that failed. `flags` go to preadv (RWF_NOWAIT)."""
        codec = self.codec
        if codec.compression != "none":
            return self._read_decoded_at_once(fd, namespace, key_bytes, segments, raw_len)
        if codec.encrypted:
            return self._read_sealed_at_once(fd, namespace, key_bytes, segments, raw_len, flags)
        return self._read_plain_at_once(fd, namespace, key_bytes, segments, raw_len, flags)

    def _read_plain_at_once(self, fd, namespace, key_bytes, segments, raw_len: int, flags):
        """A plain record: its first bytes compared with the one header check_header accepts
        for the request (codec.plain_page_digest), then its digest."""
        head = bytearray(fmt.FIXED_HEADER_BYTES + len(key_bytes))
        if not payload.read_exactly(fd, [head, *segments], len(head) + raw_len, flags):
            return False
        digest = self.codec.plain_page_digest(head, namespace, key_bytes, raw_len)
        if digest is None:
            return False
        if not digest.active:
            return self.codec.allow_unverified
        for segment in segments:
            digest.update(segment)
        return digest.matches()

    def _read_sealed_at_once(self, fd, namespace, key_bytes, segments, raw_len: int, flags):
        """A sealed record (AES-256-GCM, not compressed): header, ciphertext (into the
        caller's buffers, or the scratch buffer) and tag, then decrypted."""
        head = bytearray(fmt.FIXED_HEADER_BYTES + len(key_bytes))
        tag = bytearray(fmt.TAG_BYTES)
        scratch = payload.uses_scratch(segments, raw_len)
        body = [self._scratch.buffer()[:raw_len]] if scratch else segments
        file_len = len(head) + raw_len + fmt.TAG_BYTES
        if not payload.read_exactly(fd, [head, *body, tag], file_len, flags):
            return False
        try:
            header = self.codec.check_header(head, file_len, key_bytes, namespace.digest)
            if header.compressed or header.raw_len != raw_len:
                return False
            cipher = self.codec.cipher(namespace.tenant)
            payload.open_sealed_into(cipher, header, head, tag, segments, self._scratch)
        except fmt.FormatError:
            return False
        self._key_proven.add(namespace.dirname)
        return True

    def _read_decoded_at_once(self, fd, namespace, key_bytes, segments, raw_len: int) -> bool:
        """A record of a store that compresses, read whole into the scratch buffer (it may
        be compressed or not, sealed or not: a frame is at most the page), decoded there and
        copied into the caller's buffers. Never with RWF_NOWAIT: a short read is the file's
        end."""
        codec = self.codec
        header_len = fmt.FIXED_HEADER_BYTES + len(key_bytes)
        capacity = header_len + raw_len + (fmt.TAG_BYTES if codec.encrypted else 0)
        buffer = self._scratch.buffer()
        try:
            file_len = os.preadv(fd, [buffer[: capacity + 1]], 0)
        except OSError as error:
            if error.errno in NOT_REGULAR_ERRNOS:
                raise fmt.NotARegularFileError("the record is not a regular file") from error
            raise
        if file_len > capacity:
            return False  # longer than any record of this page: the full path says why
        try:
            header = codec.check_header(buffer[:file_len], file_len, key_bytes, namespace.digest)
            if header.raw_len != raw_len:
                return False
            page = codec.decode_payload(
                header, buffer[:header_len], buffer[header_len:file_len], namespace.tenant
            )
        except fmt.FormatError:
            return False
        if header.encrypted:
            self._key_proven.add(namespace.dirname)
        payload.copy_into(memoryview(page).cast("B"), segments)
        return True

    # ------------------------------------------------------------- the full path: every rule

    def _checked_header(self, fd, filename: str, namespace, key_bytes: bytes):
        """(header, its bytes, the file's inode) of an open record, after V0-V12."""
        info = os.fstat(fd)  # the only one: V0 and the file's length
        if not stat.S_ISREG(info.st_mode):
            raise fmt.NotARegularFileError(f"{filename} is not a regular file")
        try:
            prefix = os.pread(fd, fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES, 0)
            header = self.codec.check_header(prefix, info.st_size, key_bytes, namespace.digest)
        except fmt.FormatError as error:
            error.inode = info.st_ino
            raise
        return header, prefix[: header.header_len], info.st_ino

    def _read_checked(self, fd, filename, namespace, key_bytes, segments) -> None:
        """Every rule, one by one, naming the one that fails (a large record, or any doubt
        on the fast path): the header, the page size, then the payload read in pieces."""
        header, header_bytes, inode = self._checked_header(fd, filename, namespace, key_bytes)
        try:
            self._read_payload(fd, header, header_bytes, namespace, segments)
        except fmt.FormatError as error:
            error.inode = inode
            raise

    def _read_payload(self, fd, header, header_bytes, namespace, segments) -> None:
        # Every length the record claims is bounded by the page before a payload byte is read
        # or decoded: raw_len here (V16, verifier.check_page_size), the stored length by V9
        # (at most raw_len, plus the tag), the file's by V8.
        cipher = self.codec.cipher(namespace.tenant) if header.encrypted else None
        verifier.check_page_size(
            header,
            sum(len(segment) for segment in segments),
            lambda: payload.check_payload(
                payload.file_reader(fd), header, header_bytes, cipher, decompress=False
            ),
        )
        if not header.compressed and not header.encrypted:
            payload.read_plain_into(fd, header, header_bytes, segments)
            return
        if header.encrypted and cipher is None:
            raise verifier.no_key()
        if not header.compressed:
            payload.read_sealed_into(fd, header, header_bytes, segments, cipher, self._scratch)
        else:
            stored = bytearray(header.payload_len)
            if os.preadv(fd, [stored], header.header_len) != header.payload_len:
                raise fmt.LengthMismatchError("record shrank while being read")
            page = self.codec.decode_payload(header, header_bytes, stored, namespace.tenant)
            payload.copy_into(memoryview(page).cast("B"), segments)
        if header.encrypted:
            self._key_proven.add(namespace.dirname)
