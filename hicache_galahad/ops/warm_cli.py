"""`galahad warm` and `galahad ready`: the commands over the warming package (hicache_galahad/warming).

    galahad warm  --server URL [--root DIR] [--tenant T] [--pin] [--sections] [--json] FILE...
    galahad warm  --check ...                      (the same as `galahad ready`)
    galahad ready --server URL [--root DIR] [--tenant T] [--sections] [--no-probe] [--json] FILE...

Exit 0 when every document is fully stored (and, for ready, the server restores), 1 when one is
not, 2 for an expected condition (one line), 3 (ready) when the records are there but the
server's probe reused none of them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from ..warming import WarmReport, warm
from ..warming.http import DEFAULT_DEADLINE_S
from ..warming.probe import Probe
from ..warming.run import DEFAULT_RETRIES, DEFAULT_WAIT_S
from .common import EXIT_INCOMPLETE, EXIT_NOT_RESTORING, EXIT_OK, table


def _probe_line(probe: Probe) -> str:
    where = f" ({probe.document}, {probe.prompt_tokens} tokens)" if probe.document else ""
    if probe.verdict == "restored":
        return (
            f"server: restores now: the probe{where} took {probe.storage_tokens} tokens from "
            "storage"
        )
    if probe.verdict == "not_restored":
        return f"server: does NOT restore now{where}: {probe.reason}"
    return f"server: not probed{where}: {probe.reason}"


def _render(reports: list[WarmReport], check: bool) -> str:
    hybrid = any(report.hybrid for report in reports)
    header = ["document", "tokens", "pages stored", "restorable"]
    header += ["checkpoints"] if hybrid else []
    header += [] if check else ["requests", "seconds", "pinned"]
    rows = [header]
    for r in reports:
        row = [
            r.document,
            str(r.tokens),
            f"{r.pages_stored}/{r.pages_expected}",
            f"{r.restorable_tokens} (+question: {r.continuation_tokens})",
        ]
        if hybrid:
            row.append(",".join(str(point) for point in r.checkpoints) or "-")
        if not check:
            pinned = (
                "-"
                if r.pinned is None
                else f"{r.pinned['pinned_records'] + r.pinned['already_pinned_records']}"
            )
            row += [str(r.requests), f"{r.seconds:.2f}", pinned]
        rows.append(row)
    incomplete = [r.document for r in reports if not r.complete]
    lines = [table(rows)]
    if incomplete:
        lines.append(f"not fully stored: {', '.join(incomplete)}")
    if reports and reports[0].probe is not None:
        lines.append(_probe_line(reports[0].probe))
    return "\n".join(lines)


def _status(reports: list[WarmReport]) -> int:
    probe = reports[0].probe if reports else None
    if probe is not None and not probe.restores:
        return EXIT_NOT_RESTORING
    return EXIT_OK if all(report.complete for report in reports) else EXIT_INCOMPLETE


def cmd_warm(args) -> int:
    check = args.check or args.command == "ready"
    progress = None
    if sys.stderr.isatty() and not args.json:
        from tqdm import tqdm

        progress = tqdm(
            total=len(args.files), unit="doc", desc="ready" if check else "warm", file=sys.stderr
        )
    try:
        reports = warm(
            args.server,
            [Path(path) for path in args.files],
            root=args.root,
            tenant=args.tenant,
            pin=getattr(args, "pin", False),
            sections=args.sections,
            check=check,
            probe=not args.no_probe,
            extra_key=args.extra_key,
            cache_salt=args.cache_salt,
            retries=getattr(args, "retries", DEFAULT_RETRIES),
            wait_s=getattr(args, "wait", DEFAULT_WAIT_S),
            checkpoint_every=getattr(args, "checkpoint_every", 0),
            timeout_s=args.timeout,
            root_pin_limit=getattr(args, "root_pin_limit", False),
            on_document=(lambda report: progress.update(1)) if progress else None,
        )
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        data = {"documents": [report.as_dict() for report in reports]}
        data["complete"] = all(report.complete for report in reports)
        if reports and reports[0].probe is not None:
            probe = reports[0].probe
            data["server_probe"] = asdict(probe) | {"restores": probe.restores}
        print(json.dumps(data, indent=2))
    else:
        print(_render(reports, check))
    return _status(reports)


def _common(parser) -> None:
    parser.add_argument("--server", required=True, help="SGLang server URL (http://host:port)")
    parser.add_argument("--root", help="store directory (default: the server's root)")
    parser.add_argument("--tenant", help="the tenant the server writes as (default: its own)")
    parser.add_argument(
        "--sections", action="store_true", help="each Blaise section as its prompt prefix"
    )
    parser.add_argument("--extra-key", help="the request's extra_key (also seeds the keys)")
    parser.add_argument("--cache-salt", help="the request's cache_salt (also seeds the keys)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_DEADLINE_S,
        metavar="SECONDS",
        help="the most one call to the server may take, whole answer read (600)",
    )
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="ready: send no probe request (report from the store alone)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.set_defaults(run=cmd_warm)


def register(commands) -> None:
    """Adds `warm` and `ready` to the `galahad` command's subparsers."""
    warm_parser = commands.add_parser(
        "warm", help="send documents through a server until the store holds every page"
    )
    _common(warm_parser)
    warm_parser.add_argument("--pin", action="store_true", help="pin the warmed records")
    warm_parser.add_argument(
        "--root-pin-limit",
        action="store_true",
        help="--pin when the server's extra config cannot be read here: obey the root's limit",
    )
    warm_parser.add_argument(
        "--check", action="store_true", help="report what a request would restore now (= ready)"
    )
    warm_parser.add_argument(
        "--retries", type=int, default=DEFAULT_RETRIES, help="flush and resend this often (2)"
    )
    warm_parser.add_argument(
        "--wait", type=float, default=DEFAULT_WAIT_S, help="seconds to wait for write-back (60)"
    )
    warm_parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="TOKENS",
        help="hybrid: also leave a checkpoint every TOKENS (a multiple of the grid)",
    )
    ready_parser = commands.add_parser(
        "ready", help="how many tokens of each document a request would restore now"
    )
    _common(ready_parser)
    ready_parser.set_defaults(check=True)
