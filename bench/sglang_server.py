"""Real SGLang servers for the end-to-end tests and the benchmarks (both import this module as
``bench.sglang_server``).

A server runs under ``tests/sglang_cpu/run`` (the CPU test harness: python-only ``sgl_kernel``
stand-in, ``SGLANG_USE_CPU_ENGINE=1`` and the opt-in runtime patches; see
``tests/sglang_cpu/README.md``), or with stock SGLang (``harness=False``, the GPU benchmarks).
Test and benchmark code: nothing here is part of the shipped package. Imports no module of
tests/ (it runs tests/sglang_cpu/ files as programs only), nor SGLang except in
``storage_config``.

Typical use::

    model = ensure_model("llama", "tiny")
    with start_server(model, hicache_args("layer_first"), env={...}, log_path=p) as server:
        first = generate(server, list(range(10, 53)), max_new_tokens=4)
        flush_cache(server)
        second = generate(server, list(range(10, 53)), max_new_tokens=4)
        assert second.storage_tokens == 40

With GalahadStorage as the L3: ``galahad_args(root)`` gives the flags, ``galahad_config(root)`` the
extra config alone (also what tests/sglang_pools.py loads in-process), and ``assert_cached``,
``assert_same_output`` and ``assert_storage_healthy`` check a result and a server's log. The
store's files on disk: tests/records.py. The model fixtures (``tiny_model``, ``hybrid_model``):
tests/conftest.py. Import-only.

Every server is started in its own process group and ``Server.stop()`` kills the whole group
(SIGTERM, then SIGKILL), so no scheduler or detokenizer child survives a test. Servers still
running when the interpreter exits are stopped by an ``atexit`` hook.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

REPO_ROOT = Path(__file__).resolve().parent.parent
HARNESS_DIR = REPO_ROOT / "tests" / "sglang_cpu"
RUN_SCRIPT = HARNESS_DIR / "run"
MAKE_MODEL = HARNESS_DIR / "make_model.py"
DEFAULT_MODEL_CACHE = HARNESS_DIR / ".build" / "models"

DEFAULT_STARTUP_TIMEOUT_S = 240.0
DEFAULT_REQUEST_TIMEOUT_S = 120.0

# Flags that keep a tiny-model CPU server small and its startup short.
TINY_SERVER_ARGS = ["--max-total-tokens", "2048", "--skip-server-warmup"]


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


def ensure_model(
    arch: str = "llama",
    size: str = "tiny",
    seed: int = 0,
    cache_dir: Path | str | None = None,
    python: str | None = None,
) -> Path:
    """Return the directory of a locally built model, building it once if needed.

    Models are cached under ``tests/sglang_cpu/.build/models`` (or ``cache_dir``), keyed by
    arch, size, seed and the content of ``make_model.py``, so a change to the builder gives a
    fresh model. Safe to call from several processes at once (a file lock serialises builds).
    Call it from a session-scoped pytest fixture.
    """
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_MODEL_CACHE
    digest = hashlib.sha256(MAKE_MODEL.read_bytes()).hexdigest()[:12]
    target = cache / f"{arch}-{size}-seed{seed}-{digest}"
    if (target / "config.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache))
        try:
            cmd = [python or sys.executable, str(MAKE_MODEL)]
            cmd += ["--arch", arch, "--size", size, "--seed", str(seed), "--out", str(tmp)]
            env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"make_model failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
                )
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ------------------------------------------------------------------------------------------------
# Server arguments
# ------------------------------------------------------------------------------------------------


def hicache_args(
    layout: str,
    *,
    backend: str = "file",
    extra_config: Mapping[str, Any] | None = None,
    page_size: int = 4,
    io_backend: str = "direct",
    prefetch_threshold: int = 4,
    prefetch_policy: str | None = "wait_complete",
    write_policy: str = "write_through",
    hicache_ratio: float = 2.0,
) -> list[str]:
    """Server flags for HiCache with an L3 backend on CPU.

    On CPU only ``--hicache-io-backend direct`` with ``layer_first`` or ``page_first_direct``
    works (the harness's ``kv_direct_io`` patch). ``prefetch_threshold`` (tokens) defaults to
    256 in SGLang, which is longer than test prompts; it goes into the extra-config JSON, which
    SGLang pops before passing the rest to the backend. For ``dynamic`` backends put
    ``backend_name`` / ``module_path`` / ``class_name`` into ``extra_config``.
    ``prefetch_policy=None`` leaves SGLang's default (``timeout``).
    """
    config = {"prefetch_threshold": prefetch_threshold, **(extra_config or {})}
    policy = (
        [] if prefetch_policy is None else ["--hicache-storage-prefetch-policy", prefetch_policy]
    )
    return [
        "--page-size", str(page_size),
        "--enable-hierarchical-cache",
        "--hicache-ratio", str(hicache_ratio),
        "--hicache-io-backend", io_backend,
        "--hicache-mem-layout", layout,
        "--hicache-write-policy", write_policy,
        "--hicache-storage-backend", backend,
        *policy,
        "--hicache-storage-backend-extra-config", json.dumps(config),
    ]  # fmt: skip


GALAHAD_CLASS = {
    "backend_name": "galahad",
    "module_path": "hicache_galahad",
    "class_name": "GalahadStorage",
}


def galahad_config(root: Path | str, **options: Any) -> dict[str, Any]:
    """The extra config that loads GalahadStorage through SGLang's ``dynamic`` storage backend
    (server flag or ``StorageBackendFactory``): the class, the store root, then ``options``."""
    return {**GALAHAD_CLASS, "root": str(root), **options}


def storage_config(
    extra_config: dict | None = None,
    *,
    model_name: str | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    is_mla_model: bool = False,
    metrics: bool = False,
    page_first: bool = True,
):
    """The HiCacheStorageConfig that SGLang hands a storage backend in process (one rank, no
    pipeline or context parallelism); the one builder of the tests and the benchmarks."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=is_mla_model,
        enable_storage_metrics=metrics,
        is_page_first_layout=page_first,
        model_name=model_name,
        extra_config=extra_config,
    )


def galahad_args(
    root: Path | str,
    layout: str = "page_first_direct",
    *,
    page_size: int = 4,
    interface_v1: bool = True,
    **options: Any,
) -> list[str]:
    """Flags for a tiny-model server with GalahadStorage at ``root`` as its HiCache L3
    (``options`` go into the extra config; ``interface_v1`` selects the zero-copy interface)."""
    config = galahad_config(root, **options)
    if interface_v1:
        config["interface_v1"] = 1
    return [
        *TINY_SERVER_ARGS,
        *hicache_args(layout, backend="dynamic", extra_config=config, page_size=page_size),
    ]


# ------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the usual small race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def kill_process_group(pgid: int, proc: subprocess.Popen | None = None, grace_s: float = 20.0):
    """SIGKILL every member of the group; with ``grace_s`` > 0, SIGTERM it first and wait up
    to ``grace_s`` for every member to exit.

    Returns the pids that were still alive when SIGKILL was sent (empty if all exited).
    Raises RuntimeError if members survive even SIGKILL.
    """

    def reap():
        if proc is not None:
            proc.poll()

    def wait_empty(deadline: float) -> list[int]:
        while True:
            reap()
            alive = group_members(pgid)
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.2)

    survivors = group_members(pgid)
    if grace_s > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        survivors = wait_empty(time.monotonic() + grace_s)
    if survivors:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        left = wait_empty(time.monotonic() + 10.0)
        if left:
            raise RuntimeError(f"processes {left} of group {pgid} survived SIGKILL")
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    return survivors


_live_servers: set[Server] = set()


@dataclass(eq=False)
class Server:
    """A running SGLang server started by :func:`start_server`."""

    proc: subprocess.Popen
    port: int
    model_dir: Path
    log_path: Path
    command: list[str]
    startup_s: float = 0.0
    stopped: bool = False
    killed_pids: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session=True: the leader's pid is the group id

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop the server and every process in its group. Idempotent.

        By default at once with SIGKILL. A SIGTERM to the group gains nothing: the scheduler,
        where the storage backend runs, dies of it without running Python's cleanup (exit
        code -15), and the launcher then sleeps 5 s "to let GPU activity settle" before it
        exits. What a test restarts after is therefore a killed backend either way (which the
        store is built for). `grace_s` > 0 sends SIGTERM first and waits that long."""
        if self.stopped:
            return
        try:
            self.killed_pids = kill_process_group(self.pgid, self.proc, grace_s)
        finally:
            self.stopped = True
            _live_servers.discard(self)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@atexit.register
def _stop_leftover_servers() -> None:
    for server in list(_live_servers):
        with contextlib.suppress(Exception):
            server.stop(grace_s=5.0)


def harness_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a harness subprocess: ours, plus ``env``, plus the interpreter."""
    merged = dict(os.environ)
    merged.setdefault("SGLANG_CPU_PYTHON", sys.executable)
    merged.update(env or {})
    return merged


def start_server(
    model_dir: Path | str,
    extra_args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    log_path: Path | str | None = None,
    *,
    timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    python: str | None = None,
    harness: bool = True,
) -> Server:
    """Start ``python -m sglang.launch_server --device cpu`` under the CPU harness (or, with
    ``harness=False``, stock SGLang on the GPU).

    Picks a free loopback port, starts the server in its own process group with stdout and
    stderr going to ``log_path`` (a temporary file if None), and waits until ``/health``
    answers 200. Fails fast, with the log tail, if the process exits first; on timeout the
    server is stopped. ``env`` is added to the current environment (e.g.
    ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``). Use the result as a context manager or call
    ``stop()``.
    """
    port = free_port()
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"sglang-cpu-{port}-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    model_dir = Path(model_dir)
    command = [
        python or sys.executable, "-m", "sglang.launch_server",
        "--host", "127.0.0.1", "--port", str(port), "--model-path", str(model_dir), *extra_args,
    ]  # fmt: skip
    if harness:  # CPU: the test harness and --device cpu; else stock SGLang on the GPU
        command = [str(RUN_SCRIPT), *command, "--device", "cpu"]
    started = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=harness_env(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(proc=proc, port=port, model_dir=model_dir, log_path=log_path, command=command)
    _live_servers.add(server)
    try:
        _wait_healthy(server, timeout_s)
    except BaseException:
        server.stop(grace_s=5.0)
        raise
    server.startup_s = time.monotonic() - started
    return server


def _wait_healthy(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if not server.alive():
            raise RuntimeError(
                f"SGLang server exited with code {server.proc.returncode} before becoming "
                f"healthy; log {server.log_path}:\n{server.log_tail()}"
            )
        with contextlib.suppress(requests.RequestException):
            if requests.get(server.url + "/health", timeout=5).status_code == 200:
                return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"SGLang server not healthy after {timeout_s:.0f}s; log {server.log_path}:\n"
                f"{server.log_tail()}"
            )
        time.sleep(0.5)


# ------------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------------


@dataclass
class GenerateResult:
    output_ids: list[int]
    output_logprobs: list[float]
    meta_info: dict
    text: str
    raw: dict

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens not recomputed (device + host + storage)."""
        return int(self.meta_info.get("cached_tokens") or 0)

    @property
    def cache_details(self) -> dict:
        """``meta_info["cached_tokens_details"]``: ``{"device", "host", "storage",
        "storage_backend"}`` with HiCache storage on, ``{}`` when nothing was cached."""
        return dict(self.meta_info.get("cached_tokens_details") or {})

    @property
    def storage_tokens(self) -> int:
        """Prompt tokens that came from the L3 storage backend for this request."""
        return int(self.cache_details.get("storage", 0))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> GenerateResult:
        """A result from one request of :func:`run_engine_roundtrip` (``first``, ``second``)."""
        meta = {key: record[key] for key in ("cached_tokens", "cached_tokens_details")}
        return cls(record["output_ids"], record["output_logprobs"], meta, "", dict(record))


def generate(
    server: Server | str,
    prompt: list[int] | str,
    max_new_tokens: int = 8,
    return_logprob: bool = True,
    *,
    sampling_params: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> GenerateResult:
    """POST /generate. Greedy (temperature 0) and ``ignore_eos`` unless overridden.

    ``prompt`` is a list of token ids or a text. The storage hit count is in
    ``result.storage_tokens`` (``meta_info["cached_tokens_details"]["storage"]``).
    """
    url = server.url if isinstance(server, Server) else server.rstrip("/")
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    params.update(sampling_params or {})
    body: dict[str, Any] = {"sampling_params": params, "return_logprob": return_logprob}
    body["input_ids" if isinstance(prompt, list) else "text"] = prompt
    response = requests.post(url + "/generate", json=body, timeout=timeout_s)
    if response.status_code != 200:
        raise RuntimeError(f"/generate returned {response.status_code}: {response.text[:2000]}")
    raw = response.json()
    meta = raw.get("meta_info", {})
    triples = meta.get("output_token_logprobs") or []
    output_ids = raw.get("output_ids") or [t[1] for t in triples]
    return GenerateResult(
        output_ids=list(output_ids),
        output_logprobs=[t[0] for t in triples],
        meta_info=meta,
        text=raw.get("text", ""),
        raw=raw,
    )


def flush_cache(server: Server | str, timeout_s: float = 60.0) -> None:
    """POST /flush_cache until it succeeds (it is refused while requests are in flight).

    A flush empties the device and host tiers, so a later hit can only come from storage. It
    also drops queued storage writes: wait for them first (e.g. :func:`wait_for_files`).
    """
    url = server.url if isinstance(server, Server) else server.rstrip("/")
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            response = requests.post(url + "/flush_cache", timeout=30)
            if response.status_code == 200:
                return
            last = f"{response.status_code}: {response.text[:500]}"
        except requests.RequestException as exc:
            last = repr(exc)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"/flush_cache did not succeed within {timeout_s}s ({last})")
        time.sleep(0.5)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def wait_settled(
    look: Callable[[], Any],
    ready: Callable[[Any], bool] = lambda seen: True,
    *,
    quiet_s: float = 1.0,
    timeout_s: float = 60.0,
    poll_s: float = 0.2,
    what: str = "the store to settle",
) -> Any:
    """Polls ``look()`` until ``ready`` holds for what it sees and that has not changed for
    ``quiet_s``; returns what it saw last. SGLang writes to L3 in the background and
    ``/flush_cache`` drops writes still queued: wait for them before a flush or a count."""
    deadline = time.monotonic() + timeout_s
    last, since = look(), time.monotonic()
    while True:
        if ready(last) and time.monotonic() - since >= quiet_s:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}; saw {last!r}")
        time.sleep(poll_s)
        seen = look()
        if seen != last:
            last, since = seen, time.monotonic()


def wait_for_files(
    directory: Path | str, at_least: int, pattern: str = "*.bin", timeout_s: float = 30.0
) -> list[Path]:
    """Wait until ``directory`` holds at least ``at_least`` files matching ``pattern``.

    SGLang writes to L3 asynchronously (write-through: device -> host -> backup thread), and
    ``/flush_cache`` drops writes still queued, so wait for them before flushing. For the
    built-in ``file`` backend every stored page is one ``<hash>_<suffix>.bin`` file.
    """
    directory = Path(directory)
    found: list[Path] = []

    def enough() -> bool:
        nonlocal found
        found = sorted(directory.glob(pattern)) if directory.is_dir() else []
        return len(found) >= at_least

    wait_for(enough, timeout_s, f"{at_least} {pattern} files in {directory}")
    return found


# ------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------


def assert_cached(
    result: GenerateResult, *, storage: int = 0, device: int = 0, backend: str = "GalahadStorage"
) -> None:
    """The prompt tokens not recomputed are exactly ``storage`` from the L3 backend named
    ``backend`` plus ``device`` from SGLang's own device and host tiers (none by default)."""
    details = result.cache_details
    assert result.cached_tokens == storage + device, result.meta_info
    if result.cached_tokens:  # SGLang leaves out "storage" when only its own tiers served
        assert details.get("storage", 0) == storage, details
        assert details.get("device", 0) + details.get("host", 0) == device, details
        if storage:
            assert details["storage_backend"] == backend, details


def assert_same_output(result: GenerateResult, reference: GenerateResult) -> None:
    assert result.output_ids == reference.output_ids
    assert result.output_logprobs == reference.output_logprobs  # bit-identical floats


def server_log(server: Server) -> str:
    return Path(server.log_path).read_text(errors="replace")


def assert_storage_healthy(server: Server, *also_absent: str) -> None:
    """No SGLang storage thread died (an exception there disables L3 for the process), the
    backend caught no exception of its own, and none of ``also_absent`` is in the log."""
    log = server_log(server)
    for text in ("Exception in thread", "; reporting a miss", *also_absent):
        assert text not in log, log[-4000:]


# ------------------------------------------------------------------------------------------------
# In-process Engine
# ------------------------------------------------------------------------------------------------


def run_engine_roundtrip(model_dir: Path | str, *args: str, timeout_s: float = 400) -> dict:
    """Runs ``tests/sglang_cpu/engine_roundtrip.py`` (an in-process ``sglang.Engine``: generate,
    flush, generate) under the harness in its own process group; returns its RESULT record
    (``first``, ``second``, ``flush_success``). Extra ``args`` go to the script."""
    command = [
        str(RUN_SCRIPT), sys.executable, str(HARNESS_DIR / "engine_roundtrip.py"),
        "--model", str(model_dir), *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=harness_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    finally:
        kill_process_group(proc.pid, proc, grace_s=10.0)
    if group_members(proc.pid):
        raise RuntimeError("an Engine process survived its process group's kill")
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"engine_roundtrip failed ({proc.returncode}):\n{output[-5000:]}")
    return json.loads(lines[-1][len("RESULT ") :])
