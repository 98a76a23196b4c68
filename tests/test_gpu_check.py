"""bench/gpu_check.sh on its CPU path, as CI runs it: no CUDA, so bench/gpu_check.py restores
1k-token prefixes of a tiny geometry from disk into "device" (CPU) buffers under the CPU harness,
with real SGLang pools, GalahadStorage and HiCacheFile through SGLang's factory, every restored
page compared with what was stored. The GPU numbers need a GPU machine (docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_cpu_path_writes_its_results(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_CHECK_ARGS="--tokens 1024 --rounds 1")
    proc = subprocess.run(
        [str(REPO_ROOT / "bench" / "gpu_check.sh"), "150"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["env"]["device"] == "cpu" and results["env"]["sglang"] == "imports"
    rows = {(row["case"], row["step"]): row for row in results["rows"]}
    for case in ("store", "sglang-galahad", "sglang-hicachefile"):
        for temperature in ("cold", "warm"):
            row = rows[(case, f"disk -> device ({temperature})")]
            assert row["tokens"] == 1024 and row["bytes"] > 0 and row["GB_per_s"] > 0, row
    assert ("raw", "pinned host -> device") in rows
    assert not [key for key in rows if key[1].startswith(("FAILED", "skipped"))], rows
    assert "| store | disk -> device (cold) | 1024 |" in (out / "results.md").read_text()
    assert (out / "env.txt").is_file() and (out / "gpu_check.log").is_file()
