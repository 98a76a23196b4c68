# =================================================================================================
# TEST HARNESS ONLY -- NEVER SHIPPED IN THE hicache_galahad PACKAGE.
# Pure-torch stand-ins for the six torch.ops.sgl_kernel.*_cpu ops that SGLang 0.5.23's Qwen3-Next
# (gated delta net) code path calls on CPU. Reference speed, fp32 math, one token at a time.
# This is NOT a supported SGLang configuration; nothing here may be imported by hicache_galahad/.
# =================================================================================================
"""Gated-delta-net CPU ops for SGLang on CPU (test harness only).

The functions below are written from the math (see /work/shared/reference/sglang-hybrid-on-cpu.md
section 3) and are checked against transformers' pure-torch Qwen3-Next functions in
``tests/sglang_cpu/test_gdn_ops.py``. :func:`register_ops` defines them under SGLang's op names
and schemas in the ``sgl_kernel`` operator namespace (``torch.library``, dispatch key ``CPU``):

==========================================================  =======================================
op                                                           reached from (SGLang 0.5.23)
==========================================================  =======================================
``causal_conv1d_fwd_cpu``                                    ``gdn_backend._convolve_prefill``
``causal_conv1d_update_cpu``                                 ``gdn_backend.forward_decode``
``fused_gdn_gating_cpu``                                     ``gdn_backend._prefill_gates``
``chunk_gated_delta_rule_cpu``                               ``TritonGDNKernel.extend``
``fused_sigmoid_gating_delta_rule_update_cpu``               ``TritonGDNKernel.decode`` (keywords)
``fused_rmsnorm_gated_cpu``                                  ``FusedRMSNormGated`` / ``RMSNorm``
==========================================================  =======================================

Shapes: T tokens packed over sequences (``cu_seqlens`` / ``query_start_loc``), H key heads, HV
value heads (a multiple of H), K / V key / value head dims. The recurrent state pool is
``[slots, HV, V, K]`` (SGLang's layout; transformers keeps ``[.., K, V]``); the convolution state
pool ``[slots, dim, width - 1]`` holds each slot's last ``width - 1`` inputs.

Determinism matters more than speed here: the end-to-end tests compare a run restored from
storage with a live run bit for bit. Torch's CPU elementwise kernels compute the vectorised part
of a flattened loop with SIMD code and its tail with scalar code (whose transcendental functions
round differently), so the same token can get different bits depending on how many tokens share
its tensor. Hence: every sequence is processed on its own (the result never depends on what else
is in the batch); the gating, the q/k normalisation and the recurrence run one token at a time on
tensors whose shape does not depend on the sequence length; the convolution is an explicit sum
over its taps in a fixed order, on ``(tokens, channels)`` rows; and prefill and decode share the
same per-token code (:func:`_gate_token`, :func:`_delta_rule_token`). A state after t tokens is
therefore the same bits whether it was reached in one prefill, a split prefill or by decoding
(``test_gdn_ops.py`` checks this).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported lazily: sitecustomize must stay cheap
    import torch

# FLA's chunk size, which SGLang uses for the per-chunk states `h` when the HF config has no
# `mamba_chunk_size` (hybrid_linear_attn_backend.mamba_chunk_size).
CHUNK_SIZE = 64
# FLA's (and transformers') epsilon in the q/k L2 normalisation.
L2NORM_EPS = 1e-6

# ------------------------------------------------------------------------------------------------
# Math
# ------------------------------------------------------------------------------------------------


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension (as FLA and transformers)."""
    import torch

    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _softplus(x: torch.Tensor, beta: float = 1.0, threshold: float = 20.0) -> torch.Tensor:
    """``log(1 + exp(beta x)) / beta``, linear above ``threshold`` (torch's softplus)."""
    import torch.nn.functional as F

    return F.softplus(x, beta=beta, threshold=threshold)


def _gate_token(A_log, dt_bias, a_t, b_t, softplus_beta=1.0, softplus_threshold=20.0):
    """One token: log-decay ``g = -exp(A_log) * softplus(a + dt_bias)`` (never positive) and
    write strength ``beta = sigmoid(b)``, fp32, each ``(HV,)``."""
    import torch

    g = -torch.exp(A_log.float()) * _softplus(
        a_t.float() + dt_bias.float(), softplus_beta, softplus_threshold
    )
    return g, torch.sigmoid(b_t.float())


def gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_gate_token` for every row of ``a`` / ``b`` ``(T, HV)``; fp32, each ``(T, HV)``."""
    import torch

    num_heads = a.shape[-1]
    a2, b2 = a.reshape(-1, num_heads), b.reshape(-1, num_heads)
    g = torch.empty(a2.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(b2.shape, dtype=torch.float32, device=b.device)
    for t in range(a2.shape[0]):
        g[t], beta[t] = _gate_token(A_log, dt_bias, a2[t], b2[t], softplus_beta, softplus_threshold)
    return g.reshape(a.shape), beta.reshape(b.shape)


def _conv_window(window: torch.Tensor, weight: torch.Tensor, bias, length: int, silu: bool):
    """Depthwise causal convolution of the last ``length`` rows of ``window``
    ``(width - 1 + length, dim)`` (time-major). Returns ``(length, dim)`` fp32.

    Output row t is ``sum_j weight[:, j] * window[t + j]`` (plus bias): the taps are added in a
    fixed order, row by row, so an output's bits do not depend on ``length``.
    """
    import torch.nn.functional as F

    width = weight.shape[1]
    taps = weight.float().t().contiguous()  # (width, dim)
    acc = window[0:length] * taps[0]
    for j in range(1, width):
        acc = acc + window[j : j + length] * taps[j]
    if bias is not None:
        acc = acc + bias.float()
    return F.silu(acc) if silu else acc


def causal_conv1d_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor | None,
    query_start_loc: torch.Tensor | None,
    cache_indices: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    silu_activation: bool,
    pad_slot_id: int = -1,
    is_vnni: bool = False,
) -> torch.Tensor:
    """Prefill convolution over packed variable-length sequences.

    ``x`` is ``(dim, T)``; ``weight`` ``(dim, width)`` (never VNNI-packed without AMX, so
    ``is_vnni`` is ignored). Positions before a sequence's start come from its slot's saved
    state when ``has_initial_state`` is set, else they are zero. The slot's state becomes the
    last ``width - 1`` inputs (previous state followed by the new tokens). Sequences whose slot
    is ``pad_slot_id`` are skipped (their output stays zero). Returns ``(dim, T)``.
    """
    import torch

    dim, total = x.shape
    width = weight.shape[1]
    out = torch.zeros(total, dim, dtype=torch.float32, device=x.device)  # time-major
    x_rows = x.t()
    bounds = _sequence_bounds(query_start_loc, total)
    num_seqs = len(bounds) - 1
    slots = cache_indices.tolist() if cache_indices is not None else list(range(num_seqs))
    initial = (
        [bool(v) for v in has_initial_state.tolist()]
        if has_initial_state is not None
        else [False] * num_seqs
    )
    for i in range(num_seqs):
        start, end = bounds[i], bounds[i + 1]
        slot = int(slots[i])
        if end <= start or slot == pad_slot_id:
            continue
        if conv_states is not None and initial[i]:
            history = conv_states[slot].t().float()
        else:
            history = torch.zeros(width - 1, dim, dtype=torch.float32, device=x.device)
        window = torch.cat([history, x_rows[start:end].float()], dim=0)
        out[start:end] = _conv_window(window, weight, bias, end - start, silu_activation)
        if conv_states is not None:
            tail = window[window.shape[0] - (width - 1) :]
            conv_states[slot] = tail.t().to(conv_states.dtype)
    return out.to(x.dtype).t()


def causal_conv1d_update(
    x: torch.Tensor,
    conv_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu_activation: bool,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    is_vnni: bool = False,
) -> torch.Tensor:
    """Decode convolution: ``x`` is ``(B, dim)`` (one new token per row) or ``(B, dim, L)``.

    Row b's window is its slot's saved ``width - 1`` inputs followed by the new input(s); the
    window shifted by the new inputs becomes the slot's state. Rows whose slot is
    ``pad_slot_id`` are skipped (output zero). ``cache_seqlens`` (circular states) is not
    supported.
    """
    import torch

    if cache_seqlens is not None:
        raise NotImplementedError("causal_conv1d_update_cpu stand-in: cache_seqlens unsupported")
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    batch, dim, length = x3.shape
    width = weight.shape[1]
    out = torch.zeros(batch, length, dim, dtype=torch.float32, device=x.device)
    slots = conv_state_indices.tolist() if conv_state_indices is not None else list(range(batch))
    for row in range(batch):
        slot = int(slots[row])
        if slot == pad_slot_id:
            continue
        window = torch.cat([conv_states[slot].t().float(), x3[row].t().float()], dim=0)
        out[row] = _conv_window(window, weight, bias, length, silu_activation)
        tail = window[window.shape[0] - (width - 1) :]
        conv_states[slot] = tail.t().to(conv_states.dtype)
    out = out.to(x.dtype).transpose(1, 2)
    return out[:, :, 0] if squeeze else out


def _delta_rule_token(state, q_t, k_t, v_t, g_t, beta_t, use_l2norm: bool, eps: float):
    """One token of the gated delta rule for all value heads. ``q_t`` / ``k_t`` ``(H, K)``,
    ``v_t`` ``(HV, V)``, ``g_t`` / ``beta_t`` ``(HV,)``; ``state`` ``(HV, V, K)`` fp32 is updated
    in place. q and k are L2-normalised (``use_l2norm``), q is scaled by ``1/sqrt(K)``, each key
    head serves ``HV / H`` value heads. Then: forget ``S <- exp(g) S``; correction
    ``u = beta (v - S k)``; write ``S <- S + u k^T``; read ``o = S q``. Returns o ``(HV, V)``."""
    import torch

    q = q_t.float()
    k = k_t.float()
    if use_l2norm:
        q = l2norm(q, eps)
        k = l2norm(k, eps)
    q = q * (q.shape[-1] ** -0.5)
    groups = state.shape[0] // q.shape[0]
    if groups > 1:
        q = q.repeat_interleave(groups, dim=0)
        k = k.repeat_interleave(groups, dim=0)
    state.mul_(torch.exp(g_t)[:, None, None])
    predicted = (state @ k[:, :, None])[:, :, 0]
    correction = (v_t.float() - predicted) * beta_t[:, None]
    state.add_(correction[:, :, None] * k[:, None, :])
    return (state @ q[:, :, None])[:, :, 0]


def _sequence_bounds(cu_seqlens, total: int) -> list[int]:
    if cu_seqlens is None:
        return [0, total]
    return [int(v) for v in cu_seqlens.tolist()]


def chunk_gated_delta_rule_with_states(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    initial_state_indices: torch.Tensor | None,
    use_qk_l2norm_in_kernel: bool = True,
    eps: float = L2NORM_EPS,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill gated delta rule over packed sequences, one token at a time.

    ``query``/``key`` ``(1, T, H, K)``, ``value`` ``(1, T, HV, V)``, ``g``/``beta``
    ``(1, T, HV)``; ``initial_state`` is the state pool ``[slots, HV, V, K]``, read at
    ``initial_state_indices[i]`` for sequence i and overwritten with its final state (slots
    below 0 start from zero and are not written). Returns ``(o (1, T, HV, V), final states (N, HV, V, K), h)`` where ``h`` is
    ``(1, sum_i ceil(L_i / chunk_size), HV, V, K)`` fp32: for each sequence, the state at the
    start of each of its chunks (chunk 0 starts from the initial state), as FLA's chunk kernel
    returns it and as SGLang's ``extra_buffer`` tracking indexes it.
    """
    import torch

    total = query.shape[1]
    num_v_heads, v_dim = value.shape[2], value.shape[3]
    k_dim = key.shape[3]
    bounds = _sequence_bounds(cu_seqlens, total)
    num_seqs = len(bounds) - 1
    slots = (
        initial_state_indices.tolist()
        if initial_state_indices is not None
        else list(range(num_seqs))
    )
    q_all, k_all, v_all = query[0], key[0], value[0]
    g_all, beta_all = g[0], beta[0]
    out = torch.zeros(total, num_v_heads, v_dim, dtype=torch.float32, device=query.device)
    finals, chunk_states = [], []
    for i in range(num_seqs):
        start, end = bounds[i], bounds[i + 1]
        slot = int(slots[i])
        if slot >= 0:
            state = initial_state[slot].float().clone()
        else:
            state = torch.zeros(num_v_heads, v_dim, k_dim, dtype=torch.float32)
        for t in range(start, end):
            if (t - start) % chunk_size == 0:
                chunk_states.append(state.clone())  # the state *before* this chunk
            out[t] = _delta_rule_token(
                state, q_all[t], k_all[t], v_all[t], g_all[t].float(), beta_all[t].float(),
                use_qk_l2norm_in_kernel, eps,
            )  # fmt: skip
        finals.append(state)
        if slot >= 0:
            initial_state[slot] = state.to(initial_state.dtype)
    final = (
        torch.stack(finals)
        if finals
        else torch.zeros(0, num_v_heads, v_dim, k_dim, dtype=torch.float32)
    )
    h = (
        torch.stack(chunk_states)
        if chunk_states
        else torch.zeros(0, num_v_heads, v_dim, k_dim, dtype=torch.float32)
    )
    return out.to(value.dtype).unsqueeze(0), final, h.unsqueeze(0)


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    output_final_state: bool,
    cu_seqlens: torch.Tensor,
    head_first: bool,
    use_qk_l2norm_in_kernel: bool,
    initial_state_indices: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``chunk_gated_delta_rule_cpu`` op: :func:`chunk_gated_delta_rule_with_states`
    without ``h``. ``eps`` is the q/k L2-norm epsilon (the upstream schema's default 1e-5; the
    harness's wrapper passes FLA's 1e-6)."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu stand-in: head_first unsupported")
    out, final, _ = chunk_gated_delta_rule_with_states(
        query, key, value, g, beta, initial_state, cu_seqlens, initial_state_indices,
        use_qk_l2norm_in_kernel, eps,
    )  # fmt: skip
    return out, final


def fused_sigmoid_gating_delta_rule_update(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm_in_kernel: bool,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> torch.Tensor:
    """Decode: the gating of :func:`gdn_gating` fused with the recurrence, per sequence.

    ``q``/``k`` ``(1, T, H, K)``, ``v`` ``(1, T, HV, V)``, ``a``/``b`` ``(T, HV)`` (or with a
    leading 1); sequence i owns tokens ``cu_seqlens[i]:cu_seqlens[i+1]`` (one each in decode)
    and the state ``initial_state_source[initial_state_indices[i]]``, updated in place. Rows
    with a negative slot are skipped (output zero). Returns ``(1, T, HV, V)``.
    """
    import torch

    total = q.shape[1]
    num_v_heads, v_dim = v.shape[2], v.shape[3]
    a2 = a.reshape(total, num_v_heads)
    b2 = b.reshape(total, num_v_heads)
    out = torch.zeros(total, num_v_heads, v_dim, dtype=torch.float32, device=q.device)
    bounds = _sequence_bounds(cu_seqlens, total)
    slots = initial_state_indices.tolist()
    for i in range(len(bounds) - 1):
        slot = int(slots[i])
        if slot < 0:
            continue
        state = initial_state_source[slot].float().clone()
        for t in range(bounds[i], bounds[i + 1]):
            g_t, beta_t = _gate_token(
                A_log, dt_bias, a2[t], b2[t], softplus_beta, softplus_threshold
            )
            out[t] = _delta_rule_token(
                state, q[0, t], k[0, t], v[0, t], g_t, beta_t, use_qk_l2norm_in_kernel,
                L2NORM_EPS,
            )  # fmt: skip
        initial_state_source[slot] = state.to(initial_state_source.dtype)
    return out.to(v.dtype).unsqueeze(0)


def rmsnorm_gated(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor, eps: float):
    """RMS-normalise x over the last dimension, scale by weight, multiply by SiLU(z) (norm
    before gate, as transformers' ``Qwen3NextRMSNormGated``: fp32 math, cast back)."""
    import torch
    import torch.nn.functional as F

    dtype = x.dtype
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * normed.to(dtype) * F.silu(z.float())).to(dtype)


def fused_gdn_gating(A_log, a, b, dt_bias):
    """The ``fused_gdn_gating_cpu`` op: :func:`gdn_gating` shaped ``(1, T, HV)`` each."""
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    return g.unsqueeze(0), beta.unsqueeze(0)


# ------------------------------------------------------------------------------------------------
# Registration under SGLang's names
# ------------------------------------------------------------------------------------------------

# Schemas of sgl-kernel's csrc/cpu/torch_extension_cpu.cpp; chunk_gated_delta_rule_cpu takes the
# extra `initial_state_indices` that SGLang 0.5.23's Python wrapper passes.
SCHEMAS = {
    "causal_conv1d_fwd_cpu": (
        "causal_conv1d_fwd_cpu(Tensor x, Tensor weight, Tensor? bias, Tensor(a!)? conv_states, "
        "Tensor? query_start_loc, Tensor? cache_indices, Tensor? has_initial_state, "
        "bool silu_activation, int pad_slot_id, bool is_vnni) -> Tensor",
        causal_conv1d_fwd,
    ),
    "causal_conv1d_update_cpu": (
        "causal_conv1d_update_cpu(Tensor x, Tensor(a!) conv_states, Tensor weight, Tensor? bias, "
        "bool silu_activation, Tensor? cache_seqlens, Tensor? conv_state_indices, "
        "int pad_slot_id, bool is_vnni) -> Tensor",
        causal_conv1d_update,
    ),
    "fused_gdn_gating_cpu": (
        "fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)",
        fused_gdn_gating,
    ),
    "chunk_gated_delta_rule_cpu": (
        "chunk_gated_delta_rule_cpu(Tensor query, Tensor key, Tensor value, Tensor g, Tensor beta, "
        "Tensor(a!) initial_state, bool output_final_state, Tensor cu_seqlens, bool head_first, "
        "bool use_qk_l2norm_in_kernel, Tensor? initial_state_indices, float eps=1e-05) "
        "-> (Tensor, Tensor)",
        chunk_gated_delta_rule,
    ),
    "fused_sigmoid_gating_delta_rule_update_cpu": (
        "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, "
        "Tensor k, Tensor v, Tensor a, Tensor b, Tensor(a!) initial_state_source, "
        "Tensor initial_state_indices, Tensor cu_seqlens, bool use_qk_l2norm_in_kernel, "
        "float softplus_beta=1.0, float softplus_threshold=20.0) -> Tensor",
        fused_sigmoid_gating_delta_rule_update,
    ),
    "fused_rmsnorm_gated_cpu": (
        "fused_rmsnorm_gated_cpu(Tensor x, Tensor weight, Tensor z, float eps) -> Tensor",
        rmsnorm_gated,
    ),
}

_library = None  # the torch.library.Library must outlive the registrations
_registered: list[str] = []
_register_lock = threading.Lock()


def register_ops() -> list[str]:
    """Define every op of :data:`SCHEMAS` in ``torch.ops.sgl_kernel`` (CPU) unless an op of that
    name already exists (a real sgl-kernel CPU build). Idempotent; returns the names defined by
    this process."""
    global _library
    import torch

    with _register_lock:
        for name, (schema, fn) in SCHEMAS.items():
            if name in _registered or _op_exists(name):
                continue
            if _library is None:
                _library = torch.library.Library("sgl_kernel", "FRAGMENT")
            _library.define(schema)
            _library.impl(name, fn, "CPU")
            _registered.append(name)
        return list(_registered)


def _op_exists(name: str) -> bool:
    import torch

    try:
        getattr(torch.ops.sgl_kernel, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def chunk_gated_delta_rule_cpu_wrapper(
    q,
    k,
    v,
    g,
    beta,
    initial_state,
    cu_seqlens,
    head_first,
    use_qk_l2norm_in_kernel,
    initial_state_indices,
):
    """Replacement for ``sgl_kernel.mamba.chunk_gated_delta_rule_cpu`` that also returns ``h``,
    the per-chunk states ``extra_buffer`` needs (the 0.5.23 wrapper returns ``h = None``, and
    ``_track_mamba_state_extend`` asserts on it for a checkpoint not aligned to the prefill)."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu stand-in: head_first unsupported")
    return chunk_gated_delta_rule_with_states(
        q, k, v, g, beta, initial_state, cu_seqlens, initial_state_indices,
        use_qk_l2norm_in_kernel, L2NORM_EPS,
    )  # fmt: skip
