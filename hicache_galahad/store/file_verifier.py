"""Records found on disk by a scan checked against every rule (`galahad verify`,
`StoreAdmin.check`, `verify_file`), with the rules and verdicts of the read paths.

`FileVerifier.verify` reads a small record file whole in one pread and checks it from that
buffer (a plain page of a 64-hex key by one comparison and its digest, anything else rule by
rule); a larger one is streamed READ_CHUNK_BYTES at a time, never held whole. Each raises a
format.FormatError naming the broken rule. The key is the record's own echo, which must match
the file name (V10); the namespace, the directory's.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from ..record import format as fmt
from ..record import verifier
from ..record.codec import RecordCodec
from ..record.namespace import Namespace
from . import payload
from .context import StoreContext
from .layout import RECORD_SUFFIX, FileEntry, record_filename
from .payload import READ_CHUNK_BYTES, RWF_NOWAIT, open_record

# A record file of at most this many bytes is read whole, in one pread, and checked from that
# buffer; a larger one is streamed READ_CHUNK_BYTES at a time (never held whole).
VERIFY_WHOLE_MAX_BYTES = READ_CHUNK_BYTES
# verify(nowait=True) (`check` with threads: on the calling thread, from the page cache) takes
# a record of at most this: a larger one's digest, decryption or decompression is worth a
# thread of its own, where it runs beside the others.
VERIFY_CACHED_MAX_BYTES = 1 << 16
# The file name of a record of a 64-hex key (record_filename: the key, then the suffix).
_HEX_RECORD_NAME = re.compile("[0-9a-f]{64}" + re.escape(RECORD_SUFFIX))


def expected_page_bytes(namespace: Namespace | None) -> int | None:
    """The raw size of every record of a namespace whose geometry names it (a pool's
    `page_bytes`); None for namespaces of records of many sizes (Blaise's)."""
    if namespace is None:
        return None
    page_bytes = namespace.geometry.get("page_bytes")
    if isinstance(page_bytes, int) and not isinstance(page_bytes, bool) and page_bytes >= 0:
        return page_bytes
    return None


class FileVerifier:
    """Checks record files of one store root found by a scan; `key_proven` is the reader's
    set of namespaces where this store's key opened a record (a tag that verifies adds one)."""

    verify_whole_max_bytes = VERIFY_WHOLE_MAX_BYTES  # (a test sets it on an instance)

    def __init__(self, context: StoreContext, codec: RecordCodec, key_proven: set[str]):
        self.layout = context.layout
        self.codec = codec
        self._key_proven = key_proven
        self._nowait_works = bool(RWF_NOWAIT)

    def verify(self, entry: FileEntry, namespace: Namespace | None, nowait: bool = False) -> bool:
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
        check_header accepts (codec.plain_page_digest, as on the read paths), its
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
        view = memoryview(data)
        key_bytes = name[:64].encode("ascii")
        digest = codec.plain_page_digest(view[:header_len], namespace, key_bytes, raw_len)
        if digest is None:
            return False
        digest.update(view[header_len:])
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
        self._verify_found(header, header_bytes, payload.buffer_reader(view), entry, namespace)

    def _verify_streamed(self, fd, file_len: int, entry: FileEntry, namespace) -> None:
        """verify_file on a record file read piece by piece (one larger than a read)."""
        prefix = os.pread(fd, fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES, 0)
        header = fmt.parse_header(prefix, file_len)
        self._check_found(header, entry, namespace)
        header_bytes = prefix[: header.header_len]
        self._verify_found(header, header_bytes, payload.file_reader(fd), entry, namespace)

    def _verify_found(self, header, header_bytes, read_at, entry: FileEntry, namespace) -> None:
        """V16 then V13-V15 of a record found by a scan, whichever way its bytes are read."""
        cipher = None
        if header.encrypted and namespace is not None:
            cipher = self.codec.cipher(namespace.tenant)
        verifier.check_page_size(
            header,
            expected_page_bytes(namespace),
            lambda: payload.check_payload(read_at, header, header_bytes, cipher, decompress=False),
        )
        payload.check_payload(read_at, header, header_bytes, cipher)
        if header.encrypted:
            self._key_proven.add(entry.dirname)
