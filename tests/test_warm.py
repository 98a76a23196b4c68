"""The warming package without a model server: the page keys are SGLang's own (its storage hash
chain, with the request's extra key and cache salt), the namespaces are the server's ranks (and
only its own when another server shares the weights), and `ready`'s arithmetic (the leading run
over SGLang's strict prefix, the deepest checkpoint) agrees with the checkpoint rule's oracle.
The prefill plan is tests/test_checkpoint_prefill.py's; a hostile or broken server,
tests/test_warm_server.py's; the real server side (warm, SIGKILL, restart, ready against the
restored tokens SGLang reports) is tests/test_e2e_warm.py."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys

import pytest
from support.checkpoints import CheckpointGrid, restorable_boundary
from support.records import page_keys as oracle_page_keys

from hicache_galahad.errors import ServerError
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.warming.documents import Document, section_prefixes
from hicache_galahad.warming.keys import page_keys
from hicache_galahad.warming.namespaces import RankNamespaces, server_namespaces
from hicache_galahad.warming.profile import ServerProfile
from hicache_galahad.warming.readiness import readiness
from hicache_galahad.warming.targets import HttpTarget, as_target

MODEL = "/models/tiny"
FINGERPRINT = "fp-tiny"
DTYPES = {"kv_cache_dtype": "auto", "mamba_ssm_dtype": "None", "dtype": "auto"}


class _Key(list):
    """A token list carrying SGLang's RadixKey attributes (extra_key, cache_salt)."""


@pytest.fixture(scope="module")
def sglang_storage_hash():
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    def keys(token_ids, page_size, extra_key=None, cache_salt=None):
        key = _Key(token_ids)
        key.extra_key, key.cache_salt = extra_key, cache_salt
        return get_storage_hash_str(key, None, page_size=page_size)

    return keys


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize(
    "extra_key,cache_salt", [(None, None), ("lora-7", None), (None, "acme"), ("", ""), ("é", "x")]
)
def test_page_keys_are_sglangs_storage_chain(sglang_storage_hash, page_size, extra_key, cache_salt):
    rng = random.Random(page_size)
    tokens = [rng.randrange(0, 150_000) for _ in range(5 * page_size + page_size // 2)]
    ours = page_keys(tokens, page_size, extra_key=extra_key, cache_salt=cache_salt)
    theirs = sglang_storage_hash(tokens, page_size, extra_key, cache_salt)
    assert ours == theirs[: len(tokens) // page_size]  # SGLang also hashes a trailing part
    assert len(ours) == len(tokens) // page_size


def test_wide_token_pages_follow_sglang(sglang_storage_hash):
    tokens = [1, 2, 3, 1 << 33, 5, 6, 7, 8]
    assert page_keys(tokens, 4) == sglang_storage_hash(tokens, 4)
    with pytest.raises(ValueError):
        page_keys([1, -2, 3, 4], 4)


def test_default_namespace_keys_are_the_record_names_the_server_writes():
    """tests/support/records.page_keys is the chain test_e2e_hybrid holds the server's record
    file names to; in the default namespace ours are the same keys."""
    tokens = list(range(10, 173))
    assert page_keys(tokens, 16) == oracle_page_keys(tokens, 16)
    assert page_keys(tokens, 16, cache_salt="t")[0] != oracle_page_keys(tokens, 16)[0]


# ----------------------------------------------------------------------------- the store


def kv_namespace(
    tp_rank=0, tp_size=1, *, tenant="default", page_size=4, dtypes=DTYPES, model_name=MODEL, **more
):
    geometry = {
        **more,
        "page_size": page_size,
        "model_name": model_name,
        "parallel": {"tp_size": tp_size, "tp_rank": tp_rank},
        "serving_dtypes": dtypes,
    }
    return Namespace(tenant, FINGERPRINT, "kv", geometry)


def state_namespace(kv: Namespace, tp_rank=0) -> Namespace:
    geometry = {"page_size": 1, "kv_namespace": kv.dirname, "parallel": {"tp_rank": tp_rank}}
    return Namespace(kv.tenant, FINGERPRINT, "mamba", geometry)


def profile(page_size=4, tp_size=1, tenant="default", served_model_name=None) -> ServerProfile:
    extra = json.dumps({"root": "/r", "tenant": tenant, "model_fingerprint": FINGERPRINT})
    args = {
        "model_path": MODEL,
        "served_model_name": served_model_name,
        "page_size": page_size,
        "tp_size": tp_size,
        "hicache_storage_backend_extra_config": extra,
        **{name: (None if value == "None" else value) for name, value in DTYPES.items()},
    }
    return ServerProfile.from_args(args)


def test_server_profile_from_server_info():
    seen = profile(page_size=16, tp_size=2, tenant="acme")
    assert (seen.page_size, seen.tp_size, seen.tenant, seen.root) == (16, 2, "acme", "/r")
    assert seen.model_fingerprint == FINGERPRINT and seen.dtypes == DTYPES
    bare = ServerProfile.from_args({"model_path": MODEL})
    assert (bare.tenant, bare.root, bare.page_size) == ("default", None, 1)


def test_server_namespaces_are_its_ranks(store_factory):
    with store_factory() as store:
        ranks = [store.register_namespace(kv_namespace(rank, 2)) for rank in (0, 1)]
        states = [store.register_namespace(state_namespace(kv, i)) for i, kv in enumerate(ranks)]
        # not the server's: another tenant, page size, TP size, or model; another dtype
        store.register_namespace(kv_namespace(0, 2, tenant="bob"))
        store.register_namespace(kv_namespace(0, 2, page_size=16))
        store.register_namespace(kv_namespace(0, 1))
        store.register_namespace(Namespace("default", "other-model", "kv", ranks[0].geometry))
        store.register_namespace(kv_namespace(1, 2, dtypes={**DTYPES, "dtype": "float32"}))
        found = server_namespaces(store, profile(tp_size=2))
    assert [rank.kv for rank in found] == ranks
    assert [rank.states for rank in found] == [[states[0]], [states[1]]]
    with store_factory(read_only=True) as store:
        assert server_namespaces(store, profile(tp_size=2), tenant="bob")[0].kv.tenant == "bob"
        assert server_namespaces(store, profile(tp_size=4)) == []


def test_a_server_gets_its_own_namespaces_when_another_serves_the_same_weights(store_factory):
    """Issue 32 item 3: the same weights (one fingerprint, tenant, page and TP size) served
    under another name or mount path write other namespaces (SGLang puts the served model name
    in the pool's storage config, `model_name` of the geometry). Each server gets its own;
    before, both got the first in sort order, so `ready` answered for the other server and
    `warm --pin` pinned the other's pages."""
    with store_factory() as store:
        mine = store.register_namespace(kv_namespace())
        chat = store.register_namespace(kv_namespace(model_name="chat"))
        tagged = store.register_namespace(kv_namespace(model_name="qa-unified-token-major"))
        for served, expected in ((None, mine), (MODEL, mine), ("chat", chat), ("qa", tagged)):
            found = server_namespaces(store, profile(served_model_name=served))
            assert [rank.kv for rank in found] == [expected], served
        assert server_namespaces(store, profile(served_model_name="nobody")) == []


def test_two_namespaces_that_could_both_be_the_servers_are_refused(store_factory):
    """Same name, tenant, model, sizes and dtypes, another pool geometry (another host layout):
    which one the server writes cannot be told from the root, so ready and warm refuse in one
    line instead of answering for either."""
    with store_factory() as store:
        first = store.register_namespace(kv_namespace(layout="page_first"))
        second = store.register_namespace(kv_namespace(layout="page_first_direct"))
        with pytest.raises(ServerError, match="2 namespaces .* match this server") as error:
            server_namespaces(store, profile())
    assert first.dirname in str(error.value) and second.dirname in str(error.value)


def fill(store, namespace, keys, pages):
    for page in pages:
        assert store.put(namespace, keys[page], b"x" * 64)


def test_ready_is_the_leading_run_over_the_strict_prefix(store_factory):
    tokens = list(range(100, 144))  # 44 tokens, 11 pages of 4
    keys = page_keys(tokens, 4)
    with store_factory() as store:
        kv = store.register_namespace(kv_namespace())
        rank = [RankNamespaces("0", kv)]
        fill(store, kv, keys, range(11))
        whole = readiness(store, rank, keys, 44, 4)
        # a request of exactly the 44 tokens reuses at most 43: 10 whole pages
        assert (whole.restorable_tokens, whole.continuation_tokens) == (40, 44)
        assert (whole.pages_stored, whole.pages_expected, whole.hybrid) == (11, 11, False)
        assert readiness(store, rank, keys[:10], 43, 4).restorable_tokens == 40
        store.delete(kv, keys[5])  # a hole: only the run before it restores
        holed = readiness(store, rank, keys, 44, 4)
        assert (holed.restorable_tokens, holed.continuation_tokens) == (20, 20)
        assert holed.pages_stored == 10


def test_ready_needs_every_rank(store_factory):
    tokens = list(range(40))
    keys = page_keys(tokens, 4)
    with store_factory() as store:
        ranks = [
            RankNamespaces(str(r), store.register_namespace(kv_namespace(r, 2))) for r in (0, 1)
        ]
        fill(store, ranks[0].kv, keys, range(10))
        fill(store, ranks[1].kv, keys, range(6))
        seen = readiness(store, ranks, keys, 40, 4)
    assert (seen.restorable_tokens, seen.pages_stored) == (24, 6)


def test_ready_for_a_hybrid_is_the_deepest_checkpoint_below_n(store_factory):
    """P = 16, C = 64 (the measured matrix of test_e2e_hybrid: 128 tokens with a state only
    at 128 restore 0; with one at 64 too, 64; 163 tokens, 128)."""
    tokens = list(range(10, 173))
    keys = page_keys(tokens, 16)
    with store_factory() as store:
        kv = store.register_namespace(kv_namespace(page_size=16))
        state = store.register_namespace(state_namespace(kv))
        rank = [RankNamespaces("0", kv, [state])]
        fill(store, kv, keys, range(8))
        fill(store, state, keys, [7])
        at_128 = readiness(store, rank, keys[:8], 128, 16)
        assert (at_128.restorable_tokens, at_128.continuation_tokens) == (0, 128)
        assert at_128.checkpoints == [128] and at_128.hybrid
        fill(store, state, keys, [3])
        assert readiness(store, rank, keys[:8], 128, 16).restorable_tokens == 64
        assert readiness(store, rank, keys[:8], 163, 16).restorable_tokens == 128


def test_ready_agrees_with_the_checkpoint_oracle(store_factory):
    """Every N up to 200 and every leading run and set of grid states: `ready` gives the
    oracle's restorable boundary (tests/support/checkpoints.py)."""
    page, interval = 16, 64
    grid = CheckpointGrid(page_size_tokens=page, interval_tokens=interval)
    tokens = list(range(1000, 1200))
    keys = page_keys(tokens, page)
    grid_pages = [interval // page * k - 1 for k in (1, 2, 3)]
    with store_factory() as store:
        kv = store.register_namespace(kv_namespace(page_size=page))
        state = store.register_namespace(state_namespace(kv))
        rank = [RankNamespaces("0", kv, [state])]
        fill(store, kv, keys, range(len(keys)))
        for count in range(len(grid_pages) + 1):
            for with_state in itertools.combinations(grid_pages, count):
                for key in keys:
                    store.delete(state, key)
                fill(store, state, keys, with_state)
                for length in range(1, 200, 7):
                    usable = keys[: interval * (length // interval) // page]
                    seen = readiness(store, rank, usable, length, page)
                    expected = restorable_boundary(length, grid, len(usable), set(with_state))
                    assert seen.restorable_tokens == expected, (length, with_state)


# ----------------------------------------------------------------------------- the command


def test_no_server_is_one_line_and_exit_2(tmp_path):
    document = tmp_path / "doc.txt"
    document.write_text("hello")
    for command in ("warm", "ready"):
        result = subprocess.run(
            [sys.executable, "-m", "hicache_galahad", command, "--server", "http://127.0.0.1:9",
             "--root", str(tmp_path), str(document)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("galahad: no SGLang server at http://127.0.0.1:9")
        assert len(result.stderr.splitlines()) == 1


def test_as_target_refuses_other_things():
    assert isinstance(as_target("http://x:1/"), HttpTarget)
    assert as_target("http://x:1/").url == "http://x:1"
    with pytest.raises(TypeError):
        as_target(42)


# ----------------------------------------------------------------------------- sections


def test_section_prefixes_are_the_prefixes_blaise_prompt_composes(tiny_model, tmp_path):
    """`--sections` warms, per section, exactly the page-aligned prefix of the prompt that
    `Blaise.prompt` sends for a question about that section (same tokenizer, same segmentation,
    the document named by its path)."""
    from transformers import AutoTokenizer

    from hicache_galahad.blaise import Blaise

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    text = "\n\n".join(
        f"# Part {n}\n\n" + " ".join(f"word{n}x{i} about the chapel" for i in range(120))
        for n in range(4)
    )
    name = str(tmp_path / "handbook.md")
    prefixes = section_prefixes(Document(name, text), tokenizer, 16)
    with Blaise(str(tmp_path / "memory")) as memory:
        sections = memory.add(name, text)
        assert len(prefixes) == len(sections) > 1
        for number, prefix in enumerate(prefixes, 1):
            found = [
                s for s in memory.select(f"word{number - 1}x5 chapel", 8) if s.number == number
            ]
            prompt = memory.prompt("what?", tokenizer, page_size=16, selection=found[0])
            assert prefix.token_ids == prompt.input_ids[: prompt.prefix_len]
            assert len(prefix.token_ids) % 16 == 0 and prefix.name == f"{name}#{number}"


def test_an_engines_profile_comes_from_its_real_server_args(tiny_model):
    """`warm(engine, ...)` reads SGLang's own ServerArgs, whose vars() is empty in 0.5.23
    (a regression: the profile came out as page size 1 and no root, so no namespace matched).
    The rest of the Engine path was run by hand against a real in-process Engine (report)."""
    from types import SimpleNamespace

    from sglang.srt.server_args import ServerArgs

    extra = json.dumps({"root": "/srv/galahad", "tenant": "acme"})
    args = ServerArgs(
        model_path=str(tiny_model),
        page_size=4,
        device="cpu",
        hicache_storage_backend_extra_config=extra,
    )
    engine = SimpleNamespace(server_args=args, generate=None, tokenizer_manager=None)
    seen = as_target(engine).profile()
    assert (seen.page_size, seen.root, seen.tenant) == (4, "/srv/galahad", "acme")
    assert seen.model_path == str(tiny_model)
