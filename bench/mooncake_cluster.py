"""A real Mooncake Store cluster on loopback for tests and benchmarks: one master and one store
daemon. The tests import it as `bench.mooncake_cluster`, as the benchmarks do; pytest is imported
only by the two helpers that need it.

`MooncakeCluster` starts `mooncake_master` and a dedicated `mooncake_client` daemon (which holds
the memory; test clients are pure clients) on free 127.0.0.1 ports, each in its own process
group with its log in the cluster's directory, and can SIGKILL or restart either. Every process
it starts is killed by process group in `stop()`, which the fixture and an atexit hook call.

    cluster = mooncake_cluster_fixture(segment_bytes=64 << 20)   # a pytest fixture

The cluster has an integrity key file (`integrity_key_file`, 32 random bytes, mode 0600), which
`tier_config()` names, as every server of a real cluster would (a shared tier without a key, or
encryption, is refused); `tier_config(integrity_key_file=None)` leaves it out.

`mooncake_missing()` names what is missing (package, libibverbs) and `skip_unless_mooncake()`
skips on it (fails under GALAHAD_REQUIRE_MOONCAKE=1). `RawClient` writes arbitrary values under
arbitrary keys, as a hostile or buggy peer would. The processes also die with the test process
(PR_SET_PDEATHSIG), so a SIGKILLed pytest leaves none behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

BIND_ADDRESS = "127.0.0.1"
ENV = {"MC_TCP_BIND_ADDRESS": BIND_ADDRESS}
_running: set[int] = set()  # process-group ids started here and not yet reaped


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def mooncake_missing() -> str | None:
    """Why a real Mooncake cluster cannot run here, or None when it can."""
    package = _package_dir()
    if package is None:
        return "mooncake-transfer-engine-non-cuda is not installed (pip install the mooncake extra)"
    for binary in ("mooncake_master", "mooncake_client"):
        if not os.access(package / binary, os.X_OK):
            return f"{package / binary} is missing or not executable"
    try:
        import mooncake.store  # noqa: F401
    except ImportError as error:
        if "libibverbs" in str(error):
            return f"libibverbs1 is missing (apt-get install -y libibverbs1): {error}"
        return f"mooncake.store does not import: {error}"
    return None


def mooncake_available() -> bool:
    return mooncake_missing() is None


def skip_unless_mooncake() -> None:
    """Skips the test when Mooncake cannot run here; fails it instead under
    GALAHAD_REQUIRE_MOONCAKE=1 (CI, where the set-up installs it, must not skip silently)."""
    import pytest

    missing = mooncake_missing()
    if missing and os.environ.get("GALAHAD_REQUIRE_MOONCAKE") == "1":
        pytest.fail(f"GALAHAD_REQUIRE_MOONCAKE=1 but {missing}")
    if missing:
        pytest.skip(missing)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((BIND_ADDRESS, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@atexit.register
def _kill_leftovers() -> None:
    for pgid in list(_running):
        _kill_group(pgid)


class MooncakeCluster:
    """A master plus one store daemon of `segment_bytes` on 127.0.0.1, started by start()."""

    def __init__(
        self,
        workdir: Path,
        *,
        segment_bytes: int = 256 << 20,
        client_ttl_s: int = 2,
        lease_ttl_ms: int = 5000,
    ):
        missing = mooncake_missing()
        if missing:
            raise RuntimeError(missing)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.client_ttl_s = client_ttl_s
        self.lease_ttl_ms = lease_ttl_ms
        self.master_port = free_port()
        self.metrics_port = free_port()
        self.daemon_port = free_port()
        self.master: subprocess.Popen | None = None
        self.daemon: subprocess.Popen | None = None
        self._bin = _package_dir()
        self._starts = 0
        self.integrity_key_file = self.workdir / "integrity.key"
        self.integrity_key_file.write_bytes(os.urandom(32))
        self.integrity_key_file.chmod(0o600)

    @property
    def master_address(self) -> str:
        return f"{BIND_ADDRESS}:{self.master_port}"

    def tier_config(self, **overrides) -> dict:
        """A `mooncake` extra-config object for a pure client of this cluster."""
        config = {
            "master_server_address": self.master_address,
            "metadata_server": "P2PHANDSHAKE",
            "protocol": "tcp",
            "local_hostname": BIND_ADDRESS,
            "global_segment_size": 0,
            "local_buffer_size": 0,
            "timeout_s": 2,
            "integrity_key_file": str(self.integrity_key_file),
        }
        config.update(overrides)
        return {key: value for key, value in config.items() if value is not None}

    def tagged(self, name: str, record: bytes) -> bytes:
        """`record` as a server of this cluster stores it under Mooncake key `name`: with its
        integrity tag (what a buggy peer holding the key, or a replay of one, would put)."""
        from hicache_galahad.tier.mooncake.integrity import ValueTag

        return record + ValueTag(self.integrity_key_file.read_bytes()).tag(name, record)

    # -- processes --------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self._starts += 1
        log = open(self.workdir / f"{name}-{self._starts}.log", "wb")  # noqa: SIM115
        env = dict(os.environ, **ENV)
        with log:
            process = subprocess.Popen(
                [str(self._bin / name), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        _running.add(process.pid)
        return process

    def start(self, timeout_s: float = 20.0) -> MooncakeCluster:
        self.start_master(timeout_s)
        self.start_daemon(timeout_s)
        return self

    def start_master(self, timeout_s: float = 20.0) -> None:
        self.master = self._spawn(
            "mooncake_master",
            [
                f"--rpc_address={BIND_ADDRESS}",
                f"--rpc_port={self.master_port}",
                f"--metrics_host={BIND_ADDRESS}",
                f"--metrics_port={self.metrics_port}",
                f"--client_ttl={self.client_ttl_s}",
                f"--default_kv_lease_ttl={self.lease_ttl_ms}",
                "--logtostderr",
            ],
        )
        self._wait(lambda: "service_ready=true" in self._summary(), self.master, timeout_s)

    def start_daemon(self, timeout_s: float = 20.0) -> None:
        """Starts the store daemon and waits until the master counts its segment."""
        before = self.capacity_bytes()
        self.daemon = self._spawn(
            "mooncake_client",
            [
                f"--global_segment_size={self.segment_bytes}",
                f"--host={BIND_ADDRESS}",
                f"--port={self.daemon_port}",
                f"--master_server_address={self.master_address}",
                "--metadata_server=P2PHANDSHAKE",
                "--protocol=tcp",
                "--logtostderr",
            ],
        )
        self._wait(
            lambda: self.capacity_bytes() >= before + self.segment_bytes, self.daemon, timeout_s
        )

    def kill_master(self) -> None:
        self.master = self._kill(self.master)

    def kill_daemon(self) -> None:
        self.daemon = self._kill(self.daemon)

    def restart_master(self, timeout_s: float = 20.0) -> None:
        """SIGKILLs the master and starts a new one on the same ports (it starts empty)."""
        self.kill_master()
        self.start_master(timeout_s)

    def wait_capacity(self, at_least: int, timeout_s: float = 20.0) -> None:
        """Waits until the master counts at least this many segment bytes (daemons re-mount)."""
        self._wait(lambda: self.capacity_bytes() >= at_least, self.master, timeout_s)

    def stop(self) -> None:
        for process in (self.daemon, self.master):
            self._kill(process, signal.SIGTERM)
        self.daemon = self.master = None

    def _kill(self, process: subprocess.Popen | None, sig: int = signal.SIGKILL) -> None:
        if process is None:
            return None
        _kill_group(process.pid, sig)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait(timeout=5)
        _kill_group(process.pid)  # anything else left in the group
        _running.discard(process.pid)
        return None

    # -- observation --------------------------------------------------------------------------

    def _summary(self) -> str:
        url = f"http://{BIND_ADDRESS}:{self.metrics_port}/metrics/summary"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return response.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def capacity_bytes(self) -> int:
        """The segment bytes the master counts (0 when it does not answer)."""
        url = f"http://{BIND_ADDRESS}:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                text = response.read().decode("utf-8", "replace")
        except OSError:
            return 0
        match = re.search(r"^master_total_capacity_bytes (\d+)", text, re.MULTILINE)
        return int(match.group(1)) if match else 0

    def _wait(self, ready, process: subprocess.Popen | None, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if process is not None and process.poll() is not None:
                raise RuntimeError(
                    f"mooncake process exited ({process.returncode}); logs in {self.workdir}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"mooncake not ready after {timeout_s} s; logs in {self.workdir}"
                )
            time.sleep(0.05)


def mooncake_cluster_fixture(scope: str = "function", **cluster_options):
    """A pytest fixture yielding a started MooncakeCluster, stopped afterwards (also on failure).

    Skips with the reason when Mooncake cannot run here. Sets MC_TCP_BIND_ADDRESS for the test
    process too, so tiers and raw clients made in it publish 127.0.0.1.
    """
    import pytest

    @pytest.fixture(scope=scope)
    def cluster(tmp_path_factory):
        skip_unless_mooncake()
        previous = os.environ.get("MC_TCP_BIND_ADDRESS")
        os.environ.update(ENV)
        instance = MooncakeCluster(tmp_path_factory.mktemp("mooncake"), **cluster_options)
        try:
            yield instance.start()
        finally:
            instance.stop()
            if previous is None:
                os.environ.pop("MC_TCP_BIND_ADDRESS", None)
            else:
                os.environ["MC_TCP_BIND_ADDRESS"] = previous

    return cluster


class RawClient:
    """A plain Mooncake client in this process: writes anything under any key, no checks.

    Only for a cluster whose master is up (Mooncake's setup() blocks ~90 s, holding the GIL,
    when it is not).
    """

    def __init__(self, cluster: MooncakeCluster):
        from mooncake.store import MooncakeDistributedStore

        os.environ.update(ENV)
        self.store = MooncakeDistributedStore()
        code = self.store.setup(
            BIND_ADDRESS, "P2PHANDSHAKE", 0, 64 << 20, "tcp", "", cluster.master_address
        )
        if code != 0:
            raise RuntimeError(f"Mooncake setup() failed with {code}")

    def put(self, key: str, value: bytes) -> int:
        """Mooncake's put: 0 on success; keeps an existing key's value."""
        return self.store.put(key, value)

    def replace(self, key: str, value: bytes) -> int:
        """Removes any value under key (ignoring leases), then puts this one."""
        self.store.remove(key, True)
        return self.store.put(key, value)

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def exists(self, key: str) -> bool:
        return self.store.is_exist(key) == 1

    def remove(self, key: str) -> int:
        return self.store.remove(key, True)

    def close(self) -> None:
        self.store.close()
