"""The hybrid hit policy (checkpoint/hits.py) as a pure function: no torch, no SGLang."""

from __future__ import annotations

import itertools

from checkpoint.hits import ALL_PAGES, TRAILING_PAGES, PoolQuery, combine_pool_hits


def pool(policy, present, window=1, intact=None, name="mamba"):
    return PoolQuery(
        name,
        policy,
        window,
        lambda page: page in present,
        None if intact is None else (lambda length: length in intact),
    )


def test_kv_alone():
    hits = combine_pool_hits("kv", 3, [])
    assert hits == (3, {"kv": 3}, [1, 2, 3])
    assert combine_pool_hits("kv", 0, []) == (0, {}, [])


def test_all_pages_needs_every_page_of_the_prefix():
    hits = combine_pool_hits("kv", 5, [pool(ALL_PAGES, {0, 1, 2, 4})])
    assert hits.hit_pages == 3 and hits.pool_hit_pages == {"kv": 5, "mamba": 3}
    assert hits.restorable_prefix_pages == [1, 2, 3]


def test_trailing_pages_needs_only_the_state_where_the_prefix_ends():
    hits = combine_pool_hits("kv", 8, [pool(TRAILING_PAGES, {3, 7})])
    assert hits.restorable_prefix_pages == [4, 8] and hits.hit_pages == 8
    window_two = combine_pool_hits("kv", 8, [pool(TRAILING_PAGES, {2, 3, 7}, window=2)])
    assert window_two.restorable_prefix_pages == [4]


def test_a_damaged_deepest_state_snaps_back_to_an_intact_one():
    hits = combine_pool_hits("kv", 8, [pool(TRAILING_PAGES, {3, 7}, intact={4})])
    assert hits.hit_pages == 4 and hits.pool_hit_pages["mamba"] == 4
    none_intact = combine_pool_hits("kv", 8, [pool(TRAILING_PAGES, {3, 7}, intact=set())])
    assert none_intact.hit_pages == 0 and "mamba" not in none_intact.pool_hit_pages


def test_an_unknown_policy_is_never_a_hit():
    hits = combine_pool_hits("kv", 4, [pool("something_new", {0, 1, 2, 3})])
    assert hits.hit_pages == 0 and hits.restorable_prefix_pages == []


def test_every_pool_must_agree_and_lookups_stop_early():
    asked = []
    lazy = PoolQuery("swa", ALL_PAGES, 1, lambda page: asked.append(page) or True)
    hits = combine_pool_hits("kv", 6, [pool(TRAILING_PAGES, set()), lazy])
    assert hits.hit_pages == 0 and asked == []  # nothing left to restore: swa never asked


def test_matches_a_brute_force_over_small_cases():
    for kv_pages, window in itertools.product(range(5), (1, 2)):
        for mask in range(1 << kv_pages):
            present = {page for page in range(kv_pages) if mask >> page & 1}
            hits = combine_pool_hits("kv", kv_pages, [pool(TRAILING_PAGES, present, window)])
            expected = [
                p
                for p in range(1, kv_pages + 1)
                if all(q in present for q in range(max(0, p - window), p))
            ]
            assert hits.restorable_prefix_pages == expected
            assert hits.hit_pages == (expected[-1] if expected else 0)
