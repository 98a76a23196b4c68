"""bench/bench_serving.py: how it reads SGLang's client output (fast), and one small run of the
whole benchmark against real CPU servers (e2e, slow)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import bench_serving  # noqa: E402
from bench.load import Neighbours  # noqa: E402


def client_record(ttfts, input_lens, cached, storage):
    return {
        "ttfts": ttfts,
        "input_lens": input_lens,
        "cached_tokens": cached,
        "cached_tokens_details": [{"storage": s} if s else None for s in storage],
        "mean_ttft_ms": 1000 * sum(ttfts) / len(ttfts),
        "p99_ttft_ms": 1000 * max(ttfts),
        "request_throughput": 2.0,
        "total_throughput": 300.0,
        "duration": 2.0,
    }


def test_first_of_group_is_the_first_request_of_each_group_in_sending_order():
    record = client_record(
        ttfts=[0.5, 0.1, 0.2, 0.7],
        input_lens=[100, 100, 200, 200],
        cached=[96, 96, 192, 0],
        storage=[96, 0, 0, 0],
    )
    # requests 0 and 3 open groups 1 and 0 (the client shuffles its requests)
    result = bench_serving.summarise("galahad", "restart", 0, record, [1, 1, 0, 0], ("1", "2"))
    assert result.first_ttft_s == pytest.approx(0.35)  # requests 0 and 2
    assert result.others_ttft_s == pytest.approx(0.4)
    assert result.first_storage_share == pytest.approx(96 / 300)
    assert result.cached_share == pytest.approx(384 / 600)
    assert result.storage_share == pytest.approx(96 / 600)
    assert result.mean_ttft_s == pytest.approx(0.375)


def test_request_groups_come_from_the_clients_prompt_cache(tmp_path):
    cache = tmp_path / ".cache" / "sglang" / "benchmark"
    cache.mkdir(parents=True)
    shared = ["A" * 300, "B" * 300]
    rows = [
        SimpleNamespace(prompt=shared[g] + f"\n\nquestion {i}") for i, g in enumerate([1, 0, 1])
    ]
    (cache / "gen_shared_prefix_42_2_2_x.pkl").write_bytes(pickle.dumps(rows))
    assert bench_serving.request_groups(tmp_path, 3) == [0, 1, 0]
    with pytest.raises(RuntimeError):
        bench_serving.request_groups(tmp_path, 4)


def test_spin_modes_keep_libgomps_default_wait():
    assert bench_serving.mode_env("galahad-spin") == {"OMP_WAIT_POLICY": ""}
    assert bench_serving.mode_env("galahad") == {}
    assert bench_serving.MODES["galahad-generic-spin"] == bench_serving.MODES["galahad-generic"]
    assert bench_serving.peer("galahad-spin", "file", ["file", "file-spin"]) == "file-spin"
    assert bench_serving.peer("galahad", "none", ["file"]) is None


def test_neighbours_are_busy_until_stopped_by_pid():
    neighbours = Neighbours(2)
    try:
        assert len(neighbours.pids) == 2
        for pid in neighbours.pids:  # each has exec'd its busy loop (not only forked)
            deadline = time.monotonic() + 30
            while b"while True" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                assert time.monotonic() < deadline, pid
                time.sleep(0.05)
    finally:
        pids = neighbours.pids
        neighbours.stop()
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline")
        assert not cmdline.exists() or b"while True" not in cmdline.read_bytes(), pid


@pytest.mark.e2e
@pytest.mark.slow
def test_small_run_end_to_end(tmp_path):
    """SGLang's client against the tiny model: a cold and a restarted server, and the warm-hit
    vs restored part, for GalahadStorage (four server starts: the other modes differ only in
    the server's flags)."""
    out = tmp_path / "result.json"
    command = [
        sys.executable, str(REPO_ROOT / "bench" / "bench_serving.py"),
        "--size", "tiny", "--modes", "galahad",
        "--groups", "2", "--prompts-per-group", "2", "--system-len", "200",
        "--question-len", "16", "--output-len", "2", "--max-total-tokens", "4096",
        "--warm-lengths", "256", "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    runs = {(r["mode"], r["phase"]): r for r in result["runs"]}
    assert set(runs) == {("galahad", "cold"), ("galahad", "restart")}
    assert runs["galahad", "cold"]["storage_share"] == 0
    # after the restart, the first request of each group reads its prompt from storage
    assert runs["galahad", "restart"]["first_storage_share"] > 0.5
    warm = {w["mode"]: w for w in result["warm"]}
    assert warm["galahad"]["restored_storage_tokens"] >= 240
    assert "Warm hit vs restored" in proc.stdout
