"""The `galahad` command (also `python -m hicache_galahad`): see what a store holds, prove it is
healthy, clean it, and run the demo.

    galahad stats   --root DIR [--exact | --recount] [--json]
    galahad verify  --root DIR [--fix] [--tenant T] [--encryption-key-file F] [--json]
    galahad purge   --root DIR (--tenant T | --model-fingerprint F | --older-than D) [--dry-run]
    galahad gc      --root DIR [--max-bytes N]
    galahad inspect --root DIR FILE|KEY [--encryption-key-file F] [--json]
    galahad fingerprint MODEL_DIR
    galahad unpin   (--document LABEL | --tenant T | --all) --root DIR   (pins_cli.py)
    galahad warm    --server URL [--root DIR] [--pin] [--sections] [--check] FILE...
    galahad ready   --server URL [--root DIR] FILE...      (warm_cli.py)
    galahad demo                                  (a source checkout only: runs bench/demo.py)
    galahad blaise add|ask ...

The exit statuses and the helpers every command shares are common.py's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ..config.fingerprint import fingerprint_model_dir
from ..errors import GalahadError, OperatorError
from ..store import StoreAdmin
from ..units import parse_bytes
from . import pins_cli, warm_cli
from . import reports as ops
from .common import (
    EXIT_DAMAGE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNEXPECTED,
    EXIT_UNVERIFIED,
    emit,
    fail,
    open_store,
    root_options,
    size_text,
    table,
    when_text,
)

# ----------------------------------------------------------------------------- commands


def cmd_stats(args) -> int:
    if args.recount:  # the ledger recounted from disk (writers wait for the walk), then read
        with open_store(args, writable=True) as store:
            admin = StoreAdmin(store)
            admin.rebuild_ledger()
            report = ops.stats_report(admin)
    else:
        with open_store(args) as store:
            report = ops.stats_report(StoreAdmin(store), exact=args.exact)
    walked = report["counts"] == "walk"
    rows = [
        [
            "tenant",
            "model",
            "pool",
            "rank",
            "records",
            "on disk",
            "logical",
            "ratio",
            *(["oldest"] if walked else []),
            "newest",
        ]
    ]
    for ns in report["namespaces"]:
        ratio = ns["compression_ratio"]
        rows.append(
            [
                str(ns["tenant"] or "?"),
                str(ns["model_fingerprint"] or "?")[:24],
                str(ns["pool"] or "?"),
                str(ns["rank"] or "-"),
                str(ns["records"]),
                size_text(ns["disk_bytes"]),
                size_text(ns["logical_bytes"]),
                f"{ratio:.2f}" if ratio else "-",
                *([when_text(ns["oldest_record_s"])] if walked else []),
                when_text(ns["newest_record_s"]),
            ]
        )
    budget = report["budget"]
    counters = report["lifetime_counters"]
    if walked:
        source = "counted by reading every record"
        if not args.exact:
            source += (
                " (this ledger keeps no namespace counts yet: `galahad stats --recount` or "
                "`galahad verify --fix` fills them once)"
            )
    else:
        source = "counts kept by the ledger (--exact: read every record)"
    lines = [
        f"store {report['root']}: {report['records']} records, {size_text(report['disk_bytes'])} on "
        f"disk ({size_text(report['logical_bytes'])} of pages), {report['quarantined_files']} "
        f"quarantined files; {source}",
        "",
        table(rows),
        "",
        f"budget: max_bytes {size_text(budget['max_bytes'])}, min_free_bytes "
        f"{size_text(budget['min_free_bytes'])}; ledger {size_text(budget['ledger_bytes'])}; "
        f"filesystem free {size_text(budget['filesystem_free_bytes'])} of "
        f"{size_text(budget['filesystem_bytes'])}",
        "pinned: "
        + (
            ", ".join(
                f"{tenant or '?'} {size_text(size)}"
                for tenant, size in sorted(budget["pinned_bytes_by_tenant"].items())
            )
            or "none"
        )
        + (
            f" (max_pinned_bytes {size_text(budget['max_pinned_bytes'])})"
            if budget["max_pinned_bytes"] is not None
            else ""
        ),
        "lifetime: "
        + (", ".join(f"{name} {value}" for name, value in sorted(counters.items())) or "none"),
        *_eviction_order_lines(report["eviction_order"]),
    ]
    for dirname in report["unattributable_namespaces"]:
        lines.append(f"namespace {dirname}: no readable namespace.json (owner unknown)")
    for path in report["unreadable_dirs"]:
        lines.append(f"skipped unreadable directory {path}")
    for item in report["not_records"]:
        lines.append(f"not a record ({item['kind']}): {item['path']}")
    emit(args, report, "\n".join(lines))
    return EXIT_OK


def _eviction_order_lines(order: dict) -> list[str]:
    if not order["log"]:
        return ["eviction order: no log on this root yet (a writable store's first put starts it)"]
    lines = [
        f"eviction order: small queue {size_text(order['small_bytes'])} "
        f"({order['small_entries']} entries), main queue {size_text(order['main_bytes'])} "
        f"({order['main_entries']} entries); ghost {order['ghost_keys']} of "
        f"{order['ghost_slots']} keys; reserved {size_text(order['reserved_bytes'])} (puts "
        "in flight, evicted files not unlinked yet)"
    ]
    if order["restorable_share"] is not None:
        lines.append(
            f"restorable (estimate): {order['restorable_share']:.2f} "
            f"+/- {order['restorable_error']:.2f} of the records the order names are on every "
            f"rank with no page missing before them in their batch (an upper bound; "
            f"{order['sampled']} entries sampled, {order['stale']} naming a record gone)"
        )
    return lines


def cmd_verify(args) -> int:
    with open_store(args, writable=args.fix) as store:
        admin = StoreAdmin(store)
        dirnames = None
        if args.tenant is not None:
            dirnames = [
                dirname
                for dirname, ns in admin.namespaces_on_disk()
                if ns is not None and ns.tenant == args.tenant
            ]
        progress = _progress(admin, dirnames)
        try:
            report = admin.check(
                fix=args.fix,
                dirnames=dirnames,
                threads=args.threads,
                on_record=(lambda entry: progress.update(entry.size_bytes)) if progress else None,
            )
        finally:
            if progress:
                progress.close()
    data = report.as_dict()
    damaged_by_rule: dict[str, int] = {}
    for _, problem in report.damaged:
        damaged_by_rule[problem.split(":")[0]] = damaged_by_rule.get(problem.split(":")[0], 0) + 1
    data["damaged_by_rule"] = damaged_by_rule
    rows = [
        ["records verified", str(report.records - len(report.unverifiable))],
        ["bytes", size_text(report.record_bytes)],
        ["damaged", str(len(report.damaged))],
        *[[f"  {rule}", str(count)] for rule, count in sorted(damaged_by_rule.items())],
        ["could not verify", str(len(report.unverifiable))],
        ["stray temp files", str(len(report.stray_temp_files))],
        ["quarantined files", str(report.quarantined_files)],
        [
            "ledger / on disk",
            f"{size_text(report.ledger_bytes)} / {size_text(report.actual_bytes)}",
        ],
        ["fixed", "yes" if report.fixed else "no"],
        ["rate", _rate(report)],
    ]
    lines = [table(rows)]
    lines += [f"damaged: {path}: {problem}" for path, problem in report.damaged[:20]]
    if report.unverifiable:
        lines.append(
            f"{len(report.unverifiable)} record(s) could not be verified (e.g. "
            f"{report.unverifiable[0][1]}): encrypted records need the right "
            "--encryption-key-file"
        )
    emit(args, data, "\n".join(lines))
    if report.damaged or (report.stray_temp_files and not args.fix):
        return EXIT_DAMAGE
    return EXIT_UNVERIFIED if report.unverifiable else EXIT_OK


def _rate(report) -> str:
    if report.records_per_s is None:
        return "-"
    return (
        f"{report.records_per_s:,.0f} records/s, {report.mb_per_s:,.1f} MB/s "
        f"({report.scanned_records} records in {report.elapsed_s:.2f} s)"
    )


def _progress(admin: StoreAdmin, dirnames):
    """A progress bar over the bytes to verify, on a terminal only, sized from the ledger
    (its namespace counts, or its committed bytes): no walk before the walk."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(
        total=ops.bytes_to_verify(admin, dirnames),
        unit="B",
        unit_scale=True,
        desc="verify",
        file=sys.stderr,
    )


def cmd_purge(args) -> int:
    if args.tenant is None and args.model_fingerprint is None and args.older_than is None:
        raise OperatorError("purge needs --tenant, --model-fingerprint or --older-than")
    older_than_s = None
    if args.older_than is not None:
        try:
            older_than_s = ops.parse_duration_s(args.older_than)
        except ValueError as error:
            raise OperatorError(str(error)) from None
    with open_store(args, writable=not args.dry_run) as store:
        report = ops.purge(
            StoreAdmin(store),
            tenant=args.tenant,
            model_fingerprint=args.model_fingerprint,
            older_than_s=older_than_s,
            dry_run=args.dry_run,
        )
    verb = "would remove" if args.dry_run else "removed"
    lines = [f"{verb} {report.removed_records} records ({size_text(report.removed_bytes)})"]
    if report.kept_pinned_records:
        lines.append(f"kept {report.kept_pinned_records} pinned records (galahad unpin first)")
    lines += [
        f"namespace {dirname}: no readable namespace.json, owner unknown: left alone"
        for dirname in report.unattributable_namespaces
    ]
    emit(args, report.as_dict(), "\n".join(lines))
    return EXIT_OK


def cmd_gc(args) -> int:
    with open_store(args, writable=True) as store:
        admin = StoreAdmin(store)
        cap = parse_bytes(args.max_bytes) if args.max_bytes is not None else None
        if cap is None:
            servers = admin.live_settings()
            caps = [s.get("max_bytes") for s in servers]
            caps = [c for c in caps if isinstance(c, int)]
            cap = min(caps) if caps else None
        if cap is None:
            raise OperatorError("no budget to apply: pass --max-bytes (no server set one)")
        evicted, freed = admin.evict_to(cap)
        data = {"evicted_files": evicted, "freed_bytes": freed, "ledger_bytes": store.usage_bytes()}
    emit(
        args,
        data,
        f"evicted {evicted} files ({size_text(freed)}); now {size_text(data['ledger_bytes'])}",
    )
    return EXIT_OK


def cmd_inspect(args) -> int:
    with open_store(args) as store:
        admin = StoreAdmin(store)
        path = ops.find_record(admin, args.target)
        if path is None:
            raise OperatorError(f"no record {args.target!r} under {store.root}")
        info = ops.inspect_record(admin, path)
    lines = [f"{name}: {value}" for name, value in info.items()]
    emit(args, info, "\n".join(lines))
    return EXIT_OK if info["valid"] else EXIT_DAMAGE


def cmd_fingerprint(args) -> int:
    print(fingerprint_model_dir(args.model_dir))
    return EXIT_OK


def demo_script() -> Path | None:
    """bench/demo.py of the source checkout this package runs from; None when installed (the
    wheel holds no bench/), and `galahad demo` is then not offered."""
    demo = Path(__file__).resolve().parents[2] / "bench" / "demo.py"
    return demo if demo.is_file() else None


def cmd_demo(args) -> int:
    demo = demo_script()
    if demo is None:
        raise OperatorError("the demo ships with the source checkout: run `make demo` there")
    return subprocess.call([sys.executable, str(demo), *args.demo_args])


def cmd_blaise(args) -> int:
    from ..blaise import cli as blaise_cli

    return blaise_cli.run(args)


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="galahad", description="Operate a hicache-galahad store (docs/OPERATIONS.md)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stats = commands.add_parser("stats", help="what the store holds, its budget and counters")
    root_options(stats)
    recount = stats.add_mutually_exclusive_group()
    recount.add_argument(
        "--exact",
        action="store_true",
        help="read every record (oldest record, unreadable headers, files that are no record)",
    )
    recount.add_argument(
        "--recount",
        action="store_true",
        help="recount the ledger from disk first (writes it; writers wait for the walk)",
    )
    stats.set_defaults(run=cmd_stats)

    verify = commands.add_parser("verify", help="read every record and check every rule")
    root_options(verify, key=True)
    verify.add_argument(
        "--fix",
        action="store_true",
        help="quarantine damage, remove stray temp files, recount the ledger",
    )
    verify.add_argument("--tenant", help="only this tenant's records")
    verify.add_argument("--threads", type=int, default=4, help="records read at once (4)")
    verify.set_defaults(run=cmd_verify)

    purge = commands.add_parser("purge", help="remove records of a tenant, model or age")
    root_options(purge)
    purge.add_argument("--tenant", help="only this tenant's records")
    purge.add_argument("--model-fingerprint", help="only this model's records")
    purge.add_argument("--older-than", metavar="DURATION", help="unused for this long (12h, 7d)")
    purge.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    purge.set_defaults(run=cmd_purge)

    gc = commands.add_parser("gc", help="apply the budget now (evict least recently used)")
    root_options(gc)
    gc.add_argument("--max-bytes", help="budget to apply (default: the servers' max_bytes)")
    gc.set_defaults(run=cmd_gc)

    pins_cli.register(commands)  # unpin (store/pins/)

    inspect = commands.add_parser("inspect", help="one record's header in words")
    root_options(inspect, key=True)
    inspect.add_argument("target", metavar="FILE|KEY", help="a record file, or a record's key")
    inspect.set_defaults(run=cmd_inspect)

    fingerprint = commands.add_parser(
        "fingerprint", help="the model fingerprint the backend computes"
    )
    fingerprint.add_argument("model_dir", metavar="MODEL_DIR")
    fingerprint.set_defaults(run=cmd_fingerprint)

    warm_cli.register(commands)  # warm, ready (ops/warm_cli.py)

    if demo_script() is not None:  # a source checkout
        demo = commands.add_parser("demo", help="the README's main job: the restart demo")
        demo.add_argument("demo_args", nargs=argparse.REMAINDER, help="passed to bench/demo.py")
        demo.set_defaults(run=cmd_demo)

    blaise = commands.add_parser("blaise", help="the text memory: add documents, ask questions")
    from ..blaise import cli as blaise_cli

    blaise_cli.add_subcommands(blaise.add_subparsers(dest="blaise_command", required=True))
    blaise.set_defaults(run=cmd_blaise)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (GalahadError, OSError, ValueError) as error:
        message = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        where = f" ({error.filename})" if isinstance(error, OSError) and error.filename else ""
        return fail(f"{message}{where}")
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as error:  # a bug: one line, its own status, never a traceback
        return fail(
            f"unexpected error ({type(error).__name__}: {error}); please report it",
            EXIT_UNEXPECTED,
        )


if __name__ == "__main__":
    sys.exit(main())
