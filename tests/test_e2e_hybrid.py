"""A real SGLang 0.5.23 server on CPU serving a hybrid model (a tiny random-init Qwen3-Next: three
gated-delta-net layers, one full-attention layer, MoE) with ``--mamba-radix-cache-strategy
extra_buffer`` and GalahadStorage as its HiCache L3: KV pages and recurrent-state checkpoints go
to our store and come back bit-exact.

The server runs under the CPU harness (tests/sglang_cpu/README.md) with the hybrid patches of
``tests/sglang_cpu/patches/sglang_cpu_patches/cpu_hybrid.py``. Page size P = 16; SGLang's Mamba
checkpoint grid is ``max(FLA chunk 64, P) = 64`` and ``--mamba-track-interval 64`` puts decode
checkpoints on the same grid, so the checkpoint interval is C = 64 throughout.

Bit-exactness: outputs are compared with a live run that computed the same split (the restored
prefix computed in its own prefill, the rest on top of it). A full prefill of the same prompt is
the same tokens, and bit-identical too when the recomputed suffix is at least 12 tokens long
(torch's CPU GEMM takes other kernels for fewer rows): the tests that compare with the cold run
use such splits. The harness's ``moe_row_invariant`` patch makes the MoE independent of how the
tokens happen to be routed (see tests/sglang_cpu/README.md).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from support.records import find_record, flip_byte, page_keys, pool_records

from bench import sglang_server as e2e

sys.path.insert(0, str(e2e.HARNESS_DIR / "patches"))
from sglang_cpu_patches.cpu_hybrid import HYBRID_PATCHES  # noqa: E402

pytestmark = pytest.mark.e2e

PAGE_SIZE = 16
INTERVAL = 64  # C: SGLang's mamba checkpoint grid max(64, P) = the track interval below
MAX_NEW_TOKENS = 8
HARNESS_ENV = {
    "SGLANG_CPU_TEST_PATCHES": ",".join(
        ["host_unpinned", "kv_direct_io", "fork_children", *HYBRID_PATCHES]
    ),
    "SGLANG_CPU_TEST_HYBRID": "1",
    "SGLANG_MAMBA_CONV_DTYPE": "float32",
}
# The boundary matrix as measured with SGLang 0.5.23 (docs/CHECKPOINTS.md, "Server-level boundary
# matrix"): N -> prompt tokens served from storage after /flush_cache.
MEASURED_MATRIX = {63: 0, 64: 0, 65: 64, 127: 64, 128: 0, 129: 128, 191: 128, 192: 0, 193: 192}


def hybrid_args(root: Path, track_interval: int = INTERVAL, **options) -> list[str]:
    """Server flags for the tiny hybrid model; `options` go into the extra config."""
    config = e2e.galahad_config(root, interface_v1=1, **options)
    return [
        "--max-total-tokens", "4096", "--skip-server-warmup", "--disable-cuda-graph",
        "--dtype", "float32", "--max-mamba-cache-size", "64",
        "--mamba-radix-cache-strategy", "extra_buffer",
        "--mamba-track-interval", str(track_interval),
        *e2e.hicache_args(
            "page_first_direct", backend="dynamic", extra_config=config, page_size=PAGE_SIZE,
            prefetch_threshold=PAGE_SIZE,
        ),
    ]  # fmt: skip


def serve(model, root: Path, log_dir: Path, name: str) -> e2e.Server:
    return e2e.start_server(
        model, hybrid_args(root), env=HARNESS_ENV, log_path=log_dir / f"{name}.log"
    )


def prompt_of(length: int, seed: int) -> list[int]:
    """Distinct token ids per (length, seed), inside the tiny model's vocabulary of 512."""
    rng = random.Random(1000 * seed + length)
    return [rng.randrange(10, 500) for _ in range(length)]


def strict_prefix_bound(num_tokens: int) -> int:
    return INTERVAL * ((num_tokens - 1) // INTERVAL)


# ------------------------------------------------------------------------------------------------
# Store inspection
# ------------------------------------------------------------------------------------------------


def settle(root: Path, kv_at_least: int, mamba_at_least: int, timeout_s: float = 60.0):
    """Wait until write-through has put at least these many records of each pool in the store
    and nothing changed for a second (``/flush_cache`` drops writes still queued); returns the
    (kv, mamba) record files."""
    return e2e.wait_settled(
        lambda: (set(pool_records(root, "kv")), set(pool_records(root, "mamba"))),
        lambda seen: len(seen[0]) >= kv_at_least and len(seen[1]) >= mamba_at_least,
        timeout_s=timeout_s,
        what=f"write-through of at least ({kv_at_least}, {mamba_at_least}) records (kv, mamba)",
    )


def record_keys(root: Path, pool: str) -> set[str]:
    return {path.stem for path in pool_records(root, pool)}


def assert_storage_healthy(server: e2e.Server) -> None:
    """Also no failed hybrid transfer."""
    e2e.assert_storage_healthy(server, "transfer failed")


# ------------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------------


def same_output(result, reference) -> bool:
    return (
        result.output_ids == reference.output_ids
        and result.output_logprobs == reference.output_logprobs  # bit-identical floats
    )


def live_split(server, prompt: list[int], split: int, max_new_tokens: int):
    """The reference for a restore at `split`: the prefix computed in its own prefill, then the
    whole prompt on top of the device cache (which must hold exactly that prefix)."""
    if split == 0:
        return e2e.generate(server, prompt, max_new_tokens)
    e2e.generate(server, prompt[:split], 1)
    result = e2e.generate(server, prompt, max_new_tokens)
    e2e.assert_cached(result, device=split)
    return result


# ------------------------------------------------------------------------------------------------
# 1, 3, 4: restore, restart, damage
# ------------------------------------------------------------------------------------------------


def test_restore_restart_and_damaged_state_records(hybrid_model, tmp_path):
    """163 tokens, C = 64: storage serves KV and the state at 128 = C*floor(162/C), bit-identical
    to the cold run, also after a restart. With only the state at 128 damaged the server falls
    back to the state at 64; with a KV page damaged, or every state record, it recomputes; the
    output is always the cold run's, bit for bit."""
    root = tmp_path / "store"
    prompt = prompt_of(163, seed=1)
    keys = page_keys(prompt, PAGE_SIZE)
    expected = strict_prefix_bound(len(prompt))
    assert expected == 128

    server = serve(hybrid_model, root, tmp_path, "first")
    try:
        cold = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        e2e.assert_cached(cold)
        kv, _ = settle(root, kv_at_least=expected // PAGE_SIZE, mamba_at_least=1)
        # One checkpoint, at the prompt's last aligned position (128), keyed by page 7's hash.
        assert record_keys(root, "mamba") == {keys[7]}
        assert {keys[page] for page in range(8)} <= record_keys(root, "kv")
        # A shorter prompt sharing the first 100 tokens leaves a checkpoint at 64 (page 3).
        e2e.generate(server, prompt[:100], 1)
        settle(root, kv_at_least=len(kv), mamba_at_least=2)
        assert record_keys(root, "mamba") == {keys[3], keys[7]}

        e2e.flush_cache(server)
        warm = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        e2e.assert_cached(warm, storage=expected)
        e2e.assert_same_output(warm, cold)
        assert f"loaded={expected}" in e2e.server_log(server)
        assert_storage_healthy(server)
    finally:
        server.stop()

    server = serve(hybrid_model, root, tmp_path, "restart")
    try:
        restored = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        e2e.assert_cached(restored, storage=expected)
        e2e.assert_same_output(restored, cold)

        # Damage the state at 128 only: the KV pages are intact, the state at 64 too.
        e2e.flush_cache(server)
        flip_byte(find_record(root, keys[7], "mamba"), mask=0x5A)
        fallback = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        e2e.assert_cached(fallback, storage=INTERVAL)
        e2e.assert_same_output(fallback, cold)
        assert f"record {keys[7]} failed V13" in e2e.server_log(server)  # seen, quarantined
        # The recompute of [64, 163) stores the state at 128 again.
        settle(root, kv_at_least=0, mamba_at_least=2)
        assert record_keys(root, "mamba") == {keys[3], keys[7]}

        # Damage one KV page inside [64, 128): SGLang 0.5.23 then discards the whole hybrid
        # prefetch ("HiCache hybrid prefetch discarded ... reason=storage_transfer") rather
        # than restoring 64: a lost hit, never a wrong answer.
        e2e.flush_cache(server)
        flip_byte(find_record(root, keys[5], "kv"), mask=0x5A)
        without_page = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        assert without_page.cached_tokens in (0, INTERVAL), without_page.meta_info
        e2e.assert_same_output(without_page, cold)

        # Damage every state record (wait for the recompute's write-through first).
        settle(root, kv_at_least=expected // PAGE_SIZE, mamba_at_least=2)
        e2e.flush_cache(server)
        for path in pool_records(root, "mamba"):
            flip_byte(path, mask=0x5A)
        recomputed = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        e2e.assert_cached(recomputed)
        e2e.assert_same_output(recomputed, cold)
        assert_storage_healthy(server)
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------
# 2 and 5: boundary matrix, decode checkpoints (one server)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interval_server(hybrid_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("hybrid-interval")
    root = directory / "store"
    server = serve(hybrid_model, root, directory, "interval")
    try:
        yield server, root
    finally:
        server.stop()


def measure(server, root: Path, length: int, seed: int, states_donated: int) -> dict:
    """Cold request, write-through, flush, the same request again: how many tokens storage
    serves. Then checks the output against the same split computed live, bit for bit."""
    prompt = prompt_of(length, seed)
    kv_before, mamba_before = set(pool_records(root, "kv")), set(pool_records(root, "mamba"))
    cold = e2e.generate(server, prompt, 4)
    e2e.assert_cached(cold)
    deepest = INTERVAL * (length // INTERVAL)  # the prompt's last aligned position
    settle(
        root,
        kv_at_least=len(kv_before) + deepest // PAGE_SIZE,
        mamba_at_least=len(mamba_before) + states_donated,
    )
    e2e.flush_cache(server)
    restored = e2e.generate(server, prompt, 4)
    cached = restored.cached_tokens
    e2e.assert_cached(restored, storage=cached)
    assert cached <= strict_prefix_bound(length), (length, cached)
    e2e.flush_cache(server)
    reference = live_split(server, prompt, cached, 4)
    e2e.assert_same_output(restored, reference)
    e2e.flush_cache(server)
    return {"cached": cached, "same_as_cold": same_output(restored, cold)}


def test_server_boundary_matrix(interval_server):
    """N in {kC - 1, kC, kC + 1 : k = 1, 2, 3}, each its own prompt, sent as exact input_ids:
    after a flush the storage hit never exceeds C*floor((N-1)/C), matches the documented matrix
    (SGLang saves a prompt's state only at its last aligned position: N = kC finds none below N),
    and the output is bit-identical to the same split computed live."""
    server, root = interval_server
    measured, rows = {}, []
    for length in sorted(MEASURED_MATRIX):
        result = measure(
            server, root, length, seed=2, states_donated=1 if length >= INTERVAL else 0
        )
        measured[length] = result["cached"]
        rows.append(
            f"N={length:4d} bound={strict_prefix_bound(length):4d} storage={result['cached']:4d}"
            f" same_as_cold={result['same_as_cold']}"
        )
    print("\nserver-level boundary matrix (C = 64, P = 16):\n" + "\n".join(rows))
    assert measured == MEASURED_MATRIX
    assert_storage_healthy(server)


def test_chunked_prefill_gives_kc_prompts_a_checkpoint(hybrid_model, tmp_path):
    """The workaround for N = kC: with --chunked-prefill-size C every prefill chunk donates its
    own checkpoint, so a repeated prompt of exactly kC tokens restores (k-1)C."""
    root = tmp_path / "store"
    args = [*hybrid_args(root), "--chunked-prefill-size", str(INTERVAL)]
    server = e2e.start_server(
        hybrid_model, args, env=HARNESS_ENV, log_path=tmp_path / "chunked.log"
    )
    try:
        for k in (2, 3):
            length = k * INTERVAL
            result = measure(server, root, length, seed=5, states_donated=k)
            assert result["cached"] == (k - 1) * INTERVAL, (length, result)
        assert_storage_healthy(server)
    finally:
        server.stop()


def test_decode_checkpoints_reused_by_next_turn(interval_server):
    """A 100-token prompt decoding 60 tokens passes 128: with --mamba-track-interval 64 the
    decode leaves a checkpoint there (the prefill's is at 64). A follow-up turn (prompt, answer,
    20 new tokens: 180) restores 128 tokens from storage, bit-identical to the live follow-up that
    found the same checkpoint in the device cache."""
    server, root = interval_server
    e2e.flush_cache(server)
    prompt = prompt_of(100, seed=3)
    mamba_before = set(pool_records(root, "mamba"))
    first = e2e.generate(server, prompt, 60)
    follow_up = prompt + first.output_ids + prompt_of(20, seed=4)
    assert len(follow_up) == 180
    _, mamba = settle(root, kv_at_least=128 // PAGE_SIZE, mamba_at_least=len(mamba_before) + 2)
    assert len(mamba - mamba_before) == 2  # prefill: 64; decode: 128

    live = e2e.generate(server, follow_up, MAX_NEW_TOKENS)
    e2e.assert_cached(live, device=128)
    settle(root, kv_at_least=0, mamba_at_least=len(mamba))
    e2e.flush_cache(server)
    restored = e2e.generate(server, follow_up, MAX_NEW_TOKENS)
    e2e.assert_cached(restored, storage=128)
    assert strict_prefix_bound(len(follow_up)) == 128
    e2e.assert_same_output(restored, live)
    assert_storage_healthy(server)
