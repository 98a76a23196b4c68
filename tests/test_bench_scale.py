"""bench/bench_scale.py runs end to end on tiny roots (its --quick mode): every phase, the
growth table, and the ledger equal to the disk after every multi-process phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # about 25 s on two busy CPUs


def test_bench_scale_quick(tmp_path):
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_scale.py"),
            "--quick",
            "--only",
            "galahad",
            "--cache",
            str(tmp_path / "cache"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "x10 growth" in result.stdout
    figures = json.loads(out.read_text())["results"]["galahad"]
    assert sorted(figures) == ["200", "2000"]
    for size in figures.values():
        assert size["open warm s"] > 0 and size["verify s"] > 0
        drifts = {name: value for name, value in size.items() if name.startswith("ledger drift")}
        assert drifts and all(value == 0 for value in drifts.values()), drifts
