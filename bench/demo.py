"""The main job (for now): write pages through the record store, read them back verified,
restart the store and read again, and print throughput."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hicache_galahad.namespace import Namespace  # noqa: E402
from hicache_galahad.store import RecordStore  # noqa: E402


def main() -> None:
    page_bytes = 2 * 1024 * 1024
    pages = 64
    root = tempfile.mkdtemp(prefix="galahad-demo-")
    rng = np.random.default_rng(0)
    values = rng.standard_normal((pages, page_bytes // 2), dtype=np.float32).astype(np.float16)
    keys = [f"{index:064x}" for index in range(pages)]
    namespace = Namespace("demo", "demo-model", "kv", {"page_bytes": page_bytes})
    try:
        store = RecordStore(root)
        store.register_namespace(namespace)
        start_s = time.perf_counter()
        written = store.put_many(namespace, keys, list(values))
        write_s = time.perf_counter() - start_s
        store.close()

        store = RecordStore(root)  # a restart: a new store object on the same directory
        outs = [np.empty(page_bytes // 2, np.float16) for _ in keys]
        start_s = time.perf_counter()
        read = store.get_many_into(namespace, keys, outs)
        read_s = time.perf_counter() - start_s
        exact = all(np.array_equal(a, b) for a, b in zip(outs, values, strict=True))
        total_gb = pages * page_bytes / 1e9
        print(
            f"wrote {sum(written)}/{pages} pages of {page_bytes >> 20} MiB durably: "
            f"{total_gb / write_s:.2f} GB/s"
        )
        print(
            f"after reopen, read {sum(read)}/{pages} verified pages: "
            f"{total_gb / read_s:.2f} GB/s, byte-exact: {exact}"
        )
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
