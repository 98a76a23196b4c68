"""Model fingerprint: an identity of the weights, not of the served name.

Two models with the same name but different weights (a fine-tune, a re-quantisation, a
re-download of a moved tag) must never share KV. For a local model directory the fingerprint
digests every config and tokenizer file whole, and for every weight file its name, size,
modification time, its header (safetensors / GGUF metadata) and 16 sampled 64 KiB blocks of
its contents. It reads about 1 MiB per weight file, so a 60 GB model directory takes well under
a second, and it changes whenever a weight file is rewritten.
"""

from __future__ import annotations

import hashlib
import os
import struct

from ..errors import FingerprintError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".npz")
SAMPLE_BLOCKS = 16
SAMPLE_BLOCK_BYTES = 64 * 1024
MAX_SMALL_FILE_BYTES = 16 * 1024 * 1024
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024


def _digest_file(path: str, hasher) -> None:
    with open(path, "rb") as source:
        while block := source.read(1 << 20):
            hasher.update(block)


def _digest_weight_file(path: str, size: int, hasher) -> None:
    with open(path, "rb") as source:
        if path.endswith(".safetensors") and size >= 8:
            header_len = struct.unpack("<Q", source.read(8))[0]
            if header_len <= min(size - 8, MAX_SAFETENSORS_HEADER_BYTES):
                hasher.update(source.read(header_len))
        else:
            hasher.update(source.read(SAMPLE_BLOCK_BYTES))
        for block in range(SAMPLE_BLOCKS):
            offset = size * block // SAMPLE_BLOCKS
            source.seek(offset)
            hasher.update(source.read(SAMPLE_BLOCK_BYTES))
        if size > SAMPLE_BLOCK_BYTES:
            source.seek(size - SAMPLE_BLOCK_BYTES)
            hasher.update(source.read(SAMPLE_BLOCK_BYTES))


def fingerprint_model_dir(model_dir: str) -> str:
    """ "dir-sha256:<hex>" over the model directory's files (see the module docstring)."""
    if not os.path.isdir(model_dir):
        raise FingerprintError(f"{model_dir!r} is not a directory")
    hasher = hashlib.sha256(b"hicache-galahad/model-fingerprint/v1\0")
    weight_files = 0
    for directory, subdirectories, files in os.walk(model_dir):
        subdirectories.sort()
        subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, model_dir)
            info = os.stat(path)
            hasher.update(f"\0{relative}\0{info.st_size}\0".encode())
            if name.endswith(WEIGHT_SUFFIXES):
                weight_files += 1
                hasher.update(str(info.st_mtime_ns).encode())
                _digest_weight_file(path, info.st_size, hasher)
            elif info.st_size <= MAX_SMALL_FILE_BYTES:
                _digest_file(path, hasher)
            else:
                hasher.update(str(info.st_mtime_ns).encode())
    if weight_files == 0:
        raise FingerprintError(f"{model_dir!r} holds no weight files")
    return "dir-sha256:" + hasher.hexdigest()


def resolve_fingerprint(configured: str | None, model_name: str | None) -> str:
    """The configured fingerprint, else one computed from a local model directory."""
    if configured:
        return configured
    if model_name and os.path.isdir(model_name):
        try:
            return fingerprint_model_dir(model_name)
        except (OSError, FingerprintError) as error:
            reason = str(error)
    else:
        reason = f"model name {model_name!r} is not a local model directory"
    raise FingerprintError(
        "hicache_galahad cannot establish which weights the cache belongs to "
        f'({reason}). Pass "model_fingerprint" in --hicache-storage-backend-extra-config: '
        "a string that changes whenever the weights change (e.g. the checkpoint's commit "
        "hash or a digest of its files)."
    )
