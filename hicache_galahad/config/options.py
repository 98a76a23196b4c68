"""The backend's options, validated once (pure: no I/O but path normalisation).

`StoreOptions` is everything a `RecordStore` takes; `GalahadOptions` adds what the SGLang
backend needs, parsed from --hicache-storage-backend-extra-config by `parse_options`. Config
errors are loud and early: an unknown key or a bad value raises ConfigError at server start,
naming the key, the value and what is expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from ..errors import ConfigError, MooncakeConfigError
from ..units import parse_bytes
from .mooncake import NO_SHARED_KEY, MooncakeOptions

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

COMPRESSIONS = ("none", "zstd")
DURABILITIES = ("deferred", "fsync", "none")
DIGESTS = ("xxh3_128", "sha256", "none")
MAX_LEDGER_BYTES = (1 << 63) - 1
MAX_NAME_BYTES = 256


def default_root() -> str:
    """The store's own directory, apart from anything else the user keeps in ~/.cache."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "galahad-kv")


def _fail(key: str, value, expected: str):
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise ConfigError(f"hicache_galahad option {key!r}: got {shown}, expected {expected}")


def _path(key: str, value) -> str:
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        _fail(key, value, "a non-empty path without NUL characters")
    return os.path.abspath(os.path.expanduser(value))


def _name(key: str, value) -> str:
    """A tenant or fingerprint: printable, encodable as UTF-8, at most 256 bytes."""
    try:
        encoded = value.encode("utf-8") if isinstance(value, str) else None
    except UnicodeEncodeError:
        encoded = None
    if (
        encoded is None
        or not value.strip()
        or len(encoded) > MAX_NAME_BYTES
        or not value.isprintable()
    ):
        _fail(key, value, f"a non-empty printable UTF-8 string of at most {MAX_NAME_BYTES} bytes")
    return value


def _integer(key: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        _fail(key, value, f"an integer in [{low}, {high}]")
    return value


def _number(key: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        _fail(key, value, f"a number of seconds in [{low}, {high}]")
    return float(value)


def _size(key: str, value, *, allow_none: bool, low: int) -> int | None:
    if value is None and allow_none:
        return None
    try:
        size = parse_bytes(value)
    except ValueError:
        size = None
    if size is None or not low <= size <= MAX_LEDGER_BYTES:
        _fail(
            key,
            value,
            f"a byte count from {low} to 2^63-1 (an integer, or a string such as '500MB' "
            "or '64GiB')" + (", or null for no cap" if allow_none else ""),
        )
    return size


def _choice(key: str, value, choices) -> str:
    if value not in choices:
        _fail(key, value, " or ".join(repr(choice) for choice in choices))
    return value


# Marks a StoreOptions field that the extra config does not take.
NOT_IN_EXTRA_CONFIG = MappingProxyType({"extra_config": False})


@dataclass(frozen=True)
class StoreOptions:
    """What a RecordStore takes. Validated on construction (ConfigError).

    max_bytes: cap on the bytes of all records under root (None: no cap).
    max_pinned_bytes: the most bytes of pinned records (`galahad warm --pin`, store.pins),
        which eviction never takes; pinning more is refused. None: half of max_bytes (no
        limit without a cap). At most max_bytes.
    min_free_bytes: free space the filesystem must keep; puts evict or fail to honour it.
    compression: "none" or "zstd" (zstd_level 1..22); a page that does not shrink by at
        least 1/16 is stored uncompressed.
    encryption_key_file: path of a 32-byte master key; every record is then AES-256-GCM
        sealed with a per-tenant key, and plaintext records are refused on read.
    digest: "xxh3_128" (default) or "sha256" for unencrypted records; "none" only together
        with allow_unverified=True (benchmarks).
    durability: "deferred" (default): a put returns once its record is published (temp file,
        then link: a crash leaves nothing damaged), and a background flusher makes published
        records durable within flush_interval_s; "fsync": records and directories are
        fsynced before a put returns; "none": never fsynced (tests and benchmarks). A power
        loss can lose at most the records of the last flush window, never serve a wrong
        byte (every read is verified).
    read_only: never create, delete, move or re-account anything (operators' commands).
    """

    root: str
    max_bytes: int | None = None
    max_pinned_bytes: int | None = None
    min_free_bytes: int = 0
    compression: str = "none"
    zstd_level: int = 3
    encryption_key_file: str | None = None
    digest: str = field(default="xxh3_128", metadata=NOT_IN_EXTRA_CONFIG)
    allow_unverified: bool = field(default=False, metadata=NOT_IN_EXTRA_CONFIG)
    durability: str = "deferred"
    flush_interval_s: float = 1.0
    io_threads: int = 8
    read_only: bool = field(default=False, metadata=NOT_IN_EXTRA_CONFIG)

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "root", _path("root", self.root))
        set_(self, "max_bytes", _size("max_bytes", self.max_bytes, allow_none=True, low=1))
        pinned = _size("max_pinned_bytes", self.max_pinned_bytes, allow_none=True, low=0)
        if pinned is not None and self.max_bytes is not None and pinned > self.max_bytes:
            _fail(
                "max_pinned_bytes", self.max_pinned_bytes, f"at most max_bytes ({self.max_bytes})"
            )
        set_(self, "max_pinned_bytes", pinned)
        set_(
            self,
            "min_free_bytes",
            _size("min_free_bytes", self.min_free_bytes, allow_none=False, low=0),
        )
        _choice("compression", self.compression, COMPRESSIONS)
        _integer("zstd_level", self.zstd_level, 1, 22)
        if self.encryption_key_file is not None:
            set_(
                self,
                "encryption_key_file",
                _path("encryption_key_file", self.encryption_key_file),
            )
        _choice("digest", self.digest, DIGESTS)
        if self.digest == "none" and not self.allow_unverified and not self.encryption_key_file:
            _fail("digest", self.digest, "'xxh3_128' or 'sha256' ('none' needs allow_unverified)")
        _choice("durability", self.durability, DURABILITIES)
        set_(
            self, "flush_interval_s", _number("flush_interval_s", self.flush_interval_s, 0.01, 3600)
        )
        _integer("io_threads", self.io_threads, 1, 256)

    @property
    def pin_limit_bytes(self) -> int | None:
        """max_pinned_bytes, or its default: half of max_bytes (None: no limit)."""
        if self.max_pinned_bytes is not None:
            return self.max_pinned_bytes
        return None if self.max_bytes is None else self.max_bytes // 2

    @property
    def durable(self) -> bool:
        """Whether records are ever made durable (fsync or deferred)."""
        return self.durability != "none"


@dataclass(frozen=True)
class GalahadOptions:
    """The SGLang backend's options: who it stores for, and the store's own options."""

    store: StoreOptions
    tenant: str = "default"
    model_fingerprint: str | None = None
    mooncake: MooncakeOptions | None = None  # the shared tier; None: local disk only

    def __post_init__(self):
        _name("tenant", self.tenant)
        if self.model_fingerprint is not None:
            _name("model_fingerprint", self.model_fingerprint)


# Extra-config keys that go to StoreOptions (the others are GalahadOptions' own): every field
# but those marked NOT_IN_EXTRA_CONFIG (benchmarks' and operators' settings).
_STORE_KEYS = tuple(
    option.name for option in fields(StoreOptions) if option.metadata.get("extra_config", True)
)
_NULLABLE_KEYS = frozenset({"max_bytes", "max_pinned_bytes", "encryption_key_file"})
EXTRA_CONFIG_KEYS = frozenset(_STORE_KEYS) | {"tenant", "model_fingerprint", "mooncake"}


def parse_options(extra_config: dict | None) -> GalahadOptions:
    """Validates every key of the extra config; SGLang's own keys are ignored."""
    if extra_config is not None and not isinstance(extra_config, dict):
        raise ConfigError(
            f"hicache_galahad: the extra config must be a JSON object, got {extra_config!r}"
        )
    config = dict(extra_config or {})
    unknown = sorted(set(config) - EXTRA_CONFIG_KEYS - SGLANG_KEYS)
    if unknown:
        raise ConfigError(
            f"extra-config has unknown key(s) {unknown}: hicache_galahad accepts "
            f"{sorted(EXTRA_CONFIG_KEYS)} (see docs/CONFIG.md)"
        )
    # null means "the default" only where the default is "none": no cap, no encryption.
    store = {
        key: config[key]
        for key in _STORE_KEYS
        if key in config and not (config[key] is None and key in _NULLABLE_KEYS)
    }
    store.setdefault("root", default_root())
    backend = {key: config[key] for key in ("tenant",) if key in config}
    if config.get("model_fingerprint") is not None:
        backend["model_fingerprint"] = config["model_fingerprint"]
    if config.get("mooncake") is not None:
        if not isinstance(config["mooncake"], dict):
            _fail("mooncake", config["mooncake"], "an object of Mooncake setup() parameters")
        try:
            backend["mooncake"] = MooncakeOptions.from_config(config["mooncake"])
        except MooncakeConfigError as error:
            raise ConfigError(f"hicache_galahad option 'mooncake': {error}") from None
    options = GalahadOptions(store=StoreOptions(**store), **backend)
    shared = options.mooncake
    keyless = options.store.encryption_key_file is None
    if shared is not None and shared.integrity_key_file is None and keyless:
        raise ConfigError(f"hicache_galahad option 'mooncake': {NO_SHARED_KEY}")  # forgeable
    return options
