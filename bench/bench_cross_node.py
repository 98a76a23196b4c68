"""Two nodes, one Mooncake cluster: what node B pays for a prompt node A read.

Part 1, time to first token on the CPU demo model (a real Mooncake master and store daemon on
loopback; each server has its own local root, as two machines would):
  - node A (GalahadStorage + Mooncake) reads a ~4k-token document, then stops;
  - node B, fresh local root: the same prompt, restored through Mooncake;
  - node B restarted: the same prompt, now from its own local disk (written through);
  - a server without storage: the same prompt, recomputed.
Part 2, read throughput from the same cluster, the same pages (8 MiB bf16 KV pages in a real
host pool): SGLang's own `mooncake` backend against ours (its local records cleared before each
round, so every page comes from Mooncake and is verified, copied into the pool and written
through to the local disk), and against the part of ours before the write-through; interleaved
rounds, median and best of each, as ratios to SGLang's.

Usage: .venv/bin/python bench/bench_cross_node.py [--words 1600] [--rounds 3] [--part all|ttft|throughput]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import serving  # noqa: E402
from bench.bench_store import machine  # noqa: E402
from bench.demo import prompt, synthetic_document  # noqa: E402
from bench.mooncake_cluster import ENV, MooncakeCluster  # noqa: E402

PAGE_SIZE = 16
MAX_NEW_TOKENS = 8
PAGE_8_MIB = (64, 64, 8, 64)  # layers, tokens per page, KV heads, head dim: bf16 K and V, 8 MiB


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

    from bench.bench_backend import host_pool, storage_config

    cluster = MooncakeCluster(work / "mooncake-tp", segment_bytes=2 << 30).start()
    os.environ.update(ENV)
    try:
        layers, page_tokens, heads, head_dim = PAGE_8_MIB
        pages = 24
        host = host_pool(layers, page_tokens, heads, head_dim, pages)
        page_bytes = host.get_dummy_flat_data_page().numel() * 2
        assert page_bytes == 8 << 20, page_bytes
        source = torch.arange(page_tokens, (pages + 1) * page_tokens, dtype=torch.int64)
        target = torch.arange(
            (pages + 1) * page_tokens, (2 * pages + 1) * page_tokens, dtype=torch.int64
        )
        tier = cluster.tier_config(transfer_buffer_bytes="256MiB", timeout_s=30)
        writer = _galahad(host, work / "writer", tier)
        keys = [f"tp{index:062x}" for index in range(pages)]
        assert writer.batch_set_v1(keys, source) == [True] * pages
        assert writer.store.tier.flush(120)
        writer.close()
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
        # One long-lived reader, as SGLang's backend is; its local records are cleared before
        # each of its rounds, so every page comes from Mooncake.
        reader = _galahad(host, work / "reader", tier)
        namespace = reader.binder.kv().namespace
        slots = [int(slot) for slot in target[::page_tokens]]

        def ours() -> None:
            assert reader.batch_get_v1(keys, target) == [True] * pages

        def ours_no_write_through() -> None:
            assert _tier_read(reader, namespace, keys, slots, page_bytes) == pages

        def theirs() -> None:
            assert all(sglang_mooncake.batch_get_v1(sglang_keys, target))

        runs = {
            "SGLang mooncake (batch_get_into into the pool)": theirs,
            "GalahadStorage (verified, written through)": ours,
            "  of which: tier read, verify, copy to pool": ours_no_write_through,
        }
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        loads = []
        for _ in range(rounds):  # interleaved: each round runs each reader once
            for name, run in runs.items():
                reader.store.clear_namespace(namespace)
                loads.append(os.getloadavg()[0])
                start_s = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start_s)
                assert reader.store.flush_write_through(60)  # not timed: before the next run
        layout = reader.binder.kv().layout
        for slot, source_slot in zip(slots, source[::page_tokens].tolist(), strict=True):
            assert layout.segments(slot) == layout.segments(source_slot), "a page differs"
        print(f"tier counters: {reader.store.tier.counters()}")
        reader.close()
    finally:
        cluster.stop()
    total = pages * page_bytes
    print(
        f"\n## Reading {pages} pages of {page_bytes >> 20} MiB from one Mooncake cluster "
        "(loopback TCP), "
        f"{rounds} interleaved rounds; 1-min load during the rounds "
        f"{min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores"
    )
    base = statistics.median(seconds["SGLang mooncake (batch_get_into into the pool)"])
    best_base = min(seconds["SGLang mooncake (batch_get_into into the pool)"])
    print(f"{'':48s} {'median':>11s} {'ratio':>6s} {'best':>11s} {'ratio':>6s}")
    for name, values in seconds.items():
        median, best = statistics.median(values), min(values)
        print(
            f"{name:48s} {total / median / 1e9:6.2f} GB/s {base / median:6.2f} "
            f"{total / best / 1e9:6.2f} GB/s {best_base / best:6.2f}"
        )


def _tier_read(reader, namespace, keys: list[str], slots: list[int], page_bytes: int) -> int:
    """What TieredStore does for pages it reads from Mooncake, minus the write-through to
    the local disk: MooncakeTier.get_many, every rule of FORMAT.md, the copy into the pool."""
    from hicache_galahad.tier.tiered import _value_bound, shared_key

    store = reader.store
    layout = reader.binder.kv().layout
    values = store.tier.get_many(
        [shared_key(namespace, key) for key in keys], [_value_bound(page_bytes)] * len(keys)
    )
    hits = 0
    for key, slot, value in zip(keys, slots, values, strict=True):
        raw = store.local.decode_value(namespace, key, value, page_bytes)
        offset = 0
        for piece in layout.segments(slot):
            piece[:] = raw[offset : offset + len(piece)]
            offset += len(piece)
        hits += 1
    return hits


def _galahad(host, root: Path, tier: dict):
    from bench.bench_backend import galahad_backend

    backend = galahad_backend(
        host, str(root.parent), root.name, model_fingerprint="bench-cross-node", mooncake=tier
    )
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
