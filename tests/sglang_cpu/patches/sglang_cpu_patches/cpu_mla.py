# =================================================================================================
# TEST HARNESS ONLY -- NEVER SHIPPED IN THE hicache_galahad PACKAGE.
# =================================================================================================
"""``mla_torch_native``: DeepSeek multi-head latent attention (MLA) on SGLang's torch-native
attention backend, for the tiny ``make_model.py --arch deepseek-mla`` model in tests.

SGLang's DeepSeek attention picks, per forward batch, between the "MHA" form (decompress the
latent KV into per-head keys and values, then ordinary attention) and the absorbed "MLA" form
(attend over the compressed latent vectors with the key projection folded into the query).
``AttentionBackendRegistry`` has no handler for ``torch_native``, so it falls back to the
``triton`` handler, which chooses the MHA form for a prefill without a cached prefix. The
torch-native backend, however, always attends over what is in the KV pool, and an MLA pool holds
latent vectors: the MHA form then attends over latent vectors as if they were per-head keys. For
the tiny test model the scheduler dies at the first prefill ("Expected size for first two
dimensions of batch2 tensor to be: [2, 32] but got: [2, 48]": latent 32 + rope 16 against a
32-wide key); where the shapes happen to fit it is a wrong answer, and another one than the
absorbed form gives once the prefix is cached, so a restore would never reproduce the cold run. This patch registers a ``torch_native``
handler that always answers the absorbed MLA form: every prefill, extend and decode attends over
the pool's latent vectors the same way, so a restored run is bit-identical to a cold one.

Nothing in it is a supported SGLang configuration; it says nothing about SGLang's real MLA
kernels on a GPU.
"""

from __future__ import annotations

from types import ModuleType

from . import register


def _register_torch_native_mla(module: ModuleType) -> None:
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import (
        AttnForwardMethod,
    )

    def handle_attention_torch_native(attn, forward_batch):
        return AttnForwardMethod.MLA

    module.AttentionBackendRegistry.register("torch_native", handle_attention_torch_native)


register(
    "mla_torch_native",
    "DeepSeek MLA on the torch_native backend: always the absorbed MLA form (test models only)",
    {"sglang.srt.models.deepseek_common.attention_backend_handler": _register_torch_native_mla},
)
