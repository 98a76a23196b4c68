"""What a full store keeps that SGLang can restore (issue 30), side by side in one run.

Every real store is built as a server builds it (`StorageBackendFactory`: GalahadStorage
through `dynamic` with `interface_v1`, SGLang's HiCacheFile through `file` with its LRU
`max_size`) over real SGLang host pools of small pages, and driven with the cache controller's
calls (bench/cache_clients.py). Three parts, then issue 30's goals, each met or not:

1. Leading runs (the issue's workload): D documents of P pages, written in batches of 8 pages
   as a prefill writes them; every third document is asked again 5 documents later
   (`batch_exists`, then a read of its run); the byte budget holds a quarter of the pages
   written. At the end, the leading run `batch_exists` reports for every document: pages in
   leading runs / pages the budget holds (100 x 64 and 60 x 32, one rank). With 4 and 8 TP
   ranks (one process each, its own backend of its tp_rank, one root and one budget, the same
   script in lockstep, the hit query MIN-reduced as SGLang does): restorable pages (each
   document's run, min over ranks) / one rank's share of the budget.
2. Traces (bench/cache_traces.py), replayed request by request: restorable tokens per request
   and the share of prompt tokens served from the store, for this store, HiCacheFile's LRU (the
   same budget in pages), an exact page-level LRU and Belady's optimum (bench/cache_sim.py), and
   a store that never evicts (what the trace allows at all). Tuning seeds and held-out seeds
   are reported apart: tune with `--split tuning` only.
3. Costs: 1 and 8 writer processes (TP ranks, 32 KiB pages) sharing 2048 new pages, put into
   a full budget of 1024 pages (each writer first fills it past its cap), against the same
   writers after the same fill with room to spare: aggregate pages/s, best of 3 alternating
   rounds. Records are made durable as a server's are (`deferred`).

Budgets are in pages: each store gets that many of its own records' bytes (a GalahadStorage
record is the page plus its header and key echo; a HiCacheFile file is the page).

Usage: .venv/bin/python bench/bench_cache.py [--quick] [--split tuning|held-out|both]
           [--parts runs,tp,traces,costs] [--prefix-keys] [--store-option KEY=JSON]...
           [--json FILE] [--work DIR]
       .venv/bin/python bench/bench_cache.py --from-json FILE    (the tables of a saved run)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.bench_store import machine  # noqa: E402
from bench.cache_clients import (  # noqa: E402
    COST_PAGES,
    SMALL_PAGES,
    Client,
    Lockstep,
    galahad_record_bytes,
    geometry_page_bytes,
    make_host_pool,
    open_galahad,
    open_hicache_file,
    page_bytes_of,
    run_ranks,
)
from bench.cache_sim import (  # noqa: E402
    Belady,
    ExactLru,
    LeavesFirstLru,
    Request,
    Unbounded,
    leading_run,
    replay,
    request_of,
)
from bench.cache_traces import HELD_OUT_SEEDS, TRACES, TUNING_SEEDS  # noqa: E402

ASK_LAG_DOCS = 5
GALAHAD = "this store"
HICACHE_FILE = "HiCacheFile LRU"
SIM_LRU = "exact LRU (sim)"
LEAVES_FIRST = "LRU, leaves first (sim)"
BELADY = "Belady (sim)"
UNBOUNDED = "unbounded (sim)"
PARTS = ("runs", "tp", "traces", "costs")


# ----------------------------------------------------------------------------- the issue's workload


def document_keys(document: int, pages: int, page_tokens: int) -> list[str]:
    """SGLang's chained page keys of a document of `pages` full pages (seeded tokens)."""
    rng = random.Random(f"document/{document}")
    tokens = [rng.randrange(1, 50_000) for _ in range(pages * page_tokens)]
    return list(request_of(tokens + [0], page_tokens).keys)


def issue_script(documents: int) -> list[tuple[str, int]]:
    """("write", d) for every document in order; ("ask", d) for every third one, 5 documents
    after it was written."""
    steps = []
    for document in range(documents):
        steps.append(("write", document))
        asked = document - ASK_LAG_DOCS
        if asked >= 0 and asked % 3 == 0:
            steps.append(("ask", asked))
    return steps


@dataclass(frozen=True)
class StoreSetup:
    """How every real store of a run is opened and called: a GalahadStorage record's bytes
    (budgets are in pages), whether the client passes prefix keys, and extra options for
    GalahadStorage (`--store-option`)."""

    record_bytes: int
    prefix_keys: bool = False
    galahad_options: tuple[tuple[str, object], ...] = ()

    def open(self, store: str, root, host, budget_pages: int, rank: int = 0, ranks: int = 1):
        if store == GALAHAD:
            return open_galahad(
                root,
                host,
                max_bytes=budget_pages * self.record_bytes,
                tp_rank=rank,
                tp_size=ranks,
                **dict(self.galahad_options),
            )
        share_bytes = budget_pages * page_bytes_of(host) // ranks  # each rank evicts its own
        return open_hicache_file(
            root, host, max_size_bytes=share_bytes, tp_rank=rank, tp_size=ranks
        )

    def client(self, store: str, backend, host) -> Client:
        return Client(backend, host, zero_copy=store == GALAHAD, prefix_keys=self.prefix_keys)


def close(backend) -> None:
    if hasattr(backend, "close"):
        backend.close()


def leading_runs_real(store, root, documents, pages, ranks, setup: StoreSetup) -> dict:
    # A quarter of what is written, every rank's pages counted (the issue's own figures at
    # 02fc903: one rank squeezed to 320 pages, the others 544, of 60 x 32 x 4 / 4 = 1920).
    budget_pages = documents * pages * ranks // 4

    def job(rank: int, lockstep: Lockstep) -> list[int]:
        host = make_host_pool()
        backend = setup.open(store, root, host, budget_pages, rank, ranks)
        client = setup.client(store, backend, host)
        keys = [document_keys(d, pages, host.page_size) for d in range(documents)]
        try:
            for action, document in issue_script(documents):
                lockstep.wait()
                if action == "write":
                    client.write(keys[document])
                else:
                    run = lockstep.min(rank, client.leading_run(keys[document]))
                    client.read(keys[document][:run])
            lockstep.wait()
            return [client.leading_run(chain) for chain in keys]
        finally:
            close(backend)

    runs_by_rank = run_ranks(ranks, job)
    return leading_runs_figures(runs_by_rank, budget_pages, pages)


def leading_runs_sim(documents: int, pages: int, page_tokens: int) -> dict:
    """The same script on an exact page-level LRU of the same budget in pages."""
    budget_pages = documents * pages // 4
    lru = ExactLru(budget_pages)
    keys = [tuple(document_keys(d, pages, page_tokens)) for d in range(documents)]
    for index, (action, document) in enumerate(issue_script(documents)):
        asked = Request(keys[document], pages if action == "ask" else 0, pages * page_tokens)
        lru.write(index, asked, lru.restore(index, asked))
    return leading_runs_figures([[leading_run(lru, k) for k in keys]], budget_pages, pages)


def leading_runs_figures(runs_by_rank: Sequence[Sequence[int]], budget_pages, pages) -> dict:
    ranks = len(runs_by_rank)
    restorable = [min(runs) for runs in zip(*runs_by_rank, strict=True)]
    share_pages = budget_pages / ranks
    return {
        "ranks": ranks,
        "budget_pages": budget_pages,
        "share_pages": share_pages,
        "restorable_pages": sum(restorable),
        "ratio": sum(restorable) / share_pages,
        "whole_documents": sum(run == pages for run in restorable),
        "partial_documents": sum(0 < run < pages for run in restorable),
        "own_run_ratios": [sum(runs) / share_pages for runs in runs_by_rank],
    }


# ----------------------------------------------------------------------------- traces


def replay_real(store, root, requests, budget_pages, setup: StoreSetup) -> list[int]:
    def job(rank: int, lockstep: Lockstep) -> list[int]:
        host = make_host_pool()
        backend = setup.open(store, root, host, budget_pages)
        client = setup.client(store, backend, host)
        try:
            return replay_client(client, requests)
        finally:
            close(backend)

    return run_ranks(1, job)[0]


def replay_client(client: Client, requests: Sequence[Request]) -> list[int]:
    """Restored pages per request from a real backend: the hit query, the read of its run,
    then the backup of every full page not restored."""
    restored_pages = []
    for request in requests:
        asked = request.keys[: request.query_pages]
        restored = client.read(asked[: client.leading_run(asked)])
        client.write(request.keys, restored)
        restored_pages.append(restored)
    return restored_pages


def trace_figures(name, seed, budget_pages, page_tokens, work, setup: StoreSetup):
    trace = TRACES[name](seed, budget_pages, page_tokens)
    requests = [request_of(prompt, page_tokens) for prompt in trace.prompts]
    restored = {
        GALAHAD: replay_real(GALAHAD, work / "galahad", requests, budget_pages, setup),
        HICACHE_FILE: replay_real(
            HICACHE_FILE, work / "hicache-file", requests, budget_pages, setup
        ),
        SIM_LRU: replay(ExactLru(budget_pages), requests),
        LEAVES_FIRST: replay(LeavesFirstLru(budget_pages), requests),
        BELADY: replay(Belady(budget_pages, requests), requests),
        UNBOUNDED: replay(Unbounded(), requests),
    }
    for directory in ("galahad", "hicache-file"):
        shutil.rmtree(work / directory, ignore_errors=True)
    prompt_tokens = sum(request.prompt_tokens for request in requests)
    return {
        "trace": name,
        "seed": seed,
        "requests": len(requests),
        "prompt_tokens": prompt_tokens,
        "pages_asked": sum(request.query_pages for request in requests),
        "served_share": {
            policy: sum(pages) * page_tokens / prompt_tokens for policy, pages in restored.items()
        },
        "tokens_per_request": {
            policy: sum(pages) * page_tokens / len(requests) for policy, pages in restored.items()
        },
        "restored_pages_per_request": restored,
    }


# ----------------------------------------------------------------------------- costs


def cost_run(root, writers, fill_pages, measured_pages, max_bytes, options) -> dict:
    def job(rank: int, lockstep: Lockstep) -> tuple[float, float, int, float]:
        host = make_host_pool(COST_PAGES)
        backend = open_galahad(
            root, host, max_bytes=max_bytes, tp_rank=rank, tp_size=writers, **options
        )
        client = Client(backend, host, zero_copy=True)
        try:
            client.write(cost_keys(rank, "fill", fill_pages))
            lockstep.wait()
            start_s, start_cpu_s = time.perf_counter(), time.process_time()
            written = client.write(cost_keys(rank, "measured", measured_pages))
            end_s, cpu_s = time.perf_counter(), time.process_time() - start_cpu_s
            lockstep.wait()
        finally:
            close(backend)
        return start_s, end_s, written, cpu_s

    results = run_ranks(writers, job)
    elapsed_s = max(end for _, end, _, _ in results) - min(start for start, *_ in results)
    written = sum(pages for _, _, pages, _ in results)
    cpu_s = sum(cpu for *_, cpu in results)  # every thread of every writer, user + system
    return {
        "pages": written,
        "elapsed_s": elapsed_s,
        "pages_per_s": written / elapsed_s,
        "cpu_us_per_page": 1e6 * cpu_s / max(written, 1),
    }


def cost_keys(rank: int, phase: str, count: int) -> list[str]:
    return [
        hashlib.sha256(f"{rank}/{phase}/{index}".encode()).hexdigest() for index in range(count)
    ]


def costs(work: Path, writers_list, total_pages_measured, rounds, options=()) -> dict:
    """Per writer count (the writers share `total_pages_measured` new pages): the best round
    of each condition, every round's pages/s (the conditions alternate), and full / room."""
    record_bytes = geometry_page_bytes(COST_PAGES) + (1 << 10)  # header and key: under 1 KiB
    figures = {}
    for writers in writers_list:
        measured_pages = total_pages_measured // writers
        budget_pages = max(64, total_pages_measured // 2)
        fill_pages = budget_pages // writers + measured_pages // 4  # the full root evicts at once
        total_pages = writers * (fill_pages + measured_pages)
        budgets = {"room": 4 * total_pages * record_bytes, "full": budget_pages * record_bytes}
        runs = {"room": [], "full": []}
        for _round in range(rounds):
            for condition, max_bytes in budgets.items():
                root = work / f"costs-{writers}-{condition}"
                shutil.rmtree(root, ignore_errors=True)
                runs[condition].append(
                    cost_run(root, writers, fill_pages, measured_pages, max_bytes, dict(options))
                )
                shutil.rmtree(root, ignore_errors=True)
                progress(f"costs, {writers} writers, {condition}: {runs[condition][-1]}")
        best = {
            condition: max(results, key=lambda result: result["pages_per_s"])
            for condition, results in runs.items()
        }
        figures[writers] = {
            **best,
            "rounds_pages_per_s": {c: [r["pages_per_s"] for r in runs[c]] for c in runs},
            "budget_pages": budget_pages,
            "ratio": best["full"]["pages_per_s"] / best["room"]["pages_per_s"],
        }
    return figures


# ----------------------------------------------------------------------------- output

GOAL_ONE_RANK = 0.95
GOAL_RANKS = 0.9
GOAL_POINTS_ABOVE_LRU = {"scan": 10.0, "coding_agent": 10.0}
GOAL_POINTS_FROM_BELADY = {"zipf_chat": 10.0}
GOAL_COST_RATIO = 0.5  # a put into a full budget costs at most 2x a put with room


def report(results: dict) -> list[str]:
    """Every table of a run (from its figures: `--from-json` prints a saved run again)."""
    lines = [f"# bench_cache: {results['machine']}"]
    lines.append(
        f"# load average at start {results['load_start']:.2f}, at end {results['load_end']:.2f}"
        f"; prefix keys: {results['prefix_keys']}; quick: {results['quick']}"
        f"; GalahadStorage options: {results.get('store_options') or 'none'}"
    )
    lines.append(
        f"# small pages: {results['page_tokens']} tokens, {results['record_bytes']} B per "
        f"GalahadStorage record, {results['page_bytes']} B per HiCacheFile file"
    )
    if "leading_runs" in results:
        lines += ["", "## Leading runs: pages in leading runs / pages the budget holds"]
        lines += ["(with ranks: restorable pages, min over ranks / one rank's share)", ""]
        lines += leading_runs_table(results["leading_runs"])
    if "traces" in results:
        traces = results["traces"]
        lines += ["", f"## Traces (budget {traces['budget_pages']} pages)", ""]
        lines += traces_table(traces["rows"], traces["splits"])
    if "costs" in results:
        costs_figures = results["costs"]
        lines += ["", "## Costs: puts of 32 KiB pages into a full budget / with room", ""]
        lines += costs_table(costs_figures)
    lines += ["", "## Goals (issue 30)", ""]
    lines += goals_table(results)
    return lines


def leading_runs_table(results: dict) -> list[str]:
    lines = [
        "| workload | ranks | " + " | ".join(results["stores"]) + " |",
        "|---|---:|" + "---:|" * len(results["stores"]),
    ]
    for row in results["rows"]:
        cells = []
        for store in results["stores"]:
            figure = row["figures"].get(store)
            if figure is None:
                cells.append("")
                continue
            text = f"{figure['ratio']:.2f} ({figure['whole_documents']} whole, "
            text += f"{figure['partial_documents']} partial)"
            if figure["ranks"] > 1:
                own = figure["own_run_ratios"]
                text += f"; own runs {min(own):.2f}-{max(own):.2f}"
            cells.append(text)
        lines.append(f"| {row['workload']} | {row['ranks']} | " + " | ".join(cells) + " |")
    return lines


POLICIES = (GALAHAD, HICACHE_FILE, SIM_LRU, LEAVES_FIRST, BELADY, UNBOUNDED)


def split_shares(rows: list[dict], name: str, seeds) -> tuple[dict, dict] | None:
    """(share of prompt tokens served, restorable tokens per request) per policy, mean over
    the seeds; None when the run has no such trace."""
    chosen = [row for row in rows if row["trace"] == name and row["seed"] in seeds]
    if not chosen:
        return None
    policies = [p for p in POLICIES if p in chosen[0]["served_share"]]  # (older runs: fewer)
    share = {p: mean(row["served_share"][p] for row in chosen) for p in policies}
    tokens = {p: mean(row["tokens_per_request"][p] for row in chosen) for p in policies}
    return share, tokens


def traces_table(rows: list[dict], splits: dict) -> list[str]:
    lines = [
        "Share of prompt tokens served from the store (restorable tokens per request), mean "
        "over the split's seeds:",
        "",
        "| trace | split | "
        + " | ".join(POLICIES)
        + " | store - LRU (points) | Belady - store (points) |",
        "|---|---|" + "---:|" * (len(POLICIES) + 2),
    ]
    for name in TRACES:
        for split, seeds in splits.items():
            shares = split_shares(rows, name, seeds)
            if shares is None:
                continue
            share, tokens = shares
            cells = [
                f"{100 * share[p]:.1f}% ({tokens[p]:.0f})" if p in share else "" for p in POLICIES
            ]
            cells.append(f"{100 * (share[GALAHAD] - share[SIM_LRU]):+.1f}")
            cells.append(f"{100 * (share[BELADY] - share[GALAHAD]):+.1f}")
            lines.append(f"| {name} | {split} {sorted(seeds)} | " + " | ".join(cells) + " |")
    return lines


def costs_table(figures: dict) -> list[str]:
    lines = [
        "| writers | pages per writer | with room (pages/s) | full budget (pages/s) "
        "| full / room | CPU us/page, room | CPU us/page, full |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for writers, figure in figures.items():
        cpu = [f"{figure[c].get('cpu_us_per_page', float('nan')):.0f}" for c in ("room", "full")]
        lines.append(
            f"| {writers} | {figure['room']['pages'] // int(writers)} | "
            f"{figure['room']['pages_per_s']:.0f} | {figure['full']['pages_per_s']:.0f} | "
            f"{figure['ratio']:.2f}x | {cpu[0]} | {cpu[1]} |"
        )
    return lines


def goals_table(results: dict) -> list[str]:
    """Each goal of issue 30 that this run measures: the figure, and met or not."""
    goals = []

    def add(goal: str, figure: str, met: bool) -> None:
        goals.append((goal, figure, met))

    for row in results.get("leading_runs", {}).get("rows", []):
        figure = row["figures"][GALAHAD]
        goal = GOAL_ONE_RANK if row["ranks"] == 1 else GOAL_RANKS
        what = "pages in leading runs / budget" if row["ranks"] == 1 else "restorable / share"
        add(
            f"{what}, {row['workload']}, {row['ranks']} rank(s) >= {goal}",
            f"{figure['ratio']:.2f}",
            figure["ratio"] >= goal,
        )
    traces = results.get("traces")
    for name in TRACES if traces else ():
        for split, seeds in traces["splits"].items():
            shares = split_shares(traces["rows"], name, seeds)
            if shares is None:
                continue
            share = {p: 100 * value for p, value in shares[0].items()}
            where = f"{name} ({split})"
            above_lru = share[GALAHAD] - share[SIM_LRU]
            above_file = share[GALAHAD] - share[HICACHE_FILE]
            add(f"{where}: >= exact LRU", f"{above_lru:+.1f} points", above_lru >= 0)
            add(f"{where}: >= HiCacheFile's LRU", f"{above_file:+.1f} points", above_file >= 0)
            if name in GOAL_POINTS_ABOVE_LRU:
                points = GOAL_POINTS_ABOVE_LRU[name]
                add(
                    f"{where}: >= {points:.0f} points above exact LRU",
                    f"{above_lru:+.1f} points",
                    above_lru >= points,
                )
            if name in GOAL_POINTS_FROM_BELADY:
                points = GOAL_POINTS_FROM_BELADY[name]
                below = share[BELADY] - share[GALAHAD]
                add(
                    f"{where}: within {points:.0f} points of Belady",
                    f"{below:.1f} points below",
                    below <= points,
                )
    for writers, figure in results.get("costs", {}).items():
        add(
            f"{writers} writer(s): a put into a full budget costs <= 2x one with room",
            f"{figure['ratio']:.2f}x the pages/s",
            figure["ratio"] >= GOAL_COST_RATIO,
        )
    lines = ["| goal | figure | met |", "|---|---:|---|"]
    lines += [
        f"| {goal} | {figure} | {'met' if met else 'NOT met'} |" for goal, figure, met in goals
    ]
    return lines


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--split", choices=("tuning", "held-out", "both"), default="both")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    parser.add_argument(
        "--prefix-keys",
        action="store_true",
        help="pass prefix keys in extra_info (a server with hicache_storage_pass_prefix_keys)",
    )
    parser.add_argument(
        "--store-option",
        action="append",
        type=store_option,
        default=[],
        metavar="KEY=JSON",
        help="an extra GalahadStorage option, e.g. --store-option durability='\"none\"'",
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temp dir)")
    parser.add_argument("--from-json", type=Path, help="print the tables of a saved run only")
    args = parser.parse_args(argv)
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        print("\n".join(report(results)))
        return results
    parts = [part for part in args.parts.split(",") if part]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"--parts: unknown {sorted(unknown)}; choose from {','.join(PARTS)}")
    args.store_option = dict(args.store_option)
    # Quiet while it runs (a full budget's warnings are the point), and only then: tests call
    # main() in their own process, and a later test's caplog must still see warnings.
    logging.disable(logging.WARNING)
    try:
        results = measure(args, parts)
    finally:
        logging.disable(logging.NOTSET)
    print("\n".join(report(results)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


def measure(args, parts) -> dict:
    torch.set_num_threads(1)
    if args.quick:  # a smoke run: every part and every table, figures too small to judge
        workloads = [(24, 16)]
        tp_workloads = [(4, 48, 8)]  # a rank's share: 3 documents
        trace_budget_pages, writers_list, measured_pages, rounds = 32, (1, 2), 32, 1
        splits = {"tuning": TUNING_SEEDS[:1], "held-out": HELD_OUT_SEEDS[:1]}
    else:
        workloads = [(100, 64), (60, 32)]
        tp_workloads = [(4, 60, 32), (8, 60, 32)]
        trace_budget_pages, writers_list, measured_pages, rounds = 256, (1, 8), 2048, 3
        splits = {"tuning": TUNING_SEEDS, "held-out": HELD_OUT_SEEDS}
    if args.split != "both":
        splits = {args.split: splits[args.split]}

    page_tokens = SMALL_PAGES[1]
    results: dict = {
        "machine": machine(),
        "quick": args.quick,
        "prefix_keys": args.prefix_keys,
        "store_options": args.store_option,
        "load_start": os.getloadavg()[0],
        "page_tokens": page_tokens,
        "page_bytes": geometry_page_bytes(SMALL_PAGES),
    }
    work = Path(tempfile.mkdtemp(prefix="bench_cache-", dir=args.work))
    try:
        options = tuple(sorted(args.store_option.items()))
        results["record_bytes"] = record_bytes_of_small_pages(work, options)
        setup = StoreSetup(results["record_bytes"], args.prefix_keys, options)
        rows = []
        for documents, pages in workloads if "runs" in parts else []:
            figures = {}
            for store in (GALAHAD, HICACHE_FILE):
                figures[store] = leading_runs_real(
                    store,
                    fresh_root(work, f"runs-{documents}x{pages}-{store}"),
                    documents,
                    pages,
                    1,
                    setup,
                )
                progress(f"runs {documents} x {pages}, {store}: {figures[store]['ratio']:.2f}")
            figures[SIM_LRU] = leading_runs_sim(documents, pages, page_tokens)
            rows.append({"workload": f"{documents} x {pages}", "ranks": 1, "figures": figures})
        for ranks, documents, pages in tp_workloads if "tp" in parts else []:
            figures = {}
            for store in (GALAHAD, HICACHE_FILE):
                figures[store] = leading_runs_real(
                    store,
                    fresh_root(work, f"tp{ranks}-{documents}x{pages}-{store}"),
                    documents,
                    pages,
                    ranks,
                    setup,
                )
                progress(f"{ranks} ranks, {store}: {figures[store]['ratio']:.2f}")
            rows.append({"workload": f"{documents} x {pages}", "ranks": ranks, "figures": figures})
        if rows:
            results["leading_runs"] = {"stores": [GALAHAD, HICACHE_FILE, SIM_LRU], "rows": rows}
        if "traces" in parts:
            rows = []
            for name in TRACES:
                for seeds in splits.values():
                    for seed in seeds:
                        rows.append(
                            trace_figures(
                                name,
                                seed,
                                trace_budget_pages,
                                page_tokens,
                                work,
                                setup,
                            )
                        )
                        progress(f"trace {name} seed {seed}: {rows[-1]['served_share']}")
            results["traces"] = {
                "budget_pages": trace_budget_pages,
                "splits": {split: list(seeds) for split, seeds in splits.items()},
                "rows": rows,
            }
        if "costs" in parts:
            results["costs"] = {
                str(writers): figure
                for writers, figure in costs(
                    work, writers_list, measured_pages, rounds, setup.galahad_options
                ).items()
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_end"] = os.getloadavg()[0]
    return results


def store_option(text: str) -> tuple[str, object]:
    """KEY=JSON (a bare word that is not JSON is taken as a string)."""
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=JSON, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def fresh_root(work: Path, name: str) -> Path:
    """A root no other run has used: every run starts from an empty store."""
    root = work / name.replace(" ", "-")
    if root.exists():
        raise FileExistsError(root)
    return root


def record_bytes_of_small_pages(work: Path, options=()) -> int:
    """A GalahadStorage record's bytes on disk for one small page (measured in a child, so
    that this process never starts a store's threads before it forks ranks)."""

    def probe(rank: int, lockstep: Lockstep) -> int:
        return galahad_record_bytes(work, make_host_pool(), **dict(options))

    return run_ranks(1, probe)[0]


if __name__ == "__main__":
    main()
