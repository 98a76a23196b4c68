# =================================================================================================
# TEST HARNESS ONLY -- NEVER SHIPPED IN THE hicache_galahad PACKAGE.
# Runtime patches that let SGLang 0.5.23 serve a hybrid model (Qwen3-Next: gated delta net + full
# attention + MoE) on a CPU-only machine, with --mamba-radix-cache-strategy extra_buffer, for tests.
# Upstream refuses extra_buffer on CPU on purpose. This is NOT a supported SGLang configuration;
# nothing here may be imported by hicache_galahad/.
# =================================================================================================
"""Hybrid-model (Qwen3-Next) patches for SGLang on CPU (test harness only).

Each patch is opt-in by name through ``SGLANG_CPU_TEST_PATCHES``; :data:`HYBRID_PATCHES` lists
them all (``tests/sglang_cpu/run`` adds them when the model is hybrid). Background:
``/work/shared/reference/sglang-hybrid-on-cpu.md`` sections 3 and 4.

``gdn_ops``
    Registers the pure-torch gated-delta-net ops of :mod:`.gdn_ops` under SGLang's names in
    ``torch.ops.sgl_kernel`` (the Python-only ``sgl_kernel`` stand-in has none), and replaces
    the Python wrapper ``sgl_kernel.mamba.chunk_gated_delta_rule_cpu`` by one that returns the
    per-chunk states ``h`` (0.5.23's returns ``None``, which ``extra_buffer`` asserts on).
    Applied when ``sgl_kernel.mamba`` is imported, i.e. before ``gdn_backend`` / ``gdn_triton``
    bind the ops and the wrapper at their import.
``rmsnorm_gated_cpu``
    ``FusedRMSNormGated`` and ``layernorm_gated.RMSNorm`` use ``fused_rmsnorm_gated_cpu`` only
    when ``_use_cpu = is_cpu() and cpu_has_amx_support()``; without AMX they fall into Triton.
    Sets ``_use_cpu = True`` in both modules (and registers the op).
``gdn_device_module``
    ``Qwen3GatedDeltaNet.__init__`` calls ``torch.get_device_module().current_device()``, which
    is ``torch.cuda`` with a CUDA build of torch and fails without a driver. During that
    constructor only, ``torch.get_device_module()`` without an argument returns ``torch.cpu``.
``mamba_decode_unpinned``
    ``ScheduleBatch.prepare_for_decode`` calls ``track_mask_cpu.pin_memory()`` unconditionally on
    the ``extra_buffer`` path (``cudaHostRegister`` without a driver). During that method only,
    ``Tensor.pin_memory`` returns the tensor itself when CUDA is unavailable.
``moe_shared_gate_torch``
    The shared-expert gate of ``qwen2_moe`` (used by Qwen3-Next's MoE block) is a Triton kernel.
    Torch ``fused_gate_sigmoid_mul`` / ``fused_gate_sigmoid_mul_add`` in that module: the shared
    output scaled by ``sigmoid(hidden . w_gate)`` (fp32), added to the routed output for ``_add``.
``moe_topk_torch``
    On a CPU without AMX ``select_experts`` -> ``fused_topk`` reaches the CUDA ``topk_softmax``.
    ``topk.fused_topk`` becomes a wrapper over SGLang's own ``fused_topk_torch_native``.
``moe_row_invariant``
    Determinism, not function. SGLang's ``moe_forward_native`` runs one GEMM per expert over
    the tokens routed to it, and torch's CPU GEMM rounds a row differently when it has fewer than
    12 rows (other than 4 or 8): the same token then gets other bits depending on how many tokens
    share its prefill, so a split prefill (a restored prefix) differs from a full one by float
    noise (4.8e-7 in a logprob). The replacement runs every expert over every token and combines
    each token's top-k outputs in the same order: mathematically the same, and a token's result
    no longer depends on the others. Dense layers keep that property only for prefills of at least
    12 tokens (or 4 or 8).
``mamba_track_torch``
    ``hybrid_linear_attn_backend`` copies decode states into their checkpoint slots with the
    Triton ``track_mamba_states_all_layers`` / ``track_mamba_states_if_needed``. Torch versions:
    for every batch row whose track mask is set, copy slot ``cache_indices[row]`` to slot
    ``mamba_track_indices[row]`` (conv and SSM state; all layers for the first).
``mamba_extra_buffer_cpu``
    ``mamba_hook._platform_supports_mamba_cache_extra_buffer()`` is true only for CUDA, MUSA,
    NPU, HIP and XPU: ``extra_buffer`` fails with ``AssertionError: extra_buffer requires
    platform support ...`` (``auto`` silently picks ``no_buffer``). Makes it return True.

Not patched: the ops need ``--dtype float32`` and ``SGLANG_MAMBA_CONV_DTYPE=float32`` (model and
convolution state must have one dtype), a small ``--max-mamba-cache-size``, and HiCache only works
with ``--hicache-mem-layout page_first_direct --hicache-io-backend direct`` plus the
``host_unpinned`` and ``kv_direct_io`` patches of :mod:`.cpu_hicache`.
"""

from __future__ import annotations

import functools
from types import ModuleType

from . import gdn_ops, register

HYBRID_PATCHES = (
    "gdn_ops",
    "rmsnorm_gated_cpu",
    "gdn_device_module",
    "mamba_decode_unpinned",
    "moe_shared_gate_torch",
    "moe_topk_torch",
    "moe_row_invariant",
    "mamba_track_torch",
    "mamba_extra_buffer_cpu",
)

# ------------------------------------------------------------------------------------------------
# gdn_ops / rmsnorm_gated_cpu
# ------------------------------------------------------------------------------------------------


def _install_gdn_ops(module: ModuleType) -> None:
    gdn_ops.register_ops()
    module.chunk_gated_delta_rule_cpu = gdn_ops.chunk_gated_delta_rule_cpu_wrapper
    import sys

    package = sys.modules.get("sgl_kernel")  # sgl_kernel/__init__ re-exports the wrapper
    if package is not None and hasattr(package, "chunk_gated_delta_rule_cpu"):
        package.chunk_gated_delta_rule_cpu = gdn_ops.chunk_gated_delta_rule_cpu_wrapper


def _use_cpu_rmsnorm_gated(module: ModuleType) -> None:
    gdn_ops.register_ops()
    module._use_cpu = True


# ------------------------------------------------------------------------------------------------
# gdn_device_module / mamba_decode_unpinned
# ------------------------------------------------------------------------------------------------


def _scoped_cpu_device_module(module: ModuleType) -> None:
    import torch

    cls = module.Qwen3GatedDeltaNet
    original = cls.__init__
    if getattr(original, "_sglang_cpu_device_module", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if torch.cuda.is_available():
            return original(self, *args, **kwargs)
        saved = torch.get_device_module

        def device_module(device=None):
            return torch.cpu if device is None else saved(device)

        torch.get_device_module = device_module
        try:
            original(self, *args, **kwargs)
        finally:
            torch.get_device_module = saved

    __init__._sglang_cpu_device_module = True
    cls.__init__ = __init__


def _scoped_unpinned_decode(module: ModuleType) -> None:
    import torch

    cls = module.ScheduleBatch
    original = cls.prepare_for_decode
    if getattr(original, "_sglang_cpu_unpinned", False):
        return

    def identity(self, *args, **kwargs):
        return self

    @functools.wraps(original)
    def prepare_for_decode(self, *args, **kwargs):
        if torch.cuda.is_available():
            return original(self, *args, **kwargs)
        saved = torch.Tensor.pin_memory
        torch.Tensor.pin_memory = identity
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.Tensor.pin_memory = saved

    prepare_for_decode._sglang_cpu_unpinned = True
    cls.prepare_for_decode = prepare_for_decode


# ------------------------------------------------------------------------------------------------
# MoE: shared-expert gate and top-k routing
# ------------------------------------------------------------------------------------------------


def _shared_gate(hidden_states, gate_weight, shared_output):
    import torch

    logits = (hidden_states.float() * gate_weight.float()).sum(dim=-1, keepdim=True)
    return torch.sigmoid(logits) * shared_output.float()


def fused_gate_sigmoid_mul(hidden_states, gate_weight, shared_output):
    """``sigmoid(hidden . w) * shared`` per token (fp32 math), as the Triton kernel."""
    return _shared_gate(hidden_states, gate_weight, shared_output).to(shared_output.dtype)


def fused_gate_sigmoid_mul_add(hidden_states, gate_weight, shared_output, final_hidden_states):
    """``final += sigmoid(hidden . w) * shared`` in place (fp32 math), as the Triton kernel."""
    gated = _shared_gate(hidden_states, gate_weight, shared_output)
    final_hidden_states.copy_((gated + final_hidden_states.float()).to(final_hidden_states.dtype))


def _torch_shared_gate(module: ModuleType) -> None:
    module.fused_gate_sigmoid_mul = fused_gate_sigmoid_mul
    module.fused_gate_sigmoid_mul_add = fused_gate_sigmoid_mul_add


def _torch_topk(module: ModuleType) -> None:
    import torch

    native = module.fused_topk_torch_native
    if getattr(module.fused_topk, "_sglang_cpu_native", False):
        return

    def fused_topk(
        hidden_states,
        gating_output,
        topk,
        renormalize,
        correction_bias=None,
        scoring_func="softmax",
        routed_scaling_factor=None,
        apply_routed_scaling_factor_on_output=False,
        num_fused_shared_experts=0,
        packed_out=None,
        num_token_non_padded=None,
    ):
        if num_fused_shared_experts or packed_out is not None:
            raise NotImplementedError(
                "moe_topk_torch: fused shared experts / packed top-k are not supported"
            )
        weights, ids = native(
            hidden_states, gating_output, topk, renormalize, correction_bias, scoring_func
        )
        if apply_routed_scaling_factor_on_output and routed_scaling_factor is not None:
            weights = weights * routed_scaling_factor
        return weights.to(torch.float32), ids.to(torch.int32)

    fused_topk._sglang_cpu_native = True
    module.fused_topk = fused_topk


def _row_invariant_moe(module: ModuleType) -> None:
    import torch
    import torch.nn.functional as F

    original = module.moe_forward_native
    if getattr(original, "_sglang_cpu_row_invariant", False):
        return

    def moe_forward_native(layer, x, topk_output, moe_runner_config):
        if (
            moe_runner_config.apply_router_weight_on_input
            or moe_runner_config.activation != "silu"
            or moe_runner_config.gemm1_alpha is not None
            or getattr(layer, "w13_weight_bias", None) is not None
            or getattr(layer, "w2_weight_bias", None) is not None
        ):
            return original(layer, x, topk_output, moe_runner_config)
        topk_weights, topk_ids, _ = topk_output
        num_tokens, top_k = topk_ids.shape
        experts = []
        for i in range(layer.num_experts):  # every expert over every token: M = num_tokens
            gate_up = F.linear(x, layer.w13_weight[i])
            half = gate_up.shape[-1] // 2
            experts.append(
                F.linear(F.silu(gate_up[:, :half]) * gate_up[:, half:], layer.w2_weight[i])
            )
        stacked = torch.stack(experts)  # (E, T, hidden)
        tokens = torch.arange(num_tokens, device=x.device)[:, None].expand(num_tokens, top_k)
        chosen = stacked[topk_ids.to(torch.int64), tokens]  # (T, top_k, hidden)
        return (
            chosen.type(topk_weights.dtype)
            .mul_(topk_weights.unsqueeze(dim=-1))
            .sum(dim=1)
            .type(x.dtype)
        )

    moe_forward_native._sglang_cpu_row_invariant = True
    moe_forward_native._original = original
    module.moe_forward_native = moe_forward_native


# ------------------------------------------------------------------------------------------------
# mamba_track_torch
# ------------------------------------------------------------------------------------------------


def _track_rows(cache_indices, mamba_track_mask, mamba_track_indices, batch_size, check_freed):
    import torch

    mask = mamba_track_mask[:batch_size].to(device="cpu", dtype=torch.bool)
    src = cache_indices[:batch_size].to("cpu", torch.int64)[mask]
    dst = mamba_track_indices[:batch_size].to("cpu", torch.int64)[mask]
    if check_freed:
        keep = (src >= 0) & (dst >= 0)
        src, dst = src[keep], dst[keep]
    return src, dst


def track_mamba_states_if_needed(
    conv_states,
    ssm_states,
    cache_indices,
    mamba_track_mask,
    mamba_track_indices,
    batch_size,
    check_freed_slots=False,
):
    """One layer's pools ``[slots, ...]``: ``state[dst] = state[src]`` for tracked rows."""
    if batch_size == 0:
        return
    src, dst = _track_rows(
        cache_indices, mamba_track_mask, mamba_track_indices, batch_size, check_freed_slots
    )
    if src.numel():
        conv_states[dst.to(conv_states.device)] = conv_states[src.to(conv_states.device)]
        ssm_states[dst.to(ssm_states.device)] = ssm_states[src.to(ssm_states.device)]


def track_mamba_states_all_layers(
    conv_states_pool,
    ssm_states_pool,
    cache_indices,
    mamba_track_mask,
    mamba_track_indices,
    batch_size,
    check_freed_slots=False,
):
    """All layers' pools ``[layers, slots, ...]``: ``pool[:, dst] = pool[:, src]``."""
    if batch_size == 0:
        return
    src, dst = _track_rows(
        cache_indices, mamba_track_mask, mamba_track_indices, batch_size, check_freed_slots
    )
    if src.numel():
        conv_states_pool[:, dst] = conv_states_pool[:, src]
        ssm_states_pool[:, dst] = ssm_states_pool[:, src]


def _torch_track(module: ModuleType) -> None:
    module.track_mamba_states_if_needed = track_mamba_states_if_needed
    module.track_mamba_states_all_layers = track_mamba_states_all_layers


# ------------------------------------------------------------------------------------------------
# mamba_extra_buffer_cpu
# ------------------------------------------------------------------------------------------------


def _allow_extra_buffer(module: ModuleType) -> None:
    module._platform_supports_mamba_cache_extra_buffer = lambda: True


register(
    "gdn_ops",
    "pure-torch sgl_kernel *_cpu gated-delta-net ops + a chunk wrapper that returns h",
    {"sgl_kernel.mamba": _install_gdn_ops},
)
register(
    "rmsnorm_gated_cpu",
    "gated RMSNorm through fused_rmsnorm_gated_cpu without AMX (_use_cpu = True)",
    {
        "sglang.kernels.ops.attention.fla.fused_norm_gate": _use_cpu_rmsnorm_gated,
        "sglang.kernels.ops.attention.fla.layernorm_gated": _use_cpu_rmsnorm_gated,
    },
)
register(
    "gdn_device_module",
    "torch.get_device_module() is torch.cpu inside Qwen3GatedDeltaNet.__init__ (no CUDA)",
    {"sglang.srt.models.qwen3_next": _scoped_cpu_device_module},
)
register(
    "mamba_decode_unpinned",
    "Tensor.pin_memory is the identity inside ScheduleBatch.prepare_for_decode (no CUDA)",
    {"sglang.srt.managers.schedule_batch": _scoped_unpinned_decode},
)
register(
    "moe_shared_gate_torch",
    "torch fused_gate_sigmoid_mul[_add] (shared-expert gate) in qwen2_moe",
    {"sglang.srt.models.qwen2_moe": _torch_shared_gate},
)
register(
    "moe_topk_torch",
    "topk.fused_topk -> fused_topk_torch_native (no CUDA topk_softmax)",
    {"sglang.srt.layers.moe.topk": _torch_topk},
)
register(
    "moe_row_invariant",
    "moe_forward_native runs every expert over every token (per-row results independent of routing)",
    {"sglang.srt.layers.moe.fused_moe_native": _row_invariant_moe},
)
register(
    "mamba_track_torch",
    "torch track_mamba_states_all_layers / _if_needed in hybrid_linear_attn_backend",
    {"sglang.srt.layers.attention.hybrid_linear_attn_backend": _torch_track},
)
register(
    "mamba_extra_buffer_cpu",
    "mamba_hook: the platform supports extra_buffer (CPU, tests only)",
    {"sglang.srt.arg_groups.mamba_hook": _allow_extra_buffer},
)
