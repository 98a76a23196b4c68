"""The local record store: one verified record file per page under `<root>/ns/`.

`RecordStore` (record_store.py) is the data path and `StoreAdmin` (admin.py) the operator's
verbs, both over the parts of one open store (parts.py, each handed a context.py): the root's
layout and held directories (layout, directories, namespace_files, safe_files), the verified
reads (reader, payload), the staged writes (writer, flusher), the byte cap (budget, eviction,
eviction_order, sampling, ledger with ledger_file, ledger_state and journal, accounting,
ledger_repair, disk_count, record_stat), the processes alive on the root (liveness), damage
moved aside (quarantine), `galahad verify` (checker), the namespaces served (namespaces), pins
(pins/) and the counters kept on disk (lifetime).

No torch, no SGLang. Imports `record`, `telemetry`, `config` and the project's errors; never
the tier, the SGLang backend or the operator's command. `RecordStore` and `StoreAdmin` are
imported on first use, so that `import hicache_galahad.store.layout` loads the layout alone.
"""

__all__ = ["RecordStore", "StoreAdmin"]


def __getattr__(name):
    if name == "RecordStore":
        from .record_store import RecordStore

        return RecordStore
    if name == "StoreAdmin":
        from .admin import StoreAdmin

        return StoreAdmin
    raise AttributeError(f"module 'hicache_galahad.store' has no attribute {name!r}")
