"""Fixtures shared by the test modules.

Helper functions live in import-only modules in tests/support/: records.py (records on disk,
page keys, key files), store_helpers.py (record store tests, their child processes and the
store's consistency check), sglang_pools.py (real SGLang host pools and backends),
hybrid_models.py (tiny transformers hybrid models) and checkpoints.py (the checkpoint rule, the
tests' oracle). The harnesses the tests share with the benchmarks live in bench/ and are
imported from there: bench/sglang_server.py (real SGLang servers, on CPU here) and
bench/mooncake_cluster.py (a real Mooncake cluster). The fixtures import them only when a test
asks for one, so that collecting a test that needs neither torch nor SGLang imports neither.

Markers (pyproject.toml): `e2e` on every test that starts an SGLang server, `slow` on every
other test that starts a model process or a real Mooncake cluster, or runs long. `make
test-fast` runs what carries neither.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.append(_REPO)  # `bench` for a bare `pytest`; after tests/, so `support` is the tests'


@pytest.fixture
def galahad(tmp_path):
    """make(kv_pool, pools, root=..., **create_galahad options) -> GalahadStorage loaded through
    SGLang's factory with the pools registered (tests/sglang_pools.py `create_galahad`), on
    tmp_path / "store" unless another root is given; every backend made is closed after the
    test."""
    from support.sglang_pools import create_galahad

    opened = []

    def make(kv_pool=None, pools=None, *, root=None, **options):
        backend = create_galahad(root or tmp_path / "store", kv_pool, pools, **options)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


@pytest.fixture
def store_factory(tmp_path):
    """open(root=None, *, check=True, **options) -> RecordStore on tmp_path / "store" unless
    another root is given (options as StoreOptions takes them: durability, encryption_key_file,
    ...). After the test every store made is closed, and every root whose stores asked for it
    is checked by the store's own check, read-only: no damaged or unverifiable record, no stray
    temp file, no reservation left, and the ledger equal to the disk
    (support.store_helpers.assert_store_consistent). A test that leaves damage on purpose
    passes check=False for one of its stores on that root."""
    from support.store_helpers import assert_store_consistent

    from hicache_galahad.store import RecordStore

    opened = []
    checked_roots: dict[str, dict] = {}

    def open_store(root=None, *, check=True, **options):
        root = str(root or tmp_path / "store")
        store = RecordStore(root, **options)
        opened.append(store)
        if check:
            key_file = options.get("encryption_key_file")
            checked_roots.setdefault(root, {"encryption_key_file": key_file})
        else:
            checked_roots[root] = None  # one store left damage there on purpose
        return store

    yield open_store
    for store in opened:
        store.close()
    for root, options in checked_roots.items():
        if options is not None:
            assert_store_consistent(root, **options)


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny local Llama of the CPU harness (built once, cached on disk)."""
    from bench import sglang_server

    return sglang_server.ensure_model("llama", "tiny")


@pytest.fixture(scope="session")
def hybrid_model():
    """The tiny local Qwen3-Next (hybrid: gated delta net and full attention) of the harness."""
    from bench import sglang_server

    return sglang_server.ensure_model("qwen3-next", "tiny")
