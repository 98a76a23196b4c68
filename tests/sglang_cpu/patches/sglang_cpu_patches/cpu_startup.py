# =================================================================================================
# TEST HARNESS ONLY -- NEVER SHIPPED IN THE hicache_galahad PACKAGE.
# =================================================================================================
"""Start-up shortcut for CPU test servers: SGLang's children forked, not spawned.

SGLang's launcher sets the multiprocessing start method to "spawn" (engine.py, for CUDA, which
cannot be forked once initialised). A spawned scheduler and detokenizer each import SGLang,
torch and transformers again: on a 2-core CPU box that is about 12 s of every server start.
With no CUDA there is nothing fork-unsafe to inherit, so under the harness the children fork
from the launcher, which has already imported everything they need.
"""

from __future__ import annotations

import multiprocessing
from types import ModuleType

from . import register


class _ForkingMultiprocessing:
    """The multiprocessing module as engine.py sees it, except that its start method is fork."""

    def __getattr__(self, name):
        return getattr(multiprocessing, name)

    @staticmethod
    def set_start_method(method, force=False):
        multiprocessing.set_start_method("fork", force=force)


def _fork_children(module: ModuleType) -> None:
    module.mp = _ForkingMultiprocessing()


register(
    "fork_children",
    "SGLang's scheduler and detokenizer processes forked from the launcher instead of spawned",
    {"sglang.srt.entrypoints.engine": _fork_children},
)
