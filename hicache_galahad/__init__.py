"""hicache-galahad: persistent, verified KV-cache and hybrid-state storage for SGLang HiCache.

`hicache_galahad.GalahadStorage` is the SGLang backend class; it is imported lazily so that
the record store (`hicache_galahad.store`) works without torch or sglang installed.
`hicache_galahad.warm()` and `ready()` (the warming package) warm a corpus through a running
server and say what a request would restore now.
"""

__version__ = "0.1.0"
__all__ = ["GalahadStorage", "RecordStore", "Namespace", "warm", "ready"]


def __getattr__(name):
    if name == "GalahadStorage":
        from .serving.adapter import GalahadStorage

        return GalahadStorage
    if name == "RecordStore":
        from .store import RecordStore

        return RecordStore
    if name == "Namespace":
        from .record.namespace import Namespace

        return Namespace
    if name in ("warm", "ready"):  # warming/: warm a corpus, say what is ready
        from . import warming

        return getattr(warming, name)
    raise AttributeError(f"module 'hicache_galahad' has no attribute {name!r}")
