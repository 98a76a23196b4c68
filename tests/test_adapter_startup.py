"""GalahadStorage's constructor makes SGLang's storage-key hash ready (serving/startup.py): on an
empty TORCH_EXTENSIONS_DIR it returns only once the extension is built and loaded in its own
process, so the first prefetch pays nothing; a build that cannot happen, or a lock held by
another process, is logged once and the backend is constructed all the same.

Each case runs the real constructor (SGLang's `dynamic` factory) in a fresh interpreter, since
SGLang caches the loaded extension per process and reads TORCH_EXTENSIONS_DIR when it loads.
The first case builds the extension (8-20 s of g++ on 2 cores)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXTENSION = "hicache_hash_cpp"

CHILD = """
import json, logging, sys, time
sys.path[:0] = [{repo!r}, {tests!r}]
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("hicache_galahad").addHandler(Keep())
logging.getLogger("hicache_galahad").setLevel(logging.INFO)
from sglang.srt.mem_cache.cpp_utils import native_hash
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from bench.sglang_server import galahad_config, storage_config
import hicache_galahad.serving.startup as startup
startup.KEY_HASH_WAIT_S = {wait_s!r}
started = time.monotonic()
backend = StorageBackendFactory.create_backend(
    "dynamic", storage_config(galahad_config({root!r}, model_fingerprint="startup-test")), None
)
constructed_s = time.monotonic() - started
print("RESULT " + json.dumps({{
    "constructed_s": constructed_s,
    "startup": vars(backend.key_hash_startup),
    "loaded_in_process": native_hash._load_native_hash_module.cache_info().currsize,
    "logged": [r for r in records if "storage-key hash" in r[1]],
}}), flush=True)
"""


def construct(tmp_path: Path, extensions_dir: Path, wait_s: float = 300.0) -> dict:
    """Constructs GalahadStorage in a fresh interpreter with `extensions_dir` as
    TORCH_EXTENSIONS_DIR; returns what the child saw."""
    script = CHILD.format(
        repo=str(REPO), tests=str(REPO / "tests"), root=str(tmp_path / "store"), wait_s=wait_s
    )
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.slow
def test_constructor_builds_the_key_hash_on_an_empty_extension_dir(tmp_path):
    extensions = tmp_path / "torch_ext"  # empty: a new container, an upgrade
    seen = construct(tmp_path, extensions)
    assert seen["startup"]["outcome"] == "ready", seen
    assert seen["loaded_in_process"] == 1  # SGLang's own loader: cached for the prefetch thread
    assert (extensions / EXTENSION / f"{EXTENSION}.so").is_file()
    assert [level for level, _ in seen["logged"]] == ["INFO"], seen["logged"]


def test_a_build_that_cannot_happen_is_logged_once_and_the_backend_starts(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("a file where the extension directory should be")
    seen = construct(tmp_path, not_a_dir / "torch_ext")
    assert seen["startup"]["outcome"] == "failed", seen
    assert "Failed to load HiCache native hash extension" in seen["startup"]["error"]
    assert seen["loaded_in_process"] == 0
    ((level, message),) = seen["logged"]
    assert level == "WARNING" and "the server starts" in message


def test_a_lock_held_elsewhere_bounds_the_wait(tmp_path):
    """Another process holds SGLang's build lock (a build of another rank, or a stuck one): the
    constructor waits at most KEY_HASH_WAIT_S, says so, and the backend starts."""
    extensions = tmp_path / "torch_ext"
    extensions.mkdir()
    with open(extensions / f".{EXTENSION}.sglang.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # the lock SGLang's loader takes
        seen = construct(tmp_path, extensions, wait_s=1.0)
    assert seen["startup"]["outcome"] == "still waiting", seen
    assert 1.0 <= seen["startup"]["waited_s"] < 30.0
    assert seen["loaded_in_process"] == 0
    ((level, message),) = seen["logged"]
    assert level == "WARNING" and "TORCH_EXTENSIONS_DIR" in message
