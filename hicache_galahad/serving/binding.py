"""Binding SGLang's host pools to namespaces of the store (torch via pages.py, no I/O).

Each host pool SGLang registers (KV first, then any extra pool of a hybrid model) gets the
namespace that names everything that decides its pages' bytes: tenant, model fingerprint,
pool geometry, parallel coordinates and the server's dtype choices. Records of one binding
are never served to another.
"""

from __future__ import annotations

import logging
import threading

from sglang.srt.mem_cache.hicache_storage import PoolName

from ..errors import ConfigError
from ..record.namespace import Namespace
from .pages import PageLayout, describe_pool

log = logging.getLogger("hicache_galahad")

KV = str(PoolName.KV)
# Pools holding per-rank state that TP ranks never share, even for MLA models.
RANK_SHARDED_POOLS = frozenset({str(PoolName.MAMBA), str(PoolName.SWA)})
SERVING_DTYPE_ARGS = ("kv_cache_dtype", "mamba_ssm_dtype", "dtype")
# Host pools keep these as raw bytes; only the server's arguments tell which format they hold.
OPAQUE_STORE_DTYPES = frozenset({"torch.uint8", "torch.int8"})
PARALLEL_COORDINATES = (
    "tp_size",
    "pp_rank",
    "pp_size",
    "attn_cp_rank",
    "attn_cp_size",
    "dp_rank",
    "dcp_rank",
    "dcp_size",
    "logical_page_size",
    "tp_lcm_size",
    "should_split_heads",
    "is_mla_model",
)


def server_args():
    """SGLang's server arguments in this (scheduler) process, or None outside a server."""
    try:
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except Exception:
        return None


def serving_dtypes(args) -> dict | None:
    """The server's dtype choices, or None when no server arguments are available."""
    if args is None:
        return None
    return {name: str(getattr(args, name, None)) for name in SERVING_DTYPE_ARGS}


class PoolBinding:
    """A registered host pool, its namespace and how to reach its pages' memory."""

    def __init__(self, name: str, pool, namespace: Namespace):
        self.name = name
        self.pool = pool
        self.namespace = namespace
        self.layout = PageLayout(pool)
        self.page_size = self.layout.page_size
        self.page_bytes = self.layout.page_bytes
        self.capacity_slots = int(getattr(pool, "size", 0) or 0)


class Binder:
    """Creates and remembers the binding of each registered pool."""

    def __init__(self, store, *, tenant, model_fingerprint, model_name, storage_config):
        self.store = store
        self.tenant = tenant
        self.model_fingerprint = model_fingerprint
        self.model_name = model_name
        self.storage_config = storage_config
        self.serving_dtypes = serving_dtypes(server_args())
        self.bindings: dict[str, PoolBinding] = {}
        self._lock = threading.Lock()

    def _parallel_coordinates(self, pool_name: str) -> dict:
        config = self.storage_config
        coordinates = {name: getattr(config, name, None) for name in PARALLEL_COORDINATES}
        # MLA KV is replicated over TP ranks (rank 0 writes, all read); recurrent and
        # windowed state is always the rank's own shard.
        kv_replicated = bool(getattr(config, "is_mla_model", False)) and (
            pool_name not in RANK_SHARDED_POOLS
        )
        coordinates["tp_rank"] = None if kv_replicated else getattr(config, "tp_rank", 0)
        return coordinates

    def _dtypes(self, name: str, geometry: dict) -> dict:
        """The server's dtype choices; outside a server, what the pool itself shows, unless
        the pool stores opaque bytes (fp8 kept as uint8: e4m3 and e5m2 look alike)."""
        if self.serving_dtypes is not None:
            return self.serving_dtypes
        stored = {geometry.get("dtype")} | {
            component["dtype"] for component in geometry.get("components", [])
        }
        if stored & OPAQUE_STORE_DTYPES:
            raise ConfigError(
                f"hicache_galahad: host pool {name!r} stores {sorted(stored)} and SGLang's "
                "server arguments (--kv-cache-dtype) cannot be read in this process, so "
                "records of different fp8 formats could not be told apart; run inside an "
                "SGLang server (launch_server or sglang.Engine)"
            )
        return {"pool_dtypes": sorted(str(dtype) for dtype in stored)}

    def bind(self, name: str, pool) -> PoolBinding:
        with self._lock:
            binding = self.bindings.get(name)
            if binding is not None and binding.pool is pool:
                return binding
            geometry = describe_pool(pool)
            geometry |= {
                "model_name": self.model_name,
                "parallel": self._parallel_coordinates(name),
                # Host pools keep fp8 KV as uint8: the server's dtype choices tell e4m3 from e5m2.
                "serving_dtypes": self._dtypes(name, geometry),
            }
            if name != KV:
                # A state is only ever used together with KV pages of the KV namespace (SGLang
                # registers the KV pool first), and its value depends on how they were computed
                # (e.g. the KV dtype): tie it to that namespace, so that another KV geometry
                # never finds it (an existing state is never rewritten, so it would be kept).
                kv = self.bindings.get(KV)
                geometry["kv_namespace"] = kv.namespace.dirname if kv is not None else None
            namespace = self.store.register_namespace(
                Namespace(self.tenant, self.model_fingerprint, name, geometry)
            )
            binding = PoolBinding(name, pool, namespace)
            max_bytes = self.store.max_bytes
            if max_bytes is not None and max_bytes < binding.page_bytes:
                raise ConfigError(
                    f"hicache_galahad option 'max_bytes': got {max_bytes}, expected at least "
                    f"one page of pool {name!r} ({binding.page_bytes} bytes plus its header), "
                    "or no cap"
                )
            self.bindings[name] = binding
            log.info(
                "galahad: pool %s bound to namespace %s (%d-byte pages, zero-copy %s)",
                name,
                namespace.dirname,
                binding.page_bytes,
                "on" if binding.layout.supported else "off",
            )
            return binding

    def kv(self) -> PoolBinding:
        binding = self.bindings.get(KV)
        if binding is None:
            raise RuntimeError("no KV host pool registered yet")
        return binding

    def get(self, name, registered_pools) -> PoolBinding | None:
        """The binding of pool `name`, binding it now if SGLang registered it without us."""
        binding = self.bindings.get(str(name))
        if binding is None:
            pool = (registered_pools or {}).get(name)
            if pool is not None:
                binding = self.bind(str(name), pool)
        return binding
