"""How put_many cuts a batch: at most STAGE_BATCH records and, unless one record alone is
larger, STAGE_BATCH_MAX_BYTES of them (a batch's encoded records are held together)."""

from __future__ import annotations

from hicache_galahad.store.writer import STAGE_BATCH, STAGE_BATCH_MAX_BYTES, _batches

KIB, MIB = 1024, 1024 * 1024


def test_small_records_go_in_batches_of_stage_batch():
    assert list(_batches([32 * KIB] * 70)) == [(0, 32), (32, 64), (64, 70)]
    assert STAGE_BATCH == 32


def test_large_records_are_cut_by_bytes():
    assert STAGE_BATCH_MAX_BYTES == 64 * MIB
    assert list(_batches([8 * MIB] * 20)) == [(0, 8), (8, 16), (16, 20)]


def test_a_record_larger_than_the_byte_cap_is_a_batch_of_its_own():
    assert list(_batches([100 * MIB, 1 * MIB, 100 * MIB])) == [(0, 1), (1, 2), (2, 3)]


def test_every_record_is_in_exactly_one_batch():
    sizes = [(index * 7919) % (20 * MIB) for index in range(200)]
    batches = list(_batches(sizes))
    assert batches[0][0] == 0 and batches[-1][1] == len(sizes)
    assert all(
        end == next_start
        for (_, end), (next_start, _) in zip(batches[:-1], batches[1:], strict=True)
    )
    for start, end in batches:
        assert 1 <= end - start <= STAGE_BATCH
        assert end - start == 1 or sum(sizes[start:end]) <= STAGE_BATCH_MAX_BYTES


def test_no_records_no_batches():
    assert list(_batches([])) == []
