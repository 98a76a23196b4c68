"""One self-describing record per recurrent-state checkpoint.

Layout (all integers little-endian); docs/CHECKPOINTS.md has the same table:

    offset size  field
    0      4     magic b"GLST"
    4      2     version (1)
    6      2     flags (0)
    8      4     header_bytes: fixed part + component descriptors + zero padding, a multiple of 8
    12     8     position_tokens: the state is the one after exactly this many tokens
    20     4     page_size_tokens
    24     4     interval_tokens: the checkpoint interval C
    28     4     num_layers
    32     2     num_components
    34     2     reserved (0)
    36     8     payload_bytes
    44     ...   per component: u8 name_len, u8 dtype_len, u8 ndim, u8 per_layer (0 or 1),
                 name (UTF-8), dtype (ASCII), ndim x u64 dims, u64 byte_length;
                 then zero padding up to header_bytes
    header_bytes payload_bytes  the flat payload, byte for byte as MambaPoolHost lays it out

The payload starts on an 8-byte boundary of the record. Integrity (checksums, encryption)
belongs to the store's record format that wraps this one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from checkpoint.errors import (
    BadMagic,
    DtypeMismatch,
    GeometryMismatch,
    GridMismatch,
    MalformedHeader,
    PositionMismatch,
    TrailingBytes,
    TruncatedRecord,
    UnsupportedVersion,
)
from checkpoint.geometry import ComponentSpec, StateGeometry
from checkpoint.grid import CheckpointGrid

MAGIC = b"GLST"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
HEADER_ALIGNMENT_BYTES = 8

_FIXED = struct.Struct("<4sHHIQIIIHHQ")
_DESCRIPTOR_PREFIX = struct.Struct("<BBBB")
_U64 = struct.Struct("<Q")
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


@dataclass(frozen=True)
class StateRecordHeader:
    """The decoded, internally consistent header of a state record."""

    position_tokens: int
    page_size_tokens: int
    interval_tokens: int
    geometry: StateGeometry
    header_bytes: int
    payload_bytes: int


def _padded(length_bytes: int) -> int:
    return -(-length_bytes // HEADER_ALIGNMENT_BYTES) * HEADER_ALIGNMENT_BYTES


def _encode_descriptor(component: ComponentSpec, byte_length: int) -> bytes:
    name = component.name.encode("utf-8")
    dtype = component.dtype.encode("ascii")
    dims = struct.pack(f"<{len(component.shape)}Q", *component.shape)
    prefix = _DESCRIPTOR_PREFIX.pack(
        len(name), len(dtype), len(component.shape), int(component.per_layer)
    )
    return prefix + name + dtype + dims + _U64.pack(byte_length)


def _check_encodable(geometry: StateGeometry, grid: CheckpointGrid, position_tokens: int) -> None:
    if not isinstance(position_tokens, int) or isinstance(position_tokens, bool):
        raise ValueError(f"position_tokens={position_tokens!r}: must be an int")
    if not 0 < position_tokens <= _U64_MAX or position_tokens % grid.page_size_tokens:
        raise ValueError(
            f"position_tokens={position_tokens}: must be a positive multiple of "
            f"page_size_tokens={grid.page_size_tokens} (a state is keyed by a whole page)"
        )
    for name, value in (
        ("page_size_tokens", grid.page_size_tokens),
        ("interval_tokens", grid.interval_tokens),
        ("num_layers", geometry.num_layers),
    ):
        if value > _U32_MAX:
            raise ValueError(f"{name}={value}: does not fit the record's 32-bit field")
    if any(d > _U64_MAX for c in geometry.components for d in c.shape):
        raise ValueError("a component dimension does not fit the record's 64-bit field")


def pack_state(
    geometry: StateGeometry,
    grid: CheckpointGrid,
    position_tokens: int,
    payload: bytes | bytearray | memoryview,
) -> bytes:
    """Encode one checkpoint: header describing `geometry`, `grid` and the position, then payload.

    `payload` is any C-contiguous bytes-like object (e.g. the uint8 flat page of
    ``MambaPoolHost.get_data_page(i)`` exposed through ``.numpy()``) whose size is
    ``geometry.payload_bytes``. `position_tokens` is the number of tokens the state has
    consumed: a positive multiple of the page size. Raises ValueError on misuse.
    """
    _check_encodable(geometry, grid, position_tokens)
    flat = memoryview(payload).cast("B")
    if flat.nbytes != geometry.payload_bytes:
        raise ValueError(
            f"payload is {flat.nbytes} bytes; geometry requires {geometry.payload_bytes}"
        )
    descriptors = b"".join(
        _encode_descriptor(c, n)
        for c, n in zip(geometry.components, geometry.component_byte_lengths, strict=True)
    )
    header_bytes = _padded(_FIXED.size + len(descriptors))
    if header_bytes > MAX_HEADER_BYTES:
        raise ValueError(f"header of {header_bytes} bytes exceeds {MAX_HEADER_BYTES}")
    fixed = _FIXED.pack(
        MAGIC,
        FORMAT_VERSION,
        0,
        header_bytes,
        position_tokens,
        grid.page_size_tokens,
        grid.interval_tokens,
        geometry.num_layers,
        len(geometry.components),
        0,
        geometry.payload_bytes,
    )
    padding = bytes(header_bytes - _FIXED.size - len(descriptors))
    return b"".join((fixed, descriptors, padding, flat))


class _Cursor:
    """Reads descriptor fields from the header region; overruns are malformed headers."""

    def __init__(self, view: memoryview, offset: int) -> None:
        self.view = view
        self.offset = offset

    def take(self, num_bytes: int) -> memoryview:
        end = self.offset + num_bytes
        if end > len(self.view):
            raise MalformedHeader("component descriptors overrun header_bytes")
        chunk = self.view[self.offset : end]
        self.offset = end
        return chunk

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        return layout.unpack(self.take(layout.size))


def _decode_descriptor(cursor: _Cursor, num_layers: int) -> ComponentSpec:
    name_len, dtype_len, ndim, per_layer = cursor.unpack(_DESCRIPTOR_PREFIX)
    if per_layer not in (0, 1):
        raise MalformedHeader(f"per_layer={per_layer}; must be 0 or 1")
    try:
        name = bytes(cursor.take(name_len)).decode("utf-8")
        dtype = bytes(cursor.take(dtype_len)).decode("ascii")
        shape = struct.unpack(f"<{ndim}Q", cursor.take(8 * ndim))
        (byte_length,) = cursor.unpack(_U64)
        component = ComponentSpec(name, dtype, shape, per_layer=bool(per_layer))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedHeader(f"invalid component descriptor: {exc}") from exc
    if component.dtype != dtype:
        raise MalformedHeader(f"dtype {dtype!r} is not in canonical form")
    expected_bytes = (num_layers if component.per_layer else 1) * component.bytes_per_copy
    if byte_length != expected_bytes:
        raise MalformedHeader(
            f"component {name!r} declares {byte_length} bytes; its geometry gives {expected_bytes}"
        )
    return component


def _check_grid_fields(position_tokens: int, page_size_tokens: int, interval_tokens: int) -> None:
    if page_size_tokens == 0 or interval_tokens == 0 or interval_tokens % page_size_tokens:
        raise MalformedHeader(
            f"interval_tokens={interval_tokens} is not a positive multiple of "
            f"page_size_tokens={page_size_tokens}"
        )
    if position_tokens == 0 or position_tokens % page_size_tokens:
        raise MalformedHeader(f"position_tokens={position_tokens} is not a whole number of pages")


def read_state_header(record: bytes | bytearray | memoryview) -> StateRecordHeader:
    """Decode and validate the header of `record`, including its total length.

    Raises a `StateRecordError` subclass for anything but a well-formed record.
    """
    view = memoryview(record).cast("B")
    if len(view) < _FIXED.size:
        raise TruncatedRecord(f"{len(view)} bytes is shorter than the {_FIXED.size}-byte header")
    (
        magic,
        version,
        flags,
        header_bytes,
        position_tokens,
        page_size_tokens,
        interval_tokens,
        num_layers,
        num_components,
        reserved,
        payload_bytes,
    ) = _FIXED.unpack(view[: _FIXED.size])
    if magic != MAGIC:
        raise BadMagic(f"magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise UnsupportedVersion(f"version {version}, this reader knows {FORMAT_VERSION}")
    if flags or reserved:
        raise MalformedHeader(f"flags={flags} reserved={reserved}; both must be 0")
    if not _FIXED.size <= header_bytes <= MAX_HEADER_BYTES or header_bytes % HEADER_ALIGNMENT_BYTES:
        raise MalformedHeader(f"header_bytes={header_bytes} is out of range or unaligned")
    if len(view) < header_bytes:
        raise TruncatedRecord(f"{len(view)} bytes is shorter than header_bytes={header_bytes}")
    _check_grid_fields(position_tokens, page_size_tokens, interval_tokens)
    if num_layers == 0 or num_components == 0:
        raise MalformedHeader(f"num_layers={num_layers} num_components={num_components}")

    cursor = _Cursor(view[:header_bytes], _FIXED.size)
    components = [_decode_descriptor(cursor, num_layers) for _ in range(num_components)]
    if any(cursor.take(header_bytes - cursor.offset)):
        raise MalformedHeader("non-zero bytes in header padding")
    try:
        geometry = StateGeometry(tuple(components), num_layers)
    except ValueError as exc:
        raise MalformedHeader(str(exc)) from exc
    if geometry.payload_bytes != payload_bytes:
        raise MalformedHeader(
            f"payload_bytes={payload_bytes}; components add up to {geometry.payload_bytes}"
        )
    expected_total = header_bytes + payload_bytes
    if len(view) < expected_total:
        raise TruncatedRecord(f"{len(view)} bytes; header declares {expected_total}")
    if len(view) > expected_total:
        raise TrailingBytes(f"{len(view) - expected_total} bytes after the payload")
    return StateRecordHeader(
        position_tokens, page_size_tokens, interval_tokens, geometry, header_bytes, payload_bytes
    )


def _check_geometry(found: StateGeometry, expected: StateGeometry) -> None:
    if found == expected:
        return
    if found.num_layers != expected.num_layers:
        raise GeometryMismatch(f"num_layers {found.num_layers}, expected {expected.num_layers}")
    found_layout = [(c.name, c.shape, c.per_layer) for c in found.components]
    expected_layout = [(c.name, c.shape, c.per_layer) for c in expected.components]
    if found_layout != expected_layout:
        raise GeometryMismatch(f"components {found_layout}, expected {expected_layout}")
    raise DtypeMismatch(
        f"dtypes {[c.dtype for c in found.components]}, "
        f"expected {[c.dtype for c in expected.components]}"
    )


def unpack_state(
    record: bytes | bytearray | memoryview,
    expected_geometry: StateGeometry,
    expected_grid: CheckpointGrid,
    expected_position_tokens: int,
) -> memoryview:
    """Return the flat payload of `record` as a zero-copy uint8 memoryview.

    The record must be well formed and describe exactly the state after
    `expected_position_tokens` tokens, under `expected_grid`'s page size and checkpoint
    interval, with `expected_geometry`. Any difference raises a `StateRecordError`
    subclass (PositionMismatch, GridMismatch, GeometryMismatch, DtypeMismatch, or a
    structural error); the caller must treat it as a miss.
    """
    header = read_state_header(record)
    if header.position_tokens != expected_position_tokens:
        raise PositionMismatch(
            f"record holds the state at {header.position_tokens} tokens, "
            f"requested {expected_position_tokens}"
        )
    found_grid = (header.page_size_tokens, header.interval_tokens)
    wanted_grid = (expected_grid.page_size_tokens, expected_grid.interval_tokens)
    if found_grid != wanted_grid:
        raise GridMismatch(
            f"(page_size_tokens, interval_tokens) {found_grid}, expected {wanted_grid}"
        )
    _check_geometry(header.geometry, expected_geometry)
    return memoryview(record).cast("B")[header.header_bytes :]
