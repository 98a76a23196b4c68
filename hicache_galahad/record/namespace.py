"""Namespaces: every record belongs to exactly one, and a reader only sees its own.

A namespace is the SHA-256 of a canonical JSON document naming the tenant, the model
fingerprint, the pool and the pool's geometry (dtype, layout, page size, element counts,
parallel ranks and sizes). Any difference in any of these gives a different namespace, so
a record written under one can never be served under another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

NAMESPACE_SCHEMA = "hicache-galahad/namespace/v1"


@dataclass(frozen=True)
class Namespace:
    tenant: str
    model_fingerprint: str
    pool: str
    geometry: dict = field(default_factory=dict)
    digest: bytes = field(init=False, repr=False, compare=False)
    dirname: str = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("tenant", "model_fingerprint", "pool"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"namespace {name} must be a non-empty string, got {value!r}")
        object.__setattr__(self, "digest", hashlib.sha256(self.canonical_json()).digest())
        # The namespace's directory name: 128 bits of the digest (the header holds all 256).
        object.__setattr__(self, "dirname", self.digest.hex()[:32])

    def describe(self) -> dict:
        return {
            "schema": NAMESPACE_SCHEMA,
            "tenant": self.tenant,
            "model_fingerprint": self.model_fingerprint,
            "pool": self.pool,
            "geometry": self.geometry,
        }

    def canonical_json(self) -> bytes:
        return json.dumps(
            self.describe(), sort_keys=True, separators=(",", ":"), ensure_ascii=True
        ).encode()
