"""Blaise's records in our record store: sections, document manifests and a catalog log.

The store never replaces a record (a put of an existing key is a no-op), so every record here
is immutable and named by its content:

    s/<doc>/<sha256 of the section bytes>     one section's bytes
    m/<doc>/<sha256 of the manifest>          a document's manifest (JSON: size, digest,
                                              sections with offsets, record keys, headings)
    log/<n>                                   catalog entry n: {"op": "add" | "remove", ...}

(<doc> is the first 32 hex digits of SHA-256 of the document id.) The catalog is the log
replayed in order; an entry is appended after the records it names are durable, so a crash
leaves at worst unreferenced records. Records live under `<root>/blaise`, a RecordStore of
their own with no byte cap, so the KV budget (which evicts under `<root>/ns`) never touches
text. Every read is verified by the store (digest, or AES-GCM tag with the tenant's key); a
record that fails is a miss, and the caller skips it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass

from ..namespace import Namespace
from ..store import RecordStore

log = logging.getLogger(__name__)

MODEL_FINGERPRINT = "blaise-text"
POOL = "text"
SCHEMA = 1
MAX_SECTION_BYTES = 16 << 20
MAX_MANIFEST_BYTES = 64 << 20
MAX_LOG_BYTES = 1 << 20
LOG_GAP_PROBE = 64  # missing log entries tolerated in a row (quarantined damage) on replay


@dataclass(frozen=True, slots=True)
class SectionRef:
    start: int
    end: int
    key: str
    headings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Manifest:
    doc_id: str
    size: int
    sha256: str
    sections: tuple[SectionRef, ...]

    def encode(self) -> bytes:
        body = {
            "schema": SCHEMA,
            "doc_id": self.doc_id,
            "size": self.size,
            "sha256": self.sha256,
            "sections": [[s.start, s.end, s.key, list(s.headings)] for s in self.sections],
        }
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        body = json.loads(data)
        if body.get("schema") != SCHEMA:
            raise ValueError(f"unknown manifest schema {body.get('schema')!r}")
        sections = tuple(
            SectionRef(int(start), int(end), str(key), tuple(headings))
            for start, end, key, headings in body["sections"]
        )
        return cls(str(body["doc_id"]), int(body["size"]), str(body["sha256"]), sections)


def doc_prefix(doc_id: str) -> str:
    return hashlib.sha256(doc_id.encode("utf-8")).hexdigest()[:32]


def section_key(doc_id: str, data: bytes) -> str:
    return f"s/{doc_prefix(doc_id)}/{hashlib.sha256(data).hexdigest()}"


class TextRecords:
    """One tenant's Blaise records; the only module here that does I/O."""

    def __init__(self, root: str, tenant: str, encryption_key_file: str | None = None):
        self.store = RecordStore(
            os.path.join(root, "blaise"),
            encryption_key_file=encryption_key_file,
            max_bytes=None,
            durability="fsync",  # text cannot be recomputed: durable before a put returns
        )
        self.namespace = self.store.register_namespace(
            Namespace(tenant, MODEL_FINGERPRINT, POOL, {"schema": SCHEMA})
        )
        self._next_log = 0

    # ------------------------------------------------------------------ sections

    def put_sections(self, doc_id: str, data: bytes, ranges) -> list[str] | None:
        """Stores each [start, end) of `data` as a record; their keys, or None on failure."""
        keys = [section_key(doc_id, data[start:end]) for start, end in ranges]
        chunks = [data[start:end] for start, end in ranges]
        results = self.store.put_many(self.namespace, keys, chunks) if keys else []  # one batch
        return keys if all(results) else None

    def get_section(self, ref: SectionRef) -> bytes | None:
        """The section's verified bytes, or None if missing or damaged (or not matching)."""
        data = self.store.get_bytes(self.namespace, ref.key, MAX_SECTION_BYTES)
        if data is None or len(data) != ref.end - ref.start:
            return None
        if not ref.key.endswith("/" + hashlib.sha256(data).hexdigest()):
            return None
        return data

    def delete_section(self, ref: SectionRef) -> None:
        self.store.delete(self.namespace, ref.key)

    # ------------------------------------------------------------------ manifests

    def put_manifest(self, manifest: Manifest) -> str | None:
        data = manifest.encode()
        key = f"m/{doc_prefix(manifest.doc_id)}/{hashlib.sha256(data).hexdigest()}"
        return key if self.store.put(self.namespace, key, data) else None

    def get_manifest(self, key: str) -> Manifest | None:
        data = self.store.get_bytes(self.namespace, key, MAX_MANIFEST_BYTES)
        if data is None:
            return None
        try:
            return Manifest.decode(data)
        except (ValueError, KeyError, TypeError) as error:
            log.warning("blaise: manifest %s is unreadable: %s", key[:40], error)
            return None

    def delete_manifest(self, key: str) -> None:
        self.store.delete(self.namespace, key)

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
        data = self.store.get_bytes(self.namespace, key, MAX_LOG_BYTES)
        if data is None:
            return None
        try:
            entry = json.loads(data)
            if entry.get("op") in ("add", "remove") and isinstance(entry.get("doc_id"), str):
                return entry
        except ValueError:
            pass
        log.warning("blaise: catalog entry %s is unreadable", key)
        return None

    def append_log(self, entry: dict) -> bool:
        """Appends an entry after the last one. Another writer may take a number first (the
        store keeps the first record of a key), so each put is read back and compared."""
        data = json.dumps(
            entry | {"nonce": os.urandom(8).hex()}, ensure_ascii=False, separators=(",", ":")
        ).encode()
        for _ in range(1000):
            key = f"log/{self._next_log}"
            self._next_log += 1
            if self.store.contains(self.namespace, key):
                continue
            if not self.store.put(self.namespace, key, data):
                return False
            if self.store.get_bytes(self.namespace, key, MAX_LOG_BYTES) == data:
                return True
        return False

    def close(self) -> None:
        self.store.close()
