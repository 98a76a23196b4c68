"""Checks of the CPU harness patches (tests/sglang_cpu/patches), test harness only.

* The pure-torch direct transfer functions against a literal transliteration of sgl-kernel's
  C++ (``transfer_kv_direct`` and the page-copy path of ``transfer_kv_page_first_direct_impl``),
  for K/V pairs (MHA) and single buffers (MLA, Mamba with page_size 1). Torch only: fast.
* In a fresh interpreter under ``tests/sglang_cpu/run`` (so through ``sitecustomize`` and the
  post-import hook, exactly as in a server): real SGLang MHA host pools on CPU, default
  ``pin_memory=True``, device -> host -> device round trips for ``layer_first`` and
  ``page_first_direct`` with ``--hicache-io-backend direct``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

HARNESS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HARNESS_DIR / "patches"))

from sglang_cpu_patches import cpu_hicache  # noqa: E402


def ref_transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """transfer.cu: copy maximal runs where both index lists step by one."""
    src, dst = src_indices.tolist(), dst_indices.tolist()
    start = 0
    for i in range(len(src)):
        if i < len(src) - 1 and src[i + 1] - src[i] == 1 and dst[i + 1] - dst[i] == 1:
            continue
        end = i + 1
        n = end - start
        for s_layer, d_layer in zip(src_layers, dst_layers, strict=True):
            d_layer[dst[start] : dst[start] + n] = s_layer[src[start] : src[start] + n]
        start = end


def ref_page_first_direct(src_ptrs, dst_ptrs, src_indices, dst_indices, start_layer, ps, lf2pf):
    """transfer.cu: transfer_kv_page_first_direct_impl, fallback_to_page_copy."""
    src, dst = src_indices.tolist(), dst_indices.tolist()
    num_pages = len(src) // ps
    if lf2pf:
        is_mla = len(dst_ptrs) == 1
        num_layers = len(src_ptrs) if is_mla else len(src_ptrs) // 2
        for i in range(num_pages):
            s, d = src[i * ps], dst[i * ps] // ps
            for j in range(num_layers):
                dst_ptrs[0][d, start_layer + j, :ps] = src_ptrs[j][s : s + ps]
                if not is_mla:
                    dst_ptrs[1][d, start_layer + j, :ps] = src_ptrs[j + num_layers][s : s + ps]
    else:
        is_mla = len(src_ptrs) == 1
        num_layers = len(dst_ptrs) if is_mla else len(dst_ptrs) // 2
        for i in range(num_pages):
            s, d = src[i * ps] // ps, dst[i * ps]
            for j in range(num_layers):
                dst_ptrs[j][d : d + ps] = src_ptrs[0][s, start_layer + j, :ps]
                if not is_mla:
                    dst_ptrs[j + num_layers][d : d + ps] = src_ptrs[1][s, start_layer + j, :ps]


def _pages(starts, ps):
    return torch.tensor([s + o for s in starts for o in range(ps)], dtype=torch.int64)


def _clone(tensors):
    return [t.clone() for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transfer_kv_direct_matches_reference(dtype):
    g = torch.Generator().manual_seed(1)
    src = [torch.randn(64, 2, 8, generator=g).to(dtype) for _ in range(6)]
    dst = [torch.zeros(80, 2, 8, dtype=dtype) for _ in range(6)]
    src_idx = _pages([8, 12, 40, 0], 4)  # runs of different lengths
    dst_idx = _pages([60, 64, 4, 20], 4)
    want = _clone(dst)
    ref_transfer_kv_direct(src, want, src_idx, dst_idx, 4)
    cpu_hicache.transfer_kv_direct(src, dst, src_idx, dst_idx, 4)
    assert all(torch.equal(a, b) for a, b in zip(dst, want, strict=True))


# (host pages, device pages): scattered (one gather and one scatter per layer), and in runs of
# consecutive pages (one copy per run, as the C++ kernel does)
PAGE_PATTERNS = {
    "scattered": ([9, 7, 5, 3, 1, 8, 6, 4, 2], [0, 2, 4, 6, 8, 10, 12, 14, 1]),
    "few": ([7, 2, 5], [3, 9, 0]),
    "runs": ([0, 1, 2, 3, 4, 5, 6, 8, 9], [4, 5, 6, 7, 8, 9, 10, 1, 2]),
}


@pytest.mark.parametrize("pattern", sorted(PAGE_PATTERNS))
@pytest.mark.parametrize("kv_pair", [True, False], ids=["mha", "single-buffer"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_page_first_direct_matches_reference(kv_pair, page_size, pattern):
    g = torch.Generator().manual_seed(2)
    layers, pages, tokens = 3, 10, 64
    n_host = 2 if kv_pair else 1
    host = [torch.randn(pages, layers, page_size, 2, 8, generator=g) for _ in range(n_host)]
    device = [torch.randn(tokens, 2, 8, generator=g) for _ in range(layers * n_host)]
    host_pages, device_pages = PAGE_PATTERNS[pattern]
    host_idx = _pages([page * page_size for page in host_pages], page_size)
    dev_idx = _pages([page * page_size for page in device_pages], page_size)

    # device -> host, all layers
    got_host, want_host = _clone(host), _clone(host)
    cpu_hicache.transfer_kv_all_layer_direct_lf_pf(device, got_host, dev_idx, host_idx, page_size)
    ref_page_first_direct(device, want_host, dev_idx, host_idx, 0, page_size, True)
    assert all(torch.equal(a, b) for a, b in zip(got_host, want_host, strict=True))

    # host -> device, one layer at a time (the per-layer device list has one tensor per buffer)
    for layer in range(layers):
        got_dev = [torch.zeros(tokens, 2, 8) for _ in range(n_host)]
        want_dev = _clone(got_dev)
        cpu_hicache.transfer_kv_per_layer_direct_pf_lf(
            host, got_dev, host_idx, dev_idx, layer, page_size
        )
        ref_page_first_direct(host, want_dev, host_idx, dev_idx, layer, page_size, False)
        assert all(torch.equal(a, b) for a, b in zip(got_dev, want_dev, strict=True))


def test_transfer_functions_validate_arguments():
    a = [torch.zeros(8, 1)]
    with pytest.raises(RuntimeError):
        cpu_hicache.transfer_kv_direct(a, a + a, torch.arange(4), torch.arange(4), 4)
    with pytest.raises(RuntimeError):
        cpu_hicache.transfer_kv_direct(a, a, torch.arange(4), torch.arange(3), 4)
    with pytest.raises(RuntimeError):
        cpu_hicache.transfer_kv_direct(a, a, torch.arange(3), torch.arange(3), 4)


def test_unknown_patch_name_is_refused():
    import sglang_cpu_patches

    with pytest.raises(ValueError, match="unknown patch"):
        sglang_cpu_patches.install(["no_such_patch"])


_POOL_ROUND_TRIP = textwrap.dedent(
    """
    import torch
    import sglang_cpu_patches
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host import mha

    for layout in ("layer_first", "page_first_direct"):
        kv = MHATokenToKVPool(256, 4, torch.bfloat16, 2, 16, 3, "cpu", False,
                              start_layer=0, end_layer=2)
        # default pin_memory=True: only works because host_unpinned forces False
        host = mha.MHATokenToKVPoolHost(
            kv.get_device_pool_infos()[0].buffer_info, 2.0, 0, 4, layout,
            device_capacity_tokens=kv.size, start_layer=kv.start_layer, end_layer=kv.end_layer)
        assert host.pin_memory is False
        host.alloc(8)
        host_idx = host.alloc(12)
        buffers = (*host.device_k_buffers, *host.device_v_buffers)
        for b in buffers:
            b.copy_(torch.randn(b.shape).to(b.dtype))
        dev_idx = torch.tensor([8, 9, 10, 11, 40, 41, 42, 43, 20, 21, 22, 23])
        host.backup_from_device_all_layer(kv, host_idx, dev_idx, "direct")
        page = host.get_data_page(int(host_idx[4]), flat=False)  # second page
        dev_idx2 = torch.tensor([100, 101, 102, 103, 60, 61, 62, 63, 4, 5, 6, 7])
        for layer in range(3):
            host.load_to_device_per_layer(kv, host_idx, dev_idx2, layer, "direct")
        assert all(torch.equal(b[dev_idx], b[dev_idx2]) for b in buffers), layout
        # the host page holds device rows 40..43 of every layer, K then V
        k_rows = torch.stack([b[40:44] for b in host.device_k_buffers])
        assert torch.equal(page[0].reshape(k_rows.shape), k_rows), layout
    applied = sorted(set(sglang_cpu_patches.APPLIED))
    assert ("host_unpinned", "sglang.srt.mem_cache.pool_host.base") in applied, applied
    assert ("kv_direct_io", "sglang.srt.mem_cache.pool_host.mha") in applied, applied
    print("POOL ROUND TRIP OK")
    """
)


def _python_under_run(script: str) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter under tests/sglang_cpu/run with its default patches."""
    env = dict(os.environ, SGLANG_CPU_PYTHON=sys.executable)
    env.pop("SGLANG_CPU_TEST_PATCHES", None)  # the run script's default set
    return subprocess.run(
        [str(HARNESS_DIR / "run"), sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed")
def test_real_host_pools_round_trip_under_harness():
    proc = _python_under_run(_POOL_ROUND_TRIP)
    assert proc.returncode == 0 and "POOL ROUND TRIP OK" in proc.stdout, (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("", ""), ("ACTIVE", "ACTIVE")])
def test_run_script_sets_passive_openmp_wait_unless_given(given, expected):
    """OpenMP threads sleep between parallel regions under the harness: libgomp's default
    spin-wait made CPU servers several times slower beside a busy process (README.md, "OpenMP
    under load"). A value the caller sets, even empty, is kept."""
    env = dict(os.environ, SGLANG_CPU_PYTHON=sys.executable)
    env.pop("OMP_WAIT_POLICY", None)
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    proc = subprocess.run(
        [str(HARNESS_DIR / "run"), sys.executable, "-c",
         "import os; print(repr(os.environ.get('OMP_WAIT_POLICY')))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == repr(expected)


def _harness_env_of(args, env_update=None, drop=(), tmp_config=None):
    """The variables `run` exports for a command line with `args` (the command is a python
    that prints them)."""
    env = dict(os.environ, SGLANG_CPU_PYTHON=sys.executable)
    for name in ("SGLANG_NCCL_SO_PATH", "SGLANG_CPU_OMP_THREADS_BIND", "TORCHDYNAMO_DISABLE",
                 "SGLANG_CPU_TEST_PATCHES", "SGLANG_CPU_TEST_MLA", "SGLANG_CPU_TEST_HYBRID",
                 *drop):  # fmt: skip
        env.pop(name, None)
    env.update(env_update or {})
    names = ["SGLANG_NCCL_SO_PATH", "SGLANG_CPU_OMP_THREADS_BIND", "TORCHDYNAMO_DISABLE",
             "SGLANG_CPU_TEST_PATCHES", "SGLANG_CPU_TEST_MLA"]  # fmt: skip
    script = f"import json, os; print(json.dumps({{n: os.environ.get(n) for n in {names!r}}}))"
    proc = subprocess.run(
        [str(HARNESS_DIR / "run"), sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["--tp-size", "2"], ["--tp=2"], ["--dp-size", "2"]])
def test_run_script_sets_what_more_than_one_rank_needs(args):
    """A server of more than one rank on CPU needs NCCL off (the CUDA torch's libnccl would make
    SGLang build a PyNcclCommunicator on CPU), one OpenMP CPU group per rank (else SGLang
    asserts the ranks fit the NUMA nodes) and no inductor build at the first request
    (README.md, "More than one rank")."""
    seen = _harness_env_of(args)
    assert seen["SGLANG_NCCL_SO_PATH"] and not os.path.exists(seen["SGLANG_NCCL_SO_PATH"])
    groups = seen["SGLANG_CPU_OMP_THREADS_BIND"].split("|")
    assert len(groups) == 2 and all(groups), seen
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:  # disjoint groups covering every CPU
        flat = [int(c) for group in groups for c in group.split(",")]
        assert sorted(flat) == cpus, seen
    assert seen["TORCHDYNAMO_DISABLE"] == "1"


def test_run_script_leaves_one_rank_and_given_values_alone():
    one = _harness_env_of(["--tp-size", "1"])
    assert one["SGLANG_NCCL_SO_PATH"] is None
    assert one["SGLANG_CPU_OMP_THREADS_BIND"] is None and one["TORCHDYNAMO_DISABLE"] is None
    given = {"SGLANG_NCCL_SO_PATH": "/x.so", "SGLANG_CPU_OMP_THREADS_BIND": "0|0",
             "TORCHDYNAMO_DISABLE": ""}  # fmt: skip
    assert {k: v for k, v in _harness_env_of(["--tp", "2"], given).items() if k in given} == given
    four = _harness_env_of(["--tp", "2", "--dp-size=2"])
    assert len(four["SGLANG_CPU_OMP_THREADS_BIND"].split("|")) == 4


def test_run_script_adds_the_mla_patch_for_a_deepseek_model(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["DeepseekV3ForCausalLM"]}')
    seen = _harness_env_of(["--model-path", str(tmp_path)])
    assert seen["SGLANG_CPU_TEST_MLA"] == "1"
    assert "mla_torch_native" in seen["SGLANG_CPU_TEST_PATCHES"].split(",")
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    seen = _harness_env_of(["--model-path", str(tmp_path)])
    assert seen["SGLANG_CPU_TEST_MLA"] == "0"
    assert "mla_torch_native" not in seen["SGLANG_CPU_TEST_PATCHES"].split(",")


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed")
def test_fork_children_makes_sglangs_spawn_a_fork_under_the_run_script():
    """The default patch set turns engine.py's `mp.set_start_method("spawn", force=True)` into
    fork (a server start in about 16 s instead of 28 s); everything else of multiprocessing is
    the module itself."""
    script = textwrap.dedent(
        """
        import multiprocessing
        import sglang.srt.entrypoints.engine as engine
        engine.mp.set_start_method("spawn", force=True)
        print(multiprocessing.get_start_method(), engine.mp.Process is multiprocessing.Process)
        """
    )
    proc = _python_under_run(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "fork True"


def test_a_server_group_is_stopped_at_once_and_with_a_grace_sigterm_comes_first(tmp_path):
    """Server.stop(), with its default, SIGKILLs the group at once (a SIGTERM only bought
    SGLang's launcher a 5 s sleep); stop(grace_s > 0) still sends SIGTERM first and waits."""
    from bench import sglang_server as harness

    marker = tmp_path / "terminated"
    script = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w').close(), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    for grace_s in (None, 5.0):
        proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
        )
        server = harness.Server(proc, 0, tmp_path, tmp_path / "log", [sys.executable])
        assert proc.stdout.readline().strip() == b"ready"
        started = time.monotonic()
        server.stop() if grace_s is None else server.stop(grace_s=grace_s)
        assert harness.group_members(server.pgid) == [] and proc.returncode is not None
        if grace_s:
            assert marker.exists() and server.killed_pids == []
        else:
            assert not marker.exists() and server.killed_pids == [proc.pid]
            assert time.monotonic() - started < 2.0
        proc.stdout.close()
