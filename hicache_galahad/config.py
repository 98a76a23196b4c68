"""The backend's options from SGLang's --hicache-storage-backend-extra-config (pure).

Config errors are loud and early: an unknown key or a bad value raises ConfigError at server
start, naming the key, the value and what is expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .units import parse_bytes

# Keys SGLang reads (and keeps or pops) itself; we accept and ignore them.
SGLANG_KEYS = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        "prefetch_threshold",
        "prefetch_timeout_base",
        "prefetch_timeout_per_ki_token",
        "hicache_storage_pass_prefix_keys",
        "tp_lcm_size",
    }
)


class ConfigError(ValueError):
    """A configuration mistake; raised at start, never during I/O."""


def default_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hicache-galahad")


@dataclass(frozen=True)
class GalahadOptions:
    root: str
    tenant: str = "default"
    model_fingerprint: str | None = None
    max_bytes: int | None = None
    min_free_bytes: int = 0
    compression: str = "none"
    zstd_level: int = 3
    encryption_key_file: str | None = None
    io_threads: int = 8

    def store_kwargs(self) -> dict:
        return {
            "max_bytes": self.max_bytes,
            "min_free_bytes": self.min_free_bytes,
            "compression": self.compression,
            "zstd_level": self.zstd_level,
            "encryption_key_file": self.encryption_key_file,
            "io_threads": self.io_threads,
        }


def _string(key, value, *, allow_empty=False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ConfigError(f"extra-config key {key!r}: got {value!r}, expected a non-empty string")
    return value


def _integer(key, value, low, high) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"extra-config key {key!r}: got {value!r}, expected an integer in [{low}, {high}]"
        )
    return value


def _size(key, value, *, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    try:
        return parse_bytes(value)
    except ValueError:
        raise ConfigError(
            f"extra-config key {key!r}: got {value!r}, expected a byte count "
            "(an integer, or a string such as '500MB' or '64GiB')"
        ) from None


def parse_options(extra_config: dict | None) -> GalahadOptions:
    """Validates every key of the extra config; SGLang's own keys are ignored."""
    config = dict(extra_config or {})
    known = {
        "root",
        "tenant",
        "model_fingerprint",
        "max_bytes",
        "min_free_bytes",
        "compression",
        "zstd_level",
        "encryption_key_file",
        "io_threads",
    }
    unknown = sorted(set(config) - known - SGLANG_KEYS)
    if unknown:
        raise ConfigError(
            f"extra-config has unknown key(s) {unknown}: hicache_galahad accepts "
            f"{sorted(known)} (see docs/CONFIG.md)"
        )
    options = {"root": default_root()}
    if "root" in config:
        options["root"] = os.path.abspath(os.path.expanduser(_string("root", config["root"])))
    if "tenant" in config:
        options["tenant"] = _string("tenant", config["tenant"])
    if config.get("model_fingerprint") is not None:
        options["model_fingerprint"] = _string("model_fingerprint", config["model_fingerprint"])
    if "max_bytes" in config:
        max_bytes = _size("max_bytes", config["max_bytes"], allow_none=True)
        if max_bytes == 0:
            raise ConfigError("extra-config key 'max_bytes': got 0, expected a positive size")
        options["max_bytes"] = max_bytes
    if "min_free_bytes" in config:
        options["min_free_bytes"] = _size(
            "min_free_bytes", config["min_free_bytes"], allow_none=False
        )
    if "compression" in config:
        if config["compression"] not in ("none", "zstd"):
            raise ConfigError(
                f"extra-config key 'compression': got {config['compression']!r}, "
                "expected 'none' or 'zstd'"
            )
        options["compression"] = config["compression"]
    if "zstd_level" in config:
        options["zstd_level"] = _integer("zstd_level", config["zstd_level"], 1, 22)
    if config.get("encryption_key_file") is not None:
        options["encryption_key_file"] = os.path.abspath(
            os.path.expanduser(_string("encryption_key_file", config["encryption_key_file"]))
        )
    if "io_threads" in config:
        options["io_threads"] = _integer("io_threads", config["io_threads"], 1, 256)
    return GalahadOptions(**options)
