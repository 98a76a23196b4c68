"""Two nodes, one Mooncake cluster: what node B pays for a prompt node A read.

Part 1, time to first token on the CPU demo model (a real Mooncake master and store daemon on
loopback; each server has its own local root, as two machines would):
  - node A (GalahadStorage + Mooncake) reads a ~4k-token document, then stops;
  - node B, fresh local root: the same prompt, restored through Mooncake;
  - node B restarted: the same prompt, now from its own local disk (written through);
  - a server without storage: the same prompt, recomputed.
Part 2, read throughput from the same cluster, the same pages (8 MiB bf16 KV pages in a real
host pool): our backend (empty local root, so every page comes from Mooncake, verified) against
SGLang's own `mooncake` backend, alternating rounds, best of each.

Usage: .venv/bin/python bench/bench_cross_node.py [--words 1600] [--rounds 3] [--part all|ttft|throughput]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))

from mooncake_cluster import ENV, MooncakeCluster  # noqa: E402

from bench import serving  # noqa: E402
from bench.bench_store import machine  # noqa: E402
from bench.demo import prompt, synthetic_document  # noqa: E402

PAGE_SIZE = 16
MAX_NEW_TOKENS = 8


def load_average() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def galahad_args(root: Path, cluster: MooncakeCluster | None) -> list[str]:
    options = {"mooncake": cluster.tier_config()} if cluster else {}
    return serving.server_args(
        "galahad", root, page_size=PAGE_SIZE, max_tokens=8192, galahad_options=options
    )


def timed(model, args, log: Path, text: str, connected: bool = False) -> serving.Timed:
    os.environ.update(ENV)
    server = serving.start(model, args, log)
    try:
        if connected:
            serving.e2e.wait_for(
                lambda: "mooncake tier connected" in serving.e2e.server_log(server), 60
            )
        return serving.stream_generate(server, text, MAX_NEW_TOKENS)
    finally:
        server.stop()


def ttft(work: Path, words: int) -> None:
    model = serving.e2e.ensure_model("llama", "demo")
    cluster = MooncakeCluster(work / "mooncake", segment_bytes=2 << 30).start()
    try:
        text = prompt(synthetic_document(words), "How many records were verified?")
        a, b = work / "node-a", work / "node-b"
        node_a = timed(model, galahad_args(a, cluster), work / "a.log", text, connected=True)
        tokens = int(node_a.meta_info.get("prompt_tokens", 0))
        serving.wait_for_records(a, (tokens - 1) // PAGE_SIZE - 8, "ns/*/*.rec")
        time.sleep(3)  # the write-behind queue drains into Mooncake
        rows = {}
        rows["B through Mooncake"] = timed(
            model, galahad_args(b, cluster), work / "b1.log", text, connected=True
        )
        serving.wait_for_records(b, (tokens - 1) // PAGE_SIZE - 8, "ns/*/*.rec")
        cluster.kill_master()  # B's own disk alone now
        rows["B from its local disk"] = timed(model, galahad_args(b, None), work / "b2.log", text)
        plain = serving.server_args("none", None, page_size=PAGE_SIZE, max_tokens=8192)
        rows["B recomputing"] = timed(model, plain, work / "b3.log", text)
    finally:
        cluster.stop()
    recompute = rows["B recomputing"].ttft_s
    print(f"\n## TTFT of node A's {tokens}-token prompt on node B (demo model, page {PAGE_SIZE})")
    print(
        f"{'node B':24s} {'TTFT':>8s} {'/recompute':>10s} {'from storage':>12s} {'same output':>11s}"
    )
    for name, row in rows.items():
        same = row.output_ids == rows["B recomputing"].output_ids
        print(
            f"{name:24s} {row.ttft_s:7.2f}s {row.ttft_s / recompute:10.0%} "
            f"{row.storage_tokens:12d} {str(same):>11s}"
        )


def throughput(work: Path, rounds: int) -> None:
    import logging

    import torch

    logging.disable(logging.WARNING)
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from bench.bench_backend import GEOMETRIES, host_pool, storage_config

    cluster = MooncakeCluster(work / "mooncake-tp", segment_bytes=2 << 30).start()
    os.environ.update(ENV)
    try:
        layers, page_tokens, heads, head_dim = GEOMETRIES["8 MiB"]
        pages = 24
        host = host_pool(layers, page_tokens, heads, head_dim, pages)
        page_bytes = host.get_dummy_flat_data_page().numel() * 2
        source = torch.arange(page_tokens, (pages + 1) * page_tokens, dtype=torch.int64)
        target = torch.arange(
            (pages + 1) * page_tokens, (2 * pages + 1) * page_tokens, dtype=torch.int64
        )
        tier = cluster.tier_config(transfer_buffer_bytes="256MiB", timeout_s=30)
        writer = _galahad(host, work / "writer", tier)
        reader_root = work / "reader"
        keys = [f"tp{index:062x}" for index in range(pages)]
        assert writer.batch_set_v1(keys, source) == [True] * pages
        assert writer.store.tier.flush(120)
        sglang_mooncake = StorageBackendFactory.create_backend(
            "mooncake",
            storage_config(
                {
                    "master_server_address": cluster.master_address,
                    "metadata_server": "P2PHANDSHAKE",
                    "protocol": "tcp",
                    "local_hostname": "127.0.0.1",
                    "global_segment_size": 0,
                    "local_buffer_size": 512 << 20,
                    "device_name": "",
                }
            ),
            host,
        )
        if getattr(sglang_mooncake, "mem_pool_host", None) is None:
            sglang_mooncake.register_mem_pool_host(host)
        sglang_keys = [f"sg{index:062x}" for index in range(pages)]
        assert all(sglang_mooncake.batch_set_v1(sglang_keys, source))
        best = {
            "GalahadStorage (verified, from Mooncake)": float("inf"),
            "SGLang mooncake": float("inf"),
        }
        for _ in range(rounds):
            shutil.rmtree(reader_root, ignore_errors=True)
            reader = _galahad(host, reader_root, tier)
            start_s = time.perf_counter()
            assert reader.batch_get_v1(keys, target) == [True] * pages
            best["GalahadStorage (verified, from Mooncake)"] = min(
                best["GalahadStorage (verified, from Mooncake)"], time.perf_counter() - start_s
            )
            reader.close()
            start_s = time.perf_counter()
            assert all(sglang_mooncake.batch_get_v1(sglang_keys, target))
            best["SGLang mooncake"] = min(best["SGLang mooncake"], time.perf_counter() - start_s)
        writer.close()
    finally:
        cluster.stop()
    total = pages * page_bytes
    print(f"\n## Reading {pages} pages of 8 MiB from one Mooncake cluster (loopback TCP)")
    base = total / best["SGLang mooncake"] / 1e9
    for name, seconds in best.items():
        rate = total / seconds / 1e9
        print(f"{name:42s} {rate:6.2f} GB/s {rate / base:6.2f}x")


def _galahad(host, root: Path, tier: dict):
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from bench.bench_backend import storage_config

    backend = StorageBackendFactory.create_backend(
        "dynamic",
        storage_config(
            {
                "backend_name": "galahad",
                "module_path": "hicache_galahad",
                "class_name": "GalahadStorage",
                "root": str(root),
                "model_fingerprint": "bench-cross-node",
                "mooncake": tier,
            }
        ),
        host,
    )
    backend.register_mem_pool_host(host)
    backend.register_mem_host_pool_v2(host, PoolName.KV)
    deadline = time.monotonic() + 60
    while not backend.store.tier.available:
        assert time.monotonic() < deadline, "Mooncake never connected"
        time.sleep(0.1)
    return backend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--words", type=int, default=1600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--part", choices=("all", "ttft", "throughput"), default="all")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="galahad-bench-cross-node-"))
    print(f"# bench_cross_node on {machine()}; load {load_average()}")
    try:
        if args.part in ("all", "ttft"):
            ttft(work, args.words)
        if args.part in ("all", "throughput"):
            throughput(work, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
