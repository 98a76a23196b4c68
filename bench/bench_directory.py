"""Does sharding record files into subdirectories make a lookup by name cheaper at 10^6?

Issue 19 left `batch_exists` at 1.54x (one process) of its 10^4 cost at 10^6 records, and
the question was whether a flat namespace directory is the cause. This measures only the
system calls `RecordStore.contains` makes (an open by name relative to a held directory
descriptor, then a close) on N empty files named like records (64 hex digits), for the same
N laid out three ways, side by side in one run:

  flat      one directory of N files (the layout today)
  shard256  256 subdirectories by the key's first two hex digits (N/256 each)
  shard4096 4096 subdirectories by the first three (N/4096 each)

For each: hits (a random existing name) and misses (a random absent name), per lookup,
median of several rounds of 20,000 random lookups; warm (dentries cached) and, when this
process may write /proc/sys/vm/drop_caches, cold (caches dropped before the round). The
figure that decides is the ratio of a layout's cost at 10^6 to the flat one at 10^4, and of
shard256 to flat at the same N.

Usage: .venv/bin/python bench/bench_directory.py [--sizes 1e4,1e5,1e6] [--dir DIR] [--json OUT]
Needs about N inodes per size (empty files); the directory is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import statistics
import time

LAYOUTS = {"flat": 0, "shard256": 2, "shard4096": 3}
LOOKUPS = 20_000
ROUNDS = 5


def name_of(index: int) -> str:
    return hashlib.sha256(index.to_bytes(8, "little")).hexdigest()


def build(root: str, count: int, prefix_digits: int) -> None:
    os.makedirs(root)
    if prefix_digits:
        for shard in range(16**prefix_digits):
            os.mkdir(os.path.join(root, f"{shard:0{prefix_digits}x}"))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for index in range(count):
        name = name_of(index)
        directory = os.path.join(root, name[:prefix_digits]) if prefix_digits else root
        os.close(os.open(os.path.join(directory, name + ".rec"), flags, 0o644))


def lookups_us(root: str, prefix_digits: int, names: list[str]) -> float:
    """Per-lookup cost of open-by-name relative to a held directory descriptor, then close;
    the shard's descriptor is held as the store would hold it."""
    fds: dict[str, int] = {}
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    if prefix_digits:
        for shard in range(16**prefix_digits):
            key = f"{shard:0{prefix_digits}x}"
            fds[key] = os.open(key, os.O_RDONLY | os.O_DIRECTORY, dir_fd=root_fd)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        start = time.perf_counter()
        for name in names:
            dir_fd = fds[name[:prefix_digits]] if prefix_digits else root_fd
            with contextlib.suppress(FileNotFoundError):
                os.close(os.open(name + ".rec", flags, dir_fd=dir_fd))
        return (time.perf_counter() - start) / len(names) * 1e6
    finally:
        for fd in fds.values():
            os.close(fd)
        os.close(root_fd)


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
        return True
    except OSError:
        return False


def measure(root: str, count: int, prefix_digits: int, rng: random.Random, cold: bool):
    result = {}
    for kind in ("hit", "miss"):
        rounds = []
        for _ in range(ROUNDS):
            if kind == "hit":
                names = [name_of(rng.randrange(count)) for _ in range(LOOKUPS)]
            else:
                names = [name_of(count + rng.randrange(10**9)) for _ in range(LOOKUPS)]
            if cold:
                drop_caches()
            else:  # warm: the same names once first
                lookups_us(root, prefix_digits, names)
            rounds.append(lookups_us(root, prefix_digits, names))
        result[kind] = statistics.median(rounds)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1e4,1e5,1e6")
    parser.add_argument("--dir", default="/work/dir-bench")
    parser.add_argument("--json")
    args = parser.parse_args()
    sizes = [int(float(size)) for size in args.sizes.split(",")]
    can_drop = drop_caches()
    rng = random.Random(7)
    rows = []
    print(f"load {os.getloadavg()[0]:.2f}; cold rounds: {'yes' if can_drop else 'no (not root)'}")
    for count in sizes:
        for layout, digits in LAYOUTS.items():
            root = os.path.join(args.dir, f"{layout}-{count}")
            shutil.rmtree(root, ignore_errors=True)
            started = time.perf_counter()
            build(root, count, digits)
            build_s = time.perf_counter() - started
            row = {"n": count, "layout": layout, "build_s": build_s}
            row.update(
                {f"warm_{k}_us": v for k, v in measure(root, count, digits, rng, False).items()}
            )
            if can_drop:
                row.update(
                    {f"cold_{k}_us": v for k, v in measure(root, count, digits, rng, True).items()}
                )
            rows.append(row)
            print(
                f"{count:>9,} {layout:<10} build {build_s:6.1f} s  "
                + "  ".join(f"{k[:-3]} {v:6.2f} us" for k, v in row.items() if k.endswith("_us")),
                flush=True,
            )
            shutil.rmtree(root)
    flat = {r["n"]: r for r in rows if r["layout"] == "flat"}
    base = flat[sizes[0]]
    print(f"\nratio to flat at {sizes[0]:,} (the 1.3x goal) and to flat at the same size:")
    for row in rows:
        same = flat[row["n"]]
        cells = [
            f"{key[:-3]} {row[key] / base[key]:.2f}x / {row[key] / same[key]:.2f}x"
            for key in row
            if key.endswith("_us")
        ]
        print(f"{row['n']:>9,} {row['layout']:<10} " + "  ".join(cells))
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows}, out, indent=1)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
