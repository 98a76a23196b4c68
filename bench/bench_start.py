"""From process start to the first restored request: what a start of GalahadStorage costs (issue
31; the goal issue 19 left unmeasured: restores within 1 s of the server answering health).

A root of N records (built once under --cache, kept for later runs) in eight TP ranks'
namespaces (N/8 each; every rank also holds one document of DOC_PAGES pages under SGLang's own
page keys). For each N, page cache warm or dropped (`echo 3 > /proc/sys/vm/drop_caches`, the
whole machine's), SGLang's key-hash extension already built or its TORCH_EXTENSIONS_DIR empty
(a new container, an upgrade), R ranks (1 or 8) start at once: R fresh processes, each what a
rank's scheduler does for its storage, timed from the moment the parent spawns them:

  imported     torch and SGLang imported (the rest of a real start is the model and the
               server; this part is the same with or without a storage backend)
  constructed  GalahadStorage constructed through SGLang's `dynamic` factory and its host pool
               registered: here SGLang would go on to report the rank ready, so this is where
               health could first answer
  restored     the first request's storage work, as SGLang's prefetch thread does it: the page
               keys of the document (`get_storage_hash_str`, the call that used to build the
               extension), `batch_exists`, then `batch_get_v1` of every page into the host pool

For R ranks the slowest rank counts (a server is ready when every rank is). `after health` is
restored - constructed: the issue 19 goal is that it stays under 1 s.

A full SGLang server at TP=8 does not fit 2 cores; these are its eight storage backends alone.
With --server, real restarts of a tiny-Llama CPU server (TP=1, the test harness, SGLang's default
prefetch policy) on a stored 1,025-token document, the extension built and its directory empty:
spawn to /health, then /health to the first response and the tokens it restored.

Usage: .venv/bin/python bench/bench_start.py [--records 1e4,1e6] [--ranks 1,8]
    [--cache DIR] [--server] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

TP_SIZE = 8
PAGE_TOKENS = 16
DOC_PAGES = 32  # a 512-token document restored by every rank
BULK_BATCH = 512
DEFAULT_CACHE = "/work/start-cache"
SERVER_PROMPT_TOKENS = 1025  # 1,024 restorable with pages of 4


def document_tokens(rank: int) -> list[int]:
    return [(rank * 7919 + i * 31) % 50_000 + 10 for i in range(DOC_PAGES * PAGE_TOKENS)]


def bulk_key(rank: int, index: int) -> str:
    return hashlib.sha256(b"bulk-%d-%d" % (rank, index)).hexdigest()


# ----------------------------------------------------------------------------- one rank


def backend_for(root: str, rank: int):
    """GalahadStorage of TP rank `rank` (of TP_SIZE) through SGLang's factory, on a bf16 host
    pool of 4 KiB pages (16 tokens x 1 head x 64 dims x K,V), registered as SGLang does."""
    import torch
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from bench.sglang_server import galahad_config, storage_config

    device = MHATokenToKVPool(
        DOC_PAGES * PAGE_TOKENS, PAGE_TOKENS, torch.bfloat16, 1, 64, 1, "cpu", False,
        start_layer=0, end_layer=0,
    )  # fmt: skip
    host = MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE_TOKENS,
        "page_first_direct", pin_memory=False, device_capacity_tokens=device.size,
        start_layer=0, end_layer=0,
    )  # fmt: skip
    config = galahad_config(root, model_fingerprint="bench-start", durability="none")
    backend = StorageBackendFactory.create_backend(
        "dynamic",
        storage_config(config, model_name="bench-start", tp_rank=rank, tp_size=TP_SIZE),
        host,
    )
    backend.register_mem_pool_host(host)
    backend.register_mem_host_pool_v2(host, PoolName.KV)
    return backend


def worker(job: dict) -> dict:
    """One rank's start, with wall-clock marks (time.time(), comparable across processes)."""
    marks = {"process": time.time()}
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: F401
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: F401
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: F401
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    import hicache_galahad.serving.adapter  # noqa: F401

    marks["imported"] = time.time()
    backend = backend_for(job["root"], job["rank"])
    marks["constructed"] = time.time()
    keys = get_storage_hash_str(document_tokens(job["rank"]), None, page_size=PAGE_TOKENS)
    marks["hashed"] = time.time()
    hit_pages = backend.batch_exists(keys)
    got = backend.batch_get_v1(keys[:hit_pages], torch.arange(hit_pages * PAGE_TOKENS))
    marks["restored"] = time.time()
    backend.close()
    return {
        "marks": marks,
        "restored_pages": sum(got),
        "key_hash": vars(backend.key_hash_startup),
    }


def build_worker(job: dict) -> dict:
    """Fills every rank's namespace: N/TP_SIZE bulk records and the rank's document."""
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    per_rank = job["n"] // TP_SIZE
    for rank in range(TP_SIZE):
        backend = backend_for(job["root"], rank)
        namespace = backend.binder.kv().namespace
        page = bytes(backend.binder.kv().page_bytes)
        for first in range(0, per_rank, BULK_BATCH):
            keys = [bulk_key(rank, i) for i in range(first, min(per_rank, first + BULK_BATCH))]
            assert all(backend.store.put_many(namespace, keys, [page] * len(keys)))
        keys = get_storage_hash_str(document_tokens(rank), None, page_size=PAGE_TOKENS)
        assert all(backend.store.put_many(namespace, keys, [page] * len(keys)))
        backend.close()
    return {}


# ----------------------------------------------------------------------------- the parent


def spawn(job: dict, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def collect(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode}): {out[-2000:]}{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def built_root(cache: str, n: int) -> tuple[str, float | None]:
    root = os.path.join(cache, f"start-{n}")
    marker = Path(cache, f"start-{n}.built")
    if marker.exists():
        return root, None
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    started = time.perf_counter()
    collect(spawn({"kind": "build", "root": root, "n": n}, dict(os.environ)))
    build_s = time.perf_counter() - started
    marker.write_text(f"{n} records in {build_s:.1f} s\n")
    return root, build_s


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def start_ranks(root: str, ranks: int, extensions: str) -> dict:
    """`ranks` rank processes spawned at once; the slowest rank's marks, from the spawn."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=extensions)
    spawned = time.time()
    procs = [spawn({"kind": "rank", "root": root, "rank": rank}, env) for rank in range(ranks)]
    results = [collect(proc) for proc in procs]
    assert all(r["restored_pages"] == DOC_PAGES for r in results), results
    phases = ("imported", "constructed", "hashed", "restored")
    slowest = {phase: max(r["marks"][phase] - spawned for r in results) for phase in phases}
    slowest["after_health"] = max(
        r["marks"]["restored"] - r["marks"]["constructed"] for r in results
    )
    slowest["key_hash_wait"] = max(r["key_hash"]["waited_s"] for r in results)
    slowest["outcomes"] = sorted({r["key_hash"]["outcome"] for r in results})
    return slowest


def server_phase(work: str, extension_dirs: dict[str, str]) -> list[dict]:
    """A real server (tiny Llama, TP=1, the CPU harness, SGLang's default prefetch policy):
    one stores a document and is SIGKILLed; then, for each extension directory, a restart on
    that root: spawn to /health, and /health to the end of the first request, which must
    restore the document from storage."""
    import signal

    import hicache_galahad
    from bench import sglang_server as serving

    model = serving.ensure_model("llama", "tiny")
    root = os.path.join(work, "server-store")
    shutil.rmtree(root, ignore_errors=True)
    config = serving.galahad_config(root, interface_v1=1)
    args = [
        *serving.TINY_SERVER_ARGS,
        *serving.hicache_args(
            "page_first_direct", backend="dynamic", extra_config=config, prefetch_policy=None
        ),
    ]
    prompt = [(i * 37) % 480 + 10 for i in range(SERVER_PROMPT_TOKENS)]
    server = serving.start_server(model, args, log_path=os.path.join(work, "server-store.log"))
    try:
        (stored,) = hicache_galahad.warm(server.url, [("document", prompt)], root=root)
        assert stored.complete, stored
    finally:
        os.killpg(server.pgid, signal.SIGKILL)
        server.stop(grace_s=1.0)
    rows = []
    for name, extensions in extension_dirs.items():
        server = serving.start_server(
            model,
            args,
            env={"TORCH_EXTENSIONS_DIR": extensions},
            log_path=os.path.join(work, f"server-{name}.log"),
        )
        try:
            started = time.monotonic()
            first = serving.generate(server, prompt, 1)
            rows.append(
                {
                    "extension": name,
                    "health_s": server.startup_s,
                    "first_request_s": time.monotonic() - started,
                    "restored_tokens": first.storage_tokens,
                    "prompt_tokens": len(prompt),
                }
            )
        finally:
            server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", default="1e4,1e6")
    parser.add_argument("--ranks", default="1,8")
    parser.add_argument("--cache", default=DEFAULT_CACHE)
    parser.add_argument("--server", action="store_true", help="also time real server restarts")
    parser.add_argument("--json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        print(json.dumps((build_worker if job["kind"] == "build" else worker)(job)), flush=True)
        return

    sizes = [int(float(n)) for n in args.records.split(",")]
    rank_counts = [int(r) for r in args.ranks.split(",")]
    built_extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(REPO, ".torch_ext")
    os.makedirs(args.cache, exist_ok=True)
    rows = []
    print(f"load {os.getloadavg()[0]:.2f}; drop_caches: {'yes' if drop_caches() else 'NO'}")
    for n in sizes:
        root, build_s = built_root(args.cache, n)
        if build_s is not None:
            print(f"built {n:,} records in {build_s:.0f} s", flush=True)
        for extension in ("built", "empty"):
            for cache in ("warm", "cold"):
                for ranks in rank_counts:
                    empty = tempfile.mkdtemp(prefix="torch-ext-", dir=args.cache)
                    extensions = built_extensions if extension == "built" else empty
                    if cache == "cold":
                        drop_caches()
                    row = {"n": n, "ranks": ranks, "extension": extension, "cache": cache}
                    row.update(start_ranks(root, ranks, extensions))
                    shutil.rmtree(empty, ignore_errors=True)
                    rows.append(row)
                    print(
                        f"{n:>9,} x{ranks} ext {extension:<5} {cache:<4} imported "
                        f"{row['imported']:6.2f}  constructed {row['constructed']:6.2f} "
                        f"(key hash {row['key_hash_wait']:5.2f})  restored "
                        f"{row['restored']:6.2f} s  after health {row['after_health']:.3f} s "
                        f"{','.join(row['outcomes'])}",
                        flush=True,
                    )
    servers = []
    if args.server:
        empty = tempfile.mkdtemp(prefix="torch-ext-", dir=args.cache)
        servers = server_phase(args.cache, {"built": built_extensions, "empty": empty})
        shutil.rmtree(empty, ignore_errors=True)
        for row in servers:
            print(
                f"server restart, ext {row['extension']:<5}: /health after {row['health_s']:6.2f} s,"
                f" first request {row['first_request_s']:.3f} s later, restored "
                f"{row['restored_tokens']} of {row['prompt_tokens']} tokens",
                flush=True,
            )
    worst = max(row["after_health"] for row in rows)
    print(f"\nworst 'after health' (restored - constructed, slowest rank): {worst:.3f} s")
    print(f"median: {statistics.median(row['after_health'] for row in rows):.3f} s")
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "servers": servers}, indent=1))


if __name__ == "__main__":
    main()
