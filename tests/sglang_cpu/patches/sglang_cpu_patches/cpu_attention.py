# =================================================================================================
# TEST HARNESS ONLY -- NEVER SHIPPED IN THE hicache_galahad PACKAGE.
# =================================================================================================
"""``extend_new_queries_only``: SGLang's torch-native attention computes an extend (a prefill on
top of a cached prefix) for a full-length query of which it keeps only the new rows, so a
restored prefix saves no attention work on CPU: a 4k-token prompt with 4,032 tokens restored
from storage costs as much attention as recomputing it. GPU backends attend with the new queries
only. This patch does the same in plain torch (SDPA over the new queries, with the causal mask
aligned to the end of the sequence), so CPU demos and benchmarks show what a GPU server gains.

Opt-in (not in the harness's default patch list): the restored run's attention then uses other
matrix shapes than a full prefill, so it is equal to it in tokens, not bit for bit. The
bit-exactness tests run without it.
"""

from __future__ import annotations

from types import ModuleType

from . import register


def _patch_torch_native(module: ModuleType) -> None:
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    backend = module.TorchNativeAttnBackend
    original = backend._run_sdpa_forward_extend

    def run_sdpa_forward_extend(
        self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
        extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False,
        causal=False, is_cross_attn=False, sliding_window_size=None,
    ):  # fmt: skip
        if (
            encoder_lens is not None
            or not causal
            or (sliding_window_size is not None and sliding_window_size > -1)
            or int(extend_prefix_lens.max()) == 0
        ):
            return original(
                self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens, scaling,
                enable_gqa, causal, is_cross_attn, sliding_window_size,
            )  # fmt: skip
        query = query.movedim(0, query.dim() - 2)
        start_q = 0
        for seq_idx in range(seq_lens.shape[0]):
            new_len = int(extend_seq_lens[seq_idx])
            prefix_len = int(extend_prefix_lens[seq_idx])
            kv_len = int(seq_lens[seq_idx])
            end_q = start_q + new_len
            tokens = req_to_token[req_pool_indices[seq_idx], :kv_len]
            key = k_cache[tokens].movedim(0, query.dim() - 2)
            value = v_cache[tokens].movedim(0, query.dim() - 2)
            per_req_query = query[:, start_q:end_q, :]
            if key.dtype != per_req_query.dtype:
                key, value = key.to(per_req_query.dtype), value.to(per_req_query.dtype)
            visible = torch.ones(new_len, kv_len, dtype=torch.bool, device=query.device).tril(
                diagonal=prefix_len
            )
            output[start_q:end_q] = (
                scaled_dot_product_attention(
                    per_req_query.unsqueeze(0),
                    key.unsqueeze(0),
                    value.unsqueeze(0),
                    attn_mask=visible,
                    enable_gqa=enable_gqa,
                    scale=scaling,
                )  # fmt: skip
                .squeeze(0)
                .movedim(query.dim() - 2, 0)
            )
            start_q = end_q
        return output

    backend._run_sdpa_forward_extend = run_sdpa_forward_extend


register(
    "extend_new_queries_only",
    "torch-native extend attention over the new queries only (opt-in; demos and benchmarks)",
    {"sglang.srt.layers.attention.torch_native_backend": _patch_torch_native},
)
