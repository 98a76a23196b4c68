"""Operator's command line: stats, check [--fix], purge.

python -m hicache_galahad.cli --root DIR stats
python -m hicache_galahad.cli --root DIR check [--fix] [--encryption-key-file F]
python -m hicache_galahad.cli --root DIR purge [--tenant T]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .layout import NAMESPACE_FILE, RECORD_SUFFIX
from .store import RecordStore


def _namespaces(store: RecordStore):
    ns_root = os.path.join(store.root, "ns")
    for entry in sorted(os.scandir(ns_root), key=lambda item: item.name):
        if entry.is_dir(follow_symlinks=False):
            yield entry, store.layout.load_namespace(entry.name)


def _stats(store: RecordStore) -> dict:
    namespaces = []
    for entry, namespace in _namespaces(store):
        records = [item for item in os.scandir(entry.path) if item.name.endswith(RECORD_SUFFIX)]
        namespaces.append(
            {
                "namespace": entry.name,
                "tenant": namespace.tenant if namespace else None,
                "model_fingerprint": namespace.model_fingerprint if namespace else None,
                "pool": namespace.pool if namespace else None,
                "records": len(records),
                "bytes": sum(item.stat().st_size for item in records),
            }
        )
    return {"root": store.root, "ledger_bytes": store.usage_bytes(), "namespaces": namespaces}


def _purge(store: RecordStore, tenant: str | None) -> int:
    removed = 0
    for entry, namespace in _namespaces(store):
        if tenant is not None and (namespace is None or namespace.tenant != tenant):
            continue
        if namespace is not None:
            removed += store.clear_namespace(namespace)
        else:  # a namespace directory without a readable description: remove its records
            for item in os.scandir(entry.path):
                if item.name.endswith(RECORD_SUFFIX) or item.name == NAMESPACE_FILE:
                    os.unlink(item.path)
                    removed += item.name.endswith(RECORD_SUFFIX)
    store.check(fix=True)  # reconcile the ledger with what is left
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hicache_galahad.cli", description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="store directory")
    parser.add_argument("--encryption-key-file", help="master key, to verify encrypted records")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("stats", help="namespaces, record counts and bytes")
    check = commands.add_parser("check", help="verify every record")
    check.add_argument("--fix", action="store_true", help="quarantine damage, fix accounting")
    purge = commands.add_parser("purge", help="delete records")
    purge.add_argument("--tenant", help="only this tenant's records")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.root, "ns")):
        print(f"no hicache-galahad store at {args.root}", file=sys.stderr)
        return 2
    store = RecordStore(args.root, encryption_key_file=args.encryption_key_file)
    try:
        if args.command == "stats":
            print(json.dumps(_stats(store), indent=2))
            return 0
        if args.command == "check":
            report = store.check(fix=args.fix)
            print(json.dumps(report.as_dict(), indent=2))
            return 0 if report.clean or args.fix else 1
        removed = _purge(store, args.tenant)
        print(json.dumps({"removed_records": removed}))
        return 0
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
