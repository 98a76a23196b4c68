"""SGLang's storage keys of a prompt's pages, recomputed byte for byte.

SGLang 0.5.23's storage chain (`mem_cache/utils.py` `get_storage_hash_str`): SHA-256 over the
prior raw digest and the page's token ids as uint32 little-endian (a page with a token of 2^32
or more: tag 0xff, then uint64), seeded by `storage_namespace_seed(extra_key, cache_salt)` when
the request carries either. tests/test_warm.py holds these functions to SGLang's own.
"""

from __future__ import annotations

import hashlib
import operator

MAX_TOKEN_ID = (1 << 64) - 1  # SGLang's wide encoding is uint64


def namespace_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    """SGLang 0.5.23 `storage_namespace_seed`: the prior of a chain's first page when the
    request carries an extra key (LoRA, ...) or a cache salt; None for the default namespace."""
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(b"sglang-cache-namespace-v1")
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
            continue
        encoded = part.encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.hexdigest()


def token_ids_checked(token_ids) -> list[int]:
    """Token ids SGLang can hash, as ints: integers in [0, 2^64) (numpy's too); ValueError
    naming the first other (a float, a bool, 2^70, -1)."""
    checked = []
    for token in token_ids:
        try:
            value = operator.index(token)
        except TypeError:
            value = None
        if value is None or isinstance(token, bool) or not 0 <= value <= MAX_TOKEN_ID:
            raise ValueError(f"token id {token!r}: expected an integer in [0, 2^64)")
        checked.append(value)
    return checked


def page_keys(
    token_ids: list[int],
    page_size: int,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
) -> list[str]:
    """The storage keys SGLang gives the full pages of `token_ids` (its `get_storage_hash_str`
    over a page-aligned list): key i names the prefix of (i + 1) * page_size tokens."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    seed = namespace_seed(extra_key, cache_salt)
    prior = bytes.fromhex(seed) if seed else b""
    keys = []
    for start in range(0, len(token_ids) - len(token_ids) % page_size, page_size):
        page = token_ids_checked(token_ids[start : start + page_size])
        if any(token >= 1 << 32 for token in page):
            # SGLang switches such a page to its "wide" encoding (tag 0xff, uint64 tokens)
            body = b"\xff" + b"".join(token.to_bytes(8, "little") for token in page)
        else:
            body = b"".join(token.to_bytes(4, "little") for token in page)
        prior = hashlib.sha256(prior + body).digest()
        keys.append(prior.hex())
    return keys
