"""SGLang's own client against a server without storage, with SGLang's `file` backend and with
GalahadStorage, each on a fresh store and again after a restart on the same store.

The client is `python -m sglang.bench_serving --dataset-name generated-shared-prefix` (nothing
here writes its requests or computes its metrics): G groups of P prompts, each prompt a shared
system prompt of S tokens followed by a Q-token question, O output tokens, all sent at once.
Per mode and round:

1. cold: a server on a fresh, empty store runs the client (write-through fills the store);
   the benchmark waits until the store has settled, then stops the server;
2. restart: a new server on the same store runs the same requests (the client's prompt cache
   lives in a private HOME, so every run of the benchmark sends identical prompts in the same
   order). Without storage the restarted server recomputes everything.

Reported per run: mean and p99 TTFT, request and token throughput, the share of prompt tokens
served from cache (all tiers) and from storage; and, on their own, the first request of each
shared-prefix group (the only ones that can read their whole prompt from storage; the others
find the prefix already in device memory).

Then, per length (default 4096 tokens), the limit of a restore: TTFT for the same prompt on a
warm server (a device-memory hit, no restart) beside the restored TTFT after a restart, for
both storage backends, and the recompute TTFT without storage. The restore is timed twice, on
two restarts: as the server's very first request, and after one unrelated 64-token request
(the start-up warm-up SGLang sends itself, which the harness skips with
`--skip-server-warmup`), so a server's first-request costs are told apart from the restore.

Modes run interleaved in every round, so each ratio compares runs made under the same load.
`--neighbours N` starts N busy processes (`python -c 'while True: pass'`) before the first run
and stops them, by PID, after the last: a controlled CPU load, the same for every mode.

Runs stock SGLang on a GPU when one is present, else the CPU test harness (tests/sglang_cpu).
Usage: .venv/bin/python bench/bench_serving.py [--rounds 2] [--neighbours 1]
       [--modes none file galahad] [--warm-lengths 4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import serving  # noqa: E402
from bench.bench_store import machine  # noqa: E402
from bench.load import Neighbours, loadavg  # noqa: E402

e2e = serving.e2e
PAGE_SIZE = 16

# mode name -> (storage, GalahadStorage options). "galahad" is the configuration docs/CONFIG.md
# recommends (zero-copy v1 interface); "galahad-generic" is SGLang's generic page interface.
MODES = {
    "none": ("none", {}),
    "file": ("file", {}),
    "galahad": ("galahad", {}),
    "galahad-generic": ("galahad", {"interface_v1": 0}),
}
# A mode name ending in "-spin" runs its server with libgomp's default spin-waiting
# (OMP_WAIT_POLICY empty) instead of the CPU harness's OMP_WAIT_POLICY=PASSIVE: the setting under
# which, on a loaded 2-core box, a CPU server collapses unless some other thread of it happens to
# have made a second OpenMP team (see tests/sglang_cpu/README.md, "OpenMP under load").
SPIN = "-spin"
MODES |= {name + SPIN: value for name, value in MODES.items()}


def mode_env(mode: str) -> dict[str, str]:
    return {"OMP_WAIT_POLICY": ""} if mode.endswith(SPIN) else {}


RECORD_PATTERNS = {"file": "*.bin", "galahad": "ns/*/*.rec"}


# ------------------------------------------------------------------------------ profiling


def scheduler_pid(server: e2e.Server) -> int | None:
    """The scheduler process of a server (SGLang sets its title to sglang::scheduler...)."""
    for pid in e2e.group_members(server.pgid):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"scheduler" in cmdline:
                return pid
    return None


def thread_stats(pid: int) -> dict[int, tuple[int, int, int, int]]:
    """Per thread of a process: (user ticks, system ticks, minor faults, major faults)."""
    stats = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (task / "stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            stats[int(task.name)] = (
                int(fields[11]),
                int(fields[12]),
                int(fields[7]),
                int(fields[9]),
            )
    return stats


def python_thread_names(py_spy: str, pid: int) -> dict[int, str]:
    """Thread id -> Python thread name, from `py-spy dump` (native ids)."""
    try:
        dump = subprocess.run(
            [py_spy, "dump", "-p", str(pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    names = {}
    for line in dump.splitlines():
        # Thread 0x7F... (active): "MainThread"  or  Thread 1234 (idle): "name"
        if line.startswith("Thread ") and '"' in line:
            ident = line.split()[1]
            with contextlib.suppress(ValueError):
                tid = int(ident, 16) if ident.startswith("0x") else int(ident)
                names[tid] = line.split('"')[1]
    return names


class Profiler:
    """While a client runs: py-spy record of a server's scheduler (collapsed stacks, one line
    per stack with its sample count) and the CPU time each of its threads used."""

    def __init__(self, server: e2e.Server, out: Path, flags: list[str]):
        self.proc = None
        self.out = out
        self.pid = scheduler_pid(server)
        self.py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if self.pid is None or not Path(self.py_spy).exists():
            print(f"  (no profile: scheduler pid {self.pid}, py-spy {self.py_spy})", flush=True)
            self.pid = None
            return
        self.before = thread_stats(self.pid)
        self.started = time.monotonic()
        command = [self.py_spy, "record", "-p", str(self.pid), "-r", "250", "-f", "raw"]
        command += ["-o", str(out), "--threads"]
        # without --native, sample without pausing the process (the timings stay honest)
        command += flags if "--native" in flags else [*flags, "--nonblocking"]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(out.with_suffix(".log"), "w"),  # noqa: SIM115 (closed with the process)
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        elapsed = time.monotonic() - self.started
        after = thread_stats(self.pid)
        names = python_thread_names(self.py_spy, self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            e2e.kill_process_group(self.proc.pid, self.proc, grace_s=2)
        hertz = os.sysconf("SC_CLK_TCK")
        zero = (0, 0, 0, 0)
        rows = []
        for tid, now in after.items():
            delta = [a - b for a, b in zip(now, self.before.get(tid, zero), strict=True)]
            if any(delta):
                rows.append((delta[0] + delta[1], tid, delta))
        rows.sort(reverse=True)
        lines = [
            f"# per scheduler thread over {elapsed:.1f} s of wall time: "
            "user s, system s, minor faults, major faults, thread id, Python name"
        ]
        lines += [
            f"{d[0] / hertz:7.2f} {d[1] / hertz:7.2f} {d[2]:9d} {d[3]:5d}  {tid}  "
            f"{names.get(tid, '?')}"
            for _, tid, d in rows
        ]
        self.out.with_suffix(".threads").write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------ the client


@dataclass
class Workload:
    groups: int
    prompts_per_group: int
    system_len: int
    question_len: int
    output_len: int
    seed: int
    max_concurrency: int | None


def client_command(server: e2e.Server, model: Path, work: Workload, out_file: Path) -> list[str]:
    command = [
        sys.executable, "-m", "sglang.bench_serving",
        "--backend", "sglang", "--base-url", server.url,
        "--model", str(model), "--tokenizer", str(model),
        "--dataset-name", "generated-shared-prefix",
        "--gsp-num-groups", str(work.groups),
        "--gsp-prompts-per-group", str(work.prompts_per_group),
        "--gsp-system-prompt-len", str(work.system_len),
        "--gsp-question-len", str(work.question_len),
        "--gsp-output-len", str(work.output_len),
        "--seed", str(work.seed),
        "--warmup-requests", "0",  # a warmup request would pull a prefix from storage untimed
        "--cache-report", "--output-details", "--output-file", str(out_file),
        "--disable-tqdm",
    ]  # fmt: skip
    if work.max_concurrency:
        command += ["--max-concurrency", str(work.max_concurrency)]
    return command


def run_client(
    server: e2e.Server, model: Path, work: Workload, home: Path, out_file: Path, log: Path
) -> dict:
    """One run of SGLang's client; returns the record it appends to its output file."""
    env = dict(os.environ, HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("SGLANG_IS_IN_CI", None)  # in CI mode the client flushes the server's cache
    with open(log, "ab") as output:
        proc = subprocess.Popen(
            client_command(server, model, work, out_file),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = proc.wait(timeout=1800)
    finally:
        e2e.kill_process_group(proc.pid, proc, grace_s=5)
    if code != 0 or not out_file.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"sglang.bench_serving failed ({code}); log {log}:\n{tail}")
    return json.loads(out_file.read_text().splitlines()[-1])


def request_groups(home: Path, count: int) -> list[int]:
    """Group index of each request, in the client's sending order, from its prompt cache
    (a pickled list of DatasetRow; the shared system prompt starts every prompt)."""
    cached = sorted((home / ".cache" / "sglang" / "benchmark").glob("gen_shared_prefix_*.pkl"))
    if len(cached) != 1:
        raise RuntimeError(f"expected one prompt cache under {home}, found {cached}")
    with open(cached[0], "rb") as f:
        rows = pickle.load(f)
    if len(rows) != count:
        raise RuntimeError(f"prompt cache has {len(rows)} requests, the client sent {count}")
    keys: dict[str, int] = {}
    return [keys.setdefault(str(row.prompt)[:256], len(keys)) for row in rows]


# ------------------------------------------------------------------------------ results


@dataclass
class RunResult:
    mode: str
    phase: str  # cold | restart
    round: int
    mean_ttft_s: float
    p99_ttft_s: float
    request_throughput: float
    token_throughput: float
    duration_s: float
    prompt_tokens: int
    cached_share: float
    storage_share: float
    first_ttft_s: float  # mean TTFT of the first request of each group
    first_storage_share: float  # share of those requests' prompt tokens read from storage
    others_ttft_s: float
    load_before: str
    load_after: str
    ttfts_s: list[float] = field(default_factory=list)


def summarise(
    mode: str, phase: str, round_index: int, record: dict, groups: list[int], loads
) -> RunResult:
    ttfts = [float(t) for t in record["ttfts"]]
    input_lens = [int(n) for n in record["input_lens"]]
    details = record.get("cached_tokens_details") or [None] * len(ttfts)
    storage = [int((d or {}).get("storage") or 0) for d in details]
    cached = [int(c or 0) for c in record.get("cached_tokens") or [0] * len(ttfts)]
    first = sorted({groups.index(g) for g in set(groups)})
    others = [i for i in range(len(ttfts)) if i not in first]
    prompt_tokens = sum(input_lens)
    return RunResult(
        mode=mode,
        phase=phase,
        round=round_index,
        mean_ttft_s=record["mean_ttft_ms"] / 1000,
        p99_ttft_s=record["p99_ttft_ms"] / 1000,
        request_throughput=record["request_throughput"],
        token_throughput=record["total_throughput"],
        duration_s=record["duration"],
        prompt_tokens=prompt_tokens,
        cached_share=sum(cached) / prompt_tokens,
        storage_share=sum(storage) / prompt_tokens,
        first_ttft_s=statistics.mean(ttfts[i] for i in first),
        first_storage_share=sum(storage[i] for i in first) / sum(input_lens[i] for i in first),
        others_ttft_s=statistics.mean(ttfts[i] for i in others) if others else float("nan"),
        load_before=loads[0],
        load_after=loads[1],
        ttfts_s=ttfts,
    )


# ------------------------------------------------------------------------------ one mode


@dataclass
class Setup:
    model: Path
    work: Workload
    scratch: Path
    home: Path
    max_tokens: int
    chunked_prefill: int
    profile: set[str]
    profile_flags: list[str]
    profile_dir: Path | None


def mode_args(setup: Setup, mode: str, store: Path | None) -> list[str]:
    storage, options = MODES[mode]
    return serving.server_args(
        storage,
        store,
        page_size=PAGE_SIZE,
        max_tokens=setup.max_tokens,
        chunked_prefill=setup.chunked_prefill,
        galahad_options=options,
    )


def count_records(mode: str, store: Path) -> int:
    storage = MODES[mode][0]
    return len(list(store.glob(RECORD_PATTERNS[storage]))) if store.is_dir() else 0


def wait_store_settled(mode: str, store: Path, at_least: int) -> int:
    return e2e.wait_settled(
        lambda: count_records(mode, store),
        lambda seen: seen >= at_least,
        quiet_s=3.0,
        timeout_s=600,
        what=f"{at_least} records of {mode} in {store}",
    )


def maybe_profile(setup: Setup, server, mode: str, tag: str) -> Profiler | None:
    """A profile of the server's scheduler under profile_dir/<tag>.txt if `mode` is profiled."""
    if mode not in setup.profile or setup.profile_dir is None:
        return None
    return Profiler(server, setup.profile_dir / f"{tag}.txt", setup.profile_flags)


def client_run(setup: Setup, server, mode: str, phase: str, round_index: int) -> RunResult:
    tag = f"{mode}-{phase}-{round_index}"
    profiler = maybe_profile(setup, server, mode, tag)
    before = loadavg()
    try:
        record = run_client(
            server,
            setup.model,
            setup.work,
            setup.home,
            setup.scratch / f"{tag}.jsonl",
            setup.scratch / f"{tag}-client.log",
        )
    finally:
        if profiler is not None:
            profiler.stop()
    after = loadavg()
    groups = request_groups(setup.home, len(record["ttfts"]))
    result = summarise(mode, phase, round_index, record, groups, (before, after))
    print(
        f"  {tag}: mean TTFT {result.mean_ttft_s:.2f} s, p99 {result.p99_ttft_s:.2f} s, "
        f"first-of-group {result.first_ttft_s:.2f} s, cached {result.cached_share:.0%} "
        f"(storage {result.storage_share:.0%}); load {before} -> {after}",
        flush=True,
    )
    return result


def run_mode(setup: Setup, mode: str, round_index: int) -> list[RunResult]:
    store = setup.scratch / f"{mode}-store-{round_index}"
    args = mode_args(setup, mode, store if MODES[mode][0] != "none" else None)
    results = []
    server = serving.start(
        setup.model, args, setup.scratch / f"{mode}-cold-{round_index}.log", env=mode_env(mode)
    )
    try:
        cold = client_run(setup, server, mode, "cold", round_index)
        results.append(cold)
        if MODES[mode][0] != "none":
            work = setup.work
            # every group's shared prompt, in whole pages, must be in the store before the stop
            pages = work.groups * ((work.system_len - 1) // PAGE_SIZE) * 9 // 10
            wait_store_settled(mode, store, pages)
    finally:
        server.stop()
    server = serving.start(
        setup.model, args, setup.scratch / f"{mode}-restart-{round_index}.log", env=mode_env(mode)
    )
    try:
        results.append(client_run(setup, server, mode, "restart", round_index))
    finally:
        server.stop()
    return results


# ------------------------------------------------------------------------------ warm vs restored


def prompt_ids(length: int, seed: int, vocab: int) -> list[int]:
    import random

    rng = random.Random(seed * 1_000_003 + length)
    return [rng.randrange(10, vocab) for _ in range(length)]


@dataclass
class WarmResult:
    mode: str
    length: int
    round: int
    cold_s: float
    warm_hit_s: float  # same prompt again on the same server (device-memory hit)
    # same prompt after a restart on the same store, once as the restarted server's very first
    # request, once after one unrelated short request (what SGLang's own start-up warm-up,
    # skipped by the harness, would have sent)
    restored_first_s: float | None
    restored_s: float | None
    restored_storage_tokens: int
    load_before: str
    load_after: str


def warm_vs_restored(setup: Setup, mode: str, lengths, vocab: int, round_index: int) -> list:
    store = setup.scratch / f"{mode}-warm-store-{round_index}"
    has_storage = MODES[mode][0] != "none"
    args = mode_args(setup, mode, store if has_storage else None)
    prompts = {length: prompt_ids(length, 1000 + round_index, vocab) for length in lengths}
    before = loadavg()
    cold, warm = {}, {}
    server = serving.start(
        setup.model, args, setup.scratch / f"{mode}-warm-{round_index}.log", env=mode_env(mode)
    )
    profiler = maybe_profile(setup, server, mode, f"{mode}-warm-{round_index}")
    try:
        for length, prompt in prompts.items():
            cold[length] = serving.stream_generate(server, prompt, 1).ttft_s
            warm[length] = min(serving.stream_generate(server, prompt, 1).ttft_s for _ in range(3))
        if has_storage:
            expected = sum((length - 1) // PAGE_SIZE for length in lengths) * 9 // 10
            wait_store_settled(mode, store, expected)
    finally:
        if profiler is not None:
            profiler.stop()
        server.stop()
    restored_first: dict[int, serving.Timed] = {}
    restored: dict[int, serving.Timed] = {}
    restarts = ((False, restored_first), (True, restored)) if has_storage else ()
    for warmed_up, timings in restarts:
        name = f"{mode}-restored{'-warmed' if warmed_up else ''}-{round_index}"
        server = serving.start(setup.model, args, setup.scratch / f"{name}.log", env=mode_env(mode))
        profiler = maybe_profile(setup, server, mode, name) if warmed_up else None
        try:
            if warmed_up:  # unrelated ids: shares no page with the timed prompts
                serving.stream_generate(server, prompt_ids(64, 999_983, vocab), 1)
            for length, prompt in prompts.items():
                timings[length] = serving.stream_generate(server, prompt, 1)
        finally:
            if profiler is not None:
                profiler.stop()
            server.stop()
    after = loadavg()
    results = []
    for length in lengths:
        timed, first = restored.get(length), restored_first.get(length)
        results.append(
            WarmResult(
                mode,
                length,
                round_index,
                cold[length],
                warm[length],
                first.ttft_s if first else None,
                timed.ttft_s if timed else None,
                timed.storage_tokens if timed else 0,
                before,
                after,
            )
        )
        print(
            f"  {mode} {length} tokens: cold {cold[length]:.2f} s, warm hit {warm[length]:.3f} s"
            + (
                f", restored {timed.ttft_s:.3f} s ({timed.storage_tokens} from storage)"
                if timed
                else ""
            )
            + f"; load {before} -> {after}",
            flush=True,
        )
    return results


# ------------------------------------------------------------------------------ tables


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def peer(mode: str, base: str, modes: list[str]) -> str | None:
    """The `base` mode ("file", "none") run under the same OpenMP setting as `mode`."""
    name = base + SPIN if mode.endswith(SPIN) else base
    return name if name in modes else None


def print_tables(runs: list[RunResult], warm: list[WarmResult], modes: list[str]) -> None:
    if runs:
        print_serving_tables(runs, modes)
    if warm:
        print_warm_table(warm, modes)


def print_serving_tables(runs: list[RunResult], modes: list[str]) -> None:
    print("\n## Per run\n")
    print(
        "| round | mode | phase | mean TTFT | p99 TTFT | first-of-group TTFT | others TTFT "
        "| req/s | tok/s | cached | from storage | first-of-group from storage "
        "| load before -> after |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in runs:
        print(
            f"| {r.round} | {r.mode} | {r.phase} | {r.mean_ttft_s:.2f} s | {r.p99_ttft_s:.2f} s "
            f"| {r.first_ttft_s:.2f} s | {r.others_ttft_s:.2f} s | {r.request_throughput:.3f} "
            f"| {r.token_throughput:.0f} | {r.cached_share:.0%} | {r.storage_share:.0%} "
            f"| {r.first_storage_share:.0%} | {r.load_before} -> {r.load_after} |"
        )
    print("\n## Median over rounds (ratios: per round, then the median)\n")
    print(
        "| mode | phase | mean TTFT | p99 TTFT | first-of-group TTFT | req/s | tok/s | cached "
        "| from storage | mean TTFT / file | first-of-group / file | first-of-group / recompute |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    by_key = {(r.mode, r.phase, r.round): r for r in runs}
    for phase in ("cold", "restart"):
        for mode in modes:
            mine = [r for r in runs if r.mode == mode and r.phase == phase]
            if not mine:
                continue

            def ratio(base, attribute, mine=mine, phase=phase, mode=mode):
                other_mode = peer(mode, base, modes)
                values = []
                for r in mine:
                    other = by_key.get((other_mode, phase, r.round))
                    if other is not None:
                        values.append(getattr(r, attribute) / getattr(other, attribute))
                return f"{median(values):.2f}" if values else "-"

            print(
                f"| {mode} | {phase} | {median(r.mean_ttft_s for r in mine):.2f} s "
                f"| {median(r.p99_ttft_s for r in mine):.2f} s "
                f"| {median(r.first_ttft_s for r in mine):.2f} s "
                f"| {median(r.request_throughput for r in mine):.3f} "
                f"| {median(r.token_throughput for r in mine):.0f} "
                f"| {median(r.cached_share for r in mine):.0%} "
                f"| {median(r.storage_share for r in mine):.0%} "
                f"| {ratio('file', 'mean_ttft_s')} | {ratio('file', 'first_ttft_s')} "
                f"| {ratio('none', 'first_ttft_s')} |"
            )


def print_warm_table(warm: list[WarmResult], modes: list[str]) -> None:
    print("\n## Warm hit vs restored (median over rounds; ratios per round, then the median)\n")
    print(
        "| tokens | mode | cold | warm hit | restored, first request | restored | "
        "restored / warm hit | restored / file restored | from storage |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for length in sorted({w.length for w in warm}):
        for mode in modes:
            mine = [w for w in warm if w.mode == mode and w.length == length]
            if not mine:
                continue
            file_mode = peer(mode, "file", modes)
            per_round = [w.restored_s / w.warm_hit_s for w in mine if w.restored_s]
            vs_file = []
            for w in mine:
                other = next(
                    (
                        o
                        for o in warm
                        if o.mode == file_mode and o.length == length and o.round == w.round
                    ),
                    None,
                )
                if w.restored_s and other is not None and other.restored_s:
                    vs_file.append(w.restored_s / other.restored_s)
            restored = median(w.restored_s for w in mine)
            print(
                f"| {length} | {mode} | {median(w.cold_s for w in mine):.2f} s "
                f"| {median(w.warm_hit_s for w in mine):.3f} s "
                + (
                    f"| {median(w.restored_first_s for w in mine):.3f} s | {restored:.3f} s "
                    if per_round
                    else "| - | - "
                )
                + (f"| {median(per_round):.2f}x " if per_round else "| - ")
                + (f"| {median(vs_file):.2f} " if vs_file else "| - ")
                + f"| {median(w.restored_storage_tokens for w in mine):.0f} |"
            )


# ------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["none", "file", "galahad"], choices=MODES)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--neighbours", type=int, default=0, help="busy processes for the run")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--prompts-per-group", type=int, default=4)
    parser.add_argument("--system-len", type=int, default=2000)
    parser.add_argument("--question-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--max-total-tokens", type=int, default=20480)
    parser.add_argument("--chunked-prefill-size", type=int, default=4096)
    parser.add_argument(
        "--warm-lengths", type=int, nargs="*", default=[4096], help="empty: skip that part"
    )
    parser.add_argument("--skip-serving", action="store_true", help="only warm vs restored")
    parser.add_argument("--size", default="demo", help="model size for make_model.py")
    parser.add_argument("--profile", nargs="*", default=[], help="py-spy the scheduler of MODES")
    parser.add_argument(
        "--profile-flags",
        default="",
        help="more py-spy record flags, e.g. '--idle' (wall clock), '--gil', '--native'",
    )
    parser.add_argument("--keep", help="keep logs, stores and profiles in this directory")
    parser.add_argument("--json", help="write every result to this JSON file")
    args = parser.parse_args()

    # SIGTERM / SIGHUP run the finally blocks below (servers, clients and neighbours stop).
    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)

    model = e2e.ensure_model("llama", args.size)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="galahad-serving-"))
    scratch.mkdir(parents=True, exist_ok=True)
    home = scratch / "home"  # the client's prompt cache, private to this benchmark
    home.mkdir(exist_ok=True)
    setup = Setup(
        model=Path(model),
        work=Workload(
            args.groups,
            args.prompts_per_group,
            args.system_len,
            args.question_len,
            args.output_len,
            args.seed,
            args.max_concurrency,
        ),
        scratch=scratch,
        home=home,
        max_tokens=args.max_total_tokens,
        chunked_prefill=args.chunked_prefill_size,
        profile=set(args.profile),
        profile_flags=args.profile_flags.split(),
        profile_dir=scratch / "profiles" if args.profile else None,
    )
    if setup.profile_dir is not None:
        setup.profile_dir.mkdir(exist_ok=True)
    device = "GPU (stock SGLang)" if serving.has_gpu() else "CPU (test harness)"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=serving.REPO_ROOT,
    ).stdout.strip()
    print(
        f"# bench_serving on {machine()}; {device}; model {setup.model.name}; "
        f"page {PAGE_SIZE}; {args.groups} groups x {args.prompts_per_group} prompts, "
        f"{args.system_len}-token shared prompts, {args.question_len}-token questions, "
        f"{args.output_len} output tokens; chunked prefill {args.chunked_prefill_size}; "
        f"{args.neighbours} busy neighbour(s); load {loadavg()}",
        flush=True,
    )
    runs: list[RunResult] = []
    warm: list[WarmResult] = []
    neighbours = Neighbours(args.neighbours)
    neighbour_pids = neighbours.pids
    if neighbours.pids:
        print(f"busy neighbours: pids {neighbours.pids}", flush=True)
    try:
        for round_index in range(args.rounds):
            print(f"round {round_index + 1}/{args.rounds}", flush=True)
            if not args.skip_serving:
                for mode in args.modes:
                    runs.extend(run_mode(setup, mode, round_index))
            for mode in args.modes if args.warm_lengths else []:
                warm.extend(warm_vs_restored(setup, mode, args.warm_lengths, vocab, round_index))
    finally:
        neighbours.stop()
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "args": vars(args),
                        "commit": commit,
                        "machine": machine(),
                        "neighbour_pids": neighbour_pids,
                        "runs": [asdict(r) for r in runs],
                        "warm": [asdict(w) for w in warm],
                    },
                    indent=1,
                )
            )
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nload at the end: {loadavg()}")
    print_tables(runs, warm, args.modes)


if __name__ == "__main__":
    main()
