"""Real SGLang 0.5.23 servers on CPU with tensor parallelism (``--tp-size 2``) and GalahadStorage as
their L3: every rank its own backend instance on one root, SGLang taking the minimum of the ranks'
hit counts. One server start per model covers the cold run, a restore after ``/flush_cache``,
faults on one rank only (a damaged record, a missing record, an unwritable namespace) and a restart
that restores from disk; outputs are compared bit for bit with the cold run.

Store layout (docs/OPERATIONS.md, "Tensor parallelism" and "MLA"): a Llama (MHA) keeps one KV
namespace per rank, each rank writing and reading its own half of the heads; an MLA model (DeepSeek)
keeps one shared KV namespace, written by rank 0 alone and read by both; a hybrid model
(Qwen3-Next) keeps per-rank KV and per-rank Mamba namespaces.

The harness sets what TP needs on CPU (tests/sglang_cpu/README.md, "More than one rank"). Each
server start takes 35-80 s here (more beside busy neighbours); ``--sleep-on-idle`` keeps the two idle schedulers from
polling two cores. Llama, MLA and the hybrid model run in CI (``slow``, ``e2e``; the hybrid one is the slowest,
about 105 s on a quiet box).

At the end of the file, data parallelism: two TP=1 servers on one root under a small budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from support.records import budgeted_files, flip_byte, page_keys, pool_records

import hicache_galahad
from bench import sglang_server as e2e

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TP = ["--tp-size", "2", "--sleep-on-idle"]
MAX_NEW_TOKENS = 4


def prompt_of(length: int, seed: int) -> list[int]:
    """Distinct token ids per (length, seed), inside the tiny models' vocabulary of 512."""
    rng = random.Random(1000 * seed + length)
    return [rng.randrange(10, 500) for _ in range(length)]


# ------------------------------------------------------------------------------------------------
# The store as seen from outside: namespaces by pool and rank, records by page key
# ------------------------------------------------------------------------------------------------


def namespaces(root: Path) -> list[tuple[Path, dict]]:
    """(directory, description) of every namespace under the root."""
    found = []
    for description in sorted(Path(root, "ns").glob("*/namespace.json")):
        found.append((description.parent, json.loads(description.read_text())))
    return found


def rank_of(description: dict):
    return description["geometry"]["parallel"]["tp_rank"]


def pool_dirs(root: Path, pool: str) -> dict:
    """tp_rank (None for a namespace shared by every rank) -> namespace directory."""
    dirs = {}
    for directory, description in namespaces(root):
        if description["pool"] == pool:
            assert rank_of(description) not in dirs, "two namespaces of one pool and rank"
            dirs[rank_of(description)] = directory
    return dirs


def present(directory: Path, keys: list[str]) -> int:
    """How many of ``keys``, from the first, have a record in ``directory`` (a prefix hit)."""
    count = 0
    for key in keys:
        if not (directory / f"{key}.rec").exists():
            break
        count += 1
    return count


def wait_records(root: Path, pool: str, keys: list[str], ranks, timeout_s: float = 90.0) -> dict:
    """Wait until every rank in ``ranks`` holds all ``keys`` of ``pool`` and nothing changed for
    a second (``/flush_cache`` drops queued writes); returns the pool's directories."""

    def look():
        dirs = pool_dirs(root, pool)
        return tuple(
            present(dirs[rank], keys) if rank in dirs else -1 for rank in sorted(ranks, key=str)
        )

    e2e.wait_settled(
        look,
        lambda seen: all(count == len(keys) for count in seen),
        timeout_s=timeout_s,
        what=f"{len(keys)} {pool} records on ranks {sorted(ranks, key=str)}",
    )
    return pool_dirs(root, pool)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def writers(server: e2e.Server, root: Path) -> dict[int, dict]:
    """TP rank -> lifetime counters of that rank's backend (stats/<process>.json, matched by
    the scheduler's pid), while the server runs."""
    ranks = {}
    for pid in e2e.group_members(server.pgid):
        with contextlib.suppress(OSError):
            title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if title.startswith("sglang::scheduler_TP"):
                ranks[pid] = int(title.split("_TP")[1].split()[0].strip("\0"))
    counters = {}
    for path in Path(root, "stats").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            stats = json.loads(path.read_text())
            pid = stats["process"]["pid"]
            if pid in ranks:
                counters[ranks[pid]] = stats["counters"]
    return counters


@contextlib.contextmanager
def immutable(directory: Path):
    """``chattr +i``: nobody, root included, may create, rename or delete a file in it (the
    tests run as root, for whom a mode of 0o555 changes nothing). Yields False where the
    filesystem or the container does not allow it."""
    if shutil.which("chattr") is None:
        yield False
        return
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True)
    if done.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


# ------------------------------------------------------------------------------------------------
# One scenario per model
# ------------------------------------------------------------------------------------------------


class Model:
    """What differs between the models: flags, page size, the prompt and the expected hits."""

    def __init__(self, arch, page_size, prompt_len, args=(), env=None, mla=False, hybrid=False):
        self.arch, self.page_size, self.args, self.env = arch, page_size, list(args), env
        self.mla, self.hybrid = mla, hybrid
        self.prompt = prompt_of(prompt_len, 1)
        self.other_prompt = prompt_of(prompt_len, 2)

    def serve(self, model_dir, root, tmp_path, name):
        config = e2e.galahad_config(root, interface_v1=1)
        args = [
            "--max-total-tokens", "4096", "--skip-server-warmup", *self.args, *TP,
            *e2e.hicache_args(
                "page_first_direct", backend="dynamic", extra_config=config,
                page_size=self.page_size, prefetch_threshold=self.page_size,
            ),
        ]  # fmt: skip
        return e2e.start_server(
            model_dir, args, env=self.env, log_path=tmp_path / f"{name}.log", timeout_s=400
        )

    def hit_pages(self, prompt) -> int:
        """Pages of ``prompt`` restorable from an intact store (strict prefix, whole pages; a
        hybrid model only up to its last 64-token checkpoint)."""
        if self.hybrid:
            return 64 * ((len(prompt) - 1) // 64) // self.page_size
        return (len(prompt) - 1) // self.page_size


LLAMA = Model("llama", 4, 43)
MLA = Model("deepseek-mla", 4, 43, mla=True)
HYBRID = Model(
    "qwen3-next",
    16,
    163,
    args=[
        "--disable-cuda-graph",
        "--dtype",
        "float32",
        "--max-mamba-cache-size",
        "64",
        "--mamba-radix-cache-strategy",
        "extra_buffer",
        "--mamba-track-interval",
        "64",
    ],  # fmt: skip
    hybrid=True,
)


def run_scenario(spec: Model, tmp_path: Path) -> dict:
    """The whole TP=2 scenario on one model; returns the timings."""
    model_dir = e2e.ensure_model(spec.arch, "tiny")
    root = tmp_path / "store"
    prompt, keys = spec.prompt, page_keys(spec.prompt, spec.page_size)
    pages = spec.hit_pages(prompt)
    restored_tokens = pages * spec.page_size
    kv_ranks = [None] if spec.mla else [0, 1]
    timings = {}
    started = time.monotonic()
    server = spec.serve(model_dir, root, tmp_path, "tp2")
    timings["start_s"] = server.startup_s
    try:
        cold = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        e2e.assert_cached(cold)
        kv = wait_records(root, "kv", keys[:pages], kv_ranks)
        # extra_buffer stores the state of the prefill's last checkpoint only (at 128 of 163
        # tokens), under the key of the last page it covers
        mamba_keys = [keys[pages - 1]] if spec.hybrid else []
        if spec.hybrid:
            mamba = wait_records(root, "mamba", mamba_keys, [0, 1])

        # the layout: per-rank KV namespaces, or one shared MLA namespace written by rank 0
        assert sorted(kv, key=str) == sorted(kv_ranks, key=str), kv
        descriptions = {rank_of(d): d for _, d in namespaces(root) if d["pool"] == "kv"}
        for description in descriptions.values():
            assert description["geometry"]["parallel"]["tp_size"] == 2
            assert description["geometry"]["parallel"]["is_mla_model"] is spec.mla
        if spec.hybrid:
            assert sorted(mamba) == [0, 1]
            assert {d["pool"] for _, d in namespaces(root)} == {"kv", "mamba"}
        else:
            assert {d["pool"] for _, d in namespaces(root)} == {"kv"}

        def wrote(counters) -> bool:
            if sorted(counters) != [0, 1]:
                return False
            if spec.mla:  # rank 0 writes the shared KV, rank 1 never does
                return counters[0].get("puts", 0) > 0 and counters[1].get("puts", 0) == 0
            return all(counters[rank].get("puts", 0) > 0 for rank in (0, 1))

        e2e.wait_settled(lambda: writers(server, root), wrote, what="the ranks' counters")

        e2e.flush_cache(server)
        warm = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        e2e.assert_cached(warm, storage=restored_tokens)
        e2e.assert_same_output(warm, cold)
        e2e.wait_settled(  # both ranks read (for MLA: the same records)
            lambda: writers(server, root),
            lambda counters: all(counters.get(r, {}).get("hits", 0) >= pages for r in (0, 1)),
            what="hits on both ranks",
        )

        # A damaged KV record on one rank (for MLA: the one both read). Rank 0 keeps every
        # page, rank 1 fails at page `bad`: SGLang takes the minimum, both ranks restore `bad`
        # pages and recompute the rest, and the output is the cold run's.
        bad = pages // 2
        one = None if spec.mla else 1
        intact = {key: digest(kv[0] / f"{key}.rec") for key in keys[:pages]} if 0 in kv else {}
        flip_byte(kv[one] / f"{keys[bad]}.rec", mask=0x5A)
        e2e.flush_cache(server)
        damaged = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        expected = bad * spec.page_size
        if spec.hybrid:  # no state stored below the damage: nothing restorable
            expected = 0
        e2e.assert_cached(damaged, storage=expected)
        e2e.assert_same_output(damaged, cold)
        assert "failed V13" in e2e.server_log(server)
        assert {key: digest(kv[0] / f"{key}.rec") for key in intact} == intact
        wait_records(root, "kv", keys[:pages], kv_ranks)  # the recomputed pages written back

        # A missing KV record on one rank.
        gone = max(1, pages // 3)
        os.unlink(kv[one] / f"{keys[gone]}.rec")
        e2e.flush_cache(server)
        missing = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        expected = gone * spec.page_size
        if spec.hybrid:
            expected = 0
        e2e.assert_cached(missing, storage=expected)
        e2e.assert_same_output(missing, cold)
        wait_records(root, "kv", keys[:pages], kv_ranks)

        if spec.hybrid:  # a damaged recurrent state on rank 1 only, rank 0's intact
            flip_byte(mamba[1] / f"{mamba_keys[-1]}.rec", mask=0x5A)
            e2e.flush_cache(server)
            state = e2e.generate(server, prompt, MAX_NEW_TOKENS)
            e2e.assert_cached(state)  # the KV pages alone restore nothing
            e2e.assert_same_output(state, cold)
            wait_records(root, "mamba", mamba_keys, [0, 1])
        e2e.assert_storage_healthy(server)

        # One rank's namespace unwritable (for MLA: the shared one): a new prompt is stored by
        # the other rank only, and the next request misses on every rank, in time.
        other = spec.other_prompt
        other_keys = page_keys(other, spec.page_size)[: spec.hit_pages(other)]
        with immutable(kv[one]) as frozen:
            if not frozen:
                warnings.warn(
                    "chattr +i not possible here: unwritable-rank step skipped", stacklevel=1
                )
            else:
                first = e2e.generate(server, other, MAX_NEW_TOKENS)
                if not spec.mla:
                    wait_records(root, "kv", other_keys, [0])
                else:
                    time.sleep(3)  # what rank 0 would have written, it could not
                assert present(kv[one], other_keys) == 0
                e2e.flush_cache(server)
                again = e2e.generate(server, other, MAX_NEW_TOKENS, timeout_s=60)
                e2e.assert_cached(again)
                e2e.assert_same_output(again, first)
        assert server.alive()
    finally:
        server.stop()
    timings["first_server_s"] = time.monotonic() - started

    # A restart: both ranks reopen the store and restore the prompt from disk.
    server = spec.serve(model_dir, root, tmp_path, "restart")
    try:
        # What `galahad ready` says from the store alone (every rank's namespace, or the
        # shared MLA one) is what the server then restores (no probe: its prefix would stay
        # in the device cache and the request below reuse it from there).
        (readiness,) = hicache_galahad.ready(server.url, [prompt], root=str(root), probe=False)
        assert readiness.restorable_tokens == restored_tokens, readiness
        restored = e2e.generate(server, prompt, MAX_NEW_TOKENS)
        e2e.assert_cached(restored, storage=restored_tokens)
        e2e.assert_same_output(restored, cold)
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()
    timings["total_s"] = time.monotonic() - started
    print(f"TIMINGS {spec.arch} {json.dumps(timings)}")
    return timings


def test_tp2_llama_per_rank_namespaces(tmp_path):
    run_scenario(LLAMA, tmp_path)


def test_tp2_mla_one_shared_namespace_written_by_rank_0(tmp_path):
    run_scenario(MLA, tmp_path)


def test_tp2_hybrid_per_rank_kv_and_mamba(tmp_path):
    run_scenario(HYBRID, tmp_path)


# ------------------------------------------------------------------------------------------------
# Data parallelism: two servers (replicas of one model, TP=1) on one root, both running, with a
# byte budget small enough that their writes evict each other's records. Each restores what the
# other wrote, every output is the cold run's, the budget holds, and at the end `galahad verify`
# finds the store clean and its ledger equal to the bytes on disk.
# ------------------------------------------------------------------------------------------------

DP_PAGE_SIZE = 4
DP_PROMPTS = [[random.Random(seed).randrange(10, 500) for _ in range(43)] for seed in range(4)]
DP_PAGES = (43 - 1) // DP_PAGE_SIZE  # 10 pages of each prompt restorable
# A tiny-Llama KV record at TP=1: 1,024 bytes of page (2 layers x K,V x 4 tokens x 2 heads x 16
# x fp16) plus the record's header and tag, under 1,300 bytes. Room for about 13 records: one
# prompt's 10-11, never two prompts'.
DP_BUDGET = 16 * 1024


def dp_store_bytes(root) -> int:
    files = e2e.wait_settled(
        lambda: frozenset(budgeted_files(root).items()), quiet_s=0.5, poll_s=0.3, timeout_s=60
    )
    return sum(size for _, size in files)


def dp_keys_stored(root, prompt) -> int:
    stored = {path.stem for path in pool_records(root, "kv")}
    count = 0
    for key in page_keys(prompt, DP_PAGE_SIZE)[:DP_PAGES]:
        if key not in stored:
            break
        count += 1
    return count


def dp_wait_stored(root, prompt):
    e2e.wait_settled(
        lambda: dp_keys_stored(root, prompt),
        lambda count: count == DP_PAGES,
        timeout_s=60,
        what="the prompt's pages in the store",
    )


def galahad_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "hicache_galahad", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_two_servers_one_root_evicting_each_other(tiny_model, tmp_path):
    root = tmp_path / "store"
    args = [*e2e.galahad_args(root, page_size=DP_PAGE_SIZE, max_bytes=DP_BUDGET), "--sleep-on-idle"]
    first = e2e.start_server(tiny_model, args, log_path=tmp_path / "first.log")
    second = None
    try:
        second = e2e.start_server(tiny_model, args, log_path=tmp_path / "second.log")
        # the first replica computes every prompt; its writes evict its own older records
        cold = []
        for prompt in DP_PROMPTS:
            cold.append(e2e.generate(first, prompt, MAX_NEW_TOKENS))
            e2e.assert_cached(cold[-1])
            dp_wait_stored(root, prompt)
            assert dp_store_bytes(root) <= DP_BUDGET
        assert dp_keys_stored(root, DP_PROMPTS[0]) < DP_PAGES  # evicted by the later prompts

        # the second replica restores the first one's most recent prompt
        restored = e2e.generate(second, DP_PROMPTS[-1], MAX_NEW_TOKENS)
        e2e.assert_cached(restored, storage=DP_PAGES * DP_PAGE_SIZE)
        e2e.assert_same_output(restored, cold[-1])

        # the evicted prompt: recomputed by the second replica (same output), stored again,
        # evicting the first replica's records; the first replica then restores it
        again = e2e.generate(second, DP_PROMPTS[0], MAX_NEW_TOKENS)
        e2e.assert_same_output(again, cold[0])
        dp_wait_stored(root, DP_PROMPTS[0])
        assert dp_store_bytes(root) <= DP_BUDGET
        e2e.flush_cache(first)
        back = e2e.generate(first, DP_PROMPTS[0], MAX_NEW_TOKENS)
        e2e.assert_cached(back, storage=DP_PAGES * DP_PAGE_SIZE)
        e2e.assert_same_output(back, cold[0])
        for server in (first, second):
            e2e.assert_storage_healthy(server)
    finally:
        if second is not None:
            second.stop()
        first.stop()
    assert dp_store_bytes(root) <= DP_BUDGET

    report = galahad_cli("verify", "--root", root, "--json")
    assert report.returncode == 0, report.stdout + report.stderr
    verified = json.loads(report.stdout)
    assert verified["clean"] and not verified["damaged"], verified
    assert verified["ledger_bytes"] == verified["actual_bytes"], verified
    stats = json.loads(galahad_cli("stats", "--root", root, "--json").stdout)
    assert stats["lifetime_counters"].get("evictions", 0) > 0, stats["lifetime_counters"]
