"""The store at production size: what open, eviction, stats and verify cost as a root grows.

Issues 19 and 24. Roots of N small records (4 KiB pages, keys that are SHA-256 hex like
SGLang's page hashes), built once through the public API (put_many, durability "none") and
kept under --cache for later runs; for each N, in fresh processes:

  open         RecordStore and GalahadStorage open time and the RSS that opening added, warm
               and after dropping the page cache (`echo 3 > /proc/sys/vm/drop_caches`; where
               that is refused, posix_fadvise DONTNEED on every file: the report says which);
               HiCacheFile (default: no scan; with max_size: its LRU scan) the same way
  ops xP       P processes (1, 4, 8) on the root at once: per-page medians (and p90) of
               batch_exists (leading_run), get (get_many_into), put with room, and put into
               a full budget (every put evicts); eviction misses (victims another process
               had already removed)
  writers      three writers' worst batch while a fourth process opens the root, against
               their median before it
  open x4      four processes opening the root at once: each one's open time
  idle put     a process opened on a full root, idle while three others evict, then its
               first put
  stats/verify `galahad stats` (from the ledger's namespace counts: no record read; a root
               whose ledger predates the counts gets `stats --recount` once first, timed
               apart) and `galahad stats --exact` (a walk); `galahad verify` wall time, peak
               RSS and its own rate (records/s, MB/s of records read), beside a lean read
               of every record file in one thread with no check (the rate verify is held to)
  file evict   HiCacheFile with max_size at the root's size: one put (it evicts to 90%)

and the growth per 10x of every figure. After every multi-process phase the ledger is
compared with the bytes on disk (writers stopped): `ledger drift` must be 0.

Usage:
  .venv/bin/python bench/bench_scale.py [--records 1e4,1e5,1e6] [--procs 1,4,8]
      [--cache DIR] [--only galahad|file] [--quick] [--json OUT]
--quick: 300 and 3000 records, 1 and 2 processes, short phases (the smoke test).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PAGE_BYTES = 4096
BATCH = 32
NAMESPACE = {"tenant": "bench", "model_fingerprint": "scale", "pool": "kv"}
SCRATCH = {"tenant": "bench", "model_fingerprint": "scale-scratch", "pool": "kv"}
DEFAULT_CACHE = "/work/scale-cache"


def key_of(index: int) -> str:
    return hashlib.sha256(b"page-%d" % index).hexdigest()


def page_of(index: int) -> bytes:
    seed = hashlib.sha256(b"data-%d" % index).digest()
    return (seed * (PAGE_BYTES // len(seed) + 1))[:PAGE_BYTES]


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def percentile(values, fraction):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# ----------------------------------------------------------------------------- workers
# Each worker is this file run with --worker JSON; it prints one JSON line.


def _namespace(spec=NAMESPACE):
    from hicache_galahad.record.namespace import Namespace

    return Namespace(spec["tenant"], spec["model_fingerprint"], spec["pool"], {"page": PAGE_BYTES})


def _store(root, **options):
    from hicache_galahad import RecordStore

    options.setdefault("durability", "none")
    return RecordStore(root, **options)


def _storage_config(extra: dict):
    from bench import sglang_server

    return sglang_server.storage_config(extra, model_name="bench-model", page_first=False)


def _galahad_backend(root):
    """GalahadStorage through SGLang's factory on a 4 KiB-page bf16 host pool."""
    import torch
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    device = MHATokenToKVPool(
        64, 16, torch.bfloat16, 1, 64, 1, "cpu", False, start_layer=0, end_layer=0
    )
    host = MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2.0,
        0,
        16,
        "page_first_direct",
        pin_memory=False,
        device_capacity_tokens=device.size,
        start_layer=0,
        end_layer=0,
    )
    config = {
        "backend_name": "galahad",
        "module_path": "hicache_galahad",
        "class_name": "GalahadStorage",
        "root": root,
        "model_fingerprint": "bench",
        "durability": "none",
    }
    start = time.perf_counter()
    backend = StorageBackendFactory.create_backend("dynamic", _storage_config(config), host)
    backend.register_mem_pool_host(host)
    backend.register_mem_host_pool_v2(host, PoolName.KV)
    return backend, time.perf_counter() - start


def _file_backend(root, max_size=None):
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    storage_config = _storage_config

    os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
    extra = {"file_storage_path": root}
    if max_size is not None:
        extra["max_size"] = int(max_size)
    return HiCacheFile(storage_config(extra))


def _tensor(index):
    import torch

    return torch.frombuffer(bytearray(page_of(index)), dtype=torch.uint8)


def _barrier(job, name):
    """Every worker of the job reaches `name` before any goes on."""
    directory = Path(job["sync"])
    (directory / f"{name}-{job['rank']}").touch()
    while len(list(directory.glob(f"{name}-*"))) < job["procs"]:
        time.sleep(0.005)


def worker_build(job):
    root, start, end = job["root"], job["start"], job["end"]
    if job["impl"] == "file":
        backend = _file_backend(root)
        for first in range(start, end, 512):
            indices = range(first, min(end, first + 512))
            assert backend.batch_set([key_of(i) for i in indices], [_tensor(i) for i in indices])
        return {}
    store, namespace = _store(root), _namespace()
    store.register_namespace(namespace)
    for first in range(start, end, 512):
        indices = range(first, min(end, first + 512))
        ok = store.put_many(namespace, [key_of(i) for i in indices], [page_of(i) for i in indices])
        assert all(ok)
    store.close()
    return {}


def worker_open(job):
    """Open time and RSS added; for galahad also GalahadStorage's open."""
    result = {}
    if job["impl"] == "file":
        # (imported before the clock starts)
        from sglang.srt.mem_cache.hicache_storage import HiCacheFile  # noqa: F401
        from sglang.srt.mem_cache.storage.file import lru_file_evictor  # noqa: F401

        for label, max_size in (("file", None), ("file_lru", 1 << 50)):
            if label == "file_lru" and not job.get("lru", True):
                continue
            before = rss_bytes()
            start = time.perf_counter()
            backend = _file_backend(job["root"], max_size)
            result[label + "_open_s"] = time.perf_counter() - start
            result[label + "_rss"] = rss_bytes() - before
            del backend
        return result
    from hicache_galahad.store import RecordStore  # noqa: F401

    if job.get("wait_until"):
        while time.time() < job["wait_until"]:
            time.sleep(0.001)
    before = rss_bytes()
    start = time.perf_counter()
    store = _store(job["root"])
    result["open_s"] = time.perf_counter() - start
    result["opened_at"] = time.time()
    result["rss"] = rss_bytes() - before
    if job.get("backend"):
        backend, result["backend_open_s"] = _galahad_backend(job["root"])
        backend.close()
    store.close()
    return result


def _timed_batches(action, iterations):
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) / BATCH)
    return times


def worker_ops(job):
    """Per-page costs of SGLang's paths, every process of the job at once."""
    rng = random.Random(job["rank"])
    n, iters = job["n"], job["iters"]
    fresh = iter(range(job["fresh_start"] + job["rank"] * 10**7, 10**18))
    result = {}
    if job["impl"] == "file":
        import torch  # noqa: F401

        backend = _file_backend(job["root"])
        _barrier(job, "exists")
        result["exists"] = _timed_batches(
            lambda: backend.batch_exists([key_of(rng.randrange(n)) for _ in range(BATCH)]), iters
        )
        outs = [_tensor(0) for _ in range(BATCH)]
        _barrier(job, "get")
        result["get"] = _timed_batches(
            lambda: backend.batch_get([key_of(rng.randrange(n)) for _ in range(BATCH)], outs),
            iters,
        )
        _barrier(job, "put")
        result["put_room"] = _timed_batches(
            lambda: backend.batch_set(
                [key_of(i) for i in [next(fresh) for _ in range(BATCH)]],
                [_tensor(0)] * BATCH,
            ),
            iters,
        )
        return result
    store, namespace, scratch = _store(job["root"]), _namespace(), _namespace(SCRATCH)
    store.register_namespace(namespace)
    store.register_namespace(scratch)
    buffers = [bytearray(PAGE_BYTES) for _ in range(BATCH)]
    _barrier(job, "exists")
    result["exists"] = _timed_batches(
        lambda: store.leading_run(namespace, [key_of(rng.randrange(n)) for _ in range(BATCH)]),
        iters,
    )
    _barrier(job, "get")
    result["get"] = _timed_batches(
        lambda: store.get_many_into(
            namespace, [key_of(rng.randrange(n)) for _ in range(BATCH)], buffers
        ),
        iters,
    )

    def put():  # new records go to the scratch namespace, cleared after the run
        indices = [next(fresh) for _ in range(BATCH)]
        store.put_many(scratch, [key_of(i) for i in indices], [page_of(i) for i in indices])

    _barrier(job, "put")
    result["put_room"] = _timed_batches(put, iters)
    _barrier(job, "full")
    # The same store, its cap now the root's size: every put evicts as much as it writes.
    store.budget.max_bytes = store.max_bytes = store.usage_bytes()
    before = store.counters.snapshot()
    result["put_full"] = _timed_batches(put, iters)
    after = store.counters.snapshot()
    result["evictions"] = after.get("evictions", 0) - before.get("evictions", 0)
    _barrier(job, "done")
    store.close()
    return result


def worker_writer(job):
    """Writes batches into the scratch namespace for `duration_s` once every writer is open;
    (start, seconds) of each batch."""
    store, namespace = _store(job["root"]), _namespace(SCRATCH)
    store.register_namespace(namespace)
    _barrier(job, "writers-open")
    fresh = iter(range(job["rank"] * 10**9, 10**18))
    batches = []
    stop_at = time.time() + job["duration_s"]
    while time.time() < stop_at:
        indices = [next(fresh) for _ in range(BATCH)]
        start, clock = time.time(), time.perf_counter()
        store.put_many(namespace, [key_of(i) for i in indices], [page_of(i) for i in indices])
        batches.append((start, time.perf_counter() - clock))
        time.sleep(0.01)
    store.close()
    return {"batches": batches}


def worker_idle_put(job):
    """Opened on a full root, idle while others evict, then its first put timed."""
    store, namespace = _store(job["root"]), _namespace()
    store.register_namespace(namespace)
    store.budget.max_bytes = store.max_bytes = store.usage_bytes()
    Path(job["sync"], "idle-ready").touch()
    while not Path(job["sync"], "idle-go").exists():
        time.sleep(0.01)
    index = 10**15 + random.randrange(10**9)
    start = time.perf_counter()
    store.put(namespace, key_of(index), page_of(index))
    elapsed = time.perf_counter() - start
    store.close()
    return {"first_put_s": elapsed}


def worker_evictor(job):
    store, namespace = _store(job["root"]), _namespace(SCRATCH)
    store.register_namespace(namespace)
    store.budget.max_bytes = store.max_bytes = store.usage_bytes()
    _barrier(job, "evictors-open")
    fresh = iter(range(10**16 + job["rank"] * 10**9, 10**18))
    stop_at = time.time() + job["duration_s"]
    while time.time() < stop_at:
        indices = [next(fresh) for _ in range(BATCH)]
        store.put_many(namespace, [key_of(i) for i in indices], [page_of(i) for i in indices])
    evictions = store.counters.snapshot().get("evictions", 0)
    store.close()
    return {"evictions": evictions}


def worker_file_evict(job):
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile  # noqa: F401
    from sglang.srt.mem_cache.storage.file import lru_file_evictor  # noqa: F401

    root = job["root"]
    total = sum(entry.stat().st_size for entry in os.scandir(root) if entry.name.endswith(".bin"))
    start = time.perf_counter()
    backend = _file_backend(root, max_size=total)
    opened = time.perf_counter() - start
    start = time.perf_counter()
    backend.batch_set([key_of(10**17)], [_tensor(0)])
    return {"open_s": opened, "put_s": time.perf_counter() - start}


def worker_ledger(job):
    """The ledger against the bytes on disk, writers stopped (read-only check of counts)."""
    store = _store(job["root"], read_only=True)
    ledger = store.accounting.ledger.committed()
    disk = store.accounting.repair.disk_bytes()
    store.close()
    return {"ledger": ledger, "disk": disk, "drift": ledger - disk}


def worker_topup(job):
    """Puts back the records 0..n-1 that eviction took (a cached root is reused)."""
    store, namespace = _store(job["root"]), _namespace()
    store.register_namespace(namespace)
    store.clear_namespace(_namespace(SCRATCH))
    missing = [i for i in range(job["n"]) if not store.contains(namespace, key_of(i))]
    for first in range(0, len(missing), 512):
        part = missing[first : first + 512]
        store.put_many(namespace, [key_of(i) for i in part], [page_of(i) for i in part])
    store.close()
    return {"missing": len(missing)}


WORKERS = {
    "build": worker_build,
    "open": worker_open,
    "ops": worker_ops,
    "writer": worker_writer,
    "idle_put": worker_idle_put,
    "evictor": worker_evictor,
    "file_evict": worker_file_evict,
    "ledger": worker_ledger,
    "topup": worker_topup,
}


# ----------------------------------------------------------------------------- the parent


def spawn(job) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(job)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def collect(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode}): {out[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_jobs(jobs) -> list[dict]:
    procs = [spawn(job) for job in jobs]
    return [collect(proc) for proc in procs]


def drop_caches(root: str) -> str:
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for directory, _, names in os.walk(root):
            for name in names:
                with contextlib.suppress(OSError):
                    fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
        return "fadvise DONTNEED"


def built_root(cache: str, impl: str, n: int, procs: int = 2) -> str:
    """A root of n records (built once, then reused from the cache)."""
    root = os.path.join(cache, f"{impl}-{n}")
    marker = os.path.join(cache, f"{impl}-{n}.built")
    if os.path.exists(marker):
        if impl == "galahad":
            run_jobs([{"kind": "topup", "root": root, "n": n}])
        return root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    start = time.perf_counter()
    bounds = [n * part // procs for part in range(procs + 1)]
    run_jobs(
        [
            {"kind": "build", "impl": impl, "root": root, "start": a, "end": b}
            for a, b in zip(bounds, bounds[1:], strict=False)
        ]
    )
    Path(marker).write_text(f"{n} records in {time.perf_counter() - start:.1f} s\n")
    return root


def timed_command(args) -> tuple[float, int]:
    """Wall time and peak RSS (bytes) of a command."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_maxrss * 1024


def timed_json(args) -> tuple[float, int, dict]:
    """Wall time, peak RSS (bytes) and the JSON printed by a command (--json)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO
    )
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed_s = time.perf_counter() - start
    try:
        data = json.loads(out)
    except ValueError:
        data = {}
    return elapsed_s, usage.ru_maxrss * 1024, data


def sync_dir(work: str, name: str) -> str:
    directory = os.path.join(work, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    return directory


def ledger_drift(root: str) -> int:
    return run_jobs([{"kind": "ledger", "root": root}])[0]["drift"]


def iterations(args, n, procs) -> int:
    """Batches per op and process: the records a run writes stay a few percent of the root
    (put into a full budget evicts the root's own records), unless --fixed-iters (the same
    count at every size: the processes then overlap as much at every size)."""
    if args.fixed_iters:
        return args.iters
    return max(2, min(args.iters, n // (30 * procs * BATCH)))


def measure_galahad(n, root, args, work, cold_how) -> dict:
    fig = {}
    backend = "backend" not in args.skip
    warm = run_jobs([{"kind": "open", "impl": "galahad", "root": root, "backend": backend}])[0]
    fig["open warm s"] = warm["open_s"]
    fig["GalahadStorage open warm s"] = warm.get("backend_open_s")
    fig["open RSS MB"] = warm["rss"] / 1e6
    fig["RSS per record B"] = warm["rss"] / n
    if "cold" not in args.skip:
        cold_how.add(drop_caches(root))
        cold = run_jobs([{"kind": "open", "impl": "galahad", "root": root, "backend": backend}])
        fig["open cold s"] = cold[0]["open_s"]
        fig["GalahadStorage open cold s"] = cold[0].get("backend_open_s")
    for procs in [] if "ops" in args.skip else args.procs:
        results = run_jobs(
            [
                {
                    "kind": "ops",
                    "impl": "galahad",
                    "root": root,
                    "n": n,
                    "iters": iterations(args, n, procs),
                    "rank": rank,
                    "procs": procs,
                    "sync": sync_dir(work, f"ops-{n}-{procs}"),
                    "fresh_start": 10**12 + int(time.time() * 1000) * 1000,
                }
                for rank in range(procs)
            ]
        )
        for op in ("exists", "get", "put_room", "put_full"):
            values = [t for r in results for t in r[op]]
            fig[f"{op} x{procs} us/page"] = statistics.median(values) * 1e6
            fig[f"{op} x{procs} p90 us/page"] = percentile(values, 0.9) * 1e6
        _clear_scratch(root)
        fig[f"ledger drift x{procs} B"] = ledger_drift(root)
    if "writers" not in args.skip:  # three writers; a fourth process opens the root meanwhile
        sync = sync_dir(work, f"writers-{n}")
        writers = [
            spawn(
                {
                    "kind": "writer",
                    "root": root,
                    "rank": rank,
                    "procs": 3,
                    "sync": sync,
                    "duration_s": args.phase_s,
                }
            )
            for rank in range(3)
        ]
        while len(list(Path(sync).glob("writers-open-*"))) < 3:
            time.sleep(0.01)
        time.sleep(args.phase_s / 3)
        opener = run_jobs([{"kind": "open", "impl": "galahad", "root": root}])[0]
        batches = [b for w in writers for b in collect(w)["batches"]]
        open_end = opener["opened_at"]
        open_start = open_end - opener["open_s"]
        before = [dt for t, dt in batches if t < open_start]
        during = [dt for t, dt in batches if t + dt >= open_start and t <= open_end]
        fig["writers median batch s"] = statistics.median(before) if before else None
        fig["writers worst batch during open s"] = max(during) if during else None
        fig["open beside writers s"] = opener["open_s"]
        _clear_scratch(root)
        fig["ledger drift writers B"] = ledger_drift(root)
    if "opens" not in args.skip:  # four (and eight) processes opening at once
        for count in (4, 8) if 8 in args.procs else (4,):
            at = time.time() + 3.0
            opens = run_jobs(
                [
                    {"kind": "open", "impl": "galahad", "root": root, "wait_until": at}
                    for _ in range(count)
                ]
            )
            fig[f"open x{count} at once, slowest s"] = max(o["open_s"] for o in opens)
            fig[f"open x{count} at once, each s"] = sorted(round(o["open_s"], 3) for o in opens)
    if "idle" not in args.skip:  # an idle process's first put after others evicted
        sync = sync_dir(work, f"idle-{n}")
        idle = spawn({"kind": "idle_put", "root": root, "sync": sync})
        while not Path(sync, "idle-ready").exists():
            time.sleep(0.01)
        evicted = run_jobs(
            [
                {
                    "kind": "evictor",
                    "root": root,
                    "rank": rank,
                    "procs": 3,
                    "sync": sync,
                    "duration_s": args.phase_s / 2,
                }
                for rank in range(3)
            ]
        )
        Path(sync, "idle-go").touch()
        fig["idle process first put s"] = collect(idle)["first_put_s"]
        fig["evictions by the others"] = sum(e["evictions"] for e in evicted)
        _clear_scratch(root)
        fig["ledger drift evictors B"] = ledger_drift(root)
    galahad = [sys.executable, "-m", "hicache_galahad"]
    if "stats" not in args.skip:
        stats = [*galahad, "stats", "--root", root]
        fig["stats s"], rss, report = timed_json(stats)
        if report.get("counts") != "ledger":  # a root built before the ledger kept counts
            fig["stats --recount s (once)"] = timed_json([*stats, "--recount"])[0]
            fig["stats s"], rss, report = timed_json(stats)
        fig["stats counts from"] = report.get("counts")
        fig["stats peak RSS MB"] = rss / 1e6
        fig["stats --exact s"] = timed_json([*stats, "--exact"])[0]
    if "verify" not in args.skip:
        fig["verify s"], rss, report = timed_json([*galahad, "verify", "--root", root])
        fig["verify peak RSS MB"] = rss / 1e6
        fig["verify records/s"] = report.get("records_per_s")
        fig["verify MB/s"] = report.get("mb_per_s")
        fig["verify records/s (wall)"] = n / fig["verify s"]
        plain_s, files = _read_every_file(root)
        fig["lean read of every file, files/s"] = files / plain_s
        fig["verify / lean read"] = (
            fig["verify records/s"] / fig["lean read of every file, files/s"]
        )
    return fig


def _read_every_file(root) -> tuple[float, int]:
    """The limit verify is held to: one thread reading every record file whole into one
    reused buffer, each opened relative to its directory's descriptor, with no check at all
    (seconds, files)."""
    buffer = bytearray(1 << 20)
    start, files = time.perf_counter(), 0
    with os.scandir(os.path.join(root, "ns")) as namespaces:
        for directory in namespaces:
            if not directory.is_dir(follow_symlinks=False):
                continue
            dir_fd = os.open(directory.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for name in os.listdir(dir_fd):
                    if name.endswith(".rec"):
                        fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
                        os.readv(fd, [buffer])
                        os.close(fd)
                        files += 1
            finally:
                os.close(dir_fd)
    return time.perf_counter() - start, files


def _clear_scratch(root):
    store = _store(root)
    store.clear_namespace(_namespace(SCRATCH))
    store.close()


def measure_file(n, root, args, work, cold_how) -> dict:
    fig = {}
    warm = run_jobs([{"kind": "open", "impl": "file", "root": root}])[0]
    fig["open warm s"] = warm["file_open_s"]
    fig["open LRU warm s"] = warm["file_lru_open_s"]
    fig["open RSS MB"] = warm["file_rss"] / 1e6
    fig["open LRU RSS MB"] = warm["file_lru_rss"] / 1e6
    cold_how.add(drop_caches(root))
    cold = run_jobs([{"kind": "open", "impl": "file", "root": root}])[0]
    fig["open cold s"] = cold["file_open_s"]
    cold_how.add(drop_caches(root))
    cold = run_jobs([{"kind": "open", "impl": "file", "root": root, "lru": True}])[0]
    fig["open LRU cold s"] = cold["file_lru_open_s"]
    for procs in args.procs:
        results = run_jobs(
            [
                {
                    "kind": "ops",
                    "impl": "file",
                    "root": root,
                    "n": n,
                    "iters": iterations(args, n, procs),
                    "rank": rank,
                    "procs": procs,
                    "sync": sync_dir(work, f"fops-{n}-{procs}"),
                    "fresh_start": 10**12 + int(time.time() * 1000) * 1000,
                }
                for rank in range(procs)
            ]
        )
        for op in ("exists", "get", "put_room"):
            values = [t for r in results for t in r[op]]
            fig[f"{op} x{procs} us/page"] = statistics.median(values) * 1e6
    if "file_evict" not in args.skip:
        evict = run_jobs([{"kind": "file_evict", "root": root}])[0]
        fig["max_size open s"] = evict["open_s"]
        fig["max_size first put (evicts to 90%) s"] = evict["put_s"]
        Path(os.path.join(args.cache, f"file-{n}.built")).unlink()  # it evicted 10%: rebuilt
    return fig


def growth_table(title, figures: dict[int, dict]) -> str:
    sizes = sorted(figures)
    names = []
    for size in sizes:
        names.extend(name for name in figures[size] if name not in names)
    head = ["figure", *[f"{size:.0e} records" for size in sizes]]
    head += [f"x{b // a} growth ({a:.0e}->{b:.0e})" for a, b in zip(sizes, sizes[1:], strict=False)]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def cell(value):
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return ", ".join(f"{v:g}" for v in value)
        if isinstance(value, int) or abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"

    for name in names:
        row = [name, *[cell(figures[s].get(name)) for s in sizes]]
        for a, b in zip(sizes, sizes[1:], strict=False):
            va, vb = figures[a].get(name), figures[b].get(name)
            ok = isinstance(va, int | float) and isinstance(vb, int | float) and va > 0
            row.append(f"{vb / va:.2f}x" if ok else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--records", default="1e4,1e5,1e6", help="root sizes (1e4,1e5,1e6)")
    parser.add_argument("--procs", default="1,4,8", help="processes on one root (1,4,8)")
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="built roots kept here")
    parser.add_argument("--only", choices=("galahad", "file"), help="one implementation only")
    parser.add_argument("--iters", type=int, default=30, help="batches of 32 per op and process")
    parser.add_argument("--phase-s", type=float, default=9.0, help="writer/evictor phase length")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument(
        "--fixed-iters", action="store_true", help="--iters batches at every size (see iterations)"
    )
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument(
        "--skip",
        default="",
        help="figure groups left out: backend,cold,ops,writers,opens,idle,stats,verify,file_evict",
    )
    args = parser.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        print(json.dumps(WORKERS[job["kind"]](job)))
        return
    args.skip = set(filter(None, args.skip.split(",")))
    if args.quick:
        args.records, args.procs, args.iters, args.phase_s = "200,2000", "1,2", 2, 2.0
        args.skip |= {"backend"}
    sizes = [int(float(text)) for text in args.records.split(",")]
    args.procs = [int(text) for text in args.procs.split(",")]
    os.makedirs(args.cache, exist_ok=True)
    work = os.path.join(args.cache, "work")
    os.makedirs(work, exist_ok=True)
    impls = [args.only] if args.only else ["galahad", "file"]
    cold_how: set[str] = set()
    results: dict[str, dict[int, dict]] = {impl: {} for impl in impls}
    for n in sizes:
        for impl in impls:
            build_start = time.perf_counter()
            root = built_root(args.cache, impl, n)
            built_s = time.perf_counter() - build_start
            measure = measure_galahad if impl == "galahad" else measure_file
            figures = measure(n, root, args, work, cold_how)
            figures["(built or reused, s)"] = built_s
            results[impl][n] = figures
            print(f"# {impl} {n}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    header = (
        f"commit {commit()}, {os.cpu_count()} CPUs, load {os.getloadavg()}, cold start by "
        f"{' and '.join(sorted(cold_how)) or '-'}, {PAGE_BYTES} B pages, children CPU "
        f"{usage.ru_utime + usage.ru_stime:.0f} s"
    )
    print(header)
    for impl in impls:
        print()
        print(
            growth_table("hicache_galahad" if impl == "galahad" else "HiCacheFile", results[impl])
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "results": results}, indent=1))


if __name__ == "__main__":
    main()
