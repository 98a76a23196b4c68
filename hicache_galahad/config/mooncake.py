"""The `mooncake` options: where a Mooncake Store cluster is and how a process joins it (pure).

Keys are Mooncake's own setup() parameter names plus the tier's own (timeout_s, queue_max_bytes,
transfer_buffer_bytes, integrity_key_file). Strict: an unknown key or a bad value raises
MooncakeConfigError (errors.py, a ConfigError) naming the key, the value and what is expected.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

from ..errors import MooncakeConfigError
from ..units import parse_bytes

MIB = 1 << 20
PROTOCOLS = ("tcp", "rdma")


# Why a shared tier needs a key (config.py and tiered.py refuse one without either).
NO_SHARED_KEY = (
    "'integrity_key_file' is required when 'encryption_key_file' is not set (the path of 32 "
    "random bytes, mode 0600, the same on every server of the cluster): without a key, any "
    'Mooncake peer can forge values that pass every check (docs/OPERATIONS.md, "Security model")'
)


def _fail(key: str, value, expected: str):
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise MooncakeConfigError(f"mooncake option {key!r}: got {shown}, expected {expected}")


_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


def _host_port(text: str) -> tuple[str, int] | None:
    match = _HOST_PORT.match(text)
    if not match or not 0 < int(match.group(2)) < 65536:
        return None
    return match.group(1).strip("[]"), int(match.group(2))


def _metadata_endpoint(value: str) -> tuple[str, int] | None:
    """The HTTP metadata server's (host, port), or None for P2PHANDSHAKE."""
    if value == "P2PHANDSHAKE":
        return None
    parts = urlsplit(value)
    return (parts.hostname or "", parts.port or 80) if parts.scheme == "http" else ("", 0)


@dataclass(frozen=True)
class MooncakeOptions:
    """Where the Mooncake cluster is and how this process joins it.

    The first seven fields are Mooncake's own setup() parameters (global_segment_size 0: a
    pure client, the recommended shape; dedicated `mooncake_client` daemons hold the memory).
    local_buffer_size is Mooncake's staging buffer for its copying calls, which the tier does
    not use (it reads and writes through its own registered buffers), hence 0.
    timeout_s bounds every read; queue_max_bytes bounds the write-behind queue;
    transfer_buffer_bytes is each of the two registered buffers (read, write), and so also
    the largest value the tier stores (reads are copied out of the registered one into a
    private buffer of the same size before anyone looks at them).
    integrity_key_file: the cluster integrity key (mooncake_integrity.py), a path checked
    here, read when the tier starts.
    """

    master_server_address: str
    local_hostname: str
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "tcp"
    rdma_devices: str = ""
    global_segment_size: int = 0
    local_buffer_size: int = 0
    timeout_s: float = 2.0
    queue_max_bytes: int = 256 * MIB
    transfer_buffer_bytes: int = 64 * MIB
    integrity_key_file: str | None = None

    def __post_init__(self):
        set_ = object.__setattr__
        if not isinstance(self.master_server_address, str) or not _host_port(
            self.master_server_address
        ):
            _fail("master_server_address", self.master_server_address, "'host:port'")
        if not isinstance(self.local_hostname, str) or not self.local_hostname.strip():
            _fail("local_hostname", self.local_hostname, "this node's address, e.g. '10.0.0.5'")
        endpoint = (
            _metadata_endpoint(self.metadata_server)
            if isinstance(self.metadata_server, str)
            else ("", 0)
        )
        if endpoint is not None and not endpoint[0]:
            _fail(
                "metadata_server",
                self.metadata_server,
                "'P2PHANDSHAKE' or 'http://host:port/metadata'",
            )
        if self.protocol not in PROTOCOLS:
            _fail("protocol", self.protocol, " or ".join(repr(p) for p in PROTOCOLS))
        if not isinstance(self.rdma_devices, str):
            _fail("rdma_devices", self.rdma_devices, "a string ('' for tcp)")
        for key, low, high in (
            ("global_segment_size", 0, 1 << 50),
            ("local_buffer_size", 0, 1 << 40),
            ("queue_max_bytes", 1, 1 << 40),
            ("transfer_buffer_bytes", MIB, 1 << 34),
        ):
            set_(self, key, _size(key, getattr(self, key), low, high))
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            _fail("timeout_s", timeout, "a number of seconds in (0, 600]")
        if not 0 < timeout <= 600:
            _fail("timeout_s", timeout, "a number of seconds in (0, 600]")
        set_(self, "timeout_s", float(timeout))
        path = self.integrity_key_file
        if path is not None and (not isinstance(path, str) or not path.strip() or "\0" in path):
            _fail(
                "integrity_key_file",
                path,
                "the path of a file of 32 random bytes, mode 0600 (or null)",
            )
        if path is not None:
            set_(self, "integrity_key_file", os.path.abspath(os.path.expanduser(path)))

    @classmethod
    def from_config(cls, config: dict) -> MooncakeOptions:
        """Options from the extra-config's `mooncake` object (MooncakeConfigError if bad)."""
        if not isinstance(config, dict):
            raise MooncakeConfigError(f"the mooncake option must be an object, got {config!r}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(config) - set(known))
        if unknown:
            _fail(unknown[0], config[unknown[0]], f"one of the keys {known}")
        for key in ("master_server_address", "local_hostname"):
            if key not in config:
                raise MooncakeConfigError(f"mooncake option {key!r} is required")
        return cls(**config)

    def endpoints(self) -> list[tuple[str, int]]:
        """The TCP endpoints setup() needs up: the master, and the metadata server if HTTP."""
        found = [_host_port(self.master_server_address)]
        metadata = _metadata_endpoint(self.metadata_server)
        if metadata is not None:
            found.append(metadata)
        return found


def _size(key: str, value, low: int, high: int) -> int:
    try:
        size = parse_bytes(value)
    except ValueError:
        size = None
    if size is None or not low <= size <= high:
        _fail(key, value, f"a byte count in [{low}, {high}] (an integer, or e.g. '256MiB')")
    return size
