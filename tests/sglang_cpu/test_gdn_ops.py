"""Checks of the hybrid (Qwen3-Next) patches of the CPU harness, test harness only.

* Every pure-torch gated-delta-net op of ``patches/sglang_cpu_patches/gdn_ops.py`` against
  transformers' pure-torch Qwen3-Next functions (``modeling_qwen3_next``: ``causal_conv1d_fn``,
  ``causal_conv1d_update``, ``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule``,
  ``Qwen3NextRMSNormGated`` and the gating expressions of ``Qwen3NextGatedDeltaNet.forward``), to
  float tolerance, with packed variable-length batches, pool slots and padding rows.
* Determinism properties the end-to-end tests rely on (bit-exact): a split prefill, prefill plus
  decode and one prefill reach the same state bits; ``h`` holds the chunk-start states.
* The torch MoE gate / top-k and Mamba state-tracking replacements of ``cpu_hybrid.py``.
* In a fresh interpreter under ``tests/sglang_cpu/run`` (so through ``sitecustomize``, exactly as in
  a server): the ops are registered under SGLang's schemas, SGLang's GDN modules bind them at
  import, and every runtime patch lands where SGLang looks for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_next import modeling_qwen3_next as ref

HARNESS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HARNESS_DIR / "patches"))

from sglang_cpu_patches import cpu_hybrid, gdn_ops  # noqa: E402

ATOL = 2e-6
RTOL = 1e-5
H, HV, K, V = 2, 4, 16, 16  # the tiny model's GDN: 2 key heads, 4 value heads of 16
DIM, WIDTH = 2 * H * K + HV * V, 4  # conv channels (q, k, v) and kernel width


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def close(actual, expected, atol=ATOL, rtol=RTOL):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


# ------------------------------------------------------------------------------------------------
# Convolution
# ------------------------------------------------------------------------------------------------


def test_causal_conv1d_fwd_matches_transformers():
    g = gen(0)
    lengths, slots, initial = [5, 1, 37, 2], [3, 0, 6, 2], [False, True, True, False]
    x = torch.randn(DIM, sum(lengths), generator=g)
    weight, bias = torch.randn(DIM, WIDTH, generator=g), torch.randn(DIM, generator=g)
    pool = torch.randn(8, DIM, WIDTH - 1, generator=g)
    before = pool.clone()
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out = gdn_ops.causal_conv1d_fwd(
        x, weight, bias, pool, starts, torch.tensor(slots, dtype=torch.int32),
        torch.tensor(initial), True, -1, True,
    )  # fmt: skip
    for i, (slot, has_state) in enumerate(zip(slots, initial, strict=True)):
        seq = x[:, starts[i] : starts[i + 1]].unsqueeze(0)
        if has_state:  # the transformers decode path accepts several tokens with a state
            state = before[slot].clone().unsqueeze(0)
            expected = ref.causal_conv1d_update(seq, state, weight, bias, "silu")
        else:
            expected = ref.causal_conv1d_fn(seq, weight, bias, activation="silu")
            state = F.pad(seq, (WIDTH - 1, 0))[:, :, -(WIDTH - 1) :]
        close(out[:, starts[i] : starts[i + 1]], expected[0])
        close(pool[slot], state[0])
    untouched = [s for s in range(8) if s not in slots]
    assert torch.equal(pool[untouched], before[untouched])


def test_causal_conv1d_fwd_skips_padding_and_works_without_state():
    g = gen(1)
    x = torch.randn(DIM, 6, generator=g)
    weight = torch.randn(DIM, WIDTH, generator=g)
    pool = torch.randn(4, DIM, WIDTH - 1, generator=g)
    before = pool.clone()
    starts = torch.tensor([0, 2, 6], dtype=torch.int32)
    out = gdn_ops.causal_conv1d_fwd(
        x, weight, None, pool, starts, torch.tensor([-1, 1]), torch.tensor([True, False]),
        False, -1, True,
    )  # fmt: skip
    assert torch.equal(out[:, :2], torch.zeros(DIM, 2))  # the padding row
    close(out[:, 2:], ref.causal_conv1d_fn(x[:, 2:].unsqueeze(0), weight, None)[0])
    assert torch.equal(pool[[0, 2, 3]], before[[0, 2, 3]])
    no_pool = gdn_ops.causal_conv1d_fwd(x, weight, None, None, None, None, None, False)
    close(no_pool, ref.causal_conv1d_fn(x.unsqueeze(0), weight, None)[0])


def test_causal_conv1d_update_matches_transformers():
    g = gen(2)
    x = torch.randn(3, DIM, generator=g)
    weight, bias = torch.randn(DIM, WIDTH, generator=g), torch.randn(DIM, generator=g)
    pool = torch.randn(5, DIM, WIDTH - 1, generator=g)
    before = pool.clone()
    slots = torch.tensor([4, -1, 1], dtype=torch.int32)
    out = gdn_ops.causal_conv1d_update(x, pool, weight, bias, True, None, slots, -1, True)
    for row, slot in ((0, 4), (2, 1)):
        state = before[slot].clone().unsqueeze(0)
        expected = ref.causal_conv1d_update(x[row].view(1, DIM, 1), state, weight, bias, "silu")
        close(out[row], expected[0, :, 0])
        close(pool[slot], state[0])
    assert torch.equal(out[1], torch.zeros(DIM))
    assert torch.equal(pool[[0, 2, 3]], before[[0, 2, 3]])


def test_convolution_split_is_bit_identical_to_one_prefill():
    """Prefill 10 + 5 decode steps + prefill 7 == one prefill of 22 (outputs and state)."""
    g = gen(3)
    x = torch.randn(DIM, 22, generator=g)
    weight, bias = torch.randn(DIM, WIDTH, generator=g), torch.randn(DIM, generator=g)
    whole, split = torch.zeros(1, DIM, WIDTH - 1), torch.zeros(1, DIM, WIDTH - 1)
    slot = torch.tensor([0])
    full = gdn_ops.causal_conv1d_fwd(
        x, weight, bias, whole, torch.tensor([0, 22]), slot, torch.tensor([False]), True
    )
    pieces = [
        gdn_ops.causal_conv1d_fwd(
            x[:, :10], weight, bias, split, torch.tensor([0, 10]), slot, torch.tensor([False]), True
        )
    ]
    for t in range(10, 15):
        pieces.append(gdn_ops.causal_conv1d_update(x[:, t][None], split, weight, bias, True, None, slot).T)  # fmt: skip
    pieces.append(
        gdn_ops.causal_conv1d_fwd(
            x[:, 15:], weight, bias, split, torch.tensor([0, 7]), slot, torch.tensor([True]), True
        )
    )
    assert torch.equal(torch.cat(pieces, dim=1), full)
    assert torch.equal(split, whole)


# ------------------------------------------------------------------------------------------------
# Gating and gated RMSNorm
# ------------------------------------------------------------------------------------------------


def test_fused_gdn_gating_matches_transformers_layer():
    g = gen(4)
    A_log, dt_bias = torch.randn(HV, generator=g), torch.randn(HV, generator=g)
    a, b = 8 * torch.randn(50, HV, generator=g), torch.randn(50, HV, generator=g)  # past 20
    decay, beta = gdn_ops.fused_gdn_gating(A_log, a, b, dt_bias)
    # Qwen3NextGatedDeltaNet.forward:
    close(decay, (-A_log.float().exp() * F.softplus(a.float() + dt_bias)).unsqueeze(0))
    close(beta, b.sigmoid().unsqueeze(0))
    assert decay.shape == beta.shape == (1, 50, HV) and decay.dtype == torch.float32
    assert bool((decay <= 0).all())


def test_fused_rmsnorm_gated_matches_transformers():
    g = gen(5)
    norm = ref.Qwen3NextRMSNormGated(V, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(V, generator=g))
    x, z = torch.randn(30, V, generator=g), torch.randn(30, V, generator=g)
    with torch.no_grad():
        close(gdn_ops.rmsnorm_gated(x, norm.weight, z, 1e-6), norm(x, z))


# ------------------------------------------------------------------------------------------------
# Gated delta rule
# ------------------------------------------------------------------------------------------------


def delta_inputs(total: int, seed: int):
    g = gen(seed)
    q = torch.randn(1, total, H, K, generator=g)
    k = torch.randn(1, total, H, K, generator=g)
    v = torch.randn(1, total, HV, V, generator=g)
    a, b = torch.randn(total, HV, generator=g), torch.randn(total, HV, generator=g)
    A_log, dt_bias = torch.randn(HV, generator=g) * 0.5, torch.randn(HV, generator=g)
    decay, beta = gdn_ops.fused_gdn_gating(A_log, a, b, dt_bias)
    return q, k, v, a, b, A_log, dt_bias, decay, beta


def transformers_rule(fn, q, k, v, decay, beta, state_vk):
    """transformers' rule on one sequence: heads repeated by the caller (as in the layer), its
    state [B, HV, K, V]; returns (out, final state in SGLang's [HV, V, K])."""
    group = HV // H
    out, final = fn(
        q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2), v, g=decay,
        beta=beta, initial_state=state_vk.transpose(-1, -2).unsqueeze(0),
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return out, final[0].transpose(-1, -2)


@pytest.mark.parametrize("eps", [gdn_ops.L2NORM_EPS, 1e-5])
def test_chunk_gated_delta_rule_matches_transformers(eps):
    lengths, slots = [150, 1, 64, 70], [5, 0, 2, 7]
    total = sum(lengths)
    q, k, v, _, _, _, _, decay, beta = delta_inputs(total, 6)
    pool = 0.1 * torch.randn(8, HV, V, K, generator=gen(7))
    before = pool.clone()
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out, final = gdn_ops.chunk_gated_delta_rule(
        q, k, v, decay, beta, pool, True, starts, False, True,
        torch.tensor(slots, dtype=torch.int32), eps,
    )  # fmt: skip
    _, _, h = gdn_ops.chunk_gated_delta_rule_with_states(
        q, k, v, decay, beta, before.clone(), starts, torch.tensor(slots), True, eps
    )
    tolerance = ATOL if eps == gdn_ops.L2NORM_EPS else 1e-5  # transformers' eps is 1e-6
    chunk_offset = 0
    for i, slot in enumerate(slots):
        s, e = int(starts[i]), int(starts[i + 1])
        args = (q[:, s:e], k[:, s:e], v[:, s:e], decay[:, s:e], beta[:, s:e])
        expected_out, expected_final = transformers_rule(
            ref.torch_chunk_gated_delta_rule, *args, before[slot]
        )
        close(out[:, s:e], expected_out, atol=tolerance)
        close(final[i], expected_final, atol=tolerance)
        close(pool[slot], expected_final, atol=tolerance)
        # h: the state at the start of every 64-token chunk of this sequence
        for c in range((e - s - 1) // gdn_ops.CHUNK_SIZE + 1):
            if c == 0:
                expected_h = before[slot]
            else:
                cut = s + c * gdn_ops.CHUNK_SIZE
                _, expected_h = transformers_rule(
                    ref.torch_chunk_gated_delta_rule,
                    q[:, s:cut], k[:, s:cut], v[:, s:cut], decay[:, s:cut], beta[:, s:cut],
                    before[slot],
                )  # fmt: skip
            close(h[0, chunk_offset + c], expected_h, atol=tolerance)
        chunk_offset += (e - s - 1) // gdn_ops.CHUNK_SIZE + 1
    assert h.shape == (1, chunk_offset, HV, V, K)
    assert torch.equal(pool[[1, 3, 4, 6]], before[[1, 3, 4, 6]])


def test_fused_sigmoid_gating_delta_rule_update_matches_transformers():
    q, k, v, a, b, A_log, dt_bias, decay, beta = delta_inputs(3, 8)
    pool = 0.1 * torch.randn(6, HV, V, K, generator=gen(9))
    before = pool.clone()
    slots = torch.tensor([3, -1, 0], dtype=torch.int32)
    out = gdn_ops.fused_sigmoid_gating_delta_rule_update(
        A_log, dt_bias, q, k, v, a, b, pool, slots, torch.tensor([0, 1, 2, 3]), True, 1.0, 20.0
    )
    for row, slot in ((0, 3), (2, 0)):
        expected_out, expected_state = transformers_rule(
            ref.torch_recurrent_gated_delta_rule,
            q[:, row : row + 1], k[:, row : row + 1], v[:, row : row + 1],
            decay[:, row : row + 1], beta[:, row : row + 1], before[slot],
        )  # fmt: skip
        close(out[:, row : row + 1], expected_out)
        close(pool[slot], expected_state)
    assert torch.equal(out[:, 1], torch.zeros(1, HV, V))
    assert torch.equal(pool[[1, 2, 4, 5]], before[[1, 2, 4, 5]])


def test_split_prefill_and_decode_are_bit_identical_to_one_prefill():
    """The extra_buffer tests compare restored and live runs bit for bit: 100 prefilled + 20
    decoded + 30 prefilled tokens reach exactly the state and outputs of one 150 prefill, and
    h[1] is exactly the state after 64 tokens."""
    total = 150
    q, k, v, a, b, A_log, dt_bias, decay, beta = delta_inputs(total, 10)
    one, split = torch.zeros(1, HV, V, K), torch.zeros(1, HV, V, K)
    slot = torch.tensor([0])
    full_out, _, h = gdn_ops.chunk_gated_delta_rule_with_states(
        q, k, v, decay, beta, one, torch.tensor([0, total]), slot
    )
    pieces = []
    out, _, _ = gdn_ops.chunk_gated_delta_rule_with_states(
        q[:, :100], k[:, :100], v[:, :100], decay[:, :100], beta[:, :100], split,
        torch.tensor([0, 100]), slot,
    )  # fmt: skip
    pieces.append(out)
    for t in range(100, 120):
        pieces.append(
            gdn_ops.fused_sigmoid_gating_delta_rule_update(
                A_log,
                dt_bias,
                q[:, t : t + 1],
                k[:, t : t + 1],
                v[:, t : t + 1],
                a[t : t + 1],
                b[t : t + 1],
                split,
                slot,
                torch.tensor([0, 1]),
                True,
            )  # fmt: skip
        )
    out, _, _ = gdn_ops.chunk_gated_delta_rule_with_states(
        q[:, 120:], k[:, 120:], v[:, 120:], decay[:, 120:], beta[:, 120:], split,
        torch.tensor([0, 30]), slot,
    )  # fmt: skip
    pieces.append(out)
    assert torch.equal(torch.cat(pieces, dim=1), full_out)
    assert torch.equal(split, one)
    at_64 = torch.zeros(1, HV, V, K)
    gdn_ops.chunk_gated_delta_rule_with_states(
        q[:, :64], k[:, :64], v[:, :64], decay[:, :64], beta[:, :64], at_64,
        torch.tensor([0, 64]), slot,
    )  # fmt: skip
    assert h.shape == (1, 3, HV, V, K)
    assert torch.equal(h[0, 1], at_64[0]) and torch.equal(h[0, 0], torch.zeros(HV, V, K))


# ------------------------------------------------------------------------------------------------
# MoE gate / top-k and state tracking (cpu_hybrid.py)
# ------------------------------------------------------------------------------------------------


def test_shared_expert_gate():
    g = gen(11)
    hidden, w = torch.randn(7, 64, generator=g), torch.randn(64, generator=g)
    shared, routed = torch.randn(7, 64, generator=g), torch.randn(7, 64, generator=g)
    # transformers' Qwen3NextSparseMoeBlock: sigmoid(shared_expert_gate(h)) * shared_expert(h)
    expected = torch.sigmoid(hidden @ w)[:, None] * shared
    close(cpu_hybrid.fused_gate_sigmoid_mul(hidden, w, shared), expected)
    final = routed.clone()
    cpu_hybrid.fused_gate_sigmoid_mul_add(hidden, w, shared, final)
    close(final, routed + expected)


def test_track_mamba_states():
    g = gen(12)
    conv, ssm = torch.randn(3, 6, 5, 2, generator=g), torch.randn(3, 6, 4, 3, 3, generator=g)
    cache, mask = torch.tensor([0, 1, 2, 3]), torch.tensor([True, False, True, True])
    track = torch.tensor([4, 5, -1, 5])
    conv_all, ssm_all = conv.clone(), ssm.clone()
    cpu_hybrid.track_mamba_states_all_layers(conv_all, ssm_all, cache, mask, track, 4, True)
    expected_conv, expected_ssm = conv.clone(), ssm.clone()
    for src, dst in ((0, 4), (3, 5)):  # row 2's destination is freed (-1): skipped
        expected_conv[:, dst], expected_ssm[:, dst] = conv[:, src], ssm[:, src]
    assert torch.equal(conv_all, expected_conv) and torch.equal(ssm_all, expected_ssm)
    conv_one, ssm_one = conv[1].clone(), ssm[1].clone()
    cpu_hybrid.track_mamba_states_if_needed(conv_one, ssm_one, cache, mask, track, 2)
    assert torch.equal(conv_one[4], conv[1, 0]) and torch.equal(ssm_one[4], ssm[1, 0])
    assert torch.equal(conv_one[5], conv[1, 5])  # row 1 is not tracked, rows >= 2 ignored


# ------------------------------------------------------------------------------------------------
# Wiring under the harness (a fresh interpreter, as in a server)
# ------------------------------------------------------------------------------------------------

WIRING_SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    import sglang_cpu_patches
    from sglang_cpu_patches import gdn_ops

    report = {}
    import sgl_kernel.mamba as mamba
    from sglang.srt.layers.attention.linear import gdn_backend
    from sglang.srt.layers.attention.linear.kernels import gdn_triton
    import sglang.kernels.ops.attention.fla.fused_norm_gate as fused_norm_gate
    import sglang.kernels.ops.attention.fla.layernorm_gated as layernorm_gated
    from sglang.srt.arg_groups import mamba_hook
    from sglang.srt.layers.moe import topk
    from sglang.srt.models import qwen2_moe, qwen3_next
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    ops = torch.ops.sgl_kernel
    report["wrapper"] = mamba.chunk_gated_delta_rule_cpu is gdn_ops.chunk_gated_delta_rule_cpu_wrapper
    report["triton_binds_wrapper"] = gdn_triton.chunk_gated_delta_rule is gdn_ops.chunk_gated_delta_rule_cpu_wrapper
    report["gating_bound"] = gdn_backend.fused_gdn_gating is ops.fused_gdn_gating_cpu
    report["decode_bound"] = gdn_triton.fused_sigmoid_gating_delta_rule_update is ops.fused_sigmoid_gating_delta_rule_update_cpu
    report["use_cpu"] = [fused_norm_gate._use_cpu, layernorm_gated._use_cpu]
    report["extra_buffer"] = mamba_hook._platform_supports_mamba_cache_extra_buffer()
    report["topk"] = getattr(topk.fused_topk, "_sglang_cpu_native", False)
    report["gate"] = qwen2_moe.fused_gate_sigmoid_mul.__module__
    report["track"] = hlab.track_mamba_states_all_layers.__module__
    report["device_module"] = getattr(qwen3_next.Qwen3GatedDeltaNet.__init__, "_sglang_cpu_device_module", False)
    report["decode_unpinned"] = getattr(ScheduleBatch.prepare_for_decode, "_sglang_cpu_unpinned", False)

    # The schemas: positional and keyword calls as SGLang makes them; in-place pool updates.
    g = torch.Generator().manual_seed(0)
    pool = torch.zeros(3, 4, 16, 16)
    q, k = torch.randn(1, 1, 2, 16, generator=g), torch.randn(1, 1, 2, 16, generator=g)
    v = torch.randn(1, 1, 4, 16, generator=g)
    out = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=torch.zeros(4), dt_bias=torch.zeros(4), q=q, k=k, v=v, a=torch.zeros(1, 4),
        b=torch.zeros(1, 4), initial_state_source=pool,
        initial_state_indices=torch.tensor([2], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0,
    )
    report["decode_shape"] = list(out.shape)
    report["pool_updated"] = [bool(pool[i].abs().sum() > 0) for i in range(3)]
    o, final = ops.chunk_gated_delta_rule_cpu(
        q, k, v, torch.zeros(1, 1, 4), torch.ones(1, 1, 4), pool, True,
        torch.tensor([0, 1], dtype=torch.int32), False, True, torch.tensor([1], dtype=torch.int32),
    )
    report["chunk_shapes"] = [list(o.shape), list(final.shape)]
    o, final, h = mamba.chunk_gated_delta_rule_cpu(
        q=q, k=k, v=v, g=torch.zeros(1, 1, 4), beta=torch.ones(1, 1, 4), initial_state=pool,
        cu_seqlens=torch.tensor([0, 1], dtype=torch.int32), head_first=False,
        use_qk_l2norm_in_kernel=True, initial_state_indices=torch.tensor([0], dtype=torch.int32),
    )
    report["h_shape"] = list(h.shape)
    x = torch.randn(64, 5, generator=g)
    y = mamba.causal_conv1d_fn_cpu(
        x, torch.randn(64, 4, generator=g), None, "silu", torch.zeros(2, 64, 3),
        torch.tensor([False]), torch.tensor([1], dtype=torch.int32),
        torch.tensor([0, 5], dtype=torch.int32), [5],
    )
    report["conv_shape"] = list(y.shape)
    y = mamba.causal_conv1d_update_cpu(
        torch.randn(2, 64, generator=g), torch.zeros(2, 64, 3), torch.randn(64, 4, generator=g),
        None, "silu", torch.tensor([0, 1], dtype=torch.int32),
    )
    report["update_shape"] = list(y.shape)
    y = ops.fused_rmsnorm_gated_cpu(torch.randn(3, 16), torch.ones(16), torch.randn(3, 16), 1e-6)
    report["rmsnorm_shape"] = list(y.shape)

    # moe_row_invariant: SGLang's own moe_forward_native to float tolerance, and a token's
    # result independent of the other tokens (bit for bit, 20 of 40 rows).
    from types import SimpleNamespace
    from sglang.srt.layers.moe import fused_moe_native as fmn
    layer = SimpleNamespace(
        num_experts=4, w13_weight=0.1 * torch.randn(4, 64, 64, generator=g),
        w2_weight=0.1 * torch.randn(4, 64, 32, generator=g),
    )
    config = SimpleNamespace(
        apply_router_weight_on_input=False, activation="silu", gemm1_alpha=None,
        gemm1_clamp_limit=None,
    )
    x = torch.randn(40, 64, generator=g)
    weights, ids = torch.topk(torch.randn(40, 4, generator=g).softmax(-1), 2)
    weights, ids = weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)
    out = fmn.moe_forward_native(layer, x, (weights, ids, None), config)
    ref = fmn.moe_forward_native._original(layer, x, (weights, ids, None), config)
    part = fmn.moe_forward_native(layer, x[20:], (weights[20:], ids[20:], None), config)
    report["moe"] = [
        bool(torch.allclose(out, ref, atol=1e-6, rtol=1e-5)), bool(torch.equal(part, out[20:]))
    ]
    print("REPORT " + json.dumps(report))
    """
)


@pytest.mark.slow
def test_patches_wired_into_sglang_under_harness():
    env = dict(os.environ)
    env["SGLANG_CPU_TEST_PATCHES"] = ",".join(cpu_hybrid.HYBRID_PATCHES)
    env.setdefault("SGLANG_CPU_PYTHON", sys.executable)
    proc = subprocess.run(
        [str(HARNESS_DIR / "run"), sys.executable, "-c", WIRING_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    import json

    report = json.loads(lines[-1][len("REPORT ") :])
    assert report == {
        "wrapper": True,
        "triton_binds_wrapper": True,
        "gating_bound": True,
        "decode_bound": True,
        "use_cpu": [True, True],
        "extra_buffer": True,
        "topk": True,
        "gate": cpu_hybrid.__name__,
        "track": cpu_hybrid.__name__,
        "device_module": True,
        "decode_unpinned": True,
        "decode_shape": [1, 1, 4, 16],
        "pool_updated": [False, False, True],
        "chunk_shapes": [[1, 1, 4, 16], [1, 4, 16, 16]],
        "h_shape": [1, 1, 4, 16, 16],
        "conv_shape": [64, 5],
        "update_shape": [2, 64],
        "rmsnorm_shape": [3, 16],
        "moe": [True, True],
    }, report


def test_run_script_lists_the_hybrid_patches():
    """`run` adds the hybrid patches for a hybrid model; its list must be this module's."""
    text = (HARNESS_DIR / "run").read_text()
    line = next(row for row in text.splitlines() if row.startswith("HYBRID_PATCHES="))
    assert line.split("=", 1)[1].strip('"').split(",") == list(cpu_hybrid.HYBRID_PATCHES)
