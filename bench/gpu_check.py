"""Restoring long prefixes from disk into GPU memory: GalahadStorage against the physical limit
(the raw pinned-host-to-device copy of the same bytes) and against SGLang's HiCacheFile.

Per prefix (4k-32k tokens by default on a GPU) of a Llama-3-8B-shaped KV cache (32 layers,
8 KV heads of 128, bf16, pages of 64 tokens: 8 MiB a page, 128 KiB a token):

  raw          pinned host buffer -> device buffer, one copy: the physical limit;
  store        GalahadStorage's record store reads every page's record (cold: every file
               dropped from the page cache first; warm: again, cached) straight into pinned
               host pages (preadv, no staging copy), then one copy to the device and the
               scatter into the device KV pool's per-layer K/V tensors; needs no SGLang;
  sglang-*     where SGLang imports (a CPU machine with the project venv; a GPU machine with
               SGLang): real SGLang pools, the device MHATokenToKVPool in device memory and the
               host pool pinned, page_first_direct; GalahadStorage (batch_get_v1) and HiCacheFile
               (batch_get_v2) loaded through SGLang's StorageBackendFactory, then SGLang's own
               host -> device load of every layer (io backend "direct").

Every restored device KV buffer is compared with what was stored. Results go to OUT/results.json
(rows) and OUT/results.md (a table); OUT/env.txt says what ran where. The run stops starting new
prefixes when the time limit is near. Without CUDA everything runs on the CPU ("device" = cpu,
and a small geometry unless --geometry says otherwise): the path CI runs.

Usage: python bench/gpu_check.py --out DIR [--limit-s 420] [--tokens 4096,8192,16384,32768]
           [--geometry llama3-8b|tiny] [--device auto|cpu|cuda] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.cold_cache import drop_cache  # noqa: E402
from hicache_galahad.record.namespace import Namespace  # noqa: E402
from hicache_galahad.store import RecordStore  # noqa: E402

# name -> (layers, kv heads, head dim, page tokens)
GEOMETRIES = {"llama3-8b": (32, 8, 128, 64), "tiny": (4, 2, 32, 16)}
DTYPE = torch.bfloat16


class Clock:
    def __init__(self, limit_s: float):
        self.deadline = time.monotonic() + limit_s

    def left(self) -> float:
        return self.deadline - time.monotonic()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, fn) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def pinned(nbytes: int, device: torch.device) -> torch.Tensor:
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    return buffer.pin_memory() if device.type == "cuda" else buffer


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


# ------------------------------------------------------------------------------------------------
# Without SGLang: the record store into pinned host pages, then one copy and the scatter
# ------------------------------------------------------------------------------------------------


def run_store(device, geometry, tokens, rounds, work, rows, seed=0) -> None:
    layers, heads, head_dim, page = geometry
    pages = tokens // page
    page_bytes = 2 * layers * page * heads * head_dim * DTYPE.itemsize
    total = pages * page_bytes
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(0, 256, (total,), dtype=torch.uint8, generator=generator)
    host = pinned(total, device)
    host_pages = host.view(pages, page_bytes)
    staging = torch.empty(total, dtype=torch.uint8, device=device)
    # SGLang's device pool keeps K and V per layer as [tokens, heads, head_dim]
    kv = torch.empty(layers, 2, tokens, heads, head_dim, dtype=DTYPE, device=device)
    # page_first_direct host pages: [page][layer][k|v][token][head][dim]
    expected = (
        source.view(DTYPE)
        .view(pages, layers, 2, page, heads, head_dim)
        .permute(1, 2, 0, 3, 4, 5)
        .reshape(layers, 2, tokens, heads, head_dim)
    )

    def to_device():
        staging.copy_(host, non_blocking=True)
        kv.view(layers, 2, pages, page, heads, head_dim).copy_(
            staging.view(DTYPE)
            .view(pages, layers, 2, page, heads, head_dim)
            .permute(1, 2, 0, 3, 4, 5)
        )

    host.copy_(source)
    raw = min(timed(device, lambda: staging.copy_(host, non_blocking=True)) for _ in range(rounds))
    rows.append(row("raw", "pinned host -> device", tokens, total, raw, raw))

    root = os.path.join(work, f"store-{tokens}")
    namespace = Namespace("bench", "gpu-check", "kv", {"page_bytes": page_bytes, "tokens": page})
    keys = [f"{tokens:08x}{index:056x}" for index in range(pages)]
    with RecordStore(root) as store:
        start = time.perf_counter()
        assert all(store.put_many(namespace, keys, list(source.view(pages, page_bytes).numpy())))
        write_s = time.perf_counter() - start
        rows.append(row("store", "write (records)", tokens, total, write_s, raw))
        for temperature in ("cold", "warm"):
            best = best_load = float("inf")
            for _ in range(rounds):
                host.zero_()
                kv.zero_()
                if temperature == "cold":
                    drop_cache(root)
                outs = [memoryview(host_pages[index].numpy()) for index in range(pages)]
                read = timed(device, lambda outs=outs: store.get_many_into(namespace, keys, outs))
                load = timed(device, to_device)
                best, best_load = min(best, read + load), min(best_load, load)
            same = torch.equal(kv.cpu().view(torch.uint8), expected.contiguous().view(torch.uint8))
            assert same, "restored KV differs from what was stored"
            rows.append(row("store", f"disk -> device ({temperature})", tokens, total, best, raw))
        rows.append(row("store", "host -> device + scatter", tokens, total, best_load, raw))


# ------------------------------------------------------------------------------------------------
# With SGLang: real pools, GalahadStorage and HiCacheFile through the factory
# ------------------------------------------------------------------------------------------------


def sglang_available() -> str | None:
    """None if SGLang's pools and storage factory import, else why not."""
    try:
        import sglang  # noqa: F401
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: F401
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: F401
        from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: F401
    except Exception as error:  # any import-time need the machine lacks
        return f"{type(error).__name__}: {error}"
    return None


def run_sglang(device, geometry, tokens, rounds, work, rows) -> None:
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheFile,
        HiCacheStorageConfig,
        PoolName,
        PoolTransfer,
    )
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    layers, heads, head_dim, page = geometry
    pages = tokens // page
    capacity = (pages + 1) * page
    device_pool = MHATokenToKVPool(
        capacity, page, DTYPE, heads, head_dim, layers, str(device), False,
        start_layer=0, end_layer=layers - 1,
    )  # fmt: skip
    host = MHATokenToKVPoolHost(
        device_pool.get_device_pool_infos()[0].buffer_info,
        1.0,
        0,
        page,
        "page_first_direct",
        pin_memory=device.type == "cuda",
        device_capacity_tokens=device_pool.size,
        start_layer=0,
        end_layer=layers - 1,
    )
    generator = torch.Generator().manual_seed(1)
    host.kv_buffer.copy_(torch.randn(host.kv_buffer.shape, generator=generator).to(DTYPE))
    slots = torch.arange(page, (pages + 1) * page, dtype=torch.int64)  # host slots = device slots
    starts = slots[::page].tolist()
    stored = [host.get_data_page(start, flat=True).clone() for start in starts]
    page_bytes = host.get_dummy_flat_data_page().numel() * DTYPE.itemsize
    total = pages * page_bytes
    keys = [f"{tokens:08x}{index:056x}" for index in range(pages)]

    def config(extra):
        return HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="gpu-check", extra_config=extra,
        )  # fmt: skip

    galahad = StorageBackendFactory.create_backend(
        "dynamic",
        config(
            {
                "backend_name": "galahad",
                "module_path": "hicache_galahad",
                "class_name": "GalahadStorage",
                "root": os.path.join(work, f"galahad-{tokens}"),
                "model_fingerprint": "gpu-check",
            }
        ),  # fmt: skip
        host,
    )
    galahad.register_mem_pool_host(host)
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = os.path.join(work, f"file-{tokens}")
    hicache_file = HiCacheFile(config({}))
    hicache_file.register_mem_pool_host(host)
    hicache_file.register_mem_host_pool_v2(host, PoolName.KV)
    transfer = [PoolTransfer(name=PoolName.KV, host_indices=slots, keys=keys)]
    cases = {
        "sglang-galahad": (
            lambda: galahad.batch_set_v1(keys, slots),
            lambda: galahad.batch_get_v1(keys, slots),
            galahad.store.root,
        ),
        "sglang-hicachefile": (
            lambda: hicache_file.batch_set_v2(transfer),
            lambda: hicache_file.batch_get_v2(transfer),
            os.path.join(work, f"file-{tokens}"),
        ),
    }

    def load_all_layers():
        for layer in range(layers):
            host.load_to_device_per_layer(device_pool, slots, slots, layer, "direct")

    raw_host = pinned(total, device)
    raw_device = torch.empty(total, dtype=torch.uint8, device=device)
    raw = min(
        timed(device, lambda: raw_device.copy_(raw_host, non_blocking=True)) for _ in range(rounds)
    )
    rows.append(row("sglang-raw", "pinned host -> device", tokens, total, raw, raw))
    load = min(timed(device, load_all_layers) for _ in range(rounds))
    rows.append(
        row("sglang-host-load", "host pool -> device pool (direct)", tokens, total, load, raw)
    )
    try:
        measure_backends(
            cases,
            device,
            rounds,
            host,
            starts,
            stored,
            pages,
            tokens,
            total,
            raw,
            rows,
            load_all_layers,
        )
    finally:
        if hasattr(galahad, "close"):
            galahad.close()


def measure_backends(
    cases, device, rounds, host, starts, stored, pages, tokens, total, raw, rows, load_all_layers
):
    for name, (write, read, directory) in cases.items():
        start = time.perf_counter()
        results = write()
        assert all(results) if isinstance(results, list) else results, f"{name}: write failed"
        rows.append(row(name, "write", tokens, total, time.perf_counter() - start, raw))
        for temperature in ("cold", "warm"):
            best = float("inf")
            for _ in range(rounds):
                host.kv_buffer.zero_()
                if temperature == "cold":
                    drop_cache(directory)

                def restore(read=read, name=name):
                    count = hits(read())
                    assert count == pages, f"{name}: {count} of {pages} pages read"
                    load_all_layers()

                best = min(best, timed(device, restore))
            restored = [host.get_data_page(start, flat=True) for start in starts]
            assert all(map(torch.equal, restored, stored)), f"{name}: restored pages differ"
            rows.append(row(name, f"disk -> device ({temperature})", tokens, total, best, raw))


# ------------------------------------------------------------------------------------------------


def hits(got) -> int:
    """Pages a backend says it read: a count, a list of flags, or per pool (v2)."""
    if isinstance(got, dict):
        return min((hits(value) for value in got.values()), default=0)
    if isinstance(got, (list, tuple)):
        return sum(map(bool, got))
    return int(got)


def row(case, step, tokens, nbytes, seconds, raw_s) -> dict:
    return {
        "case": case,
        "step": step,
        "tokens": tokens,
        "bytes": nbytes,
        "seconds": round(seconds, 6),
        "GB_per_s": round(gbps(nbytes, seconds), 3),
        "x_raw": round(seconds / raw_s, 2) if raw_s > 0 else None,
    }


def write_results(out, rows, env) -> None:
    with open(os.path.join(out, "results.json"), "w") as handle:
        json.dump({"env": env, "rows": rows}, handle, indent=1)
    lines = [
        f"device {env['device']} ({env.get('device_name', '')}), geometry {env['geometry']}, "
        f"{env['modes']}",
        "",
        "| case | step | tokens | MiB | ms | GB/s | x raw |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['step']} | {r['tokens']} | {r['bytes'] / 2**20:.1f} | "
            f"{r['seconds'] * 1e3:.1f} | {r['GB_per_s']:.2f} | {r['x_raw']} |"
        )
    with open(os.path.join(out, "results.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit-s", type=float, default=420.0)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES))
    parser.add_argument("--tokens", help="comma-separated prefix lengths")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", help="scratch directory for the stores (default: a temp dir)")
    args = parser.parse_args(argv)
    clock = Clock(args.limit_s)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.device == "cuda" and not cuda:
        print("gpu_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    geometry_name = args.geometry or ("llama3-8b" if cuda else "tiny")
    geometry = GEOMETRIES[geometry_name]
    default_tokens = "4096,8192,16384,32768" if cuda else "1024,2048"
    tokens_list = [int(t) for t in (args.tokens or default_tokens).split(",")]
    page = geometry[3]
    assert all(t % page == 0 for t in tokens_list), f"prefix lengths must be multiples of {page}"
    os.makedirs(args.out, exist_ok=True)
    why_not = sglang_available()
    env = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(0) if cuda else cpu_name(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "geometry": f"{geometry_name} (layers, kv heads, head dim, page tokens) = {geometry}",
        "sglang": "imports" if why_not is None else f"not importable ({why_not})",
        "modes": "store + sglang" if why_not is None else "store only (no SGLang)",
        "cpus": os.cpu_count(),
        "tokens": tokens_list,
        "limit_s": args.limit_s,
    }
    with open(os.path.join(args.out, "env.txt"), "w") as handle:
        handle.write("\n".join(f"{k}: {v}" for k, v in env.items()) + "\n")
    work = args.work or tempfile.mkdtemp(prefix="galahad-gpu-check-")
    rows: list[dict] = []
    status = 0
    started = time.monotonic()
    try:
        for tokens in tokens_list:
            runners = [("store", run_store)] + ([("sglang", run_sglang)] if why_not is None else [])
            for name, runner in runners:
                spent = time.monotonic() - started
                # the first prefix always runs; a later one when a quarter of what the run
                # has spent so far (it grows with the prefix) is left, and 20 s
                first = tokens == tokens_list[0]
                if clock.left() < (5.0 if first else max(20.0, 0.25 * spent)):
                    rows.append({"case": name, "step": "skipped (time limit)", "tokens": tokens,
                                 "bytes": 0, "seconds": 0, "GB_per_s": 0, "x_raw": None})  # fmt: skip
                    continue
                try:
                    runner(device, geometry, tokens, args.rounds, work, rows)
                except Exception:
                    status = 1
                    trace = traceback.format_exc()
                    print(trace, file=sys.stderr)
                    rows.append({"case": name, "step": "FAILED: " + trace.strip().splitlines()[-1],
                                 "tokens": tokens, "bytes": 0, "seconds": 0, "GB_per_s": 0,
                                 "x_raw": None})  # fmt: skip
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                    os.makedirs(work, exist_ok=True)
                    write_results(args.out, rows, env)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    write_results(args.out, rows, env)
    with open(os.path.join(args.out, "results.md")) as handle:
        print(handle.read())
    return status


if __name__ == "__main__":
    sys.exit(main())
