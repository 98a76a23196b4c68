"""The CPU harness's opt-in extend_new_queries_only patch computes the same attention as
SGLang's torch-native extend (which runs a full-length query and keeps the new rows)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "sglang_cpu" / "patches"))

torch_native = pytest.importorskip("sglang.srt.layers.attention.torch_native_backend")


def test_new_queries_only_matches_the_full_length_extend():
    from sglang_cpu_patches import cpu_attention

    backend_class = torch_native.TorchNativeAttnBackend
    original = backend_class._run_sdpa_forward_extend
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = 4, 2, 16
    prefix = torch.tensor([0, 37, 5])
    new = torch.tensor([9, 6, 1])
    seq = prefix + new
    total = int(new.sum())
    slots = 256
    k_cache = torch.randn(slots, kv_heads, dim, generator=generator)
    v_cache = torch.randn(slots, kv_heads, dim, generator=generator)
    req_to_token = torch.randperm(slots, generator=generator)[: 3 * 64].reshape(3, 64)
    query = torch.randn(total, heads, dim, generator=generator)
    arguments = (k_cache, v_cache, req_to_token, torch.arange(3), seq, prefix, new)
    expected = original(None, query, torch.zeros(total, heads, dim), *arguments,
                        scaling=0.25, enable_gqa=True, causal=True)  # fmt: skip
    try:
        cpu_attention._patch_torch_native(torch_native)
        patched = backend_class._run_sdpa_forward_extend
        actual = patched(None, query, torch.zeros(total, heads, dim), *arguments,
                         scaling=0.25, enable_gqa=True, causal=True)  # fmt: skip
    finally:
        backend_class._run_sdpa_forward_extend = original
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
