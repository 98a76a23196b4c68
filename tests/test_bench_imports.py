"""bench/ imports nothing from tests/: the harnesses both use live in bench/ (sglang_server.py,
mooncake_cluster.py), where the tests import them from, no module stands in for another in
sys.modules, and HiCacheStorageConfig is built in one place (sglang_server.storage_config)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# gpu_check.py builds its own: it is one file that also runs on a device machine without SGLang.
PENDING_CONFIG_BUILDERS = {"bench/gpu_check.py"}


BENCH_MODULES = sorted(path.stem for path in REPO.glob("bench/*.py") if path.stem != "__init__")
# The top-level names a module of tests/ is imported by (tests/ on sys.path, or the repository).
TEST_NAMES = {"tests", "support", "conftest"}


def _from_tests(name: str) -> bool:
    return name.split(".")[0] in TEST_NAMES or name.startswith("test_")


def test_no_bench_module_names_a_module_of_tests():
    """By the code (ast): no `import tests...`, `from tests...`, nor a name only tests/ on the
    path would find (support), anywhere in bench/, functions included."""
    found = []
    for path in sorted(REPO.glob("bench/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [f"{path.name}:{node.lineno} {name}" for name in names if _from_tests(name)]
    assert found == []


def test_every_bench_module_imports_with_no_tests_path_and_no_tests_module(tmp_path):
    """Each bench/*.py module's top level, imported with only the repository on the path, puts
    no tests/ directory on sys.path and loads no module of tests/ (the Mooncake cluster the
    benchmarks start is bench/mooncake_cluster.py, which the tests import too)."""
    code = (
        f"import importlib, json, sys; sys.path.insert(0, {str(REPO)!r})\n"
        f"for name in {BENCH_MODULES!r}: importlib.import_module('bench.' + name)\n"
        "print(json.dumps({'path': sys.path, 'modules': sorted(sys.modules),"
        " 'files': sorted(str(getattr(m, '__file__', None)) for m in list(sys.modules.values()))}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    tests_dir = REPO / "tests"
    on_path = [entry for entry in seen["path"] if Path(entry).name == "tests"]
    on_path += [e for e in seen["path"] if e and Path(e).resolve().is_relative_to(tests_dir)]
    assert on_path == []
    assert [name for name in seen["modules"] if _from_tests(name)] == []
    assert [f for f in seen["files"] if Path(f).resolve().is_relative_to(tests_dir)] == []
    assert {"bench.mooncake_cluster", "bench.sglang_server"} <= set(seen["modules"])


def test_no_module_replaces_itself_in_sys_modules():
    """By the code (ast): no module of tests/ or bench/ assigns to `sys.modules[...]` anything
    but None (which tests use to block an import). A module that put another in its own place
    (tests/e2e_support.py and tests/support/mooncake_cluster.py did) hid where its names live."""
    found = []
    for path in sorted([*REPO.glob("bench/*.py"), *REPO.glob("tests/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Assign) or (
                isinstance(node.value, ast.Constant) and node.value.value is None
            ):
                continue
            for target in node.targets:
                if isinstance(target, ast.Subscript) and ast.unparse(target.value) == "sys.modules":
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def test_hicache_storage_config_is_built_in_one_place():
    builders = []
    for path in sorted([*REPO.glob("bench/*.py"), *REPO.glob("tests/**/*.py")]):
        if "sglang_cpu" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
                "HiCacheStorageConfig"
            ):
                builders.append(str(path.relative_to(REPO)))
    assert set(builders) - PENDING_CONFIG_BUILDERS == {"bench/sglang_server.py"}, builders
    from bench.sglang_server import storage_config

    config = storage_config({"a": 1}, model_name="m", tp_size=2)
    assert (config.tp_size, config.model_name, config.extra_config) == (2, "m", {"a": 1})


def test_no_bench_module_silences_logging_at_import():
    """By the code (ast): `logging.disable` only inside functions, never at a module's top
    level, where importing the module (tests/test_bench_cache.py imports bench_cache, which
    imports bench_backend) silenced every later test's warnings and failed their caplog."""
    found = []
    for path in sorted(REPO.glob("bench/*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            found += [
                f"{path.name}:{call.lineno}"
                for call in calls
                if isinstance(call.func, ast.Attribute) and call.func.attr == "disable"
            ]
    assert found == []
