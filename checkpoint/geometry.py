"""Geometry of one recurrent-state checkpoint, as SGLang's `MambaPoolHost` lays it out.

A host Mamba slot holds the state of all Mamba layers of one TP rank. Its flat page
(`MambaPoolHost.get_data_page`) is a uint8 concatenation, component by component:

    [temporal (all layers), conv_0 (all layers), conv_1 (all layers), ..., side states]

A per-layer component occupies ``num_layers * prod(shape) * itemsize`` bytes. SGLang
0.5.23 appends the model's registered slot side states (``extra_checkpoint_buffers``),
which have no layer axis: describe them with ``per_layer=False``, one copy each. The
order of `StateGeometry.components` is the order of the bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Names as torch prints them, without the "torch." prefix.
DTYPE_ITEMSIZE_BYTES: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}

MAX_NAME_BYTES = 255
MAX_NDIM = 8


def canonical_dtype(dtype: str) -> str:
    """Return the canonical dtype name (``"torch.bfloat16"`` -> ``"bfloat16"``).

    Raises ValueError for a dtype whose item size is not known.
    """
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_ITEMSIZE_BYTES:
        known = ", ".join(sorted(DTYPE_ITEMSIZE_BYTES))
        raise ValueError(f"dtype={dtype!r} is not supported; expected one of: {known}")
    return name


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class ComponentSpec:
    """One state component: the SSM/temporal state, a conv state, or a slot side state.

    `shape` is the shape of one copy (SGLang's ``temporal_shape`` / ``conv_shape``),
    without the layer or slot axes. `per_layer` says whether the payload holds one copy
    per Mamba layer (temporal, conv) or a single copy (a side state without a layer
    axis). `dtype` accepts torch spellings ("torch.float32") and is stored canonically
    ("float32").
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    per_layer: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name={self.name!r}: must be a non-empty string")
        if len(self.name.encode("utf-8")) > MAX_NAME_BYTES:
            raise ValueError(f"name={self.name!r}: longer than {MAX_NAME_BYTES} UTF-8 bytes")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        shape = tuple(self.shape)
        if not 1 <= len(shape) <= MAX_NDIM or not all(_is_positive_int(d) for d in shape):
            raise ValueError(
                f"shape={self.shape!r} of component {self.name!r}: "
                f"must have 1..{MAX_NDIM} positive integer dimensions"
            )
        object.__setattr__(self, "shape", shape)
        if not isinstance(self.per_layer, bool):
            raise ValueError(f"per_layer={self.per_layer!r} of {self.name!r}: must be a bool")

    @property
    def itemsize_bytes(self) -> int:
        return DTYPE_ITEMSIZE_BYTES[self.dtype]

    @property
    def bytes_per_copy(self) -> int:
        """Bytes of one copy: one layer's worth for a per-layer component."""
        return math.prod(self.shape) * self.itemsize_bytes


@dataclass(frozen=True)
class StateGeometry:
    """All components of one checkpoint over `num_layers` Mamba layers of one TP rank.

    `num_layers` is SGLang's ``MambaPoolHost.num_mamba_layers`` (MTP draft layers
    included).
    """

    components: tuple[ComponentSpec, ...]
    num_layers: int

    def __post_init__(self) -> None:
        components = tuple(self.components)
        if not components or not all(isinstance(c, ComponentSpec) for c in components):
            raise ValueError(
                f"components={self.components!r}: must be a non-empty sequence of ComponentSpec"
            )
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"components: duplicate names in {names}")
        if not _is_positive_int(self.num_layers):
            raise ValueError(f"num_layers={self.num_layers!r}: must be a positive integer")
        object.__setattr__(self, "components", components)

    def component_bytes(self, component: ComponentSpec) -> int:
        """Bytes `component` occupies in the flat payload (all its copies)."""
        num_copies = self.num_layers if component.per_layer else 1
        return num_copies * component.bytes_per_copy

    @property
    def component_byte_lengths(self) -> tuple[int, ...]:
        """Byte length of each component in the flat payload, in payload order."""
        return tuple(self.component_bytes(c) for c in self.components)

    @property
    def payload_bytes(self) -> int:
        """Size of the flat payload; equals SGLang's ``MambaPoolHost.size_per_token``."""
        return sum(self.component_byte_lengths)
