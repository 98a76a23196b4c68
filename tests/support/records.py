"""A store root as the tests see it from outside: where records lie, how to find and damage
them, the bytes they take, the keys pages are stored under, and the key files a store is given.

Import-only; standard library and `hicache_galahad` only (no torch, no SGLang), so that every
test module can use it. Paths that the store's own reports name (`check`'s damaged records and
stray temp files) are strings, as the store gives them: `record_path`, `temp_files`,
`quarantine_files`. What is found by looking at the disk is a `pathlib.Path`: `record_files`,
`pool_records`, `find_record`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from hicache_galahad.record import format as fmt
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store.layout import TEMP_PREFIX, record_filename

# ----------------------------------------------------------------------------- where records lie


def ns_dir(root, namespace: Namespace) -> str:
    """root/ns/<namespace>: the directory of one namespace's records."""
    return os.path.join(str(root), "ns", namespace.dirname)


def record_path(root, namespace: Namespace, key: str) -> str:
    """Where the store keeps `key` of `namespace` (whether or not it is there)."""
    return os.path.join(ns_dir(root, namespace), record_filename(key))


def record_files(root) -> list[Path]:
    """Every record file under the root, of every namespace (temp files are not records)."""
    return sorted(Path(root, "ns").glob("*/*.rec"))


def pool_records(root, pool: str, tenant: str | None = None) -> list[Path]:
    """The record files of every namespace of one pool ("kv", "mamba", ...), of one tenant or
    of all, found through the namespace descriptions (namespace.json)."""
    return sorted(
        path
        for directory in _namespace_dirs(root, pool, tenant)
        for path in directory.glob("*.rec")
    )


def find_record(root, key: str, pool: str = "kv", tenant: str | None = None) -> Path | None:
    """The record of `key` in the pool's (and tenant's) namespaces, the first that holds it."""
    for directory in _namespace_dirs(root, pool, tenant):
        path = directory / f"{key}.rec"
        if path.exists():
            return path
    return None


def _namespace_dirs(root, pool: str, tenant: str | None) -> list[Path]:
    found = []
    for description in sorted(Path(root, "ns").glob("*/namespace.json")):
        namespace = json.loads(description.read_text())
        if namespace["pool"] == pool and tenant in (None, namespace["tenant"]):
            found.append(description.parent)
    return found


def temp_files(root) -> list[str]:
    """Writes in progress (or left by a dead writer), in every namespace."""
    found = []
    ns_root = os.path.join(str(root), "ns")
    if not os.path.isdir(ns_root):
        return found
    for dirname in os.listdir(ns_root):
        directory = os.path.join(ns_root, dirname)
        found.extend(
            os.path.join(directory, name)
            for name in os.listdir(directory)
            if name.startswith(TEMP_PREFIX)
        )
    return found


def quarantine_files(root) -> list[str]:
    directory = os.path.join(str(root), "quarantine")
    return [os.path.join(directory, name) for name in os.listdir(directory)]


# ----------------------------------------------------------------------------- bytes on disk


def budgeted_files(root) -> dict[tuple[int, int], int]:
    """(device, inode) -> size of every file the byte budget covers: record files, temp files
    in flight and quarantined files (namespace.json descriptions are not budgeted). Each inode
    counts once: a temp file and the record it was just linked to are one file. A file that
    goes while it is looked at (evicted, published) is left out."""
    ns_root = Path(root, "ns")
    paths = [
        *record_files(root),
        *ns_root.glob(f"*/{TEMP_PREFIX}*"),
        *Path(root).glob("quarantine/*"),
    ]
    sizes = {}
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            sizes[(info.st_dev, info.st_ino)] = info.st_size
    return sizes


def store_disk_bytes(root) -> int:
    """Bytes the budget covers (see `budgeted_files`)."""
    return sum(budgeted_files(root).values())


# ----------------------------------------------------------------------------- key files, damage


def write_key_file(path, data: bytes | None = None, mode: int = 0o600) -> str:
    """An encryption key file: `data` (32 random bytes by default) with permissions `mode`."""
    with open(path, "wb") as key_file:
        key_file.write(os.urandom(32) if data is None else data)
    os.chmod(path, mode)
    return str(path)


def flip_byte(path, offset: int = -1, mask: int = 0xFF) -> None:
    """XORs one byte of a file with `mask`, in place (negative offsets count from the end)."""
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    data[offset] ^= mask
    with open(path, "wb") as handle:
        handle.write(bytes(data))


# ----------------------------------------------------------------------------- page keys


def hash_chain(pieces: Iterable[bytes]) -> list[str]:
    """sha256 chained over `pieces`: key i is sha256(raw digest of key i - 1 + piece i), hex."""
    keys, prior = [], b""
    for piece in pieces:
        prior = hashlib.sha256(prior + piece).digest()
        keys.append(prior.hex())
    return keys


def page_keys(token_ids: list[int], page_size: int) -> list[str]:
    """SGLang's page-hash chain (mem_cache/utils.py get_hash_str): sha256 over the prior raw
    digest and the page's tokens as uint32 little-endian; full pages only. A recurrent state is
    stored under the key of the last page it covers."""
    full = len(token_ids) - len(token_ids) % page_size
    return hash_chain(
        b"".join(token.to_bytes(4, "little") for token in token_ids[start : start + page_size])
        for start in range(0, full, page_size)
    )


def chain_keys(count: int, label: str = "seq") -> list[str]:
    """`count` chained 64-hex keys, as SGLang names its pages, without tokens behind them: one
    chain per label."""
    return hash_chain(f"{label}:{index}".encode() for index in range(count))


def zstd_record(namespace: Namespace, key: str, frame: bytes, raw_len: int) -> bytes:
    """A sound zstd record (header, xxh3 digest and all) of `frame` claiming `raw_len` raw
    bytes: what a size or decompression bomb looks like when every other rule holds."""
    header = fmt.pack_header(
        flags=fmt.FLAG_ZSTD,
        payload_len=len(frame),
        raw_len=raw_len,
        namespace=namespace.digest,
        key=key.encode(),
        digest_alg=fmt.DIGEST_XXH3_128,
    )
    fmt.seal_digest(header, [frame], fmt.DIGEST_XXH3_128)
    return bytes(header) + frame
