"""Which namespaces under the root are this server's: one KV namespace per rank (and, for a
hybrid, its state pools), chosen by what the server reports about itself, or refused when two
could be."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..config.fingerprint import fingerprint_model_dir
from ..errors import ServerError
from ..record.namespace import Namespace
from ..store import RecordStore, StoreAdmin
from .profile import ServerProfile

KV_POOL, STATE_POOLS = "kv", ("mamba",)


@dataclass
class RankNamespaces:
    """The namespaces one rank of the server writes: its KV pages and (hybrid) its states."""

    rank: str
    kv: Namespace
    states: list[Namespace] = field(default_factory=list)


def _fingerprint(profile: ServerProfile) -> str | None:
    if profile.model_fingerprint:
        return profile.model_fingerprint
    if os.path.isdir(profile.model_path):
        try:
            return fingerprint_model_dir(profile.model_path)
        except Exception:
            return None
    return None


def _parallel(ns: Namespace) -> dict:
    parallel = (ns.geometry or {}).get("parallel")
    return parallel if isinstance(parallel, dict) else {}


def _size(parallel: dict, name: str) -> int | None:
    value = parallel.get(name) or 1
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def server_namespaces(
    store: RecordStore, profile: ServerProfile, tenant: str | None = None
) -> list[RankNamespaces]:
    """The server's namespaces under the store's root, one entry per rank: the KV namespaces
    whose description names the server's tenant, model (fingerprint, else model path), page
    size, TP and PP sizes and the model name its pools carry (the served model name, which
    tells apart the same weights served under another name or mount path), grouped by parallel
    coordinates (a TP rank, a PP stage: every one must hold a page for SGLang to restore it);
    where several match one rank, those of the server's dtypes; the state pools tied to each
    (their `kv_namespace`). ServerError when a rank still has two: which one the server writes
    cannot be told from the root, and answering for the other would be wrong."""
    tenant = tenant or profile.tenant
    fingerprint = _fingerprint(profile)
    names = profile.storage_model_names()
    described = [ns for _, ns in StoreAdmin(store).namespaces_on_disk() if ns is not None]

    def ours(ns: Namespace) -> bool:
        geometry = ns.geometry or {}
        parallel = _parallel(ns)
        if ns.pool != KV_POOL or ns.tenant != tenant:
            return False
        if geometry.get("page_size") != profile.page_size:
            return False
        if (_size(parallel, "tp_size"), _size(parallel, "pp_size")) != (
            profile.tp_size,
            profile.pp_size,
        ):
            return False
        if fingerprint is not None and ns.model_fingerprint != fingerprint:
            return False
        return geometry.get("model_name") in names

    kv_by_rank: dict[str, list[Namespace]] = {}
    for ns in described:
        if ours(ns):
            kv_by_rank.setdefault(json.dumps(_parallel(ns), sort_keys=True), []).append(ns)
    ranks = []
    for rank, found in sorted(kv_by_rank.items()):
        same_dtypes = [ns for ns in found if ns.geometry.get("serving_dtypes") == profile.dtypes]
        chosen = sorted(same_dtypes or found, key=lambda ns: ns.dirname)
        if len(chosen) > 1:
            raise ServerError(
                f"{len(chosen)} namespaces under {store.root} match this server's rank {rank} "
                f"(model name {profile.served_model_name!r}, tenant {tenant!r}): "
                f"{', '.join(ns.dirname for ns in chosen)}; they differ only in pool geometry, "
                "so which one it writes cannot be told from the root"
            )
        kv = chosen[0]
        states = [
            ns
            for ns in described
            if ns.pool in STATE_POOLS and (ns.geometry or {}).get("kv_namespace") == kv.dirname
        ]
        ranks.append(RankNamespaces(rank, kv, sorted(states, key=lambda ns: ns.pool)))
    return ranks
