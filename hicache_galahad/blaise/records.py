"""Blaise's records in our record store: sections, document manifests and a catalog log.

The store never replaces a record (a put of an existing key is a no-op), so every record here
is immutable and named by its content:

    b/<doc>/<sha256 of the block bytes>       a block: consecutive sections of one document,
                                              up to BLOCK_BYTES (one section alone if larger)
    m/<doc>/<sha256 of the manifest>          a document's manifest (JSON: size, digest,
                                              blocks, sections with offsets, SHA-256, headings)
    log/<n>                                   catalog entry n: {"op": "add" | "remove", ...}
    s/<doc>/<sha256 of the section bytes>     one section's bytes (manifests of schema 1,
                                              written before blocks; still read)

(<doc> is the first 32 hex digits of SHA-256 of the document id.) A document is one batch of
records (its blocks and its manifest: a few files, not one per section), then one log entry.
The catalog is the log replayed in order; an entry is published after the records it names,
so a crash of the process leaves at worst unreferenced records. Durability is the store's
"deferred" mode by default: records are fsynced by its flusher within its window (1 s), so a
power loss may lose the last adds, in any combination of records; every read is verified
(the store's digest or tag, then the section's SHA-256 from the manifest), so a catalog entry
that survived without its blocks is a miss (the sections are skipped), never a wrong byte.
Before replaced or removed records are deleted, everything published is flushed, so a power
loss never keeps the deletion without the entry that made it safe. Records live under `<root>/blaise`, a RecordStore of
their own with no byte cap, so the KV budget (which evicts under `<root>/ns`) never touches
text. Every read is verified by the store (digest, or AES-GCM tag with the tenant's key); a
record that fails is a miss, and the caller skips it.

With `encryption_key_file`, the namespace also names the key (`key_id`: 64 bits of an HMAC
under the tenant's key, which says nothing about the key), so each key has records, catalog
and log numbers of its own. Two writers of one tenant with different key files never read
each other's records: in one shared namespace the store, having opened a record with this
reader's key, takes a tag that fails as damage and quarantines the record (reader.py,
`reader_may_be_wrong`), so one writer's replay destroyed the other's catalog entries.

Every log entry is padded to LOG_ENTRY_BYTES: the store replaces an existing record whose
size differs from a put's (a damaged or foreign page, for KV), so two writers racing for one
log number with entries of different sizes could replace an entry its writer had already read
back; with one size the second put keeps the first entry and its writer moves on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass

from ..record.crypto import derive_tenant_key, load_master_key
from ..record.namespace import Namespace
from ..store import RecordStore

log = logging.getLogger(__name__)

MODEL_FINGERPRINT = "blaise-text"
POOL = "text"
SCHEMA = 1
MAX_SECTION_BYTES = 16 << 20
BLOCK_BYTES = 64 << 10  # sections are packed into records of up to this many bytes
MANIFEST_SCHEMA = 2  # 1: a record per section (still read); 2: blocks
INLINE_SCHEMA = 3  # 2, with the one block of a small document after the manifest's JSON
INLINE = ""  # the block key of a section whose bytes follow its manifest in one record
MAX_MANIFEST_BYTES = 64 << 20
MAX_LOG_BYTES = 1 << 20
LOG_ENTRY_BYTES = 4096  # every catalog entry is padded to this size (see the module notes)
MAX_DOC_ID_BYTES = 1024  # UTF-8 bytes; so that the longest entry fits LOG_ENTRY_BYTES
LOG_GAP_PROBE = 64  # missing log entries tolerated in a row (quarantined damage) on replay


@dataclass(frozen=True, slots=True)
class SectionRef:
    start: int  # byte offsets into the document
    end: int
    key: str  # the record holding the section's bytes (a block, or the manifest's own
    # record for an inline document; schema 1: its own)
    headings: tuple[str, ...]
    digest: str  # SHA-256 (hex) of the section's bytes
    base: int  # the document offset at which that record's bytes start


@dataclass(frozen=True, slots=True)
class Manifest:
    doc_id: str
    size: int
    sha256: str
    sections: tuple[SectionRef, ...]

    def encode(self) -> bytes:
        blocks: dict[tuple[int, str], int] = {}  # two blocks of equal bytes share a key
        bounds: list[list] = []
        sections = []
        for s in self.sections:
            number = blocks.get((s.base, s.key))
            if number is None:
                number = blocks[(s.base, s.key)] = len(bounds)
                bounds.append([s.base, s.end, s.key])
            bounds[number][1] = max(bounds[number][1], s.end)
            sections.append([s.start, s.end, s.digest, list(s.headings), number])
        body = {
            "schema": INLINE_SCHEMA if any(b[2] == INLINE for b in bounds) else MANIFEST_SCHEMA,
            "doc_id": self.doc_id,
            "size": self.size,
            "sha256": self.sha256,
            "blocks": bounds,
            "sections": sections,
        }
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, key: str = "") -> Manifest:
        """The manifest in the record `data` (stored under `key`, which its inline sections
        name); raises ValueError for anything but a well-formed one (on a plaintext root a
        record's digest is unkeyed, so its bytes may be forged: `[]`, a missing field, 10^5
        nested arrays)."""
        try:
            body = json.loads(data.split(b"\n", 1)[0])  # compact JSON has no line break
        except RecursionError:
            raise ValueError("nested too deeply") from None
        if not isinstance(body, dict):
            raise ValueError(f"a manifest is a JSON object, not {type(body).__name__}")
        schema = body.get("schema")
        sections = []
        if schema == 1:
            for item in _list(body, "sections"):
                start, end, key, headings = _fields(item, (int, int, str, list))
                sections.append(SectionRef(start, end, key, _headings(headings), key[-64:], start))
        elif schema in (MANIFEST_SCHEMA, INLINE_SCHEMA):
            blocks = [_fields(item, (int, int, str)) for item in _list(body, "blocks")]
            if any(block_key == INLINE for _, _, block_key in blocks):
                if schema != INLINE_SCHEMA or not key:
                    raise ValueError("an inline block outside an inline manifest")
                blocks = [(b, e, key if k == INLINE else k) for b, e, k in blocks]
            for item in _list(body, "sections"):
                start, end, digest, headings, number = _fields(item, (int, int, str, list, int))
                if not 0 <= number < len(blocks):
                    raise ValueError(f"section [{start}, {end}) names no block")
                base, block_end, key = blocks[number]
                if not base <= start <= end <= block_end:
                    raise ValueError(f"section [{start}, {end}) outside its block")
                sections.append(SectionRef(start, end, key, _headings(headings), digest, base))
        else:
            raise ValueError(f"unknown manifest schema {schema!r:.40}")
        doc_id, size, sha256 = (body.get(name) for name in ("doc_id", "size", "sha256"))
        if not (isinstance(doc_id, str) and _is_int(size) and isinstance(sha256, str)):
            raise ValueError("doc_id, size or sha256 missing or of the wrong type")
        return cls(doc_id, size, sha256, tuple(sections))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _list(body: dict, name: str) -> list:
    value = body.get(name)
    if not isinstance(value, list):
        raise ValueError(f"{name} is not a list")
    return value


def _fields(item, types: tuple[type, ...]) -> tuple:
    """A manifest row's fields, each checked against its type (int: non-negative)."""
    if not isinstance(item, list) or len(item) != len(types):
        raise ValueError(f"a row of {len(types)} fields expected")
    for value, kind in zip(item, types, strict=True):
        if not (_is_int(value) if kind is int else isinstance(value, kind)):
            raise ValueError(f"a field of type {kind.__name__} expected")
    return tuple(item)


def _headings(headings: list) -> tuple[str, ...]:
    if not all(isinstance(heading, str) for heading in headings):
        raise ValueError("a heading is not a string")
    return tuple(headings)


def pack_blocks(bounds: list[tuple[int, int]], limit: int = BLOCK_BYTES) -> list[tuple[int, int]]:
    """Consecutive sections ((start, end), in order, contiguous) packed greedily into blocks
    of at most `limit` bytes; a section larger than that is a block alone."""
    blocks: list[tuple[int, int]] = []
    for start, end in bounds:
        if blocks and end - blocks[-1][0] <= limit:
            blocks[-1] = (blocks[-1][0], end)
        else:
            blocks.append((start, end))
    return blocks


def doc_prefix(doc_id: str) -> str:
    return hashlib.sha256(doc_id.encode("utf-8")).hexdigest()[:32]


def section_key(doc_id: str, data: bytes) -> str:
    """The key of a schema-1 section record (one record per section; no longer written)."""
    return f"s/{doc_prefix(doc_id)}/{hashlib.sha256(data).hexdigest()}"


def block_key(doc_id: str, data: bytes) -> str:
    return f"b/{doc_prefix(doc_id)}/{hashlib.sha256(data).hexdigest()}"


def manifest_record(manifest: Manifest, inline: bytes | None = None) -> tuple[str, bytes]:
    """The manifest's record key and bytes. With `inline` (the bytes of the block whose
    sections have the key INLINE), the record is the manifest's JSON, a line break, then
    those bytes: a small document is one record, not a block and a manifest (every record
    is a file the store creates, links and fsyncs: per document, that is what add() costs)."""
    data = manifest.encode()
    if inline is not None:
        data += b"\n" + inline
    return f"m/{doc_prefix(manifest.doc_id)}/{hashlib.sha256(data).hexdigest()}", data


def inline_block(record: bytes) -> bytes:
    """The block bytes of an inline manifest record (after its JSON)."""
    return record.split(b"\n", 1)[1] if b"\n" in record else b""


def log_entry(entry: dict) -> bytes:
    """A catalog entry's bytes: JSON with a nonce, padded with spaces to LOG_ENTRY_BYTES.
    Raises ValueError if it does not fit (a doc id over MAX_DOC_ID_BYTES)."""
    data = json.dumps(
        entry | {"nonce": os.urandom(8).hex()}, ensure_ascii=False, separators=(",", ":")
    ).encode()
    if len(data) > LOG_ENTRY_BYTES:
        raise ValueError(f"blaise: a catalog entry of {len(data)} bytes exceeds {LOG_ENTRY_BYTES}")
    return data.ljust(LOG_ENTRY_BYTES)


def key_id(encryption_key_file: str, tenant: str) -> str:
    """64 bits naming the tenant's key (an HMAC under it): equal for equal keys only."""
    tenant_key = derive_tenant_key(load_master_key(encryption_key_file), tenant)
    return hmac.new(tenant_key, b"hicache-galahad/blaise/key-id/v1", "sha256").hexdigest()[:16]


class TextRecords:
    """One tenant's Blaise records; the only module here that does I/O."""

    def __init__(
        self,
        root: str,
        tenant: str,
        encryption_key_file: str | None = None,
        durability: str = "deferred",
    ):
        # "deferred": fsynced by the store's flusher within its window, and before any
        # deletion (sync); "fsync": durable before a put returns (one fsync per record)
        self.store = RecordStore(
            os.path.join(root, "blaise"),
            encryption_key_file=encryption_key_file,
            max_bytes=None,
            durability=durability,
        )
        geometry: dict = {"schema": SCHEMA}
        if encryption_key_file:
            geometry["key"] = key_id(encryption_key_file, tenant)  # a namespace per key
        self.namespace = self.store.register_namespace(
            Namespace(tenant, MODEL_FINGERPRINT, POOL, geometry)
        )
        self._next_log = 0

    # ------------------------------------------------------------------ sections

    def put_document(self, keys: list[str], datas: list, entry: dict) -> bool:
        """Stores a document's blocks, its manifest and then its catalog entry `entry` in one
        batch (one ledger update, linked in order: the entry after the records it names);
        False on failure. The entry takes the next log number; if another writer took that
        number first (the store keeps its entry: the batch did not link ours), append_log
        tries the numbers after it."""
        log_key = f"log/{self._next_log}"
        self._next_log += 1
        linked: set[str] = set()
        stored = self.store.publish_many(
            self.namespace,
            [*keys, log_key],
            [*datas, log_entry(entry)],
            lambda _, records: linked.update(key for key, _ in records),
        )
        if not all(stored[:-1]):
            return False
        return log_key in linked or self.append_log(entry)

    def get_section(self, ref: SectionRef) -> bytes | None:
        """The section's verified bytes, or None if missing or damaged (or not matching)."""
        return self.get_sections([ref])[0]

    def get_sections(self, refs) -> list[bytes | None]:
        """get_section for many, each record read (and verified by the store) once."""
        blocks: dict[str, bytes | None] = {}
        out: list[bytes | None] = []
        for ref in refs:
            if ref.key not in blocks:
                cap = MAX_MANIFEST_BYTES if ref.key.startswith("m/") else MAX_SECTION_BYTES
                record = self.store.get_bytes(self.namespace, ref.key, cap)
                if record is not None and ref.key.startswith("m/"):
                    record = inline_block(record)
                blocks[ref.key] = record
            block = blocks[ref.key]
            data = None
            if block is not None and ref.base <= ref.start <= ref.end <= ref.base + len(block):
                data = block[ref.start - ref.base : ref.end - ref.base]
                if hashlib.sha256(data).hexdigest() != ref.digest:
                    data = None
            out.append(data)
        return out

    def delete_record(self, key: str) -> None:
        self.store.delete(self.namespace, key)

    def sync(self) -> None:
        """Makes every record published so far durable now (deferred durability's flush)."""
        flusher = self.store.flusher
        if flusher is not None:
            flusher.flush()

    # ------------------------------------------------------------------ manifests

    def get_manifest(self, key: str) -> Manifest | None:
        """The manifest, or None if missing, damaged or malformed (the caller counts it)."""
        data = self.store.get_bytes(self.namespace, key, MAX_MANIFEST_BYTES)
        if data is None:
            return None
        try:
            return Manifest.decode(data, key)
        except ValueError as error:
            log.debug("blaise: manifest %s is unreadable: %s", key[:40], error)
            return None

    # ------------------------------------------------------------------ catalog log

    def replay(self) -> tuple[dict[str, str], list[int]]:
        """The catalog {doc_id: manifest key} in order of addition, and the numbers of log
        entries that exist but failed verification (skipped)."""
        catalog: dict[str, str] = {}
        damaged: list[int] = []
        index, missing = 0, 0
        while missing < LOG_GAP_PROBE:
            key = f"log/{index}"
            if not self.store.contains(self.namespace, key):
                missing += 1
                index += 1
                continue
            missing = 0
            self._next_log = index + 1
            entry = self._read_log(key)
            if entry is None:
                damaged.append(index)
            elif entry["op"] == "add":
                catalog.pop(entry["doc_id"], None)
                catalog[entry["doc_id"]] = entry["manifest"]
            elif entry["op"] == "remove":
                catalog.pop(entry["doc_id"], None)
            index += 1
        return catalog, damaged

    def _read_log(self, key: str) -> dict | None:
        """The entry, or None if missing, damaged or malformed: JSON that is not an object
        with a known op, a str doc_id and (to add) a str manifest key. A plaintext root's
        digest is unkeyed, so a well-digested entry may still be forged."""
        data = self.store.get_bytes(self.namespace, key, MAX_LOG_BYTES)
        if data is None:
            return None
        try:
            entry = json.loads(data)
        except (ValueError, RecursionError):
            return None
        if not isinstance(entry, dict) or not isinstance(entry.get("doc_id"), str):
            return None
        if entry.get("op") == "remove" or (
            entry.get("op") == "add" and isinstance(entry.get("manifest"), str)
        ):
            return entry
        return None

    def append_log(self, entry: dict) -> bool:
        """Appends an entry after the last one. Another writer may take a number first (the
        store keeps the first record of a key, all entries being one size), so each put is
        read back and compared; a number taken is skipped. False if the entry cannot be
        stored or read back (three tries: never a stream of records)."""
        data = log_entry(entry)
        failures = 0
        while failures < 3:
            key = f"log/{self._next_log}"
            self._next_log += 1
            if self.store.contains(self.namespace, key):
                continue  # taken (numbers in use are bounded by the log itself)
            if not self.store.put(self.namespace, key, data):
                return False
            stored = self.store.get_bytes(self.namespace, key, MAX_LOG_BYTES)
            if stored == data:
                return True
            if stored is None:
                failures += 1  # ours or another's, unreadable: try the next number, not forever
        return False

    def close(self) -> None:
        self.store.close()
