"""Shared helpers for the record store tests (tests/test_store_*.py).

Importable from the tests (pytest puts tests/ on sys.path) and runnable as a script: the
subprocess roles (crash writer, budget writer, concurrent writer, reader, open measurement)
live in `main()` so that every test process runs this repository's code with the venv's
python and PYTHONPATH set to the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # when run as a script
    sys.path.insert(0, REPO_ROOT)

from hicache_galahad import format as fmt  # noqa: E402
from hicache_galahad.layout import RECORD_SUFFIX, TEMP_PREFIX  # noqa: E402
from hicache_galahad.namespace import Namespace  # noqa: E402
from hicache_galahad.store import RecordStore  # noqa: E402

PYTHON = sys.executable
HELPER = os.path.abspath(__file__)

GEOMETRY = {"dtype": "bfloat16", "layout": "layer_first", "page_size": 64, "tp_rank": 0}
NS_A = Namespace("tenant-a", "model-fp-1", "kv", GEOMETRY)

# A table that keeps the low 4 bits of every byte: random bytes through it carry 4 bits of
# entropy per byte, which zstd roughly halves (well past the store's 1/16 threshold).
_LOW_NIBBLE = bytes(value & 0x0F for value in range(256))


# ----------------------------------------------------------------------------- content


def content(key: str, size: int, compressible: bool = False) -> bytes:
    """Deterministic bytes for a key (the same in every process and every run)."""
    data = random.Random(f"galahad-test:{key}:{size}").randbytes(size)
    return data.translate(_LOW_NIBBLE) if compressible else data


def hex_key(label: str) -> str:
    """A 64-hex key, as SGLang names its pages (stored under its own name)."""
    return hashlib.sha256(label.encode()).hexdigest()


def crash_keyspace(count: int = 160) -> list[tuple[str, int, bool]]:
    """(key, size, compressible) for the crash test: sizes log-uniform in 1 KiB..1 MiB,
    every third key compressible, even keys 64-hex and odd keys free-form."""
    space = []
    for index in range(count):
        rng = random.Random(f"crash-size:{index}")
        size = int(1024 * 1024 ** rng.random())
        key = hex_key(f"crash-{index}") if index % 2 == 0 else f"crash-key/{index}"
        space.append((key, size, index % 3 == 0))
    return space


# ----------------------------------------------------------------------------- reads


def checked_get(store: RecordStore, namespace: Namespace, key: str, expected: bytes) -> bool:
    """get_into that fails the test if the store ever reports a hit with wrong bytes."""
    out = bytearray(b"\xa5" * len(expected))  # a sentinel that differs from any real page
    ok = store.get_into(namespace, key, out)
    assert ok in (True, False)
    if ok:
        assert bytes(out) == expected, f"store served wrong bytes for {key!r}"
    return ok


def verify_all(store: RecordStore, namespace: Namespace, items) -> dict:
    """Reads every (key, expected bytes); returns counts; any wrong byte fails."""
    hits = misses = 0
    for key, expected in items:
        if checked_get(store, namespace, key, expected):
            hits += 1
        else:
            misses += 1
    return {"hits": hits, "misses": misses}


# ----------------------------------------------------------------------------- files


def ns_dir(root, namespace: Namespace = NS_A) -> str:
    return os.path.join(str(root), "ns", namespace.dirname)


def record_path(root, namespace: Namespace, key: str) -> str:
    from hicache_galahad.layout import record_filename

    return os.path.join(ns_dir(root, namespace), record_filename(key))


def record_files(root) -> list[str]:
    found = []
    ns_root = os.path.join(str(root), "ns")
    if not os.path.isdir(ns_root):
        return found
    for dirname in os.listdir(ns_root):
        directory = os.path.join(ns_root, dirname)
        for name in os.listdir(directory):
            if name.endswith(RECORD_SUFFIX) and not name.startswith(TEMP_PREFIX):
                found.append(os.path.join(directory, name))
    return found


def temp_files(root) -> list[str]:
    found = []
    ns_root = os.path.join(str(root), "ns")
    if not os.path.isdir(ns_root):
        return found
    for dirname in os.listdir(ns_root):
        directory = os.path.join(ns_root, dirname)
        found.extend(
            os.path.join(directory, name)
            for name in os.listdir(directory)
            if name.startswith(TEMP_PREFIX)
        )
    return found


def quarantine_files(root) -> list[str]:
    directory = os.path.join(str(root), "quarantine")
    return [os.path.join(directory, name) for name in os.listdir(directory)]


def store_disk_bytes(root) -> int:
    """Bytes the budget covers: record files, temp files in flight and quarantined files
    (namespace.json descriptions are not records and are not budgeted). Each inode counts
    once: a temp file and the record it was just linked to are one file."""
    sizes = {}
    for path in record_files(root) + temp_files(root) + quarantine_files(root):
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            sizes[(info.st_dev, info.st_ino)] = info.st_size
    return sum(sizes.values())


def header_of(path: str) -> fmt.Header:
    with open(path, "rb") as record:
        data = record.read()
    return fmt.parse_header(data, len(data))


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped (so it is not alive)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, 0)
        raise AssertionError("pid was reused at once; cannot build a dead-writer temp file")
    return child.pid


def write_key_file(path, data: bytes, mode: int = 0o600) -> str:
    with open(path, "wb") as key_file:
        key_file.write(data)
    os.chmod(path, mode)
    return str(path)


# ----------------------------------------------------------------------------- processes


def helper_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def spawn(*args, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    """Starts `python tests/store_helpers.py ARGS` with stdout as a text pipe."""
    return subprocess.Popen(
        [PYTHON, HELPER, *map(str, args)],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=helper_env(),
        cwd=REPO_ROOT,
    )


def read_line(process: subprocess.Popen, timeout_s: float) -> str:
    """One line of the child's stdout, failing the test on timeout or early exit."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        raise AssertionError(f"child {process.pid} said nothing in {timeout_s} s")
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=10)
        raise AssertionError(f"child exited with {process.returncode}: {process.stderr.read()}")
    return line.strip()


def stop(process: subprocess.Popen) -> None:
    """Kills (by pid) a child of ours if it still runs, and reaps it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


@contextlib.contextmanager
def children():
    """Collects the processes a test starts and always kills and reaps them."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        for process in started:
            stop(process)


def run_json(*args, timeout_s: float = 120) -> dict:
    """Runs a helper role to completion and returns the JSON of its last stdout line."""
    process = spawn(*args)
    try:
        out, err = process.communicate(timeout=timeout_s)
    finally:
        stop(process)
    assert process.returncode == 0, f"helper {args} failed ({process.returncode}): {err}"
    return json.loads(out.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- roles


def _crash_writer(args) -> None:
    """Writes the crash key space forever (until SIGKILLed), through a plain and a zstd store
    on one root, with put_many, put and delete, under a byte budget that forces evictions."""
    space = crash_keyspace(args.keys)
    plain = RecordStore(args.root, max_bytes=args.max_bytes, durable=True, io_threads=4)
    packed = RecordStore(
        args.root, max_bytes=args.max_bytes, compression="zstd", durable=True, io_threads=4
    )
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
    store = RecordStore(args.root, max_bytes=args.max_bytes, durable=False)
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
    print(json.dumps(store.stats() | summary), flush=True)
    store.close()


def _mixed_writer(args) -> None:
    """Waits for the go file, then puts shared and own keys in a shuffled order."""
    store = RecordStore(args.root, durable=args.durable, io_threads=4)
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
    print(json.dumps({"failed": [k for k, ok in results.items() if not ok]} | store.stats()))
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
    print(json.dumps(store.stats() | {"hit_keys": hits, "wrong_keys": wrong}))
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
                "indexed_records": stats["indexed_records"],
                "ledger_bytes": stats["ledger_bytes"],
                "probe_ok": probe_ok,
            }
        )
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    roles = parser.add_subparsers(dest="role", required=True)

    crash = roles.add_parser("crash-writer")
    crash.add_argument("root")
    crash.add_argument("--seed", type=int, required=True)
    crash.add_argument("--keys", type=int, default=160)
    crash.add_argument("--max-bytes", type=int, default=None)
    crash.set_defaults(run=_crash_writer)

    budget = roles.add_parser("budget-writer")
    budget.add_argument("root")
    budget.add_argument("--prefix", required=True)
    budget.add_argument("--max-bytes", type=int, required=True)
    budget.add_argument("--size", type=int, required=True)
    budget.add_argument("--per-round", type=int, required=True)
    budget.set_defaults(run=_budget_writer)

    mixed = roles.add_parser("mixed-writer")
    mixed.add_argument("root")
    mixed.add_argument("--prefix", required=True)
    mixed.add_argument("--shared", type=int, required=True)
    mixed.add_argument("--own", type=int, required=True)
    mixed.add_argument("--size", type=int, required=True)
    mixed.add_argument("--go-file", required=True)
    mixed.add_argument("--durable", type=int, default=1)
    mixed.set_defaults(run=_mixed_writer)

    reader = roles.add_parser("reader")
    reader.add_argument("root")
    reader.add_argument("--items", required=True)
    reader.add_argument("--key-file", default="")
    reader.set_defaults(run=_reader)

    measure = roles.add_parser("open-measure")
    measure.add_argument("root")
    measure.add_argument("--probe-key", required=True)
    measure.add_argument("--probe-size", type=int, required=True)
    measure.set_defaults(run=_open_measure)

    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
