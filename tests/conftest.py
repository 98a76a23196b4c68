"""Fixtures shared by the test modules.

Helper functions live in import-only modules next to this file: tests/records.py (records on
disk, page keys, key files), tests/store_helpers.py (record store tests and their child
processes), tests/sglang_pools.py (real SGLang host pools and backends), tests/hybrid_models.py
(tiny transformers hybrid models) and tests/e2e_support.py (real SGLang servers on CPU). The
fixtures import them only when a test asks for one, so that collecting a test that needs neither
torch nor SGLang imports neither.

Markers (pyproject.toml): `e2e` on every test that starts an SGLang server, `slow` on every
other test that starts a model process or a real Mooncake cluster, or runs long. `make
test-fast` runs what carries neither.
"""

from __future__ import annotations

import pytest


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


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny local Llama of the CPU harness (built once, cached on disk)."""
    import e2e_support

    return e2e_support.ensure_model("llama", "tiny")


@pytest.fixture(scope="session")
def hybrid_model():
    """The tiny local Qwen3-Next (hybrid: gated delta net and full attention) of the harness."""
    import e2e_support

    return e2e_support.ensure_model("qwen3-next", "tiny")
