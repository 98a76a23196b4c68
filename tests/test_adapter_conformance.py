"""GalahadStorage against SGLang's reference HiCacheFile: the same calls, the same answers.

Both backends come out of StorageBackendFactory ("file" and "dynamic"), get the same real host
pools registered and receive the same call sequences. The existence cases mirror SGLang's
upstream test_hicache_storage_unit.py (TestBatchExistsV2 and the batch_exists prefix counts),
for ALL_PAGES and TRAILING_PAGES (windows 1 and 2) pools.

Intentional differences are tested separately at the end of this file, each asserting what
HiCacheFile does and what GalahadStorage does instead:
  D1 damaged bytes: HiCacheFile serves them as a hit; Galahad reports a miss (and quarantines).
  D2 truncated file: HiCacheFile.get raises; SGLang 0.5.23's cache controller catches that in
     _page_transfer, logs it and counts the whole batch of pages as missed. Galahad reports a
     miss for that page only.
  D3 a damaged record is never healed by HiCacheFile (set skips existing files); Galahad
     quarantines it on read, so the next set writes a fresh record.
  D4 unknown hit policy (BLOCK_GROUPS): HiCacheFile.batch_exists_v2 raises ValueError; Galahad
     reports that pool as a miss (no restorable length, kv_hit_pages 0), never a guess.
  D5 TRAILING_PAGES with a damaged deepest state: HiCacheFile checks file existence only and
     reports the damaged boundary; Galahad verifies it, quarantines it and snaps back to the
     deepest intact state.
  D6 a pool that was never registered: HiCacheFile still looks for its files; Galahad answers
     only for registered pools (a miss).
  D7 a wrong-size target page: HiCacheFile reads a prefix of the record into a short target and
     calls it a hit; Galahad refuses it (a miss) and keeps the record.
"""

from __future__ import annotations

import os

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName
from support.records import chain_keys, find_record, flip_byte
from support.sglang_pools import (
    create_galahad,
    create_hicache_file,
    mamba_pool,
    mha_pool,
    normalized,
    page_bytes,
    slots_of,
    transfer,
)

ALL = PoolHitPolicy.ALL_PAGES
TRAILING = PoolHitPolicy.TRAILING_PAGES
DSA = PoolName.INDEXER  # an ALL_PAGES sidecar pool (the upstream tests call it "dsa")


class Pair:
    """HiCacheFile and GalahadStorage over the same host pools, driven in lockstep."""

    def __init__(self, tmp_path):
        self.kv = mha_pool("page_first", tokens=64)
        self.mamba = mamba_pool(slots=16)
        self.dsa = mamba_pool(slots=16, seed=3)
        pools = {PoolName.MAMBA: self.mamba, DSA: self.dsa}
        self.file_dir = tmp_path / "hicache-file"
        self.root = tmp_path / "galahad"
        self.file = create_hicache_file(self.file_dir, self.kv, pools)
        self.galahad = create_galahad(self.root, self.kv, pools)
        self.both = (self.file, self.galahad)

    def write_kv(self, keys, indices) -> None:
        """KV pages keys[i] for i in indices, from host page i, through the generic path."""
        chosen = [keys[i] for i in indices]
        values = [self.kv.get_data_page(i * self.kv.page_size) for i in indices]
        for backend in self.both:
            assert backend.batch_set(chosen, values) is True

    def write_states(self, pool, keys, indices) -> None:
        """One state per key keys[i] (the state after page i), from host slot i, through v2."""
        chosen = [keys[i] for i in indices]
        for backend in self.both:
            results = backend.batch_set_v2([transfer(pool, chosen, list(indices))])
            assert [flags for flags in results.values()] == [[True] * len(chosen)]

    def exists_v2(self, keys, transfers=None):
        answers = [normalized(b.batch_exists_v2(keys, transfers)) for b in self.both]
        assert answers[0] == answers[1], f"HiCacheFile {answers[0]} != Galahad {answers[1]}"
        return answers[0]

    def exists(self, keys) -> int:
        answers = [backend.batch_exists(keys) for backend in self.both]
        assert answers[0] == answers[1]
        return answers[0]

    def close(self) -> None:
        self.galahad.close()


@pytest.fixture
def pair(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    monkeypatch.delenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", raising=False)
    monkeypatch.delenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY", raising=False)
    pair = Pair(tmp_path)
    yield pair
    pair.close()


def trailing(window: int):
    return transfer(PoolName.MAMBA, [f"placeholder-{i}" for i in range(window)], policy=TRAILING)


def all_pages(keys):
    return transfer(DSA, keys, policy=ALL)


# ----------------------------------------------------------------------------- batch_exists


def test_batch_exists_prefix_counts(pair):
    keys = chain_keys(4, "prefix")
    assert pair.exists(keys) == 0
    pair.write_kv(keys, [0, 1, 3])  # a hole at 2
    assert pair.exists(keys) == 2
    assert pair.exists(keys[3:]) == 1
    assert pair.exists([]) == 0
    pair.write_kv(keys, [2])
    assert pair.exists(keys) == 4
    assert [b.exists(keys[0]) for b in pair.both] == [True, True]
    assert [b.exists("not-a-page") for b in pair.both] == [False, False]


# ----------------------------------------------------------------------------- batch_exists_v2


def test_kv_only(pair):
    keys = chain_keys(4, "kv-only")
    assert pair.exists_v2(keys) == (0, {}, [])
    pair.write_kv(keys, [0, 1, 3])
    assert pair.exists_v2(keys) == (2, {"kv": 2}, [1, 2])
    pair.write_kv(keys, [2])
    assert pair.exists_v2(keys) == (4, {"kv": 4}, [1, 2, 3, 4])


def test_all_pages_pool_shrinks_prefix_when_pool_page_missing(pair):
    keys = chain_keys(4, "dsa-shrink")
    pair.write_kv(keys, range(4))
    pair.write_states(DSA, keys, [0, 1])
    assert pair.exists_v2(keys, [all_pages(keys)]) == (2, {"kv": 4, "indexer": 2}, [1, 2])


def test_all_pages_pool_full_match(pair):
    keys = chain_keys(3, "dsa-full")
    pair.write_kv(keys, range(3))
    pair.write_states(DSA, keys, range(3))
    assert pair.exists_v2(keys, [all_pages(keys)]) == (3, {"kv": 3, "indexer": 3}, [1, 2, 3])


def test_all_pages_pool_does_not_expand_beyond_kv(pair):
    keys = chain_keys(4, "dsa-beyond")
    pair.write_kv(keys, [0, 1])
    pair.write_states(DSA, keys, range(4))
    assert pair.exists_v2(keys, [all_pages(keys)]) == (2, {"kv": 2, "indexer": 2}, [1, 2])


def test_trailing_window_2_needs_only_the_last_two_pages(pair):
    keys = chain_keys(4, "trailing-last")
    pair.write_kv(keys, range(4))
    pair.write_states(PoolName.MAMBA, keys, [2, 3])
    assert pair.exists_v2(keys, [trailing(2)]) == (4, {"kv": 4, "mamba": 4}, [4])


def test_trailing_partial_prefix_when_tail_absent(pair):
    keys = chain_keys(4, "trailing-tail")
    pair.write_kv(keys, range(4))
    pair.write_states(PoolName.MAMBA, keys, [0, 1])
    # the window is clipped at the first page: length 1 needs page 0 only
    assert pair.exists_v2(keys, [trailing(2)]) == (2, {"kv": 4, "mamba": 2}, [1, 2])
    assert pair.exists_v2(keys, [trailing(1)]) == (2, {"kv": 4, "mamba": 2}, [1, 2])


def test_trailing_zero_without_any_state(pair):
    keys = chain_keys(3, "trailing-none")
    pair.write_kv(keys, range(3))
    for window in (1, 2):
        assert pair.exists_v2(keys, [trailing(window)]) == (0, {"kv": 3}, [])


def test_trailing_window_1_at_every_checkpoint(pair):
    keys = chain_keys(8, "trailing-grid")
    pair.write_kv(keys, range(8))
    pair.write_states(PoolName.MAMBA, keys, [1, 3, 5])  # states after 2, 4 and 6 pages
    assert pair.exists_v2(keys, [trailing(1)]) == (6, {"kv": 8, "mamba": 6}, [2, 4, 6])
    assert pair.exists_v2(keys, [trailing(2)]) == (0, {"kv": 8}, [])
    assert pair.exists_v2(keys[:5], [trailing(1)]) == (4, {"kv": 5, "mamba": 4}, [2, 4])


def test_trailing_with_holes_in_kv(pair):
    keys = chain_keys(8, "trailing-holes")
    pair.write_kv(keys, [0, 1, 2, 4, 5, 6, 7])  # page 3 missing
    pair.write_states(PoolName.MAMBA, keys, [1, 3, 5, 7])
    assert pair.exists_v2(keys, [trailing(1)]) == (2, {"kv": 3, "mamba": 2}, [2])


def test_no_kv_hit_skips_pools(pair):
    keys = chain_keys(2, "no-kv")
    pair.write_states(PoolName.MAMBA, keys, [0])
    pair.write_states(DSA, keys, [0, 1])
    assert pair.exists_v2(keys, [transfer(PoolName.MAMBA, keys, policy=ALL)]) == (0, {}, [])
    assert pair.exists_v2(keys, [trailing(1), all_pages(keys)]) == (0, {}, [])


def test_empty_keys(pair):
    assert pair.exists_v2([]) == (0, {}, [])
    assert pair.exists_v2([], [trailing(1), all_pages([])]) == (0, {}, [])


def test_several_pools_intersect_their_restorable_lengths(pair):
    """Upstream's main-branch test expects min(boundaries) = 3 here; 0.5.23 intersects the
    pools' restorable sets instead ({1, 2, 3} and {4}: none), and so does Galahad."""
    keys = chain_keys(4, "minimum")
    pair.write_kv(keys, range(4))
    pair.write_states(DSA, keys, [0, 1, 2])
    pair.write_states(PoolName.MAMBA, keys, [2, 3])
    expected = (0, {"kv": 4, "indexer": 3, "mamba": 4}, [])
    assert pair.exists_v2(keys, [all_pages(keys), trailing(2)]) == expected
    pair.write_states(PoolName.MAMBA, keys, [1])  # now the window of length 3 is whole too
    expected = (3, {"kv": 4, "mamba": 4, "indexer": 3}, [3])
    assert pair.exists_v2(keys, [trailing(2), all_pages(keys)]) == expected


def test_unrelated_files_are_ignored(pair):
    keys = chain_keys(1, "unrelated")
    pair.write_kv(keys, [0])
    (pair.file_dir / "random_unrelated_file.bin").write_bytes(b"\0" * 16)
    for namespace_dir in (pair.root / "ns").iterdir():
        (namespace_dir / "random_unrelated_file.rec").write_bytes(b"\0" * 16)
        (namespace_dir / f"{chain_keys(1, 'planted')[0]}.tmp").write_bytes(b"\0" * 16)
    assert pair.exists_v2(keys) == (1, {"kv": 1}, [1])
    assert pair.exists_v2(chain_keys(1, "missing")) == (0, {}, [])


# ----------------------------------------------------------------------------- reads


def test_reads_agree_byte_for_byte(pair):
    keys = chain_keys(3, "reads")
    pair.write_kv(keys, [0, 1, 2])
    pair.write_states(PoolName.MAMBA, keys, [2])
    for backend, dst in zip(pair.both, ([5, 6, 7], [9, 10, 11]), strict=True):
        results = backend.batch_get_v2(
            [
                transfer(PoolName.KV, keys + ["absent"], dst + [12], page_size=4),
                transfer(PoolName.MAMBA, [keys[2], "absent"], [dst[0], dst[1]], policy=TRAILING),
            ]
        )
        flags = {str(name): value for name, value in results.items()}
        assert flags == {"kv": [True, True, True, False], "mamba": [True, False]}
    for file_page, galahad_page in zip([5, 6, 7], [9, 10, 11], strict=True):
        assert torch.equal(
            page_bytes(pair.kv, file_page * 4), page_bytes(pair.kv, galahad_page * 4)
        )
    assert torch.equal(page_bytes(pair.mamba, 5), page_bytes(pair.mamba, 9))
    assert torch.equal(page_bytes(pair.mamba, 9), page_bytes(pair.mamba, 2))
    # HiCacheFile answers [False] * n for indices that do not match the keys; so does Galahad
    for backend in pair.both:
        results = backend.batch_get_v2([transfer(PoolName.KV, keys, [5], page_size=4)])
        assert [flags for flags in results.values()] == [[False] * 3]


def test_generic_and_zero_copy_reads_of_each_others_pages(pair):
    """HiCacheFile stores get_data_page's raw bytes; a Galahad record holds the same bytes."""
    keys = chain_keys(2, "generic")
    pair.write_kv(keys, [0, 1])
    file_pages = pair.file.batch_get(keys, [pair.kv.get_dummy_flat_data_page() for _ in keys])
    assert pair.galahad.batch_get_v1(keys, slots_of([14, 15], 4)) == [True, True]
    for index, page in enumerate(file_pages):
        assert torch.equal(page.view(torch.uint8), page_bytes(pair.kv, (14 + index) * 4))
        file_bytes = next(pair.file_dir.glob(f"{keys[index]}_*.bin")).read_bytes()
        assert file_bytes == bytes(page_bytes(pair.kv, index * 4).numpy())


# ----------------------------------------------------------------------------- differences


def _damage(pair, key: str, *, pool: str = "kv") -> None:
    """Flips the last byte of the key's HiCacheFile file and of its Galahad record."""
    infix = "" if pool == "kv" else f".{pool}"
    flip_byte(next(pair.file_dir.glob(f"{key}{infix}_*.bin")))
    flip_byte(find_record(pair.root, key, pool))


def test_D1_damaged_bytes_served_by_hicache_file_but_a_miss_here(pair):
    keys = chain_keys(1, "D1")
    pair.write_kv(keys, [0])
    _damage(pair, keys[0])
    served = pair.file.get(keys[0], pair.kv.get_dummy_flat_data_page())
    assert served is not None  # HiCacheFile: a hit ...
    assert not torch.equal(served.view(torch.uint8), page_bytes(pair.kv, 0))  # ... wrong bytes
    assert pair.galahad.get(keys[0], pair.kv.get_dummy_flat_data_page()) is None
    assert pair.galahad.batch_get_v1(keys, slots_of([3], 4)) == [False]


def test_D2_truncated_file_raises_in_hicache_file_but_is_a_miss_here(pair):
    keys = chain_keys(1, "D2")
    pair.write_kv(keys, [0])
    for path in (next(pair.file_dir.glob(f"{keys[0]}_*.bin")), find_record(pair.root, keys[0])):
        os.truncate(path, path.stat().st_size - 100)
    with pytest.raises(OSError, match="Short read"):
        pair.file.get(keys[0], pair.kv.get_dummy_flat_data_page())
    assert pair.galahad.batch_get(keys, [pair.kv.get_dummy_flat_data_page()]) == [None]


def test_D3_damaged_record_is_healed_by_the_next_set_here_only(pair):
    keys = chain_keys(1, "D3")
    pair.write_kv(keys, [0])
    _damage(pair, keys[0])
    assert pair.galahad.batch_get_v1(keys, slots_of([3], 4)) == [False]  # quarantined
    assert [b.exists(keys[0]) for b in pair.both] == [True, False]
    pair.write_kv(keys, [0])  # SGLang writes the page again
    served = pair.file.get(keys[0], pair.kv.get_dummy_flat_data_page())
    assert not torch.equal(served.view(torch.uint8), page_bytes(pair.kv, 0))  # still damaged
    assert pair.galahad.batch_get_v1(keys, slots_of([3], 4)) == [True]
    assert torch.equal(page_bytes(pair.kv, 12), page_bytes(pair.kv, 0))


def test_D4_unknown_hit_policy(pair):
    keys = chain_keys(2, "D4")
    pair.write_kv(keys, [0, 1])
    pair.write_states(PoolName.MAMBA, keys, [0, 1])
    blocks = transfer(PoolName.MAMBA, keys, policy=PoolHitPolicy.BLOCK_GROUPS)
    with pytest.raises(ValueError, match="Unsupported pool hit policy"):
        pair.file.batch_exists_v2(keys, [blocks])
    assert normalized(pair.galahad.batch_exists_v2(keys, [blocks])) == (0, {"kv": 2}, [])


def test_D5_damaged_deepest_state(pair):
    keys = chain_keys(4, "D5")
    pair.write_kv(keys, range(4))
    pair.write_states(PoolName.MAMBA, keys, [1, 3])
    _damage(pair, keys[3], pool="mamba")
    assert normalized(pair.file.batch_exists_v2(keys, [trailing(1)])) == (
        4,
        {"kv": 4, "mamba": 4},
        [2, 4],
    )
    assert normalized(pair.galahad.batch_exists_v2(keys, [trailing(1)])) == (
        2,
        {"kv": 4, "mamba": 2},
        [2],
    )


def test_D6_unregistered_pool(pair, tmp_path):
    keys = chain_keys(2, "D6")
    pair.write_kv(keys, [0, 1])
    pair.write_states(PoolName.MAMBA, keys, [1])
    file_only_kv = create_hicache_file(pair.file_dir, pair.kv)
    galahad_only_kv = create_galahad(pair.root, pair.kv)
    try:
        assert normalized(file_only_kv.batch_exists_v2(keys, [trailing(1)])) == (
            2,
            {"kv": 2, "mamba": 2},
            [2],
        )
        assert normalized(galahad_only_kv.batch_exists_v2(keys, [trailing(1)])) == (
            0,
            {"kv": 2},
            [],
        )
    finally:
        galahad_only_kv.close()


def test_D7_wrong_size_target(pair):
    keys = chain_keys(1, "D7")
    pair.write_kv(keys, [0])
    short = torch.zeros(8, dtype=pair.kv.dtype)
    assert pair.file.get(keys[0], short) is short  # a hit holding the first 16 bytes
    assert pair.galahad.get(keys[0], short) is None
    assert pair.galahad.batch_get_v1(keys, slots_of([3], 4)) == [True]
