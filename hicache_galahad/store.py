"""RecordStore: verified, crash-safe, budgeted records on a local filesystem.

Layout under `root`:
    ledger                      shared byte count of records (u64 LE, guarded by flock)
    presence.lock               every open store holds it shared; exclusive means "alone"
    ns/<namespace>/namespace.json
    ns/<namespace>/<key>.rec    one record per key (docs/FORMAT.md)
    ns/<namespace>/.tmp-<pid>-<rand>-<key>.rec   a write in progress
    quarantine/                 damaged records, newest few kept for inspection

Every public method is safe to call from many threads and from several processes on one
root. Data errors never raise: a read that fails any check is a miss (counted, quarantined,
warned about at a limited rate); a write that cannot be completed returns False and leaves
no partial record behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import format as fmt
from .crypto import RecordCipher, derive_tenant_key, load_master_key
from .eviction import LruIndex
from .ledger import Ledger
from .metrics import Counters, RateLimitedLog
from .namespace import Namespace

log = logging.getLogger("hicache_galahad.store")

RECORD_SUFFIX = ".rec"
TEMP_PREFIX = ".tmp-"
NAMESPACE_FILE = "namespace.json"
QUARANTINE_KEEP_FILES = 32
READ_CHUNK_BYTES = 1 << 20
IOV_MAX = 1024
STAGE_BATCH = 32  # records written, then fsynced together (temp files open at once)
FAST_READ_MAX_BYTES = 1 << 20
STALE_TEMP_AGE_S = 60.0
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def record_filename(key: str) -> str:
    """SGLang's 64-hex page hashes name their file directly; other keys are hashed."""
    if _HEX64.match(key):
        return key + RECORD_SUFFIX
    import hashlib

    return "k" + hashlib.sha256(key.encode("utf-8")).hexdigest() + RECORD_SUFFIX


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_batches(segments):
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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Staged:
    """A record written to its temp file, its bytes reserved, not yet published."""

    key: str
    path: str
    temp_path: str
    location: tuple
    total_bytes: int
    fd: int | None = None
    error: OSError | None = None
    done: bool = False

    def sync(self) -> None:
        """Phase 2 of a put (run concurrently for a whole batch)."""
        try:
            os.fsync(self.fd)
        except OSError as error:
            self.error = error

    def abandon(self, store, keep: bool = False) -> None:
        """Closes and removes the temp file and ends the reservation (kept if published)."""
        if self.done:
            return
        self.done = True
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        store._unlink_quietly(self.temp_path)
        store._end_reservation(self.total_bytes, keep=keep)


@dataclass
class CheckReport:
    records: int = 0
    record_bytes: int = 0
    damaged: list = field(default_factory=list)
    unverifiable: list = field(default_factory=list)
    stray_temp_files: list = field(default_factory=list)
    quarantined_files: int = 0
    ledger_bytes: int = 0
    actual_bytes: int = 0
    fixed: bool = False

    @property
    def ledger_drift_bytes(self) -> int:
        return self.ledger_bytes - self.actual_bytes

    @property
    def clean(self) -> bool:
        return not self.damaged and not self.stray_temp_files and self.ledger_drift_bytes == 0

    def as_dict(self) -> dict:
        return {
            "records": self.records,
            "record_bytes": self.record_bytes,
            "damaged": self.damaged,
            "unverifiable": self.unverifiable,
            "stray_temp_files": self.stray_temp_files,
            "quarantined_files": self.quarantined_files,
            "ledger_bytes": self.ledger_bytes,
            "actual_bytes": self.actual_bytes,
            "ledger_drift_bytes": self.ledger_drift_bytes,
            "clean": self.clean,
            "fixed": self.fixed,
        }


class _ThreadCodecs(threading.local):
    compressor = None
    decompressor = None


class RecordStore:
    """Records of many namespaces under one root directory.

    max_bytes: cap on the bytes of all records under root (None: no cap).
    min_free_bytes: free space the filesystem must keep; puts evict or fail to honour it.
    compression: "none" or "zstd" (zstd_level 1..22); a page that does not shrink by at
        least 1/16 is stored uncompressed.
    encryption_key_file: path of a 32-byte master key; every record is then AES-256-GCM
        sealed with a per-tenant key, and plaintext records are refused on read.
    digest: "xxh3_128" (default) or "sha256" for unencrypted records; "none" only together
        with allow_unverified=True (benchmarks).
    durable: fsync files and directories before a put reports success.
    """

    def __init__(
        self,
        root: str,
        *,
        max_bytes: int | None = None,
        min_free_bytes: int = 0,
        compression: str = "none",
        zstd_level: int = 3,
        encryption_key_file: str | None = None,
        digest: str = "xxh3_128",
        allow_unverified: bool = False,
        durable: bool = True,
        io_threads: int = 8,
    ):
        if compression not in ("none", "zstd"):
            raise ValueError(f"compression must be 'none' or 'zstd', got {compression!r}")
        if not 1 <= int(zstd_level) <= 22:
            raise ValueError(f"zstd_level must be 1..22, got {zstd_level!r}")
        digest_ids = {name: alg for alg, name in fmt.DIGEST_NAMES.items()}
        if digest not in digest_ids:
            raise ValueError(f"digest must be one of {sorted(digest_ids)}, got {digest!r}")
        if digest == "none" and not allow_unverified and not encryption_key_file:
            raise ValueError("digest='none' needs allow_unverified=True (benchmarks only)")
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0 or None, got {max_bytes!r}")
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes
        self.min_free_bytes = int(min_free_bytes)
        self.compression = compression
        self.zstd_level = int(zstd_level)
        self.digest_alg = digest_ids[digest]
        self.allow_unverified = allow_unverified
        self.durable = durable
        self._master_key = load_master_key(encryption_key_file) if encryption_key_file else None
        self._ciphers: dict[str, RecordCipher] = {}
        self._codecs = _ThreadCodecs()
        self.counters = Counters()
        self._warn = RateLimitedLog(log)
        self._index = LruIndex()
        self._touched: set = set()
        self._header_templates: dict = {}
        self._ns_dirs: dict[str, str] = {}
        self._key_proven: set[str] = set()  # namespaces where this key opened a record
        self._digest_bytes = fmt.DIGEST_SIZES[self.digest_alg]
        self._digest_padding = bytes(32 - self._digest_bytes)
        self._namespaces: dict[str, Namespace] = {}
        self._ns_lock = threading.Lock()
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()
        self._io_threads = max(1, int(io_threads))
        self._pool = ThreadPoolExecutor(self._io_threads, thread_name_prefix="galahad-io")
        self._closed = False

        os.makedirs(os.path.join(self.root, "ns"), exist_ok=True)
        os.makedirs(os.path.join(self.root, "quarantine"), exist_ok=True)
        self._ledger = Ledger(os.path.join(self.root, "ledger"))
        self._presence_fd = os.open(
            os.path.join(self.root, "presence.lock"), os.O_RDWR | os.O_CREAT, 0o644
        )
        self._open_scan()

    # ----------------------------------------------------------------- open and scan

    def _open_scan(self) -> None:
        """Indexes every record for eviction, removes temp files of dead writers and, when
        no other process has the root open, resets the ledger to the bytes really on disk."""
        try:
            fcntl.flock(self._presence_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        entries, total_bytes = self._scan(remove_temps_of_dead=True, assume_alone=alone)
        entries.sort(key=lambda entry: entry[2])
        self._index.load((location, size) for location, size, _ in entries)
        if alone:
            self._ledger.set(total_bytes)
        fcntl.flock(self._presence_fd, fcntl.LOCK_SH)

    def _scan(self, *, remove_temps_of_dead: bool, assume_alone: bool):
        entries = []
        total_bytes = 0
        ns_root = os.path.join(self.root, "ns")
        for ns_entry in os.scandir(ns_root):
            if not ns_entry.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(ns_entry.path):
                name = entry.name
                if name.startswith(TEMP_PREFIX):
                    if remove_temps_of_dead and (assume_alone or self._temp_is_stale(entry)):
                        self._unlink_quietly(entry.path)
                        self.counters.add("stale_temp_removed")
                    continue
                if not name.endswith(RECORD_SUFFIX):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                entries.append(((ns_entry.name, name), info.st_size, info.st_mtime_ns))
                total_bytes += info.st_size
        for entry in os.scandir(os.path.join(self.root, "quarantine")):
            with contextlib.suppress(FileNotFoundError):
                total_bytes += entry.stat(follow_symlinks=False).st_size
        return entries, total_bytes

    @staticmethod
    def _temp_is_stale(entry) -> bool:
        """A temp file is stale when its writer process is gone (or it is a day old)."""
        try:
            pid = int(entry.name[len(TEMP_PREFIX) :].split("-", 1)[0])
        except ValueError:
            return True
        if pid == os.getpid():
            return False
        if not _pid_alive(pid):
            return True
        try:
            return time.time() - entry.stat().st_mtime > 24 * 3600
        except FileNotFoundError:
            return False

    # ----------------------------------------------------------------- namespaces

    def register_namespace(self, namespace: Namespace) -> Namespace:
        """Creates the namespace's directory (idempotent) and returns it."""
        with self._ns_lock:
            if namespace.dirname in self._namespaces:
                return self._namespaces[namespace.dirname]
            directory = self._ns_dir(namespace)
            os.makedirs(directory, exist_ok=True)
            description_path = os.path.join(directory, NAMESPACE_FILE)
            if not os.path.exists(description_path):
                temp_path = f"{description_path}.{os.getpid()}.{threading.get_ident()}.tmp"
                with open(temp_path, "w") as description:
                    json.dump(
                        namespace.describe() | {"digest": namespace.digest.hex()}, description
                    )
                    description.flush()
                    if self.durable:
                        os.fsync(description.fileno())
                os.replace(temp_path, description_path)
                if self.durable:
                    _fsync_dir(directory)
                    _fsync_dir(os.path.dirname(directory))
            self._namespaces[namespace.dirname] = namespace
            return namespace

    def _ns_dir(self, namespace: Namespace) -> str:
        directory = self._ns_dirs.get(namespace.dirname)
        if directory is None:
            directory = self._ns_dirs[namespace.dirname] = os.path.join(
                self.root, "ns", namespace.dirname
            )
        return directory

    def _cipher(self, tenant: str) -> RecordCipher | None:
        if self._master_key is None:
            return None
        cipher = self._ciphers.get(tenant)
        if cipher is None:
            cipher = RecordCipher(derive_tenant_key(self._master_key, tenant))
            self._ciphers[tenant] = cipher
        return cipher

    # ----------------------------------------------------------------- reads

    def get_into(self, namespace: Namespace, key: str, out) -> bool:
        """Fills `out` with the record's verified bytes. `out` is a writable buffer of exactly
        the record's raw size, or a list of buffers filled in order (a scattered page).
        False on a miss of any kind; `out` is then undefined."""
        self.counters.add("gets")
        if self._closed:
            return False
        ok = self._get_into_guarded(namespace, key, out)
        if ok:
            self._index.touch((namespace.dirname, record_filename(key)))
        return ok

    def get(self, namespace: Namespace, key: str, expected_size: int) -> bytes | None:
        buffer = bytearray(expected_size)
        return bytes(buffer) if self.get_into(namespace, key, buffer) else None

    def get_many_into(self, namespace: Namespace, keys: list, outs: list) -> list[bool]:
        """get_into for many records, spread over the I/O threads."""
        if len(keys) != len(outs) or self._closed:
            return [False] * len(keys)
        self.counters.add("gets", len(keys))
        results = self._parallel(
            lambda index: self._get_into_guarded(namespace, keys[index], outs[index]), len(keys)
        )
        self._index.touch_many_head_last(
            [
                (namespace.dirname, record_filename(k))
                for k, ok in zip(keys, results, strict=True)
                if ok
            ]
        )
        return results

    def _get_into_guarded(self, namespace: Namespace, key: str, out) -> bool:
        try:
            self._read_record(namespace, key, out)
        except FileNotFoundError:
            self.counters.add("misses")
            return False
        except fmt.FormatError as error:
            self._on_bad_record(namespace, key, error)
            return False
        except OSError as error:
            self.counters.add("io_errors")
            self.counters.add("misses")
            self._warn.warning("read-io", "galahad: I/O error reading %s: %s", key, error)
            return False
        except Exception as error:  # never raise into the caller
            self.counters.add("misses")
            self._warn.warning("read-bug", "galahad: unexpected read failure: %r", error)
            return False
        self.counters.add("hits")
        return True

    def _on_bad_record(self, namespace: Namespace, key: str, error: fmt.FormatError) -> None:
        foreign = isinstance(error, fmt.NamespaceMismatchError | fmt.KeyMismatchError)
        self.counters.add("foreign" if foreign else "corrupt")
        self.counters.add("misses")
        keep = self._mismatch_of_reader(namespace, error)
        self._warn.warning(
            f"bad-{error.rule}",
            "galahad: record %s failed %s (%s): treated as a miss%s",
            key,
            error.rule,
            error,
            " (kept: the reader's configuration may be what differs)"
            if keep
            else " and quarantined",
        )
        if not keep:
            self.quarantine(namespace, key, getattr(error, "inode", None))

    def _mismatch_of_reader(self, namespace: Namespace, error: fmt.FormatError) -> bool:
        """Failures a wrong configuration of this reader would cause on sound records: a
        plaintext record in an encrypted store, a page size the reader got wrong, and a tag
        that fails before any record of the namespace opened with this key (a wrong key).
        Such records are left in place; only proven damage is quarantined."""
        if isinstance(error, fmt.ProtectionPolicyError | fmt.RawSizeError):
            return True
        if isinstance(error, fmt.AuthenticationError):
            return namespace.dirname not in self._key_proven
        return False

    def _read_record(self, namespace: Namespace, key: str, out) -> None:
        segments = fmt.as_segments(out)
        key_bytes = fmt.encode_key(key)
        raw_len = sum(len(segment) for segment in segments)
        filename = record_filename(key)
        fd = os.open(os.path.join(self._ns_dir(namespace), filename), os.O_RDONLY)
        try:
            if not (
                raw_len <= FAST_READ_MAX_BYTES
                and len(segments) < IOV_MAX - 2
                and self._read_fast(fd, namespace, key_bytes, segments, raw_len)
            ):
                info = os.fstat(fd)
                try:
                    self._read_verified(fd, info.st_size, namespace, key_bytes, segments)
                except fmt.FormatError as error:
                    error.inode = info.st_ino
                    raise
            location = (namespace.dirname, filename)
            if location not in self._touched:
                with contextlib.suppress(OSError):  # e.g. a read-only mount
                    os.utime(fd)  # persists recency (once per process) for eviction after restart
                if len(self._touched) > 1_000_000:
                    self._touched.clear()
                self._touched.add(location)
        finally:
            os.close(fd)
        self.counters.add("get_bytes", raw_len)

    def _read_fast(self, fd, namespace, key_bytes, segments, raw_len: int) -> bool:
        """One preadv for header, key echo and payload, straight into the caller's buffers.

        A sound plain record's header is fully determined by what the reader expects (all but
        its digest), so the header check is one comparison with that expected header: equal
        bytes mean every structural and identity rule holds. True only if the record passes
        every rule; on any doubt the caller re-reads it on the full path, which names the rule
        that failed."""
        if self._master_key is not None:
            return False
        head = bytearray(fmt.FIXED_HEADER_BYTES + len(key_bytes))
        sentinel = bytearray(1)  # stays empty only if the file ends where it should
        if os.preadv(fd, [head, *segments, sentinel], 0) != len(head) + raw_len:
            return False
        template = self._expected_header(namespace, len(key_bytes), raw_len)
        if (
            head[: fmt.DIGEST_OFFSET] != template
            or head[fmt.FIXED_HEADER_BYTES :] != key_bytes
            or head[fmt.DIGEST_OFFSET + self._digest_bytes : fmt.FIXED_HEADER_BYTES]
            != self._digest_padding
        ):
            return False
        hasher = fmt.new_digest(self.digest_alg)
        if hasher is None:
            return self.allow_unverified
        fmt.hash_header(hasher, head)
        for segment in segments:
            hasher.update(segment)
        return hasher.digest() == head[fmt.DIGEST_OFFSET : fmt.DIGEST_OFFSET + self._digest_bytes]

    def _expected_header(self, namespace: Namespace, key_len: int, raw_len: int) -> bytes:
        """Bytes [0, 80) of a plain record of this store's digest algorithm."""
        cache_key = (namespace.digest, key_len, raw_len)
        template = self._header_templates.get(cache_key)
        if template is None:
            template = bytes(
                fmt.pack_header(
                    flags=0,
                    payload_len=raw_len,
                    raw_len=raw_len,
                    namespace=namespace.digest,
                    key=b"k" * key_len,
                    digest_alg=self.digest_alg,
                )[: fmt.DIGEST_OFFSET]
            )
            if len(self._header_templates) > 4096:
                self._header_templates.clear()
            self._header_templates[cache_key] = template
        return template

    def _read_header(self, fd, file_len: int, namespace: Namespace, key_bytes: bytes):
        """(header, its bytes) of the record open at fd, after V1-V12."""
        prefix = os.pread(fd, fmt.FIXED_HEADER_BYTES + fmt.MAX_KEY_BYTES, 0)
        header = fmt.parse_header(prefix, file_len)
        fmt.check_identity(
            header,
            key=key_bytes,
            namespace=namespace.digest,
            require_encryption=self._master_key is not None,
            allow_unverified=self.allow_unverified,
        )
        return header, prefix[: header.header_len]

    def _read_verified(self, fd, file_len, namespace, key_bytes, segments) -> None:
        header, header_bytes = self._read_header(fd, file_len, namespace, key_bytes)
        expected_len = sum(len(segment) for segment in segments)
        if header.raw_len != expected_len:
            # Damage first (V13-V15), so that only a sound record of another size is V16.
            self._read_decoded(fd, header, header_bytes, namespace)
            raise fmt.RawSizeError(
                f"record holds {header.raw_len} bytes, reader expects {expected_len}"
            )
        if not header.compressed and not header.encrypted:
            self._read_plain_into(fd, header, header_bytes, segments)
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
        body = fmt.decode_payload(
            header,
            header_bytes,
            payload,
            cipher=self._cipher(namespace.tenant),
            decompress=self._decompress,
        )
        if header.encrypted:
            self._key_proven.add(namespace.dirname)
        return body

    def _read_plain_into(self, fd, header, header_bytes, segments) -> None:
        """Reads straight into the caller's buffers, hashing each piece while it is in cache."""
        hasher = fmt.new_digest(header.digest_alg)
        if hasher is not None:
            fmt.hash_header(hasher, header_bytes)
        position = header.header_len
        for batch in _read_batches(segments):
            expected = sum(len(piece) for piece in batch)
            if os.preadv(fd, batch, position) != expected:
                raise fmt.LengthMismatchError("record shrank while being read")
            position += expected
            if hasher is not None:
                for piece in batch:
                    hasher.update(piece)
        if hasher is not None and hasher.digest() != header.digest:
            raise fmt.DigestMismatchError("digest mismatch")

    def _decompress(self, payload, raw_len: int) -> bytes:
        import zstandard

        if self._codecs.decompressor is None:
            self._codecs.decompressor = zstandard.ZstdDecompressor()
        try:
            return self._codecs.decompressor.decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError as error:
            raise fmt.DecompressionError(str(error)) from error

    def contains(self, namespace: Namespace, key: str) -> bool:
        """Whether a record file exists (cheap; the read still verifies everything)."""
        try:
            return os.path.exists(os.path.join(self._ns_dir(namespace), record_filename(key)))
        except Exception:
            return False

    def leading_run(self, namespace: Namespace, keys: list) -> int:
        """How many keys from the start have a record."""
        for index, key in enumerate(keys):
            if not self.contains(namespace, key):
                return index
        return len(keys)

    def verify(self, namespace: Namespace, key: str, expected_size: int) -> bool:
        """Reads and verifies a record completely, without keeping its bytes."""
        return self._get_into_guarded(namespace, key, bytearray(expected_size))

    def get_bytes(self, namespace: Namespace, key: str, max_bytes: int) -> bytes | None:
        """A verified record of any raw size up to `max_bytes` (text, manifests); None on a
        miss of any kind, including a record larger than `max_bytes`."""
        try:
            fd = os.open(os.path.join(self._ns_dir(namespace), record_filename(key)), os.O_RDONLY)
        except OSError:
            self.counters.add("gets")
            self.counters.add("misses")
            return None
        try:
            header, _ = self._read_header(fd, os.fstat(fd).st_size, namespace, fmt.encode_key(key))
        except (OSError, fmt.FormatError):
            header = None
        finally:
            os.close(fd)
        if header is None or header.raw_len > max_bytes:
            self.counters.add("gets")
            self.counters.add("misses")
            return None
        return self.get(namespace, key, header.raw_len)

    # ----------------------------------------------------------------- writes

    def put(self, namespace: Namespace, key: str, data) -> bool:
        """Publishes `data` (a buffer, or a list of buffers taken in order) under `key`
        atomically and durably. True if the record is (or already was) stored; False if it
        could not be, with nothing partial left behind."""
        return self.put_many(namespace, [key], [data])[0]

    def put_many(self, namespace: Namespace, keys: list, datas: list) -> list[bool]:
        """put for many records. Each batch is written in three phases: every temp file is
        written, then all are fsynced concurrently (the filesystem commits them together,
        about 3x faster here than write-fsync-write-fsync), then each is published with
        link(2), and the directory is fsynced once."""
        if len(keys) != len(datas) or self._closed:
            return [False] * len(keys)
        results: list[bool] = []
        for start in range(0, len(keys), STAGE_BATCH):
            batch_keys, batch_datas = (
                keys[start : start + STAGE_BATCH],
                datas[start : start + STAGE_BATCH],
            )
            staged = self._parallel(
                lambda index, ks=batch_keys, ds=batch_datas: self._guarded(
                    self._stage, namespace, ks[index], ds[index]
                ),
                len(batch_keys),
            )
            pending = [item for item in staged if isinstance(item, _Staged)]
            if self.durable:
                self._parallel(lambda index, items=pending: items[index].sync(), len(pending))
            results += [
                self._guarded(self._publish, item) if isinstance(item, _Staged) else item
                for item in staged
            ]
        if self.durable and any(results) and not self._sync_dir(namespace):
            results = [False] * len(keys)
        self.counters.add("puts_failed", results.count(False))
        self._index.touch_many_head_last(
            [
                (namespace.dirname, record_filename(k))
                for k, ok in zip(keys, results, strict=True)
                if ok
            ]
        )
        return results

    def _sync_dir(self, namespace: Namespace) -> bool:
        try:
            _fsync_dir(self._ns_dir(namespace))
            return True
        except OSError as error:
            self.counters.add("io_errors")
            self._warn.warning("dir-fsync", "galahad: directory fsync failed: %s", error)
            return False

    def _guarded(self, step, *args):
        """Runs one write step; any unexpected exception is a failed write, never raised."""
        try:
            return step(*args)
        except Exception as error:
            if isinstance(args[0], _Staged):
                args[0].abandon(self)
            self._warn.warning("write-bug", "galahad: unexpected write failure: %r", error)
            return False

    def _existing_is_sound(self, namespace: Namespace, key_bytes: bytes, path: str) -> bool | None:
        """None if no record exists; True if it passes the header checks; False otherwise."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            self._read_header(fd, os.fstat(fd).st_size, namespace, key_bytes)
            return True
        except fmt.FormatError:
            return False
        finally:
            os.close(fd)

    def _stage(self, namespace: Namespace, key: str, data):
        """Phase 1 of a put: True if a sound record already exists, False on failure, else the
        reserved, written (not yet fsynced) temp file as a _Staged."""
        key_bytes = fmt.encode_key(key)
        directory = self._ns_dir(namespace)
        filename = record_filename(key)
        path = os.path.join(directory, filename)
        sound = self._existing_is_sound(namespace, key_bytes, path)
        if sound:
            self.counters.add("puts_existing")
            self._index.touch((namespace.dirname, filename))
            return True
        if sound is False:
            self.quarantine(namespace, key)

        header, payload_chunks = self._encode(namespace, key_bytes, data)
        total_bytes = len(header) + sum(len(chunk) for chunk in payload_chunks)
        if not self._reserve(total_bytes):
            self.counters.add("no_space")
            return False
        staged = _Staged(
            key=key,
            path=path,
            temp_path=os.path.join(
                directory, f"{TEMP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}-{filename}"
            ),
            location=(namespace.dirname, filename),
            total_bytes=total_bytes,
        )
        try:
            staged.fd = os.open(staged.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self._write_all(staged.fd, [header, *payload_chunks])
        except OSError as error:
            self._write_failed(key, error)
            staged.abandon(self)
            return False
        return staged

    def _publish(self, staged: _Staged) -> bool:
        """Phase 3 of a put: link the fsynced temp file into place (never replacing a record)."""
        published = False
        try:
            if staged.error is not None:
                raise staged.error
            os.close(staged.fd)
            staged.fd = None
            try:
                os.link(staged.temp_path, staged.path)
                published = True
            except FileExistsError:
                self.counters.add("puts_existing")
        except OSError as error:
            self._write_failed(staged.key, error)
            return False
        finally:
            staged.abandon(self, keep=published)
        if published:  # else another writer published the same record first
            self._index.add(staged.location, staged.total_bytes)
            self.counters.add("puts")
            self.counters.add("put_bytes", staged.total_bytes)
        return True

    def _write_failed(self, key: str, error: OSError) -> None:
        self.counters.add("no_space" if error.errno == errno.ENOSPC else "io_errors")
        self._warn.warning("write-io", "galahad: write of %s failed: %s", key, error)

    @staticmethod
    def _write_all(fd, buffers) -> None:
        views = [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)]
        while views:
            written = os.writev(fd, views[:IOV_MAX])
            while views and written >= len(views[0]):
                written -= len(views[0])
                views.pop(0)
            if views and written:
                views[0] = views[0][written:]

    def _encode(self, namespace: Namespace, key_bytes: bytes, raw):
        return fmt.encode_record(
            raw,
            key=key_bytes,
            namespace=namespace.digest,
            digest_alg=self.digest_alg,
            compress=self._compress if self.compression == "zstd" else None,
            cipher=self._cipher(namespace.tenant),
        )

    def _compress(self, raw) -> bytes:
        import zstandard

        if self._codecs.compressor is None:
            self._codecs.compressor = zstandard.ZstdCompressor(level=self.zstd_level)
        return self._codecs.compressor.compress(raw)

    # ----------------------------------------------------------------- budget

    def _free_bytes(self) -> int:
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def _reserve(self, amount: int) -> bool:
        """Claims `amount` bytes of budget, evicting least-recently-used records as needed."""
        if self.max_bytes is not None and amount > self.max_bytes:
            return False  # can never fit: evicting every record first would only lose them
        while not self._ledger.reserve(amount, self.max_bytes):
            if not self._evict_one():
                return False
        with self._pending_lock:
            self._pending_bytes += amount
        try:
            while self.min_free_bytes and (
                self._free_bytes() - self._pending_bytes < self.min_free_bytes
            ):
                if not self._evict_one():
                    self._end_reservation(amount, keep=False)
                    return False
        except OSError:
            self._end_reservation(amount, keep=False)
            return False
        return True

    def _end_reservation(self, amount: int, *, keep: bool) -> None:
        with self._pending_lock:
            self._pending_bytes -= amount
        if not keep:
            self._ledger.release(amount)

    def _evict_one(self) -> bool:
        """Deletes the least recently used record (quarantined files first)."""
        if self._trim_quarantine(keep_files=0, max_files=1):
            return True
        victim = self._index.pop_oldest()
        if victim is None:
            # Records other processes wrote since we opened are not indexed yet.
            entries, _ = self._scan(remove_temps_of_dead=False, assume_alone=False)
            if not entries:
                return False
            entries.sort(key=lambda entry: entry[2])
            self._index.load((location, size) for location, size, _ in entries)
            victim = self._index.pop_oldest()
            if victim is None:
                return False
        (dirname, filename), _ = victim
        path = os.path.join(self.root, "ns", dirname, filename)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            return True  # someone else removed it (and released its bytes)
        self._ledger.release(size)
        self.counters.add("evictions")
        self.counters.add("evicted_bytes", size)
        return True

    # ----------------------------------------------------------------- quarantine

    def quarantine(self, namespace: Namespace, key: str, inode: int | None = None) -> None:
        """Moves a damaged record aside (its bytes stay counted until trimmed). With `inode`,
        only if the record is still the file that was found damaged."""
        path = os.path.join(self._ns_dir(namespace), record_filename(key))
        try:
            if inode is not None and os.stat(path).st_ino != inode:
                return  # replaced by a fresh record since we read it
        except OSError:
            return
        if self._quarantine_path(path, namespace.dirname):
            self._trim_quarantine(keep_files=QUARANTINE_KEEP_FILES)

    def _trim_quarantine(self, keep_files: int, max_files: int | None = None) -> int:
        directory = os.path.join(self.root, "quarantine")
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return 0
        victims = names[: max(0, len(names) - keep_files)]
        if max_files is not None:
            victims = victims[:max_files]
        removed = 0
        for name in victims:
            path = os.path.join(directory, name)
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except OSError:
                continue
            self._ledger.release(size)
            removed += 1
        return removed

    # ----------------------------------------------------------------- maintenance

    def delete(self, namespace: Namespace, key: str) -> bool:
        filename = record_filename(key)
        path = os.path.join(self._ns_dir(namespace), filename)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except OSError:
            return False
        self._index.discard((namespace.dirname, filename))
        self._ledger.release(size)
        return True

    def clear_namespace(self, namespace: Namespace) -> int:
        """Deletes every record of one namespace; returns how many."""
        directory = self._ns_dir(namespace)
        removed = 0
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if not entry.name.endswith(RECORD_SUFFIX):
                continue
            try:
                size = entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
            except OSError:
                continue
            self._index.discard((namespace.dirname, entry.name))
            self._ledger.release(size)
            removed += 1
        return removed

    def usage_bytes(self) -> int:
        return self._ledger.read()

    def stats(self) -> dict:
        return self.counters.snapshot() | {
            "ledger_bytes": self._ledger.read(),
            "indexed_records": len(self._index),
        }

    def check(self, fix: bool = False) -> CheckReport:
        """Verifies every record of every namespace under root. With fix: quarantines damaged
        records, removes temp files of dead writers and corrects the ledger."""
        report = CheckReport()
        ns_root = os.path.join(self.root, "ns")
        for ns_entry in sorted(os.scandir(ns_root), key=lambda e: e.name):
            if not ns_entry.is_dir(follow_symlinks=False):
                continue
            namespace = self._load_namespace(ns_entry.path)
            tag_failures = []  # judged once we know whether this key opens any record here
            key_opened_one = False
            for entry in sorted(os.scandir(ns_entry.path), key=lambda e: e.name):
                if entry.name.startswith(TEMP_PREFIX):
                    if self._temp_is_stale(entry):
                        report.stray_temp_files.append(entry.path)
                        if fix:
                            self._unlink_quietly(entry.path)
                    continue
                if not entry.name.endswith(RECORD_SUFFIX):
                    continue
                problem = self._check_file(entry.path, ns_entry.name, namespace)
                if problem is None or problem.startswith(("unverifiable", "V14")):
                    report.records += 1
                    report.record_bytes += entry.stat().st_size
                if problem is None:
                    key_opened_one = key_opened_one or self._master_key is not None
                elif problem.startswith("unverifiable"):
                    report.unverifiable.append(entry.path)
                elif problem.startswith("V14"):
                    tag_failures.append((entry.path, problem))
                else:
                    report.damaged.append((entry.path, problem))
                    if fix:
                        self._quarantine_path(entry.path, ns_entry.name)
            for path, problem in tag_failures:
                if not key_opened_one:  # most likely a wrong key: never destroy on that
                    report.unverifiable.append(path)
                    continue
                report.records -= 1
                report.record_bytes -= os.path.getsize(path)
                report.damaged.append((path, problem))
                if fix:
                    self._quarantine_path(path, ns_entry.name)
        if fix:
            self._trim_quarantine(keep_files=QUARANTINE_KEEP_FILES)
        _, actual_bytes = self._scan(remove_temps_of_dead=False, assume_alone=False)
        report.quarantined_files = len(os.listdir(os.path.join(self.root, "quarantine")))
        report.ledger_bytes = self._ledger.read()
        report.actual_bytes = actual_bytes
        if fix:
            report.ledger_bytes = self._correct_ledger(actual_bytes)
            report.fixed = True
        return report

    def _correct_ledger(self, actual_bytes: int) -> int:
        """Sets the ledger to the bytes on disk when no other process has the root open.
        Otherwise it only raises it: writes in flight elsewhere hold reservations that the
        files on disk do not show yet, and lowering the ledger under them would let the store
        grow past max_bytes. (An over-count is safe; it is corrected at the next lone open.)"""
        fcntl.flock(self._presence_fd, fcntl.LOCK_UN)
        try:
            fcntl.flock(self._presence_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        try:
            with self._pending_lock:
                pending = self._pending_bytes
            if alone:
                self._ledger.set(actual_bytes + pending)
            elif self._ledger.read() < actual_bytes:
                self._ledger.set(actual_bytes)
            return self._ledger.read()
        finally:
            fcntl.flock(self._presence_fd, fcntl.LOCK_SH)

    @staticmethod
    def _load_namespace(directory: str) -> Namespace | None:
        try:
            with open(os.path.join(directory, NAMESPACE_FILE)) as description:
                data = json.load(description)
            namespace = Namespace(
                data["tenant"], data["model_fingerprint"], data["pool"], data.get("geometry", {})
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return namespace if namespace.dirname == os.path.basename(directory) else None

    def _check_file(self, path: str, dirname: str, namespace: Namespace | None) -> str | None:
        """None if sound, "unverifiable" if sealed with a key we lack, else the problem."""
        try:
            with open(path, "rb") as record:
                data = record.read()
            header = fmt.parse_header(data, len(data))
            if header.namespace.hex()[:32] != dirname:
                raise fmt.NamespaceMismatchError("record is in another namespace's directory")
            if namespace is not None and header.namespace != namespace.digest:
                raise fmt.NamespaceMismatchError("record namespace differs from namespace.json")
            key = header.key.decode("utf-8", errors="replace")
            if record_filename(key) != os.path.basename(path):
                raise fmt.KeyMismatchError("file name does not match the record's key")
            if header.encrypted and (namespace is None or self._master_key is None):
                return "unverifiable: sealed, and no key for it"
            if not header.encrypted and header.digest_alg == fmt.DIGEST_NONE:
                return "unverifiable: neither digest nor tag"
            if not header.encrypted and self._master_key is not None:
                return "unverifiable: plaintext, refused by this encrypted store (V12)"
            fmt.decode_payload(
                header,
                data[: header.header_len],
                memoryview(data)[header.header_len :],
                cipher=self._cipher(namespace.tenant) if header.encrypted else None,
                decompress=self._decompress,
            )
        except fmt.FormatError as error:
            return f"{error.rule}: {error}"
        except OSError as error:
            return f"unreadable: {error}"
        return None

    def _quarantine_path(self, path: str, dirname: str) -> bool:
        filename = os.path.basename(path)
        target = os.path.join(self.root, "quarantine", f"{time.time_ns()}-{dirname}-{filename}")
        try:
            os.rename(path, target)
        except OSError:
            return False
        self._index.discard((dirname, filename))
        self.counters.add("quarantined")
        return True

    # ----------------------------------------------------------------- plumbing

    def _parallel(self, work, count: int) -> list:
        """Runs work(i) for i in range(count) over the I/O threads in contiguous slices."""
        if count == 0:
            return []
        slices = min(self._io_threads, count)
        if slices == 1:
            return [work(index) for index in range(count)]
        bounds = [count * part // slices for part in range(slices + 1)]

        def run_slice(part):
            return [work(index) for index in range(bounds[part], bounds[part + 1])]

        results = []
        for slice_results in self._pool.map(run_slice, range(slices)):
            results.extend(slice_results)
        return results

    @staticmethod
    def _unlink_quietly(path: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self._ledger.close()
        os.close(self._presence_fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
