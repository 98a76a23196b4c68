"""Parsing of byte sizes given in configuration ("64GiB", "500 MB", 1048576)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str) -> int:
    """An int >= 0 from an int or a string such as "64GiB", "1.5 GB", "4096"."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected a byte size >= 0, got {value}")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS and len(match.group(1)) <= 24:
            return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    raise ValueError(f"expected a byte size such as 1048576, '500MB' or '64GiB', got {value!r}")
