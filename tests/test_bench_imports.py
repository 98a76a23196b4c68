"""bench/ imports nothing from tests/: the SGLang server harness both use lives in
bench/sglang_server.py, which the tests import as `e2e_support` (the same module object), and
HiCacheStorageConfig is built in one place (sglang_server.storage_config)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# gpu_check.py builds its own: it is one file that also runs on a device machine without SGLang.
PENDING_CONFIG_BUILDERS = {"bench/gpu_check.py"}


def test_bench_serving_imports_with_only_the_repository_on_the_path(tmp_path):
    code = (
        f"import json, sys; sys.path.insert(0, {str(REPO)!r}); import bench.serving, bench.demo\n"
        "print(json.dumps({'path': sys.path, 'modules': sorted(sys.modules)}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    tests_dir = str(REPO / "tests")
    assert tests_dir not in seen["path"]
    assert "e2e_support" not in seen["modules"] and "support" not in seen["modules"]


def test_e2e_support_is_the_bench_harness():
    import e2e_support

    from bench import serving, sglang_server

    assert e2e_support is sglang_server and serving.e2e is sglang_server
    assert e2e_support.start_server.__module__ == "bench.sglang_server"


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
    config = __import__("e2e_support").storage_config({"a": 1}, model_name="m", tp_size=2)
    assert (config.tp_size, config.model_name, config.extra_config) == (2, "m", {"a": 1})
