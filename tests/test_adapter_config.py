"""GalahadStorage configuration through SGLang's factory: loud config errors at construction,
the model fingerprint, metrics, close(), encryption and zstd compression end to end."""

from __future__ import annotations

import json
import os

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.observability.metrics_collector import StorageMetrics
from support.records import chain_keys, find_record, write_key_file
from support.sglang_pools import (
    assert_pages_equal,
    create_galahad,
    galahad_extra,
    mamba_pool,
    mha_pool,
    page_bytes,
    pool_buffers,
    slots_of,
    storage_config,
    transfer,
)


def create(root, **options):
    return StorageBackendFactory.create_backend(
        "dynamic", storage_config(galahad_extra(root, **options)), None
    )


# ----------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"rooot": "/tmp/x"}, "rooot"),
        ({"compression": "lz4"}, "compression"),
        ({"compression": None}, "compression"),
        ({"zstd_level": 99}, "zstd_level"),
        ({"max_bytes": "12 parsecs"}, "max_bytes"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"min_free_bytes": "-5GB"}, "min_free_bytes"),
        ({"io_threads": "8"}, "io_threads"),
        ({"tenant": ""}, "tenant"),
    ],
)
def test_config_errors_name_the_key(tmp_path, options, named):
    with pytest.raises(ValueError, match=named):
        create(tmp_path / "store", **options)


@pytest.mark.parametrize(
    ("mode", "size", "problem"),
    [(0o640, 32, "group or others"), (0o604, 32, "group or others"), (0o600, 16, "32 random")],
)
def test_bad_encryption_key_files_are_refused(tmp_path, mode, size, problem):
    path = write_key_file(tmp_path / "key", os.urandom(size), mode)
    with pytest.raises(ValueError, match=rf"encryption_key_file(.|\n)*{problem}"):
        create(tmp_path / "store", encryption_key_file=path)
    with pytest.raises(ValueError, match="encryption_key_file"):
        create(tmp_path / "store", encryption_key_file=str(tmp_path / "missing"))


@pytest.mark.parametrize("model_name", ["org/not-a-local-dir", None])
def test_a_fingerprint_is_required_for_a_remote_model_name(tmp_path, model_name):
    config = storage_config(galahad_extra(tmp_path / "store", None), model_name=model_name)
    with pytest.raises(ValueError, match="model_fingerprint"):
        StorageBackendFactory.create_backend("dynamic", config, None)


def write_model(directory, weights: torch.Tensor) -> None:
    from safetensors.torch import save_file

    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "layers": 2}))
    save_file({"layer.weight": weights}, str(directory / "model.safetensors"))


def test_fingerprint_of_a_local_model_directory(galahad, tmp_path):
    model = tmp_path / "model"
    weights = torch.arange(64, dtype=torch.float32)
    write_model(model, weights)
    kv = mha_pool()
    keys = chain_keys(2, "fingerprint")
    first = galahad(kv, fingerprint=None, config={"model_name": str(model)})
    assert first.model_fingerprint.startswith("dir-sha256:")
    assert first.batch_set_v1(keys, slots_of([0, 1], 4)) == [True, True]

    same = galahad(kv, fingerprint=None, config={"model_name": str(model)})
    assert same.model_fingerprint == first.model_fingerprint
    assert same.batch_exists(keys) == 2

    # new weights of the same size, even with the old modification time: another model
    stat = (model / "model.safetensors").stat()
    changed = weights.clone()
    changed[17] = -1.0
    write_model(model, changed)
    os.utime(model / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (model / "model.safetensors").stat().st_size == stat.st_size
    retrained = galahad(kv, fingerprint=None, config={"model_name": str(model)})
    assert retrained.model_fingerprint != first.model_fingerprint
    assert retrained.batch_exists(keys) == 0

    # a configured fingerprint wins over the directory
    pinned = galahad(kv, fingerprint="pinned", config={"model_name": str(model)})
    assert pinned.model_fingerprint == "pinned"


def test_sglang_keys_in_the_extra_config_are_accepted(galahad):
    backend = galahad(
        mha_pool(),
        interface_v1=1,
        prefetch_threshold=4,
        hicache_storage_pass_prefix_keys=True,
    )
    assert backend.batch_set_v1(chain_keys(1, "ok"), slots_of([0], 4)) == [True]


# ----------------------------------------------------------------------------- metrics, close


def test_get_stats(galahad):
    kv = mha_pool()
    quiet = galahad(kv)
    keys = chain_keys(3, "stats")
    assert quiet.batch_set_v1(keys, slots_of([0, 1, 2], 4)) == [True] * 3
    stats = quiet.get_stats()
    assert stats is None or isinstance(stats, StorageMetrics)
    if stats is not None:
        assert stats.prefetch_pgs == [] and stats.backup_pgs == []

    counted = galahad(kv, config={"metrics": True})
    assert counted.batch_set_v1(chain_keys(2, "more"), slots_of([3, 4], 4)) == [True, True]
    assert counted.batch_get_v1(keys + ["absent"], slots_of([5, 6, 7, 8], 4)) == [True] * 3 + [
        False
    ]
    stats = counted.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert (stats.backup_pgs, stats.prefetch_pgs) == ([2], [3])
    assert all(value > 0 for value in stats.backup_bandwidth + stats.prefetch_bandwidth)
    assert counted.get_stats().prefetch_pgs == []  # each call reports what came since the last


def test_close_twice_and_calls_after_close(galahad, tmp_path):
    """Regression: after close() the store's descriptors are closed and their numbers get
    reused; a set() on the closed backend wrote the byte ledger into whatever file had taken
    the ledger's number. Calls after close are now misses that touch nothing."""
    kv = mha_pool()
    backend = galahad(kv, {PoolName.MAMBA: mamba_pool()})
    keys = chain_keys(2, "closed")
    assert backend.batch_set_v1(keys, slots_of([0, 1], 4)) == [True, True]
    backend.close()
    backend.close()
    bystanders = [open(tmp_path / f"bystander-{i}", "wb+") for i in range(6)]  # noqa: SIM115
    try:
        for bystander in bystanders:
            bystander.write(b"\0" * 16)
            bystander.flush()
        assert backend.set(chain_keys(1, "late")[0], kv.get_data_page(8)) is False
        assert backend.batch_set(keys, [kv.get_data_page(0)] * 2) is False
        assert backend.batch_set_v1(keys, slots_of([2, 3], 4)) == [False, False]
        assert backend.batch_get_v1(keys, slots_of([2, 3], 4)) == [False, False]
        assert backend.get(keys[0], kv.get_dummy_flat_data_page()) is None
        assert backend.batch_exists(keys) == 0 and backend.exists(keys[0]) is False
        assert backend.batch_get_v2([transfer(PoolName.MAMBA, keys, [0, 1])]) == {
            "mamba": [False, False]
        }
        assert backend.batch_exists_v2(keys).kv_hit_pages == 0
        assert backend.clear() is None and backend.get_stats() is None
        for bystander in bystanders:
            bystander.seek(0)
            assert bystander.read() == b"\0" * 16
    finally:
        for bystander in bystanders:
            bystander.close()
    reopened = galahad(kv)
    assert reopened.batch_exists(keys) == 2


# ----------------------------------------------------------------------------- encryption, zstd


def make_compressible(pool) -> None:
    for buffer in pool_buffers(pool):
        buffer.view(torch.uint8).bitwise_and_(0x03)


@pytest.mark.parametrize("mode", ["encrypted", "zstd", "encrypted+zstd"])
def test_encryption_and_compression_round_trip_on_every_path(galahad, tmp_path, mode):
    options = {}
    if "encrypted" in mode:
        options["encryption_key_file"] = write_key_file(tmp_path / "master.key")
    if "zstd" in mode:
        options |= {"compression": "zstd", "zstd_level": 5}
    kv, states = mha_pool("page_first_direct"), mamba_pool(conv_states=2, side_state=True)
    make_compressible(kv)
    make_compressible(states)
    backend = galahad(kv, {PoolName.MAMBA: states}, **options)
    keys = chain_keys(4, mode)
    assert backend.batch_set_v1(keys[:2], slots_of([0, 1], 4)) == [True, True]
    assert backend.batch_set(keys[2:], [kv.get_data_page(8), kv.get_data_page(12)]) is True
    mamba = transfer(PoolName.MAMBA, keys[3:], [3], policy=PoolHitPolicy.TRAILING_PAGES)
    assert backend.batch_set_v2([mamba]) == {"mamba": [True]}

    root = backend.store.root
    page = bytes(page_bytes(kv, 0).numpy())
    record = find_record(root, keys[0]).read_bytes()
    if "zstd" in mode:  # header and key echo included, smaller than the raw page
        assert len(record) < len(page)
    if "encrypted" in mode:
        assert page[64:96] not in record

    reopened = galahad(kv, {PoolName.MAMBA: states}, **options)
    assert reopened.batch_get_v1(keys, slots_of([10, 11, 12, 13], 4)) == [True] * 4
    assert_pages_equal(kv, [0, 1, 2, 3], [10, 11, 12, 13])
    got = reopened.batch_get(keys, [kv.get_dummy_flat_data_page() for _ in keys])
    assert torch.equal(got[1].view(torch.uint8), page_bytes(kv, 4))
    assert reopened.batch_get_v2([transfer(PoolName.MAMBA, keys[3:], [9])]) == {"mamba": [True]}
    assert torch.equal(page_bytes(states, 9), page_bytes(states, 3))
    result = reopened.batch_exists_v2(keys, [mamba])
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (4, [4])


def test_records_need_the_right_key(galahad, tmp_path):
    kv = mha_pool()
    keys = chain_keys(2, "keys")
    right = write_key_file(tmp_path / "right.key")
    encrypted = galahad(kv, encryption_key_file=right)
    assert encrypted.batch_set_v1(keys, slots_of([0, 1], 4)) == [True, True]
    plain = galahad(kv)
    assert plain.batch_get_v1(keys, slots_of([2, 3], 4)) == [False, False]
    other = galahad(kv, encryption_key_file=write_key_file(tmp_path / "other.key"))
    assert other.batch_get_v1(keys, slots_of([2, 3], 4)) == [False, False]
    # and plaintext records are refused by an instance that requires encryption
    assert plain.batch_set_v1(chain_keys(1, "plain"), slots_of([4], 4)) == [True]
    assert encrypted.batch_get_v1(chain_keys(1, "plain"), slots_of([5], 4)) == [False]


def test_a_wrong_key_does_not_destroy_records(galahad, tmp_path):
    """A record sealed with another master key fails its tag just as a damaged one does; until
    a record of the namespace has opened with this key, that is taken for a wrong key (a miss,
    record kept), not damage (quarantined)."""
    kv = mha_pool()
    keys = chain_keys(2, "wrong-key")
    right = write_key_file(tmp_path / "right.key")
    assert galahad(kv, encryption_key_file=right).batch_set_v1(keys, slots_of([0, 1], 4)) == [
        True,
        True,
    ]
    wrong = galahad(kv, encryption_key_file=write_key_file(tmp_path / "wrong.key"))
    assert wrong.batch_get_v1(keys, slots_of([2, 3], 4)) == [False, False]
    again = galahad(kv, encryption_key_file=right)
    assert again.batch_get_v1(keys, slots_of([2, 3], 4)) == [True, True]


def test_factory_passes_its_kwargs_dict(tmp_path):
    """SGLang constructs a dynamic backend as cls(storage_config, kwargs): both shapes work."""
    config = storage_config(galahad_extra(tmp_path / "store"))
    backend = StorageBackendFactory.create_backend("dynamic", config, None, anything="ignored")
    try:
        backend.register_mem_pool_host(mha_pool())
        assert backend.batch_set_v1(chain_keys(1, "kwargs"), slots_of([0], 4)) == [True]
    finally:
        backend.close()
    direct = create_galahad(tmp_path / "store", mha_pool())
    try:
        assert direct.batch_exists(chain_keys(1, "kwargs")) == 1
    finally:
        direct.close()
