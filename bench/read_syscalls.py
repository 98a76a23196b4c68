"""System calls per record of the store's read path, counted with strace.

Each case writes RECORDS records of one 32 KiB page into a fresh store, then reads them back
with one `get_many_into` (as SGLang's batch_get_v1 does) in a process traced with
`strace -f`; the calls between two marker calls (a stat of a path that does not exist) are
counted and divided by the number of records. Cases:

- warm: a plain record whose bytes are in the page cache;
- cold: the same, after fsync and posix_fadvise(DONTNEED) on each record file (checked with
  nothing: the kernel may keep a page, which only lowers the count);
- zstd / zstd cold: a compressed record (the page compresses), warm and cold;
- aes warm / aes cold: an encrypted record (AES-256-GCM);
- put / re-put: the write path (`put_many` of new records, durability "none"; then of the
  same records again: the "already stored?" check), for reference.

A first batch of other records is read before the marker, so that the I/O threads exist.
"file" sums the calls on record files listed; "all" adds the others, mostly futex calls of
the hand-offs to the I/O threads (under strace the threads contend for the interpreter: their
number varies from run to run).

Usage: .venv/bin/python bench/read_syscalls.py [--records N] [--root DIR]
Run it with PYTHONPATH pointing at the tree to measure (a checkout of main for "before").
strace must be installed (`apt-get install -y strace`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

PAGE_BYTES = 32768
WARMUP_RECORDS = 8
BEGIN = "/galahad-read-syscalls-begin"
END = "/galahad-read-syscalls-end"
CASES = {
    # name: (compression, encrypted, cold, what is measured)
    "warm": ("none", False, False, "get"),
    "cold": ("none", False, True, "get"),
    "zstd": ("zstd", False, False, "get"),
    "zstd cold": ("zstd", False, True, "get"),
    "aes warm": ("none", True, False, "get"),
    "aes cold": ("none", True, True, "get"),
    "put": ("none", False, False, "put"),
    "re-put": ("none", False, False, "re-put"),
}
# The record file's own calls, reported one by one; "all" adds the rest (futex of the I/O
# threads' hand-offs, the counters' file, ...).
FILE_CALLS = ("openat", "fstat", "newfstatat", "pread64", "preadv", "preadv2", "utimensat", "close")


def page(index: int, compressible: bool) -> bytes:
    if compressible:  # a run of one byte per 512: zstd shrinks it far below 15/16
        return bytes([index % 251]) * 512 * (PAGE_BYTES // 512)
    return random.Random(index).randbytes(PAGE_BYTES)  # incompressible


def worker(case: str, root: str, records: int) -> None:
    from hicache_galahad.record.namespace import Namespace
    from hicache_galahad.store import RecordStore

    compression, encrypted, cold, what = CASES[case]
    key_file = None
    if encrypted:
        key_file = os.path.join(root, "master.key")
        with open(key_file, "wb") as handle:
            handle.write(os.urandom(32))
        os.chmod(key_file, 0o600)
    namespace = Namespace("tenant", "model", "kv", {"page_bytes": PAGE_BYTES})
    keys = [f"{index:064x}" for index in range(records)]
    pages = [page(index, compression == "zstd") for index in range(records)]
    store = RecordStore(
        os.path.join(root, "store"),
        compression=compression,
        encryption_key_file=key_file,
        durability="none",
    )
    store.register_namespace(namespace)
    outs = [bytearray(PAGE_BYTES) for _ in keys]
    if what == "re-put":
        assert all(store.put_many(namespace, keys, pages))
    if what in ("put", "re-put"):
        _mark(BEGIN)
        results = store.put_many(namespace, keys, pages)
        _mark(END)
        assert all(results), results
        store.close()
        return
    # A first batch of other records, read the same way, starts the I/O threads (once per
    # process: not the read path's cost).
    warmup_keys = [f"{index:064x}" for index in range(records, records + WARMUP_RECORDS)]
    assert all(store.put_many(namespace, keys + warmup_keys, pages + pages[:WARMUP_RECORDS]))
    directory = store.layout.namespace_dir(namespace.dirname)
    names = sorted(name for name in os.listdir(directory) if name.endswith(".rec"))
    assert len(names) == records + WARMUP_RECORDS, names
    for name in names:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        os.fsync(fd)
        if cold:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        else:
            os.pread(fd, 1 << 20, 0)  # in the page cache
        os.close(fd)
    warmup_outs = [bytearray(PAGE_BYTES) for _ in warmup_keys]
    assert all(store.get_many_into(namespace, warmup_keys, warmup_outs))
    _mark(BEGIN)
    results = store.get_many_into(namespace, keys, outs)
    _mark(END)
    assert all(results), results
    assert outs == [bytearray(data) for data in pages]
    store.close()


def _mark(path: str) -> None:
    """A call strace shows with `path` in it, which does nothing else."""
    with contextlib.suppress(FileNotFoundError):
        os.stat(path)


def count(case: str, records: int, root: str) -> collections.Counter:
    trace = os.path.join(root, "trace.txt")
    command = [
        "strace",
        "-f",
        "-qq",
        "-o",
        trace,
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        case,
        "--records",
        str(records),
        "--root",
        root,
    ]
    subprocess.run(command, check=True)
    calls: collections.Counter = collections.Counter()
    inside = False
    with open(trace) as lines:
        for line in lines:
            if BEGIN in line:
                inside = True
                continue
            if END in line:
                break
            if not inside:
                continue
            match = re.match(r"\d+\s+(\w+)\(", line)
            if match is not None:  # ("<... x resumed>" ends a call counted at its start)
                calls[match.group(1)] += 1
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--root", default=None, help="a directory on the disk to measure")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--verbose", action="store_true", help="also list the other calls")
    arguments = parser.parse_args()
    if arguments.worker is not None:
        worker(arguments.worker, arguments.root, arguments.records)
        return
    if shutil.which("strace") is None:
        sys.exit("strace is not installed (apt-get install -y strace)")
    columns = [*FILE_CALLS, "file", "all"]
    print(f"system calls per record ({arguments.records} records of {PAGE_BYTES} B per case)")
    print(f"{'case':<10}" + "".join(f"{name:>11}" for name in columns))
    for case in arguments.cases.split(","):
        root = tempfile.mkdtemp(prefix="read-syscalls-", dir=arguments.root)
        try:
            calls = count(case, arguments.records, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        per_record = {name: calls.get(name, 0) / arguments.records for name in FILE_CALLS}
        per_record["file"] = sum(per_record.values())
        per_record["all"] = sum(calls.values()) / arguments.records
        print(f"{case:<10}" + "".join(f"{per_record[name]:>11.2f}" for name in columns))
        if arguments.verbose:
            others = {name: calls[name] for name in calls if name not in FILE_CALLS}
            print(f"{'':<10} others: {others}")


if __name__ == "__main__":
    main()
