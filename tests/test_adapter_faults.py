"""Damaged records, the TRAILING_PAGES boundary under damage, SGLang's failure injector and
concurrent callers: GalahadStorage answers misses, never raises, and every hit is byte-exact."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageFailureInjector,
    PoolHitPolicy,
    PoolName,
)
from support.records import chain_keys, find_record, flip_byte
from support.sglang_pools import (
    assert_pages_equal,
    create_galahad,
    mamba_pool,
    mha_pool,
    normalized,
    page_bytes,
    slots_of,
    transfer,
)

TRAILING = PoolHitPolicy.TRAILING_PAGES


def tail(window: int = 1):
    return transfer(PoolName.MAMBA, [f"tail-{i}" for i in range(window)], policy=TRAILING)


def clear_pages(pool, pages) -> None:
    for page in pages:
        pool.set_from_flat_data_page(page * pool.page_size, pool.get_dummy_flat_data_page())


# ----------------------------------------------------------------------------- damaged records


@pytest.mark.parametrize("offset", [0, 9, 40, "middle", -1])
def test_a_damaged_record_is_a_miss_on_every_path(galahad, offset):
    """Each read path meets a damaged record first (keys 1, 3, 5, 7 and the state of key 1)."""
    kv, states = mha_pool("page_first_direct"), mamba_pool()
    backend = galahad(kv, {PoolName.MAMBA: states})
    root = backend.store.root
    keys = chain_keys(8, f"damage-{offset}")
    assert backend.batch_set_v1(keys, slots_of(range(8), 4)) == [True] * 8
    results = backend.batch_set_v2([transfer(PoolName.MAMBA, keys[:2], [0, 1])])
    assert results == {"mamba": [True, True]}
    damaged = [find_record(root, keys[i]) for i in (1, 3, 5, 7)]
    for path in [*damaged, find_record(root, keys[1], "mamba")]:
        flip_byte(path, path.stat().st_size // 2 if offset == "middle" else offset)
    clear_pages(kv, range(8, 16))

    assert backend.batch_get_v1(keys[0:2], slots_of([8, 9], 4)) == [True, False]
    assert_pages_equal(kv, [0], [8])
    assert backend.get(keys[3], kv.get_dummy_flat_data_page()) is None
    page = backend.get(keys[2], kv.get_dummy_flat_data_page())
    assert torch.equal(page.view(torch.uint8), page_bytes(kv, 8))
    got = backend.batch_get(keys[4:6], [kv.get_dummy_flat_data_page() for _ in range(2)])
    assert got[1] is None and torch.equal(got[0].view(torch.uint8), page_bytes(kv, 16))
    results = backend.batch_get_v2([transfer(PoolName.KV, keys[6:8], [14, 15], page_size=4)])
    assert results == {"kv": [True, False]}
    assert_pages_equal(kv, [6], [14])
    clear_pages(states, [8, 9])
    results = backend.batch_get_v2([transfer(PoolName.MAMBA, keys[:2], [8, 9])])
    assert results == {"mamba": [True, False]}
    assert_pages_equal(states, [0], [8])

    # each damaged record was quarantined by the read that met it: gone for every later call
    assert backend.store.stats().counter("quarantined") == 5
    assert not any(path.exists() for path in damaged)
    assert backend.batch_exists(keys) == 1 and not backend.exists(keys[1])
    assert backend.batch_get_v1(keys[1:2], slots_of([9], 4)) == [False]
    # the next write of the page heals it
    assert backend.batch_set_v1(keys[1:2], slots_of([1], 4)) == [True]
    assert backend.batch_get_v1(keys[1:2], slots_of([9], 4)) == [True]
    assert_pages_equal(kv, [1], [9])


def test_damage_of_other_kinds_is_a_miss(galahad):
    kv = mha_pool()
    backend = galahad(kv)
    keys = chain_keys(6, "kinds")
    assert backend.batch_set_v1(keys, slots_of(range(6), 4)) == [True] * 6
    root = backend.store.root
    paths = [find_record(root, key) for key in keys]
    os.truncate(paths[0], paths[0].stat().st_size - 1)  # truncated
    os.truncate(paths[1], 0)  # empty
    shutil.copy(paths[3], paths[2])  # another key's record under this key's name
    with open(paths[4], "ab") as record:  # trailing garbage
        record.write(b"\0" * 64)
    # a sound record of the same key, but from another namespace (another tenant's)
    other = galahad(mha_pool(seed=9), root=root, tenant="other")
    assert other.batch_set_v1(keys[5:], slots_of([5], 4)) == [True]
    shutil.copy(find_record(root, keys[5], tenant="other"), paths[5])

    clear_pages(kv, range(8, 14))
    flags = backend.batch_get_v1(keys, slots_of(range(8, 14), 4))
    assert flags == [False, False, False, True, False, False]
    assert_pages_equal(kv, [3], [11])
    assert backend.batch_exists(keys) == 0
    # the other tenant's own record was not touched
    assert other.batch_get_v1(keys[5:], slots_of([6], 4)) == [True]


def test_trailing_boundary_snaps_back_to_an_intact_state(galahad):
    """8 KV pages; states after 2, 4 and 6 pages. A damaged state at 6 drops the boundary to
    4 (and is quarantined); a missing KV page 3 (0-based) then cuts the KV run to 3 pages,
    whose deepest state is at 2."""
    kv, states = mha_pool(), mamba_pool()
    backend = galahad(kv, {PoolName.MAMBA: states})
    keys = chain_keys(8, "boundary")
    assert backend.batch_set_v1(keys, slots_of(range(8), 4)) == [True] * 8
    for index in (1, 3, 5):
        assert backend.batch_set_v2([transfer(PoolName.MAMBA, [keys[index]], [index])]) == {
            "mamba": [True]
        }
    root = backend.store.root
    assert normalized(backend.batch_exists_v2(keys, [tail()])) == (
        6,
        {"kv": 8, "mamba": 6},
        [2, 4, 6],
    )

    flip_byte(find_record(root, keys[5], "mamba"), -3)
    assert normalized(backend.batch_exists_v2(keys, [tail()])) == (4, {"kv": 8, "mamba": 4}, [2, 4])
    assert find_record(root, keys[5], "mamba") is None
    assert len(os.listdir(os.path.join(root, "quarantine"))) == 1
    assert backend.batch_get_v2([transfer(PoolName.MAMBA, [keys[5]], [12])]) == {"mamba": [False]}
    assert backend.batch_get_v2([transfer(PoolName.MAMBA, [keys[3]], [12])]) == {"mamba": [True]}
    assert torch.equal(page_bytes(states, 12), page_bytes(states, 3))

    find_record(root, keys[3]).unlink()  # KV page 3 evicted
    assert normalized(backend.batch_exists_v2(keys, [tail()])) == (2, {"kv": 3, "mamba": 2}, [2])
    assert backend.batch_exists(keys) == 3


def test_trailing_window_2_with_missing_and_damaged_states(galahad):
    kv, states = mha_pool(), mamba_pool()
    backend = galahad(kv, {PoolName.MAMBA: states})
    keys = chain_keys(8, "window-2")
    assert backend.batch_set_v1(keys, slots_of(range(8), 4)) == [True] * 8
    state_pages = [2, 3, 5, 6]  # windows complete at lengths 4 and 7
    results = backend.batch_set_v2(
        [transfer(PoolName.MAMBA, [keys[i] for i in state_pages], state_pages)]
    )
    assert results == {"mamba": [True] * 4}
    root = backend.store.root
    assert normalized(backend.batch_exists_v2(keys, [tail(2)])) == (
        7,
        {"kv": 8, "mamba": 7},
        [4, 7],
    )
    flip_byte(find_record(root, keys[5], "mamba"), -1)  # the first state of the deepest window
    assert normalized(backend.batch_exists_v2(keys, [tail(2)])) == (4, {"kv": 8, "mamba": 4}, [4])
    find_record(root, keys[2], "mamba").unlink()  # a state of the remaining window is missing
    assert normalized(backend.batch_exists_v2(keys, [tail(2)])) == (0, {"kv": 8}, [])
    assert normalized(backend.batch_exists_v2(keys, [tail(1)])) == (
        7,
        {"kv": 8, "mamba": 7},
        [4, 7],
    )


# ----------------------------------------------------------------------------- failure injector


def test_sglang_failure_injector(tmp_path, monkeypatch):
    """SGLang's own fault injection (a probability per call, plus random delays): the wrapped
    backend's answers are misses or exact hits, and nothing raises."""
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.5")
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY", "0.001")
    kv, states = mha_pool(), mamba_pool()
    backend = create_galahad(tmp_path / "store", kv, {PoolName.MAMBA: states})
    try:
        assert isinstance(backend, HiCacheStorageFailureInjector)
        keys = chain_keys(4, "injected")
        for _ in range(40):
            if backend.batch_set_v1(keys, slots_of(range(4), 4)) == [True] * 4:
                break
        else:
            pytest.fail("no write got through in 40 tries")
        while backend.batch_set_v2([transfer(PoolName.MAMBA, keys[3:], [3])]) != {"mamba": [True]}:
            pass
        outcomes = set()
        for _ in range(30):
            clear_pages(kv, range(8, 12))
            flags = backend.batch_get_v1(keys, slots_of(range(8, 12), 4))
            assert flags in ([True] * 4, [False] * 4)
            if flags[0]:
                assert_pages_equal(kv, range(4), range(8, 12))
            got = backend.batch_get(keys, [kv.get_dummy_flat_data_page() for _ in keys])
            assert len(got) == 4
            for index, page in enumerate(got):
                if page is not None:
                    assert torch.equal(page.view(torch.uint8), page_bytes(kv, index * 4))
            assert backend.batch_exists(keys) in (0, 4)
            result = backend.batch_exists_v2(keys, [tail()])
            assert normalized(result) in ((0, {}, []), (4, {"kv": 4, "mamba": 4}, [4]))
            flags = backend.batch_get_v2([transfer(PoolName.MAMBA, keys[3:], [9])])
            assert {str(name): value for name, value in flags.items()} in (
                {"mamba": [True]},
                {"mamba": [False]},
            )
            outcomes.add(bool(flags[PoolName.MAMBA][0]))
            if flags[PoolName.MAMBA][0]:
                assert torch.equal(page_bytes(states, 9), page_bytes(states, 3))
        assert outcomes == {True, False}
        assert backend.get_stats() is not None
    finally:
        backend.close()
        backend.close()


# ----------------------------------------------------------------------------- concurrency


def test_concurrent_exists_reads_and_writes_on_overlapping_keys(galahad):
    kv = mha_pool(tokens=64)  # 33 pages: sources 0..5, each thread reads into its own 6
    states = mamba_pool(slots=16)
    backend = galahad(kv, {PoolName.MAMBA: states})
    keys = chain_keys(6, "concurrent")
    threads_count, rounds = 4, 12
    barrier = threading.Barrier(threads_count)
    errors: list[BaseException] = []
    hits = [0] * threads_count

    def worker(number: int) -> None:
        try:
            mine = list(range(6 + 6 * number, 12 + 6 * number))
            state_slot = 6 + number
            barrier.wait()
            for round_ in range(rounds):
                chosen = [(number + round_ + offset) % 6 for offset in range(3)]
                write_keys = [keys[i] for i in chosen]
                assert backend.batch_set_v1(write_keys, slots_of(chosen, 4)) == [True] * 3
                assert all(
                    backend.batch_set_v2([transfer(PoolName.MAMBA, write_keys[:1], chosen[:1])])[
                        "mamba"
                    ]
                )
                present = backend.batch_exists(keys)
                assert 0 <= present <= 6
                clear_pages(kv, mine)
                flags = backend.batch_get_v1(keys, slots_of(mine, 4))
                assert len(flags) == 6
                for source, (target, ok) in enumerate(zip(mine, flags, strict=True)):
                    if ok:
                        hits[number] += 1
                        assert torch.equal(page_bytes(kv, target * 4), page_bytes(kv, source * 4))
                result = backend.batch_get_v2(
                    [transfer(PoolName.MAMBA, write_keys[:1], [state_slot])]
                )
                assert result == {"mamba": [True]}
                assert torch.equal(page_bytes(states, state_slot), page_bytes(states, chosen[0]))
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads_count)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=120)
    assert not errors, errors
    assert all(count > 0 for count in hits)
    assert backend.batch_exists(keys) == 6
    assert backend.store.stats().counter("corrupt") == 0
