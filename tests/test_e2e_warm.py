"""`galahad warm` and `galahad ready` against real SGLang 0.5.23 servers on CPU with
GalahadStorage: warm (and pin) a document, SIGKILL the server's process group, restart it,
`ready` says how many tokens a request restores, and the request's
`cached_tokens_details.storage` agrees (and `ready`'s probe finds the restarted server
restoring), for the tiny Llama and the tiny hybrid Qwen3-Next (KV
pages plus recurrent-state checkpoints on the grid C = 64). One server start per phase (four in
all); the whole file ran in 207 s on 2 shared cores (Llama 112 s, hybrid 94 s)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest
from test_e2e_hybrid import HARNESS_ENV as HYBRID_ENV
from test_e2e_hybrid import INTERVAL, hybrid_args

import hicache_galahad
from bench import sglang_server as e2e
from hicache_galahad.store import RecordStore

pytestmark = pytest.mark.e2e

PAGE_SIZE = 4
TEXT = (
    "The pilgrims reached the chapel at dusk. The knight kept watch over the vessel all night, "
    "and in the morning the abbot wrote down what he had seen, word for word, in the book."
)
OTHER = "A document that was never warmed: nothing of it can be in the store."


def galahad(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hicache_galahad", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=e2e.REPO_ROOT,
    )


def sigkill(server: e2e.Server) -> None:
    """The whole process group at once, no grace (what a crash or an OOM kill does)."""
    os.killpg(server.pgid, signal.SIGKILL)
    server.stop(grace_s=1.0)  # reaps; nothing is left to terminate


def tokenize(server: e2e.Server, text: str) -> list[int]:
    import requests

    answer = requests.post(
        server.url + "/tokenize", json={"prompt": text, "add_special_tokens": True}, timeout=60
    )
    return list(answer.json()["tokens"])


def test_llama_warm_pin_sigkill_restart_ready(tiny_model, tmp_path):
    root = tmp_path / "store"
    doc, other = tmp_path / "chapel.txt", tmp_path / "other.txt"
    doc.write_text(TEXT)
    other.write_text(OTHER)
    args = e2e.galahad_args(root, page_size=PAGE_SIZE)

    server = e2e.start_server(tiny_model, args, log_path=tmp_path / "first.log")
    try:
        ids = tokenize(server, TEXT)
        num_pages = len(ids) // PAGE_SIZE
        warm = galahad(
            "warm", "--server", server.url, "--root", str(root), "--json", str(doc),
            "--pin",
        )  # fmt: skip
        assert warm.returncode == 0, warm.stdout + warm.stderr
        (report,) = json.loads(warm.stdout)["documents"]
        assert report["complete"] and report["tokens"] == len(ids)
        assert report["pages_stored"] == report["pages_expected"] == num_pages
        assert report["requests"] == 1 and report["attempts"] == 1
        pinned = report["pinned"]
        assert pinned["pinned_records"] + pinned["already_pinned_records"] == num_pages
        assert pinned["missing_keys"] == 0 and pinned["refused_keys"] == 0
        # --sections: each Blaise section's prompt prefix, every page of each stored
        handbook = tmp_path / "handbook.md"
        handbook.write_text("\n\n".join(f"# Part {n}\n\n{TEXT * 4}" for n in range(3)))
        sections = galahad("warm", "--server", server.url, "--sections", "--json", str(handbook))
        assert sections.returncode == 0, sections.stdout + sections.stderr
        parts = json.loads(sections.stdout)["documents"]
        assert len(parts) > 1 and all(part["complete"] for part in parts)
        assert all(part["tokens"] % PAGE_SIZE == 0 for part in parts)  # page-aligned prefixes
        # warming it again sends nothing: every page is already there
        again = galahad("warm", "--server", server.url, "--json", str(doc))
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["documents"][0]["requests"] == 0
        # a document never sent: ready says 0 and exits 1; warm --check too
        missing = galahad("ready", "--server", server.url, "--json", str(other))
        assert missing.returncode == 1, missing.stdout + missing.stderr
        (nothing,) = json.loads(missing.stdout)["documents"]
        assert nothing["restorable_tokens"] == 0 and not nothing["complete"]
        check = galahad("warm", "--check", "--server", server.url, str(other), str(doc))
        assert check.returncode == 1 and "not fully stored: " + str(other) in check.stdout
    finally:
        sigkill(server)

    server = e2e.start_server(tiny_model, args, log_path=tmp_path / "restart.log")
    try:
        ready = galahad("ready", "--server", server.url, "--root", str(root), "--json", str(doc))
        assert ready.returncode == 0, ready.stdout + ready.stderr
        (state,) = json.loads(ready.stdout)["documents"]
        expected = (len(ids) - 1) // PAGE_SIZE * PAGE_SIZE  # strict prefix, whole pages
        assert state["restorable_tokens"] == expected
        assert state["continuation_tokens"] == num_pages * PAGE_SIZE
        # the probe (issue 31): the first 12 tokens (SGLang loads back no fewer than 10) and
        # one more, restored from storage by the restarted server
        probe = json.loads(ready.stdout)["server_probe"]
        assert probe["verdict"] == "restored", probe
        assert probe["storage_tokens"] == probe["expected_tokens"] == 12
        with RecordStore(str(root), read_only=True) as store:  # the pins outlived the kill
            assert store.pinned_bytes_by_tenant()["default"] >= num_pages * 1024
        (api,) = hicache_galahad.ready(server.url, [doc], root=str(root))
        assert api.restorable_tokens == expected
        assert api.probe.verdict == "in_memory"  # the first probe left its prefix there
        e2e.flush_cache(server)  # so that the request below can only reuse storage
        result = e2e.generate(server, ids, 4)
        e2e.assert_cached(result, storage=expected)  # what ready said, from storage
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()


def prompt_of(length: int, seed: int) -> list[int]:
    rng = random.Random(7000 * seed + length)
    return [rng.randrange(10, 390) for _ in range(length)]


def test_hybrid_warm_restart_ready(hybrid_model, tmp_path):
    """C = 64, P = 16. 128 tokens (a multiple of C): warm sends 64 then 128, so states land at
    64 and 128 and the document alone restores 64 = C*floor(127/C); 163 tokens: one request,
    the state at 128. After a SIGKILL and a restart `ready` says so and the server agrees."""
    root = tmp_path / "store"
    documents = [("grid", prompt_of(2 * INTERVAL, 1)), ("off-grid", prompt_of(163, 2))]
    server = e2e.start_server(
        hybrid_model, hybrid_args(root), env=HYBRID_ENV, log_path=tmp_path / "first.log"
    )
    try:
        reports = hicache_galahad.warm(server.url, documents, root=str(root))
        assert [r.complete for r in reports] == [True, True], reports
        grid, off_grid = reports
        assert grid.requests == 2 and grid.checkpoints_expected == [64, 128]
        assert set(grid.checkpoints) >= {64, 128} and grid.restorable_tokens == 64
        assert off_grid.requests == 1 and 128 in off_grid.checkpoints
        assert off_grid.restorable_tokens == 128 and off_grid.continuation_tokens == 128
    finally:
        sigkill(server)

    server = e2e.start_server(
        hybrid_model, hybrid_args(root), env=HYBRID_ENV, log_path=tmp_path / "restart.log"
    )
    try:
        states = hicache_galahad.ready(server.url, documents, root=str(root))
        assert [s.restorable_tokens for s in states] == [64, 128]
        probe = states[0].probe  # the first checkpoint past prefetch_threshold, and a token
        assert (probe.verdict, probe.expected_tokens, probe.storage_tokens) == ("restored", 64, 64)
        e2e.flush_cache(server)  # the probe's prefix: from storage again
        for (_, ids), state in zip(documents, states, strict=True):
            result = e2e.generate(server, ids, 4)
            e2e.assert_cached(result, storage=state.restorable_tokens)
            e2e.flush_cache(server)
        e2e.assert_storage_healthy(server, "transfer failed")
    finally:
        server.stop()
