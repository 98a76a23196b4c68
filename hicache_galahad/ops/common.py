"""What every `galahad` command shares: the exit statuses, opening a store, the --root options,
sizes, times and tables in words, and printing text or JSON.

Exit status: 0 success; 1 damage found (verify, inspect), or documents not fully stored (warm,
ready); 2 an expected condition (no such store, a bad or too open key file, a read-only
filesystem for a command that writes, a bad argument, no server or a broken one), reported in
one line; 3 records that could not be verified (verify: encrypted, and no key or another key),
or a server that does not restore what the store holds (ready); 4 an unexpected failure (a bug:
one line naming it, never a traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

from ..errors import OperatorError
from ..store import RecordStore

EXIT_OK, EXIT_DAMAGE, EXIT_EXPECTED, EXIT_UNVERIFIED, EXIT_UNEXPECTED = 0, 1, 2, 3, 4
EXIT_INCOMPLETE = EXIT_DAMAGE  # warm, ready: a document not fully stored
EXIT_NOT_RESTORING = EXIT_UNVERIFIED  # ready: the records are there, the server reuses none
EXIT_INTERRUPTED = 130


def open_store(args, *, writable: bool = False) -> RecordStore:
    """The store at `args.root` (with `args.encryption_key_file` when the command has it);
    OperatorError when there is none or it must be written and cannot."""
    root = os.path.abspath(os.path.expanduser(args.root))
    if not os.path.isdir(os.path.join(root, "ns")):
        if not os.path.exists(root):
            raise OperatorError(f"no directory {root}")
        raise OperatorError(f"{root} is not a hicache-galahad store (no ns/ directory)")
    if writable and not os.access(root, os.W_OK):
        raise OperatorError(f"{root} is not writable (read-only mount or permissions)")
    key_file = getattr(args, "encryption_key_file", None)
    return RecordStore(root, encryption_key_file=key_file, read_only=not writable)


def root_options(parser: argparse.ArgumentParser, *, key: bool = False, as_json: bool = True):
    parser.add_argument("--root", required=True, help="store directory (the backend's root)")
    if key:
        parser.add_argument(
            "--encryption-key-file", help="32-byte master key, to verify encrypted records"
        )
    if as_json:
        parser.add_argument("--json", action="store_true", help="machine-readable output")


def size_text(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def when_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def table(rows: list[list[str]]) -> str:
    """Rows as columns padded to their widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def emit(args, data: dict, text: str) -> None:
    """`data` as JSON with --json, else `text`."""
    print(json.dumps(data, indent=2, default=str) if getattr(args, "json", False) else text)


def fail(message: str, status: int = EXIT_EXPECTED) -> int:
    """Prints one line on stderr and returns the exit status."""
    print(f"galahad: {message}", file=sys.stderr)
    return status
