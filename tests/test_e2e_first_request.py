"""The first request after a restart restores what the store holds (issue 31), under SGLang's
default prefetch policy (`timeout`: a prefetch gives up after about a second), when the restart
must build SGLang's storage-key hash extension first: on an empty TORCH_EXTENSIONS_DIR (a new
container, an upgrade) at TP=1, and at TP=2 on one that another path's build just used (two
venvs or checkouts sharing it; both ranks then wait on one build lock).

Each test: a server stores a document (`hicache_galahad.warm`, on the checkout's extension
directory), is SIGKILLed, restarts on the populated store with the other directory, `galahad
ready` says how many tokens a request restores, and the first request after health restores
exactly that from storage. Before the fix the build ran in the prefetch thread of that first
request: 0 restored (both tests, on fd5324f). Two server starts per test: 47-86 s at TP=1 and
48-93 s at TP=2 on 2 shared cores, with the extension build inside each restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_e2e_tp import TP
from test_e2e_warm import TEXT, galahad, sigkill, tokenize

import hicache_galahad
from bench import sglang_server as e2e

pytestmark = pytest.mark.e2e

PAGE_SIZE = 4
DOCUMENT = " ".join([TEXT] * 3)
EXTENSION = "hicache_hash_cpp"

# Builds SGLang's key-hash extension from a copy of its source at another path into the
# TORCH_EXTENSIONS_DIR it is given: what another venv or checkout sharing the directory does.
OTHER_PATH_BUILD = """
import os, shutil, sys
from sglang.srt.mem_cache.cpp_utils import native_hash
from sglang.srt.utils.cpp_extension_loader import load_extension_with_recovery
source = os.path.join(os.path.dirname(native_hash.__file__), "hash_binding.cpp")
copy = os.path.join(sys.argv[1], "hash_binding.cpp")
os.makedirs(sys.argv[1], exist_ok=True)
shutil.copyfile(source, copy)
load_extension_with_recovery(
    name="hicache_hash_cpp", sources=[copy], extra_cflags=["-O3", "-std=c++17", "-DNDEBUG"],
    extra_ldflags=["-lcrypto"], with_cuda=False,
)
"""


def server_args(root: Path, *parallel: str) -> list[str]:
    """GalahadStorage flags with SGLang's default prefetch policy: no policy flag at all."""
    config = e2e.galahad_config(root, interface_v1=1)
    args = e2e.hicache_args(
        "page_first_direct",
        backend="dynamic",
        extra_config=config,
        page_size=PAGE_SIZE,
        prefetch_policy=None,
    )
    assert "--hicache-storage-prefetch-policy" not in args
    return ["--max-total-tokens", "4096", "--skip-server-warmup", *parallel, *args]


def built_since(extensions: Path, since_s: float) -> bool:
    """Whether the extension in this directory was (re)built after `since_s` (wall clock).
    (ninja's own log cannot say: two ninja versions, the venv's and the system's, each discard
    the other's log format.)"""
    library = extensions / EXTENSION / f"{EXTENSION}.so"
    return library.is_file() and library.stat().st_mtime >= since_s


def store_restart_first_request(
    model_dir: Path,
    tmp_path: Path,
    extensions: Path,
    *parallel: str,
    before_restart: Callable[[], None] = lambda: None,
    timeout_s: float = 240,
) -> None:
    """Stores the document through one server, SIGKILLs it, restarts it with `extensions` as
    TORCH_EXTENSIONS_DIR, and checks the first request against `galahad ready`."""
    root, document = tmp_path / "store", tmp_path / "chapel.txt"
    document.write_text(DOCUMENT)
    args = server_args(root, *parallel)
    server = e2e.start_server(model_dir, args, log_path=tmp_path / "store.log", timeout_s=timeout_s)
    try:
        prompt = tokenize(server, DOCUMENT)
        (stored,) = hicache_galahad.warm(server.url, [document], root=str(root))
        assert stored.complete and stored.tokens == len(prompt), stored
    finally:
        sigkill(server)

    before_restart()
    restarted_s = time.time()
    server = e2e.start_server(
        model_dir,
        args,
        env={"TORCH_EXTENSIONS_DIR": str(extensions)},
        log_path=tmp_path / "restart.log",
        timeout_s=timeout_s,
    )
    try:
        # --no-probe: the probe is a request of its own (a stored prefix, restored into the
        # device cache), and the request below must be the first since the start.
        ready = galahad(
            "ready",
            "--server",
            server.url,
            "--root",
            str(root),
            "--no-probe",
            "--json",
            str(document),
        )
        assert ready.returncode == 0, ready.stdout + ready.stderr
        (state,) = json.loads(ready.stdout)["documents"]
        restorable = state["restorable_tokens"]
        assert restorable == (len(prompt) - 1) // PAGE_SIZE * PAGE_SIZE > 0

        first = e2e.generate(server, prompt, 4)  # the first request since the start
        e2e.assert_cached(first, storage=restorable)

        # the restart built the extension in this directory, every rank loaded it before health
        assert built_since(extensions, restarted_s)
        log = e2e.server_log(server)
        ranks = int(dict(zip(parallel, parallel[1:], strict=False)).get("--tp-size", 1))
        assert log.count("storage-key hash ready after") == ranks, log[-4000:]
        e2e.assert_storage_healthy(server, "storage-key hash still not ready")
    finally:
        server.stop()


def test_first_request_restores_on_an_empty_extension_dir(tiny_model, tmp_path):
    extensions = tmp_path / "torch_ext"  # empty: a new container, an upgrade of torch/SGLang
    store_restart_first_request(tiny_model, tmp_path, extensions)


@pytest.mark.slow
def test_first_request_restores_at_tp2_after_another_paths_build(tiny_model, tmp_path):
    """Both ranks' backends load the extension: one rebuilds it (another path's build just
    replaced it) while the other waits on SGLang's build lock, then loads it."""
    extensions = tmp_path / "torch_ext"
    other = subprocess.Popen(  # builds while the first server starts
        [sys.executable, "-c", OTHER_PATH_BUILD, str(tmp_path / "other-checkout")],
        env=dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def other_path_built() -> None:
        output, _ = other.communicate(timeout=600)
        assert other.returncode == 0, output[-3000:]
        assert built_since(extensions, 0)

    try:
        store_restart_first_request(
            tiny_model, tmp_path, extensions, *TP, before_restart=other_path_built, timeout_s=400
        )
    finally:
        e2e.kill_process_group(other.pid, other, grace_s=0)
