"""State record codec: round trips, one rejection per rule, and fuzzing."""

from __future__ import annotations

import contextlib
import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint import (
    BadMagic,
    CheckpointGrid,
    ComponentSpec,
    DtypeMismatch,
    GeometryMismatch,
    GridMismatch,
    MalformedHeader,
    PositionMismatch,
    StateGeometry,
    StateRecordError,
    TrailingBytes,
    TruncatedRecord,
    UnsupportedVersion,
    pack_state,
    read_state_header,
    unpack_state,
)
from checkpoint.geometry import DTYPE_ITEMSIZE_BYTES
from checkpoint.state import MAX_HEADER_BYTES

GRID = CheckpointGrid(page_size_tokens=64, interval_tokens=1792)
# The example of sglang-hicache-api.md §6.7: 2 layers, fp32 temporal (4, 8, 16),
# one bf16 conv (3, 64) -> 2 * (512 * 4 + 192 * 2) = 4864 bytes.
GEOMETRY = StateGeometry(
    (
        ComponentSpec("temporal", "torch.float32", (4, 8, 16)),
        ComponentSpec("conv_0", "bfloat16", (3, 64)),
    ),
    num_layers=2,
)
FIXED_HEADER = struct.Struct("<4sHHIQIIIHHQ")


def payload_for(geometry: StateGeometry, seed: int = 7) -> bytes:
    return bytes((seed + 31 * i) % 256 for i in range(geometry.payload_bytes))


def good_record(position_tokens: int = 1792) -> bytes:
    return pack_state(GEOMETRY, GRID, position_tokens, payload_for(GEOMETRY))


def patch_fixed_field(record: bytes, index: int, value: int | bytes) -> bytes:
    fields = list(FIXED_HEADER.unpack_from(record))
    fields[index] = value
    return FIXED_HEADER.pack(*fields) + record[FIXED_HEADER.size :]


# --- geometry --------------------------------------------------------------------------


def test_payload_size_matches_sglang_size_per_token():
    assert GEOMETRY.payload_bytes == 4864
    assert GEOMETRY.component_byte_lengths == (4096, 768)


def test_side_state_without_layer_axis_counts_once():
    geometry = StateGeometry(
        (
            ComponentSpec("temporal", "float32", (2, 2)),
            ComponentSpec("conv_0", "bfloat16", (3,)),
            ComponentSpec("side_0", "int32", (5,), per_layer=False),
        ),
        num_layers=3,
    )
    assert geometry.component_byte_lengths == (3 * 16, 3 * 6, 20)
    assert geometry.payload_bytes == 86


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ComponentSpec("", "float32", (1,)), "name=''"),
        (lambda: ComponentSpec("x" * 256, "float32", (1,)), "255"),
        (lambda: ComponentSpec("t", "complex64", (1,)), "dtype='complex64'"),
        (lambda: ComponentSpec("t", "float32", ()), "shape=()"),
        (lambda: ComponentSpec("t", "float32", (2, 0)), "shape=(2, 0)"),
        (lambda: ComponentSpec("t", "float32", (1,) * 9), "1..8"),
        (lambda: ComponentSpec("t", "float32", (1,), per_layer=1), "per_layer=1"),
        (lambda: StateGeometry((), 1), "non-empty"),
        (lambda: StateGeometry((ComponentSpec("t", "float32", (1,)),), 0), "num_layers=0"),
        (
            lambda: StateGeometry(
                (ComponentSpec("t", "float32", (1,)), ComponentSpec("t", "int8", (1,))), 1
            ),
            "duplicate",
        ),
    ],
)
def test_geometry_validation(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


# --- round trip ------------------------------------------------------------------------


def test_round_trip_is_zero_copy_and_exact():
    record = good_record()
    payload = unpack_state(record, GEOMETRY, GRID, 1792)
    assert isinstance(payload, memoryview)
    assert payload.obj is record  # a view into the record, not a copy
    assert payload.tobytes() == payload_for(GEOMETRY)
    header = read_state_header(record)
    assert header.position_tokens == 1792
    assert (header.page_size_tokens, header.interval_tokens) == (64, 1792)
    assert header.geometry == GEOMETRY
    assert header.header_bytes % 8 == 0
    assert len(record) == header.header_bytes + GEOMETRY.payload_bytes


def test_pack_accepts_any_bytes_like_payload():
    payload = payload_for(GEOMETRY)
    records = {
        pack_state(GEOMETRY, GRID, 1792, kind(payload)) for kind in (bytes, bytearray, memoryview)
    }
    assert len(records) == 1
    as_words = memoryview(bytearray(payload)).cast("I")
    assert pack_state(GEOMETRY, GRID, 1792, as_words) in records


def test_unpack_accepts_bytearray_and_memoryview():
    record = good_record()
    for view in (bytearray(record), memoryview(record)):
        assert unpack_state(view, GEOMETRY, GRID, 1792).tobytes() == payload_for(GEOMETRY)


dtypes = st.sampled_from(sorted(DTYPE_ITEMSIZE_BYTES))
names = st.text(min_size=1, max_size=12)


@st.composite
def geometries(draw: st.DrawFn) -> StateGeometry:
    component_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    components = tuple(
        ComponentSpec(
            name,
            draw(dtypes),
            tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))),
            per_layer=draw(st.booleans()),
        )
        for name in component_names
    )
    return StateGeometry(components, draw(st.integers(1, 4)))


@settings(max_examples=300, deadline=None)
@given(geometries(), st.integers(1, 64), st.integers(1, 8), st.integers(1, 1000), st.data())
def test_round_trip_property(geometry, page, pages_per_interval, position_pages, data):
    grid = CheckpointGrid(page, page * pages_per_interval)
    payload = data.draw(st.binary(min_size=geometry.payload_bytes, max_size=geometry.payload_bytes))
    record = pack_state(geometry, grid, position_pages * page, payload)
    assert unpack_state(record, geometry, grid, position_pages * page) == payload
    assert read_state_header(record).geometry == geometry


# --- one rejection per rule ------------------------------------------------------------


def test_wrong_position_is_rejected():
    record = good_record(position_tokens=3584)
    with pytest.raises(PositionMismatch, match="3584.*requested 3520"):
        unpack_state(record, GEOMETRY, GRID, 3520)


@pytest.mark.parametrize(
    "other_grid", [CheckpointGrid(64, 3584), CheckpointGrid(32, 1792), CheckpointGrid(16, 1792)]
)
def test_other_page_size_or_interval_is_rejected(other_grid):
    with pytest.raises(GridMismatch):
        unpack_state(good_record(), GEOMETRY, other_grid, 1792)


def test_model_chunk_size_is_not_part_of_the_record():
    grid = CheckpointGrid(64, 1792, model_chunk_size_tokens=256)
    assert unpack_state(good_record(), GEOMETRY, grid, 1792).nbytes == 4864


def _variant(num_layers=2, temporal=("float32", (4, 8, 16)), conv=("bfloat16", (3, 64)), **extra):
    components = [ComponentSpec("temporal", *temporal), ComponentSpec("conv_0", *conv)]
    components += [ComponentSpec(name, *spec) for name, spec in extra.items()]
    return StateGeometry(tuple(components), num_layers)


@pytest.mark.parametrize(
    "expected, error",
    [
        (_variant(num_layers=3), GeometryMismatch),
        (_variant(temporal=("float32", (4, 8, 8))), GeometryMismatch),
        (_variant(conv=("bfloat16", (4, 64))), GeometryMismatch),
        (_variant(conv_1=("bfloat16", (3, 64))), GeometryMismatch),
        (
            StateGeometry((ComponentSpec("conv_0", "bfloat16", (3, 64)),) * 1, 2),
            GeometryMismatch,
        ),
        (_variant(temporal=("bfloat16", (4, 8, 16))), DtypeMismatch),
        (_variant(conv=("float16", (3, 64))), DtypeMismatch),
        (
            StateGeometry(
                (
                    ComponentSpec("temporal", "float32", (4, 8, 16)),
                    ComponentSpec("conv_0", "bfloat16", (3, 64), per_layer=False),
                ),
                2,
            ),
            GeometryMismatch,
        ),
    ],
)
def test_other_geometry_or_dtype_is_rejected(expected, error):
    with pytest.raises(error):
        unpack_state(good_record(), expected, GRID, 1792)


def test_dtype_mismatch_is_a_geometry_mismatch():
    assert issubclass(DtypeMismatch, GeometryMismatch)
    for error in (
        BadMagic,
        UnsupportedVersion,
        TruncatedRecord,
        TrailingBytes,
        MalformedHeader,
        PositionMismatch,
        GridMismatch,
        GeometryMismatch,
    ):
        assert issubclass(error, StateRecordError)


def test_bad_magic():
    with pytest.raises(BadMagic):
        unpack_state(patch_fixed_field(good_record(), 0, b"GLSX"), GEOMETRY, GRID, 1792)


def test_unsupported_version():
    with pytest.raises(UnsupportedVersion, match="version 2"):
        unpack_state(patch_fixed_field(good_record(), 1, 2), GEOMETRY, GRID, 1792)


@pytest.mark.parametrize("cut", [0, 1, FIXED_HEADER.size - 1, FIXED_HEADER.size, 100, 143, 144])
def test_truncated_header_or_payload(cut):
    with pytest.raises(TruncatedRecord):
        unpack_state(good_record()[:cut], GEOMETRY, GRID, 1792)


def test_truncated_by_one_payload_byte():
    with pytest.raises(TruncatedRecord):
        unpack_state(good_record()[:-1], GEOMETRY, GRID, 1792)


@pytest.mark.parametrize("extra", [b"\x00", b"trailing", bytes(4864)])
def test_trailing_bytes(extra):
    with pytest.raises(TrailingBytes):
        unpack_state(good_record() + extra, GEOMETRY, GRID, 1792)


@pytest.mark.parametrize(
    "field, value, message",
    [
        (2, 1, "flags=1"),  # flags
        (9, 3, "reserved=3"),  # reserved
        (3, 40, "header_bytes=40"),  # below the fixed part
        (3, 148, "header_bytes=148"),  # not a multiple of 8
        (3, MAX_HEADER_BYTES + 8, "header_bytes="),
        (3, 136, "overrun"),  # descriptors no longer fit
        (3, 152, "padding"),  # payload bytes now read as header padding
        (4, 0, "position_tokens=0"),
        (4, 1793, "position_tokens=1793"),
        (5, 0, "page_size_tokens=0"),
        (6, 100, "interval_tokens=100"),
        (7, 0, "num_layers=0"),
        (7, 3, "declares 4096 bytes"),  # byte lengths no longer follow from num_layers
        (8, 0, "num_components=0"),
        (8, 3, "overrun|non-zero|invalid"),
        (10, 4865, "payload_bytes=4865"),
    ],
)
def test_malformed_fixed_header(field, value, message):
    record = patch_fixed_field(good_record(), field, value)
    with pytest.raises(MalformedHeader, match=message):
        read_state_header(record)


def _descriptor_offset(name: str) -> int:
    record = good_record()
    return record.index(name.encode()) - 4


@pytest.mark.parametrize(
    "relative_offset, value, message",
    [
        (3, 2, "per_layer=2"),
        (2, 0, "shape=()"),
        (2, 9, "overrun|1..8"),
        (1, 3, "dtype 'flo'|not supported"),
    ],
)
def test_malformed_component_descriptor(relative_offset, value, message):
    record = bytearray(good_record())
    record[_descriptor_offset("temporal") + relative_offset] = value
    with pytest.raises(MalformedHeader, match=message):
        read_state_header(bytes(record))


def test_non_canonical_dtype_in_record_is_rejected():
    record = bytearray(good_record())
    # Rename the temporal dtype "float32" to a same-length string that is not a dtype.
    at = record.index(b"float32")
    record[at : at + 7] = b"floatXX"
    with pytest.raises(MalformedHeader, match="floatXX"):
        read_state_header(bytes(record))


def test_invalid_utf8_name_is_rejected():
    record = bytearray(good_record())
    at = record.index(b"temporal")
    record[at] = 0xFF
    with pytest.raises(MalformedHeader, match="invalid component descriptor"):
        read_state_header(bytes(record))


def test_declared_component_length_must_follow_from_geometry():
    record = bytearray(good_record())
    at = record.index(b"temporal") + len("temporal") + len("float32") + 3 * 8
    record[at : at + 8] = struct.pack("<Q", 4095)
    with pytest.raises(MalformedHeader, match="declares 4095"):
        read_state_header(bytes(record))


# --- encoder misuse --------------------------------------------------------------------


@pytest.mark.parametrize(
    "position, payload, message",
    [
        (1792, bytes(4863), "payload is 4863 bytes"),
        (1792, bytes(4865), "payload is 4865 bytes"),
        (0, bytes(4864), "position_tokens=0"),
        (100, bytes(4864), "position_tokens=100"),
        (True, bytes(4864), "position_tokens=True"),
        (2**64, bytes(4864), "position_tokens="),
    ],
)
def test_pack_rejects_misuse(position, payload, message):
    with pytest.raises(ValueError, match=message):
        pack_state(GEOMETRY, GRID, position, payload)


def test_pack_accepts_off_interval_page_aligned_positions():
    """The codec records any page-aligned state; which ones to keep is the policy's call."""
    record = pack_state(GEOMETRY, GRID, 64, payload_for(GEOMETRY))
    assert not GRID.is_checkpoint_position(64)
    assert unpack_state(record, GEOMETRY, GRID, 64).nbytes == GEOMETRY.payload_bytes


# --- fuzzing ---------------------------------------------------------------------------


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_raise_only_state_record_errors(data):
    with contextlib.suppress(StateRecordError):
        unpack_state(data, GEOMETRY, GRID, 1792)


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 4864 + 143), st.integers(0, 255), st.integers(0, 8))
def test_mutated_records_raise_only_state_record_errors(offset, value, cut):
    record = bytearray(good_record())
    record[offset] = value
    mutated = bytes(record[: len(record) - cut])
    try:
        payload = unpack_state(mutated, GEOMETRY, GRID, 1792)
    except StateRecordError:
        return
    # Only a payload byte (or a header byte rewritten to its own value) can pass.
    assert cut == 0
    assert offset >= read_state_header(mutated).header_bytes or mutated == good_record()
    assert payload.nbytes == GEOMETRY.payload_bytes


@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_fuzzed_headers_with_valid_prefix_raise_only_state_record_errors(data):
    """Keep magic and version so decoding reaches the deeper checks."""
    fixed = FIXED_HEADER.pack(
        b"GLST",
        1,
        data.draw(st.sampled_from([0, 0, 1])),
        data.draw(st.sampled_from([48, 56, 64, 72, 144, data.draw(st.integers(0, 2**32 - 1))])),
        data.draw(st.integers(0, 2**64 - 1)),
        data.draw(st.sampled_from([1, 64, 0, data.draw(st.integers(0, 2**32 - 1))])),
        data.draw(st.sampled_from([64, 1792, 0, data.draw(st.integers(0, 2**32 - 1))])),
        data.draw(st.integers(0, 5)),
        data.draw(st.integers(0, 5)),
        0,
        data.draw(st.integers(0, 2**64 - 1)),
    )
    tail = data.draw(st.binary(max_size=300))
    with contextlib.suppress(StateRecordError):
        read_state_header(fixed + tail)
        unpack_state(fixed + tail, GEOMETRY, GRID, 1792)
