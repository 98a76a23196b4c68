"""MooncakeTier throughput and fault timings on a loopback Mooncake cluster, one run.

Starts a master and one store daemon (bench/mooncake_cluster.py), a pure-client MooncakeTier in
this process, and measures for 32 KiB and 8 MiB values:
  - put_async of N values until flush() returns (write-behind throughput, MB/s);
  - get_many in batches (per-call median / p90 / max, MB/s, and the ratio to a raw
    batch_get_into into registered memory already touched, which is what SGLang's own backend
    does and the tier's ceiling), next to Mooncake's raw get_batch and batch_get_into + a copy
    into fresh bytes (what the tier did before it lent values in place), interleaved;
  - the latency of a one-key get_many.
It also times (--part faults): construction with the master down, connect once it starts, a
get_many while the master is dead, and the reconnect after a master restart.

Usage: .venv/bin/python bench/bench_mooncake.py [--rounds 5] [--part all|throughput|faults]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import mmap
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.mooncake_cluster import ENV, MooncakeCluster, RawClient  # noqa: E402
from hicache_galahad.tier.mooncake.tier import MooncakeOptions, MooncakeTier  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
# (value bytes, values per round, keys per get_many)
WORKLOADS = ((32 * KIB, 2048, 64), (8 * MIB, 32, 4))


def header(segment_bytes: int) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return (
        f"# bench_mooncake  commit {commit}  {datetime.datetime.now():%Y-%m-%d %H:%M}\n"
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load {' '.join(f'{load:.2f}' for load in os.getloadavg())}, "
        f"Python {platform.python_version()}, "
        f"mooncake-transfer-engine-non-cuda {version('mooncake-transfer-engine-non-cuda')}\n"
        f"# loopback TCP, one master, one daemon holding {segment_bytes >> 20} MiB, "
        "this process a pure client"
    )


def summary(name: str, seconds: list[float], bytes_per_call: int, base: float = 0.0) -> str:
    ordered = sorted(seconds)
    median = statistics.median(ordered)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    ratio = f"  {base / median:5.2f}x" if base else ""
    return (
        f"{name:38s} median {median * 1e3:8.2f} ms  p90 {p90 * 1e3:8.2f} ms  "
        f"max {ordered[-1] * 1e3:8.2f} ms  {bytes_per_call / median / 1e6:7.0f} MB/s{ratio}"
    )


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def bench_workload(tier, raw, size: int, count: int, batch: int, rounds: int) -> None:
    values = [os.urandom(size) for _ in range(min(count, 64))]
    put_s = []
    for r in range(rounds):
        keys = [f"bench/{size}/{r}/{i}" for i in range(count)]

        def put_round(keys=keys):
            for i, key in enumerate(keys):
                if not tier.put_async(key, values[i % len(values)]):
                    raise RuntimeError(f"put_async dropped a value: {tier.counters()}")
            if not tier.flush(120):
                raise RuntimeError("flush timed out")

        put_s.append(timed(put_round))
    print(summary(f"{size >> 10} KiB put_async x{count}+flush", put_s, size * count))

    keys = [f"bench/{size}/0/{i}" for i in range(count)]
    batches = [keys[i : i + batch] for i in range(0, count, batch)]
    arena = mmap.mmap(-1, size * batch)
    view = memoryview(arena)
    view[:] = bytes(len(view))  # touched, as SGLang's host pool is
    address = ctypes.addressof(ctypes.c_char.from_buffer(arena))
    raw.store.register_buffer(address, size * batch)
    offsets = [i * size for i in range(batch)]

    def into(p):
        return raw.store.batch_get_into(
            p, [address + o for o in offsets[: len(p)]], [size] * len(p)
        )

    def into_copy(p):
        codes = into(p)
        return [bytes(view[o : o + c]) for o, c in zip(offsets, codes, strict=True)]

    calls = {
        "raw batch_get_into (no copy)": lambda p: into(p),
        "tier get_many": lambda p: tier.get_many(p, [size] * len(p)),
        "raw batch_get_into+copy to bytes": into_copy,
        "raw get_batch": lambda p: raw.store.get_batch(p),
    }
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for part in batches:
            for name, call in calls.items():
                start = time.perf_counter()
                got = call(part)
                seconds[name].append(time.perf_counter() - start)
                if name == "tier get_many" and None in got:
                    raise RuntimeError(f"tier missed: {tier.counters()}")
                del got
    base = statistics.median(seconds["raw batch_get_into (no copy)"])
    for name, values in seconds.items():
        print(summary(f"{size >> 10} KiB {name} x{batch}", values, size * batch, base))
    one = [timed(lambda: tier.get_many(keys[:1], [size])) for _ in range(50 * rounds)]
    print(summary(f"{size >> 10} KiB get_many x1", one, size))
    view.release()
    raw.store.unregister_buffer(address)


def wait_for(predicate, timeout_s: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError("condition not met")
        time.sleep(0.01)
    return time.monotonic() - start


def bench_faults(workdir: str) -> None:
    print("# faults (tier timeout_s=1; a 64 MiB daemon)")
    cluster = MooncakeCluster(os.path.join(workdir, "faults"), segment_bytes=64 * MIB)
    try:
        start = time.perf_counter()
        tier = MooncakeTier(MooncakeOptions.from_config(cluster.tier_config(timeout_s=1)))
        print(f"construction, master down:          {(time.perf_counter() - start) * 1e3:8.1f} ms")
        start = time.perf_counter()
        tier.get_many(["k"], [100])
        print(f"get_many, master down (unavailable): {(time.perf_counter() - start) * 1e3:8.2f} ms")
        started = time.monotonic()
        cluster.start()
        ready_s = wait_for(lambda: tier.available, 30)
        print(
            f"available after the cluster started: {ready_s * 1e3:8.0f} ms "
            f"(cluster start took {(time.monotonic() - started - ready_s) * 1e3:.0f} ms)"
        )
        cluster.kill_master()
        start = time.perf_counter()
        tier.get_many(["k"], [100])
        print(f"get_many just after master SIGKILL:  {(time.perf_counter() - start) * 1e3:8.1f} ms")
        print(
            f"tier marked down after:              {wait_for(lambda: not tier.available, 10) * 1e3:8.0f} ms"
        )
        cluster.start_master()
        start = time.monotonic()
        back_s = wait_for(lambda: tier.available, 30)
        print(f"available after master restart:      {back_s * 1e3:8.0f} ms")
        tier.close()
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--segment-mib", type=int, default=2048)
    parser.add_argument("--part", choices=("all", "throughput", "faults"), default="all")
    args = parser.parse_args()
    os.environ.update(ENV)
    print(header(args.segment_mib * MIB), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-mooncake-") as workdir:
        if args.part != "throughput":
            bench_faults(workdir)
        if args.part == "faults":
            return
        cluster = MooncakeCluster(workdir, segment_bytes=args.segment_mib * MIB).start()
        try:
            config = cluster.tier_config(queue_max_bytes="512MiB", timeout_s=10)
            tier = MooncakeTier(MooncakeOptions.from_config(config))
            wait_for(lambda: tier.available, 30)
            raw = RawClient(cluster)
            for size, count, batch in WORKLOADS:
                bench_workload(tier, raw, size, count, batch, args.rounds)
                raw.store.remove_all()
            print(f"# tier counters: {tier.counters()}")
            tier.close()
            raw.close()
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
