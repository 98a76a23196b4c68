"""The child processes of the record store tests: `python tests/store_child.py ROLE ARGS`.

Started by `store_helpers.spawn` / `run_json` (the venv's python, PYTHONPATH set to the
repository root): a crash writer SIGKILLed at random, a budget writer driven over stdin, a
concurrent writer, a reader and an open measurement. Each prints "ready" or its JSON result on
stdout. A script only: the tests import tests/store_helpers.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from support.records import store_disk_bytes
from support.store_helpers import NS_A, content, crash_keyspace

from hicache_galahad.store import RecordStore


def _crash_writer(args) -> None:
    """Writes the crash key space forever (until SIGKILLed), through a plain and a zstd store
    on one root, with put_many, put and delete, under a byte budget that forces evictions."""
    space = crash_keyspace(args.keys)
    options = {"max_bytes": args.max_bytes, "durability": args.durability, "io_threads": 4}
    plain = RecordStore(args.root, **options)
    packed = RecordStore(args.root, compression="zstd", **options)
    for store in (plain, packed):
        store.register_namespace(NS_A)
    rng = random.Random(args.seed)
    print("ready", flush=True)
    while True:
        store = rng.choice((plain, packed))
        roll = rng.random()
        if roll < 0.5:
            batch = rng.sample(space, rng.randint(2, 6))
            store.put_many(NS_A, [key for key, _, _ in batch], [content(*item) for item in batch])
        elif roll < 0.9:
            store.put(NS_A, *_key_and_data(rng.choice(space)))
        else:
            store.delete(NS_A, rng.choice(space)[0])


def _key_and_data(item):
    key, size, compressible = item
    return key, content(key, size, compressible)


def _budget_writer(args) -> None:
    """Rounds of puts on command ("go N" on stdin), sampling the shared ledger after each."""
    store = RecordStore(args.root, max_bytes=args.max_bytes, durability="none")
    store.register_namespace(NS_A)
    print("ready", flush=True)
    highest_ledger = highest_disk = 0
    for line in sys.stdin:
        command = line.split()
        if command[0] == "quit":
            break
        round_index = int(command[1])
        results = []
        for index in range(args.per_round):
            key = f"{args.prefix}-r{round_index}-{index}"
            results.append(store.put(NS_A, key, content(key, args.size)))
            highest_ledger = max(highest_ledger, store.usage_bytes())
            highest_disk = max(highest_disk, store_disk_bytes(args.root))
        print(json.dumps({"round": round_index, "ok": sum(results)}), flush=True)
    summary = {"highest_ledger": highest_ledger, "highest_disk": highest_disk}
    print(json.dumps(store.stats().as_dict() | summary), flush=True)
    store.close()


def _mixed_writer(args) -> None:
    """Waits for the go file, then puts shared and own keys in a shuffled order."""
    store = RecordStore(args.root, durability="fsync" if args.durable else "none", io_threads=4)
    store.register_namespace(NS_A)
    items = [(f"shared-{i}", args.size + i) for i in range(args.shared)]
    items += [(f"{args.prefix}-{i}", args.size + i) for i in range(args.own)]
    random.Random(args.prefix).shuffle(items)
    print("ready", flush=True)
    while not os.path.exists(args.go_file):
        time.sleep(0.001)
    results = {}
    for start in range(0, len(items), 8):
        batch = items[start : start + 8]
        if start % 16:
            keys = [key for key, _ in batch]
            oks = store.put_many(NS_A, keys, [content(key, size) for key, size in batch])
        else:
            oks = [store.put(NS_A, key, content(key, size)) for key, size in batch]
        results.update(zip((key for key, _ in batch), oks, strict=True))
    print(
        json.dumps({"failed": [k for k, ok in results.items() if not ok]} | store.stats().as_dict())
    )
    store.close()


def _reader(args) -> None:
    """Verifies the (key, size, compressible) items listed in a JSON file; prints counts."""
    with open(args.items) as items_file:
        items = json.load(items_file)
    key_file = args.key_file or None
    store = RecordStore(args.root, encryption_key_file=key_file)
    hits = []
    wrong = []
    for key, size, compressible in items:
        expected = content(key, size, compressible)
        out = bytearray(len(expected))
        if store.get_into(NS_A, key, out):
            (hits if bytes(out) == expected else wrong).append(key)
    print(json.dumps(store.stats().as_dict() | {"hit_keys": hits, "wrong_keys": wrong}))
    store.close()


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _open_measure(args) -> None:
    """Opens a store (imports done beforehand) and reports open time, RSS delta and size."""
    import gc

    gc.collect()
    rss_before = _rss_bytes()
    started = time.perf_counter()
    store = RecordStore(args.root)
    open_s = time.perf_counter() - started
    rss_after = _rss_bytes()
    stats = store.stats()
    key = args.probe_key
    probe_ok = store.get(NS_A, key, args.probe_size) == content(key, args.probe_size)
    store.close()
    print(
        json.dumps(
            {
                "open_s": open_s,
                "rss_delta_bytes": rss_after - rss_before,
                "rss_after_bytes": rss_after,
                "indexed_records": stats.indexed_records,
                "ledger_bytes": stats.ledger_bytes,
                "probe_ok": probe_ok,
            }
        )
    )


REQUIRED = object()
# Each role: its function and its options after the store root, as (type, default).
ROLES = {
    "crash-writer": (
        _crash_writer,
        {
            "seed": (int, REQUIRED),
            "keys": (int, 160),
            "max-bytes": (int, None),
            "durability": (str, "fsync"),
        },
    ),
    "budget-writer": (
        _budget_writer,
        {
            "prefix": (str, REQUIRED),
            "max-bytes": (int, REQUIRED),
            "size": (int, REQUIRED),
            "per-round": (int, REQUIRED),
        },
    ),
    "mixed-writer": (
        _mixed_writer,
        {
            "prefix": (str, REQUIRED),
            "shared": (int, REQUIRED),
            "own": (int, REQUIRED),
            "size": (int, REQUIRED),
            "go-file": (str, REQUIRED),
            "durable": (int, 1),
        },
    ),
    "reader": (_reader, {"items": (str, REQUIRED), "key-file": (str, "")}),
    "open-measure": (_open_measure, {"probe-key": (str, REQUIRED), "probe-size": (int, REQUIRED)}),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    roles = parser.add_subparsers(dest="role", required=True)
    for name, (run, options) in ROLES.items():
        role = roles.add_parser(name)
        role.add_argument("root")
        for option, (kind, default) in options.items():
            if default is REQUIRED:
                role.add_argument(f"--{option}", type=kind, required=True)
            else:
                role.add_argument(f"--{option}", type=kind, default=default)
        role.set_defaults(run=run)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
