"""bench/bench_cache.py (issue 30): its simulators against cases worked out by hand, Belady
never below LRU, and the whole benchmark end to end in its --quick mode."""

from __future__ import annotations

import functools
import json
import random

import pytest

from bench.cache_sim import (
    Belady,
    ExactLru,
    LeavesFirstLru,
    Request,
    Unbounded,
    replay,
    request_of,
)
from bench.cache_traces import HELD_OUT_SEEDS, TRACES, TUNING_SEEDS

# Three documents of 3, 2 and 2 pages; each prompt asks every page of its document (a question
# follows it), except A_EXACT, a prompt of exactly 3 pages: SGLang asks only 2 of them.
A = Request(("a1", "a2", "a3"), 3, 53)
A_EXACT = Request(("a1", "a2", "a3"), 2, 48)
B = Request(("b1", "b2"), 2, 37)
C = Request(("c1", "c2"), 2, 37)
HAND_TRACE = [A, B, B, A, C, A_EXACT, B, A, C, A]


def test_exact_lru_by_hand():
    """Five pages; held pages listed oldest first after each request:
    1 A   0  [a1 a2 a3]
    2 B   0  [a1 a2 a3 b1 b2]
    3 B   2  [a1 a2 a3 b1 b2]           (b1, b2 touched)
    4 A   3  [b1 b2 a1 a2 a3]           (the run touched head first)
    5 C   0  [a1 a2 a3 c1 c2]           (c1 evicts b1, c2 evicts b2)
    6 A'  2  [c1 c2 a1 a2 a3]           (asks a1 a2; writing a3, already held, touches it)
    7 B   0  [a1 a2 a3 b1 b2]
    8 A   3  [b1 b2 a1 a2 a3]
    9 C   0  [a1 a2 a3 c1 c2]
    10 A  3
    """
    lru = ExactLru(5)
    assert replay(lru, HAND_TRACE) == [0, 0, 2, 3, 0, 2, 0, 3, 0, 3]
    assert list(lru._pages) == ["c1", "c2", "a1", "a2", "a3"]


def test_exact_lru_loop_longer_than_the_budget_restores_nothing():
    """A and B (5 pages) in turn through 4 pages: each write evicts the head the next request
    needs, so LRU never restores a page."""
    assert replay(ExactLru(4), [A, B] * 5) == [0] * 10


def test_belady_by_hand():
    """Five pages; next use (request number) of each held page, ties to the deeper page:
    1 A   0  write a1 a2 a3 (next use 4)
    2 B   0  write b1 b2 (3): full
    3 B   2  b1 b2 next 7
    4 A   3  a1 a2 next 6 (A' asks them), a3 next 8
    5 C   0  c1 c2 next 9: farther than every held page (a3's 8 is the farthest): not kept
    6 A'  2  a1 a2 next 8
    7 B   2  b1 b2 never again
    8 A   3
    9 C   0  c1 c2 never asked again: not kept
    10 A  3
    """
    assert replay(Belady(5, HAND_TRACE), HAND_TRACE) == [0, 0, 2, 3, 0, 2, 2, 3, 0, 3]
    assert replay(Unbounded(), HAND_TRACE) == [0, 0, 2, 3, 0, 2, 2, 3, 2, 3]


def test_belady_keeps_the_head_of_a_loop():
    """The loop that defeats LRU: Belady keeps what the next request can use."""
    restored = replay(Belady(4, [A, B] * 5), [A, B] * 5)
    assert sum(restored) > 0
    assert restored[:4] == [0, 0, 3, 1]  # A kept whole; of B, the head only (b2 is not kept)


def test_belady_never_below_lru_never_above_unbounded():
    """On random prompts sharing prefixes (chained keys), at several budgets: Belady's
    restored pages total at least LRU's and at most a store that never evicts."""
    rng = random.Random(0)
    for case in range(60):
        page_tokens = 4
        stems = [[rng.randrange(1, 9) for _ in range(rng.randint(4, 40))] for _ in range(6)]
        prompts = []
        for _ in range(40):
            stem = rng.choice(stems)
            prompts.append(stem[: rng.randint(1, len(stem))] + [rng.randrange(1, 9)])
        requests = [request_of(prompt, page_tokens) for prompt in prompts]
        budget = rng.randint(1, 30)
        lru = sum(replay(ExactLru(budget), requests))
        belady = sum(replay(Belady(budget, requests), requests))
        unbounded = sum(replay(Unbounded(), requests))
        assert lru <= belady <= unbounded, (case, budget, lru, belady, unbounded)


def test_leaves_first_lru_holds_only_leading_runs():
    """On random chained prompts at budgets that hold any one prompt: after every request,
    each page the leaves-first LRU holds has its predecessor held (what it holds is
    restorable), and Belady still restores at least as much."""
    rng = random.Random(1)
    for case in range(40):
        stems = [[rng.randrange(1, 9) for _ in range(rng.randint(4, 40))] for _ in range(6)]
        prompts = [
            stem[: rng.randint(1, len(stem))] + [rng.randrange(1, 9)]
            for stem in (rng.choice(stems) for _ in range(40))
        ]
        requests = [request_of(prompt, 4) for prompt in prompts]
        budget = rng.randint(max(len(request.keys) for request in requests), 30)
        policy = LeavesFirstLru(budget)
        for index, request in enumerate(requests):
            policy.write(index, request, policy.restore(index, request))
            for other in requests:
                held = [key in policy for key in other.keys]
                assert held == sorted(held, reverse=True), (case, index)
        leaves_first = sum(replay(LeavesFirstLru(budget), requests))
        assert leaves_first <= sum(replay(Belady(budget, requests), requests)), case


def most_restorable(requests, capacity_pages: int) -> int:
    """By exhaustive search: the most pages any policy restores from `requests` with
    `capacity_pages`, deciding at every write whether to keep the page and what to evict."""

    @functools.cache
    def best(index: int, held: frozenset) -> int:
        if index == len(requests):
            return 0
        request = requests[index]
        run = 0
        while run < request.query_pages and request.keys[run] in held:
            run += 1
        outcomes = {held}
        for key in request.keys[run:]:
            grown = set()
            for state in outcomes:
                grown.add(state)  # not kept
                if key in state:
                    continue
                if len(state) < capacity_pages:
                    grown.add(state | {key})
                else:
                    grown.update((state - {victim}) | {key} for victim in state)
            outcomes = grown
        return run + max(best(index + 1, state) for state in outcomes)

    return best(0, frozenset())


def test_belady_is_the_most_any_policy_restores():
    """Belady against an exhaustive search over every keep-and-evict decision, on small random
    traces of chained prompts: it restores exactly the most that can be restored."""
    rng = random.Random(1)
    for case in range(25):
        stems = [[rng.randrange(1, 4) for _ in range(rng.randint(2, 8))] for _ in range(3)]
        prompts = []
        for _ in range(rng.randint(4, 7)):
            stem = rng.choice(stems)
            prompts.append(stem[: rng.randint(1, len(stem))] + [rng.randrange(1, 4)])
        requests = [request_of(prompt, 2) for prompt in prompts]
        capacity = rng.randint(1, 3)
        belady = sum(replay(Belady(capacity, requests), requests))
        assert belady == most_restorable(requests, capacity), (case, capacity, prompts)


def test_exact_lru_is_hicache_files_lru_request_by_request(tmp_path, monkeypatch):
    """SGLang's HiCacheFile evicting to exactly its cap (eviction_ratio 1.0) is an exact
    page-level LRU: driven through the benchmark's client (the controller's calls) on a trace,
    it restores what the simulator restores, request by request. This checks the simulator and
    the client against SGLang's own code."""
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE", raising=False)
    from bench import bench_cache, cache_clients

    budget_pages = 32
    trace = TRACES["zipf_chat"](TUNING_SEEDS[0], budget_pages, 16)
    requests = [request_of(prompt, 16) for prompt in trace.prompts]
    host = cache_clients.make_host_pool()
    backend = cache_clients.open_hicache_file(
        tmp_path / "file",
        host,
        max_size_bytes=budget_pages * cache_clients.page_bytes_of(host),
        eviction_ratio=1.0,
    )
    client = cache_clients.Client(backend, host, zero_copy=False)
    real = bench_cache.replay_client(client, requests)
    simulated = replay(ExactLru(budget_pages), requests)
    assert sum(simulated) > 0
    assert real == simulated


def test_request_of_asks_a_strict_prefix():
    assert request_of(list(range(32)), 16).query_pages == 1  # two full pages, one asked
    assert request_of(list(range(33)), 16).query_pages == 2
    assert len(request_of(list(range(33)), 16).keys) == 2
    assert request_of(list(range(15)), 16) == Request((), 0, 15)


def test_store_options_are_json_or_plain_words():
    import argparse

    from bench.bench_cache import store_option

    assert store_option("durability=none") == ("durability", "none")
    assert store_option('durability="fsync"') == ("durability", "fsync")
    assert store_option("io_threads=4") == ("io_threads", 4)
    with pytest.raises(argparse.ArgumentTypeError):
        store_option("durability")


def test_traces_are_named_by_their_seed():
    assert not set(TUNING_SEEDS) & set(HELD_OUT_SEEDS)
    for name, make in TRACES.items():
        assert make(1, 32, 16) == make(1, 32, 16), name
        assert make(1, 32, 16).prompts != make(2, 32, 16).prompts, name


def test_bench_cache_quick_end_to_end(tmp_path, capsys):
    """--quick runs every part through the real stores and prints every table; the figures are
    consistent with each other (too small to judge a policy)."""
    from bench import bench_cache

    out = tmp_path / "figures.json"
    bench_cache.main(["--quick", "--json", str(out), "--work", str(tmp_path)])
    printed = capsys.readouterr().out
    for title in ("## Leading runs", "## Traces", "## Costs", "## Goals", "commit"):
        assert title in printed
    figures = json.loads(out.read_text())
    assert figures["record_bytes"] > 512  # the page and the record's header

    rows = figures["leading_runs"]["rows"]
    assert [row["ranks"] for row in rows] == [1, 4]
    for row in rows:
        for store, figure in row["figures"].items():
            assert 0 <= figure["restorable_pages"] <= 384, store  # 24 x 16 and 48 x 8 pages
            assert figure["whole_documents"] + figure["partial_documents"] <= 48
    assert rows[0]["figures"]["exact LRU (sim)"]["ratio"] == pytest.approx(1.0)

    traces = figures["traces"]["rows"]
    assert {row["trace"] for row in traces} == set(TRACES)
    assert {row["seed"] for row in traces} == {TUNING_SEEDS[0], HELD_OUT_SEEDS[0]}
    for row in traces:
        restored = row["restored_pages_per_request"]
        ceiling = restored["unbounded (sim)"]
        assert sum(restored["Belady (sim)"]) >= sum(restored["exact LRU (sim)"]), row["trace"]
        for policy, pages in restored.items():
            assert len(pages) == row["requests"]
            # no store restores a page that was never written before the request
            assert all(got <= most for got, most in zip(pages, ceiling, strict=True)), policy
        assert 0 < row["served_share"]["unbounded (sim)"] < 1

    for writers, figure in figures["costs"].items():
        assert int(writers) in (1, 2)
        for condition in ("room", "full"):
            assert figure[condition]["pages"] == 32  # the writers share 32 new pages
        assert figure["ratio"] > 0
