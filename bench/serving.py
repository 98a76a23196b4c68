"""Serving helpers shared by the restart demo and the TTFT benchmark.

A server runs on the GPU with stock SGLang when one is present, else on the CPU under the test
harness (tests/sglang_cpu/run: for tests and demos only). Time to first token is measured with
a streamed /generate: the time from sending the request to the first streamed chunk.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from bench import sglang_server as e2e  # the server harness the end-to-end tests use too

REPO_ROOT = Path(__file__).resolve().parent.parent


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def galahad_config(root: Path, **options) -> dict:
    """GalahadStorage's extra config for a benchmark server: the zero-copy interface (v1)."""
    return e2e.galahad_config(root, **{"interface_v1": 1, **options})


def server_args(
    storage: str,
    root: Path | None,
    *,
    page_size: int,
    max_tokens: int,
    chunked_prefill: int | None = None,
    galahad_options: dict | None = None,
) -> list[str]:
    """Flags for storage in {"none", "file", "galahad"}; every mode keeps the same page size and
    memory so that only the L3 tier differs. `chunked_prefill` defaults to `max_tokens`;
    `galahad_options` go into GalahadStorage's extra config (e.g. {"interface_v1": 0})."""
    common = ["--max-total-tokens", str(max_tokens), "--skip-server-warmup"]
    common += ["--page-size", str(page_size)]
    common += ["--chunked-prefill-size", str(chunked_prefill or max_tokens)]
    if storage == "none":
        return common
    extra = {"prefetch_threshold": page_size}
    if storage == "galahad":
        extra = galahad_config(root, **(galahad_options or {})) | extra
        backend = "dynamic"
    else:
        extra["file_storage_path"] = str(root)
        backend = "file"
    return [
        *common,
        *e2e.hicache_args(
            "page_first_direct", backend=backend, extra_config=extra, page_size=page_size
        ),
    ]


# On CPU, attention over the new queries only (as GPU backends do), so that a restored prefix
# saves attention work too; see tests/sglang_cpu/patches/sglang_cpu_patches/cpu_attention.py.
CPU_PATCHES = "host_unpinned,kv_direct_io,extend_new_queries_only,fork_children"


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX). Without it torch's bf16
    matmul is emulated, about 45x slower than fp32 on an AVX2-only EPYC."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_dtype_args(args: list[str]) -> list[str]:
    """`--dtype float32` for the CPU harness when bf16 is emulated (unless the caller chose a
    dtype): the bf16 demo model is then served in fp32, the same for every storage mode."""
    if "--dtype" in args or cpu_has_fast_bf16():
        return []
    return ["--dtype", "float32"]


def start(
    model_dir: Path, args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> e2e.Server:
    """A server for `model_dir` with `args`, plus the flags in $GALAHAD_BENCH_SERVER_ARGS
    (e.g. `--disable-cuda-graph` for a GPU run that only measures prefill); `env` is added to
    the server's environment."""
    args = [*args, *shlex.split(os.environ.get("GALAHAD_BENCH_SERVER_ARGS", ""))]
    if has_gpu():
        return e2e.start_server(model_dir, args, env=env, log_path=log_path, harness=False)
    env = {"SGLANG_CPU_TEST_PATCHES": CPU_PATCHES, **(env or {})}
    args = [*args, *cpu_dtype_args(args)]
    return e2e.start_server(model_dir, args, env=env, log_path=log_path)


@dataclass
class Timed:
    ttft_s: float
    total_s: float
    output_ids: list[int]
    meta_info: dict

    @property
    def storage_tokens(self) -> int:
        return int((self.meta_info.get("cached_tokens_details") or {}).get("storage", 0))

    @property
    def cached_tokens(self) -> int:
        return int(self.meta_info.get("cached_tokens") or 0)


def stream_generate(server: e2e.Server, prompt, max_new_tokens: int) -> Timed:
    """Greedy generation, streamed; TTFT is the arrival of the first chunk."""
    body = {
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": True,
        },
        "stream": True,
    }
    body["input_ids" if isinstance(prompt, list) else "text"] = prompt
    start_s = time.perf_counter()
    ttft_s = None
    last = {}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=1800) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            if ttft_s is None:
                ttft_s = time.perf_counter() - start_s
            last = json.loads(payload)
    total_s = time.perf_counter() - start_s
    return Timed(
        ttft_s or total_s, total_s, list(last.get("output_ids") or []), last.get("meta_info", {})
    )


def wait_for_records(root: Path, at_least: int, pattern: str, timeout_s: float = 300) -> None:
    e2e.wait_for(
        lambda: len(list(root.glob(pattern))) >= at_least, timeout_s, f"{at_least} {pattern}"
    )
