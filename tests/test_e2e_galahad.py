"""A real SGLang 0.5.23 server on CPU with GalahadStorage as its L3: write-back, flush or
restart, prefetch from our store, identical output. Damage, tenants and eviction too."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

try:
    import e2e_support as e2e
except ImportError:  # pragma: no cover
    from tests import e2e_support as e2e

pytestmark = pytest.mark.e2e

PAGE_SIZE = 4
PROMPT = list(range(10, 53))  # 43 token ids
EXPECTED_STORAGE_HIT = (len(PROMPT) - 1) // PAGE_SIZE * PAGE_SIZE  # 40: strict prefix, whole pages
MAX_NEW_TOKENS = 4


@pytest.fixture(scope="module")
def tiny_model():
    return e2e.ensure_model("llama", "tiny")


def galahad_args(root: Path, layout="page_first_direct", *, interface_v1=True, **options):
    config = {
        "backend_name": "galahad",
        "module_path": "hicache_galahad",
        "class_name": "GalahadStorage",
        "root": str(root),
        **options,
    }
    if interface_v1:
        config["interface_v1"] = 1
    return [
        *e2e.TINY_SERVER_ARGS,
        *e2e.hicache_args(layout, backend="dynamic", extra_config=config, page_size=PAGE_SIZE),
    ]


def record_files(root: Path) -> list[Path]:
    return sorted(root.glob("ns/*/*.rec"))


def kv_record_files(root: Path) -> list[Path]:
    files = []
    for description in root.glob("ns/*/namespace.json"):
        if json.loads(description.read_text())["pool"] == "kv":
            files += sorted(description.parent.glob("*.rec"))
    return files


def store_bytes(root: Path) -> tuple[frozenset, int]:
    """Files under the store that count against max_bytes (records, temp files, quarantine),
    by inode: a record being published briefly has two names for one inode."""
    sizes = {}
    for path in [*root.glob("ns/*/*.rec"), *root.glob("ns/*/.tmp-*"), *root.glob("quarantine/*")]:
        try:
            info = path.stat()
        except FileNotFoundError:  # evicted while we looked
            continue
        sizes[info.st_ino] = info.st_size
    return frozenset(sizes.items()), sum(sizes.values())


def settled_store_bytes(root: Path) -> int:
    """The store's bytes once SGLang's background write-back has gone quiet (a scan racing a
    write and an eviction could see the new file and the evicted one together)."""
    previous, _ = store_bytes(root)
    for _ in range(100):
        time.sleep(0.3)
        current, total = store_bytes(root)
        if current == previous:
            return total
        previous = current
    raise TimeoutError("the store never went quiet")


def serve(model, root, tmp_path, name, **kwargs):
    return e2e.start_server(model, galahad_args(root, **kwargs), log_path=tmp_path / f"{name}.log")


def ask(server, root, expected_pages=EXPECTED_STORAGE_HIT // PAGE_SIZE):
    result = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
    e2e.wait_for(lambda: len(kv_record_files(root)) >= expected_pages, 60, "write-through")
    return result


def assert_same_output(reference, result):
    assert result.output_ids == reference.output_ids
    assert result.output_logprobs == reference.output_logprobs  # bit-identical


def assert_from_storage(result, tokens=EXPECTED_STORAGE_HIT):
    details = result.cache_details
    assert result.cached_tokens == tokens, result.meta_info
    assert details["storage"] == tokens and details["device"] == 0 and details["host"] == 0, details
    assert details["storage_backend"] == "GalahadStorage", details


def assert_storage_healthy(server):
    """No SGLang storage thread died (an exception there disables L3 for the process) and the
    backend caught no exception of its own."""
    log = Path(server.log_path).read_text(errors="replace")
    assert "Exception in thread" not in log, log[-4000:]
    assert "; reporting a miss" not in log, log[-4000:]


@pytest.mark.parametrize(
    "layout,interface_v1", [("page_first_direct", True), ("layer_first", False)]
)
def test_flush_then_restart_then_damage(tiny_model, tmp_path, layout, interface_v1):
    root = tmp_path / "store"
    server = serve(tiny_model, root, tmp_path, "first", layout=layout, interface_v1=interface_v1)
    try:
        cold = ask(server, root)
        assert cold.cached_tokens == 0
        e2e.flush_cache(server)
        warm = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        assert_from_storage(warm)
        assert_same_output(cold, warm)
        assert_storage_healthy(server)
    finally:
        server.stop()

    server = serve(tiny_model, root, tmp_path, "restart", layout=layout, interface_v1=interface_v1)
    try:
        restored = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        assert_from_storage(restored)
        assert_same_output(cold, restored)
    finally:
        server.stop()

    for path in record_files(root):  # flip one payload byte in every record
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x5A
        path.write_bytes(bytes(data))
    server = serve(tiny_model, root, tmp_path, "damaged", layout=layout, interface_v1=interface_v1)
    try:
        recomputed = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        assert recomputed.cached_tokens == 0, recomputed.meta_info
        assert_same_output(cold, recomputed)
        assert_storage_healthy(server)
        log = Path(server.log_path).read_text(errors="replace")
        assert "failed V13" in log  # the damage was seen and reported, not served
    finally:
        server.stop()


def test_tenants_never_share(tiny_model, tmp_path):
    root = tmp_path / "store"
    server = serve(tiny_model, root, tmp_path, "alice", tenant="alice")
    try:
        reference = ask(server, root)
    finally:
        server.stop()
    server = serve(tiny_model, root, tmp_path, "bob", tenant="bob")
    try:
        result = e2e.generate(server, PROMPT, MAX_NEW_TOKENS)
        assert result.cached_tokens == 0, result.meta_info
        assert_same_output(reference, result)
    finally:
        server.stop()


def test_eviction_keeps_answers_correct_within_budget(tiny_model, tmp_path):
    root = tmp_path / "store"
    probe = serve(tiny_model, root, tmp_path, "probe")
    try:
        ask(probe, root)
        page_bytes = max(path.stat().st_size for path in kv_record_files(root))
    finally:
        probe.stop()
    for path in record_files(root):
        path.unlink()
    budget = 12 * page_bytes  # room for 12 of the ~40 pages the prompts below produce
    server = serve(tiny_model, root, tmp_path, "budget", max_bytes=budget)
    try:
        prompts = [[(base * 7 + index) % 300 + 5 for index in range(43)] for base in range(4)]
        references = [e2e.generate(server, prompt, MAX_NEW_TOKENS) for prompt in prompts]
        e2e.wait_for(lambda: len(kv_record_files(root)) >= 10, 60, "write-through")
        e2e.flush_cache(server)
        for prompt, reference in zip(prompts, references, strict=True):
            again = e2e.generate(server, prompt, MAX_NEW_TOKENS)
            assert_same_output(reference, again)
            assert settled_store_bytes(root) <= budget
        server.stop()
        assert settled_store_bytes(root) <= budget
        assert_storage_healthy(server)
    finally:
        server.stop()


@pytest.mark.parametrize("form", ["json", "file"])
def test_engine_in_process(tiny_model, tmp_path, form):
    """sglang.Engine(...) in-process with the dynamic backend, the extra config given as a JSON
    string or as @config.json."""
    root = tmp_path / "store"
    config = json.dumps(
        {
            "backend_name": "galahad",
            "module_path": "hicache_galahad",
            "class_name": "GalahadStorage",
            "interface_v1": 1,
            "root": str(root),
            "prefetch_threshold": 4,
        }
    )
    if form == "file":
        (tmp_path / "galahad.json").write_text(config)
        config = "@" + str(tmp_path / "galahad.json")
    result = e2e.run_engine_roundtrip(
        tiny_model, "--layout", "page_first_direct", "--backend", "dynamic",
        "--extra-config", config, "--storage-dir", str(root), "--record-glob", "ns/*/*.rec",
        "--page-size", str(PAGE_SIZE), "--prompt-len", str(len(PROMPT)),
        "--max-new-tokens", str(MAX_NEW_TOKENS),
    )  # fmt: skip
    first, second = result["first"], result["second"]
    assert result["flush_success"], result
    assert first["cached_tokens"] == 0
    assert second["cached_tokens"] == EXPECTED_STORAGE_HIT, second
    details = second["cached_tokens_details"]
    assert (
        details["storage"] == EXPECTED_STORAGE_HIT
        and details["storage_backend"] == "GalahadStorage"
    )
    assert second["output_ids"] == first["output_ids"]
    assert second["output_logprobs"] == first["output_logprobs"]
