# =================================================================================================
# TEST HARNESS ONLY -- NEVER SHIPPED IN THE hicache_galahad PACKAGE.
# Runtime patches that let a real SGLang 0.5.23 server run on a CPU-only machine for tests and
# demos. This is NOT a supported SGLang configuration; nothing here may be imported by
# hicache_galahad/ or used in production.
# =================================================================================================
"""Registry of opt-in runtime patches for running SGLang on CPU in tests.

Every patch has a name and is applied only when that name is listed in the comma-separated
environment variable ``SGLANG_CPU_TEST_PATCHES`` (``tests/sglang_cpu/run`` sets a default).
``sitecustomize.py`` calls :func:`install_from_env` at interpreter start-up in every Python process
that has ``tests/sglang_cpu/patches`` on ``PYTHONPATH``, including SGLang's scheduler and
detokenizer subprocesses.

Patches are applied lazily: a patch names the modules it changes, and its function runs right
after such a module has been imported (or immediately if it is already imported). Nothing from
SGLang is imported at start-up, so processes that never touch SGLang pay nothing.

Adding a patch: write one function ``apply(module)`` per target module in a submodule (see
``cpu_hicache.py``) and register it with :func:`register`; add the submodule to ``_SUBMODULES``.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

ENV_VAR = "SGLANG_CPU_TEST_PATCHES"
VERBOSE_ENV_VAR = "SGLANG_CPU_TEST_PATCHES_VERBOSE"

# Submodules that register patches when imported.
_SUBMODULES = ("cpu_hicache", "cpu_attention", "cpu_hybrid", "cpu_mla", "cpu_startup")


@dataclass
class Patch:
    name: str
    description: str
    # target module name -> function applied to that module once it is imported
    targets: dict[str, Callable[[ModuleType], None]] = field(default_factory=dict)


PATCHES: dict[str, Patch] = {}
APPLIED: list[tuple[str, str]] = []  # (patch name, module name), in application order
_lock = threading.RLock()
_pending: dict[str, list[tuple[str, Callable[[ModuleType], None]]]] = {}
_installed: set[str] = set()


def register(name: str, description: str, targets: dict[str, Callable[[ModuleType], None]]):
    if name in PATCHES:
        raise ValueError(f"patch {name!r} registered twice")
    PATCHES[name] = Patch(name, description, dict(targets))


def _log(message: str) -> None:
    if os.environ.get(VERBOSE_ENV_VAR) == "1":
        print(f"[sglang-cpu-patches pid={os.getpid()}] {message}", file=sys.stderr, flush=True)


def _run(patch_name: str, module: ModuleType, fn: Callable[[ModuleType], None]) -> None:
    fn(module)
    APPLIED.append((patch_name, module.__name__))
    _log(f"applied {patch_name} to {module.__name__}")


class _PostImportFinder:
    """A meta-path finder that runs patch functions right after a target module executes.

    It finds the real spec through the other finders and wraps ``exec_module`` on that spec's
    loader instance (loaders of source modules are per-module objects), so the module, its
    loader type and its ``__spec__`` stay exactly what the normal import system produced.
    """

    def find_spec(self, fullname, path=None, target=None):
        with _lock:
            if fullname not in _pending:
                return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module, _original=original_exec, _name=fullname):
            _original(module)
            with _lock:
                hooks = _pending.pop(_name, [])
            for patch_name, fn in hooks:
                _run(patch_name, module, fn)

        loader.exec_module = exec_module
        return spec


_finder = _PostImportFinder()


def install(names: list[str]) -> None:
    """Apply the named patches now or as soon as their target modules are imported."""
    for sub in _SUBMODULES:
        importlib.import_module(f"{__name__}.{sub}")
    unknown = [n for n in names if n not in PATCHES]
    if unknown:
        raise ValueError(f"unknown patch name(s) {unknown}; known: {sorted(PATCHES)}")
    with _lock:
        for name in names:
            if name in _installed:
                continue
            _installed.add(name)
            for module_name, fn in PATCHES[name].targets.items():
                module = sys.modules.get(module_name)
                if module is not None:
                    _run(name, module, fn)
                else:
                    _pending.setdefault(module_name, []).append((name, fn))
        if _pending and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def requested_from_env() -> list[str]:
    raw = os.environ.get(ENV_VAR, "")
    return [n.strip() for n in raw.split(",") if n.strip()]


def install_from_env() -> list[str]:
    names = requested_from_env()
    if names:
        install(names)
        _log(f"installed {names}")
    return names
