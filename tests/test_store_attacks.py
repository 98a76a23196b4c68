"""Regression tests for the attack pass on the record store (issue 14): each reproduces an
attack for real (real files, real processes, a real small tmpfs where the tests run as root)
and checks that the store neither serves a wrong byte nor loses records it did not have to."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hicache_galahad.config.options import StoreOptions, default_root
from hicache_galahad.errors import ConfigError
from hicache_galahad.record import format as fmt
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore, ledger_repair, namespaces
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.layout import record_filename
from hicache_galahad.store.ledger_state import HEAD, MAGIC

REPO_ROOT = Path(__file__).resolve().parent.parent
ALICE = Namespace("alice", "model", "kv", {"page_bytes": 4096})
BOB = Namespace("bob", "model", "kv", {"page_bytes": 4096})
PAGE = 4096
RECORD_BYTES = PAGE + fmt.FIXED_HEADER_BYTES + 64  # one record on disk (64-hex key)


def key(index: int, label: str = "k") -> str:
    return f"{label}{index}".encode().hex().ljust(64, "0")[:64]


def page(index: int) -> bytes:
    return bytes([index % 251]) * PAGE


def fill(store, namespace, count, label="k"):
    store.register_namespace(namespace)
    for index in range(count):
        assert store.put(namespace, key(index, label), page(index))


def live_temp_file(store: RecordStore, record_key: str) -> Path:
    """A write in progress of `store`'s (live) process, as its writer names it."""
    path = Path(
        store.layout.new_temp_path(
            ALICE.dirname, record_filename(record_key), store.accounting.token
        )
    )
    path.write_bytes(b"in flight")
    return path


def records_of(root, namespace) -> list[str]:
    directory = Path(root) / "ns" / namespace.dirname
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".rec"))


def child(code: str, *args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A real, small tmpfs (root only); skipped with a reason otherwise."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


# ----------------------------------------------------------------------------- 1. budget


def test_a_floor_larger_than_the_filesystem_is_refused_at_start(tmp_path):
    with tmpfs(tmp_path / "fs", "4m") as root, pytest.raises(ConfigError, match="min_free_bytes"):
        RecordStore(str(root), min_free_bytes=64 << 20)


def test_a_ledger_rewritten_to_a_huge_number_never_empties_the_store(
    store_factory, tmp_path, monkeypatch
):
    root = str(tmp_path / "store")
    with store_factory(root, max_bytes=40 * RECORD_BYTES, durability="none") as store:
        fill(store, ALICE, 10)
        fill(store, BOB, 10)
        ledger = Path(root) / "ledger"

        def rewrite_ledger() -> None:
            data = bytearray(ledger.read_bytes())
            HEAD.pack_into(data, 0, MAGIC, 1 << 60, *HEAD.unpack_from(data, 0)[2:])
            ledger.write_bytes(bytes(data))

        # No recount since the open: the ledger is recounted from disk at once, nothing goes.
        rewrite_ledger()
        assert store.put(ALICE, key(99), page(99))
        assert len(records_of(root, ALICE)) == 11 and len(records_of(root, BOB)) == 10
        # Again before another recount is due: the put fails and deletes nothing ...
        rewrite_ledger()
        assert not store.put(ALICE, key(98), page(98))
        assert len(records_of(root, ALICE)) == 11 and len(records_of(root, BOB)) == 10
        assert store.stats().counter("budget_unreconciled") >= 1
        # ... and once it is due, the ledger is recounted from disk and the put succeeds.
        monkeypatch.setattr(ledger_repair, "LEDGER_REBUILD_INTERVAL_S", 0.0)
        assert store.put(ALICE, key(98), page(98))
        assert len(records_of(root, ALICE)) == 12 and len(records_of(root, BOB)) == 10
        assert store.usage_bytes() == store.parts.checker.disk_bytes()


def test_a_huge_sparse_file_under_the_root_is_accounted_by_what_it_occupies(
    store_factory, tmp_path
):
    root = str(tmp_path / "store")
    with store_factory(root, max_bytes=30 * RECORD_BYTES, durability="none") as store:
        fill(store, BOB, 20)
    sparse = Path(root) / "ns" / ALICE.dirname / record_filename(key(0, "sparse"))
    sparse.parent.mkdir(parents=True, exist_ok=True)
    with open(sparse, "wb") as handle:
        handle.truncate(1 << 40)  # claims a terabyte, occupies nothing
    # check=False: the sparse file stays, a record of no header (V2)
    with store_factory(root, check=False, max_bytes=30 * RECORD_BYTES, durability="none") as store:
        assert store.usage_bytes() < 30 * RECORD_BYTES
        fill(store, ALICE, 5)
        assert len(records_of(root, BOB)) == 20  # nothing had to go


RESERVE_AND_WAIT = """
import sys, time
from hicache_galahad.store import RecordStore
store = RecordStore(sys.argv[1], max_bytes=int(sys.argv[2]), durability="none")
assert store.budget.reserve(int(sys.argv[3]))
print("reserved", flush=True)
time.sleep(600)
"""


def test_reservations_of_sigkilled_writers_come_back_while_peers_run(
    store_factory, tmp_path, monkeypatch
):
    root = str(tmp_path / "store")
    cap = 40 * RECORD_BYTES
    with store_factory(root, max_bytes=cap, durability="none") as peer:
        fill(peer, ALICE, 10)
        writers = [child(RESERVE_AND_WAIT, root, cap, 4 * RECORD_BYTES) for _ in range(6)]
        for writer in writers:  # six writers hold 4 records' worth each: 60% of the cap ...
            assert writer.stdout.readline().strip() == "reserved", writer.stderr.read()
        for writer in writers:  # ... and die holding it
            kill(writer)
        assert peer.usage_bytes() >= 10 * RECORD_BYTES + 24 * RECORD_BYTES
        monkeypatch.setattr(ledger_repair, "LEDGER_REBUILD_INTERVAL_S", 0.0)
        fill(peer, BOB, 25)  # needs the leaked space: reclaimed, nothing of alice evicted
        assert len(records_of(root, ALICE)) == 10 and len(records_of(root, BOB)) == 25
        assert peer.usage_bytes() == peer.parts.checker.disk_bytes()
        assert os.listdir(Path(root) / "procs") == [f"{peer.accounting.token}.lock"]


# ----------------------------------------------------------------------------- 2. temp files


def test_purge_and_clearing_never_touch_a_live_writers_temp_file(store_factory, tmp_path):
    root = str(tmp_path / "store")
    # check=False: the made-up write in progress outlives its store, a stray temp file
    with store_factory(root, check=False, durability="none") as store:
        fill(store, ALICE, 3)
        live_temp = live_temp_file(store, key(7))
        assert store.clear_namespace(ALICE) == 3
        assert live_temp.exists()
        report = StoreAdmin(store).check(fix=True)
        assert live_temp.exists() and report.stray_temp_files == []
        assert not live_temp.name.endswith(".rec")


# ----------------------------------------------------------------------------- 3. ledger files


def test_a_deleted_or_truncated_ledger_is_rebuilt_while_the_store_runs(store_factory, tmp_path):
    root = str(tmp_path / "store")
    with store_factory(root, max_bytes=30 * RECORD_BYTES, durability="none") as store:
        fill(store, ALICE, 10)
        os.unlink(Path(root) / "ledger")
        assert store.put(ALICE, key(50), page(50))
        assert store.usage_bytes() == store.parts.checker.disk_bytes() == 11 * RECORD_BYTES
        with open(Path(root) / "ledger", "r+b") as ledger:
            ledger.truncate(3)
        assert store.put(ALICE, key(51), page(51))
        assert store.usage_bytes() == store.parts.checker.disk_bytes() == 12 * RECORD_BYTES


def test_a_deleted_process_lock_does_not_let_a_new_opener_remove_live_temp_files(
    store_factory, tmp_path
):
    root = str(tmp_path / "store")
    # check=False: the made-up write in progress outlives its store, a stray temp file
    with store_factory(root, check=False, durability="none") as first:
        fill(first, ALICE, 1)
        live_temp = live_temp_file(first, key(9))
        for lock in (Path(root) / "procs").iterdir():
            lock.unlink()
        with store_factory(root, durability="none"):
            assert live_temp.exists()


# ----------------------------------------------------------------------------- 4-6. odd files


def test_a_symlinked_quarantine_or_namespace_never_reaches_outside_the_root(
    store_factory, tmp_path
):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "precious.rec"
    victim.write_bytes(b"not yours")
    root = tmp_path / "store"
    with store_factory(root, durability="none") as store:
        fill(store, ALICE, 2)
    (root / "quarantine").rmdir()
    (root / "quarantine").symlink_to(outside)
    with pytest.raises(ConfigError, match="symbolic link"):
        RecordStore(str(root))
    (root / "quarantine").unlink()
    (root / "quarantine").mkdir()
    (root / "ns" / BOB.dirname).symlink_to(outside)  # a namespace directory pointing out
    with store_factory(root, max_bytes=3 * RECORD_BYTES, durability="none") as store:
        report = StoreAdmin(store).check(fix=True)
        store.clear_namespace(BOB)
        fill(store, ALICE, 6, label="more")  # evicts
        assert report.records == 2
    assert victim.read_bytes() == b"not yours"


def _in_thread(call, timeout_s=20):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", call()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the call hung"
    return result["value"]


def test_a_fifo_at_a_record_path_is_a_miss_and_never_hangs(store_factory, tmp_path):
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        fill(store, ALICE, 2)
        fifo = Path(root) / "ns" / ALICE.dirname / record_filename(key(5))
        os.mkfifo(fifo)
        assert not store.contains(ALICE, key(5))
        out = [bytearray(PAGE), bytearray(PAGE), bytearray(PAGE)]
        got = _in_thread(lambda: store.get_many_into(ALICE, [key(0), key(5), key(1)], out))
        assert got == [True, False, True]
        assert _in_thread(lambda: store.put(ALICE, key(5), page(5)))  # replaces the FIFO
        assert store.get(ALICE, key(5), PAGE) == page(5)
        os.unlink(Path(root) / "ns" / ALICE.dirname / record_filename(key(5)))
        os.mkfifo(fifo)
        report = _in_thread(lambda: StoreAdmin(store).check(fix=True))
        assert [problem[:2] for _, problem in report.damaged] == ["V0"]
        assert not fifo.exists()


def test_a_sound_record_of_the_wrong_size_is_never_read_whole(store_factory, tmp_path):
    root = str(tmp_path / "store")
    big = 64 << 20
    with store_factory(root, durability="none") as store:
        store.register_namespace(ALICE)
        assert store.put(ALICE, key(1), bytes(big))  # sound, but not a page of this pool
        rss_before = _rss_bytes()
        started = time.perf_counter()
        for _ in range(20):
            assert store.get(ALICE, key(1), PAGE) is None
        assert _rss_bytes() - rss_before < 16 << 20
        assert time.perf_counter() - started < 5  # checked once, then by its header only
        assert store.put(ALICE, key(1), page(1))  # a correct put replaces it
        assert store.get(ALICE, key(1), PAGE) == page(1)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ----------------------------------------------------------------------------- 7-8. namespaces

OPEN_AND_STAT_AS_NOBODY = """
import json, logging, os, sys
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
logging.basicConfig()
os.setgid(65534); os.setuid(65534)  # everything is imported: now drop root
with RecordStore(sys.argv[1], durability="none") as store:
    StoreAdmin(store).rebuild_ledger()  # a walk of every record (an open reads no record directory)
    print(json.dumps(store.stats().as_dict()))
"""


def test_an_unreadable_namespace_directory_is_skipped_with_a_warning(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to run the store as another user")
    shared = Path(tempfile.mkdtemp(prefix="galahad-shared-"))
    try:
        os.chmod(shared, 0o777)
        root = shared / "store"
        with RecordStore(str(root), durability="none") as store:
            fill(store, ALICE, 2)
            fill(store, BOB, 2)
        for path in [root, *root.rglob("*")]:
            os.chmod(path, 0o777 if path.is_dir() else 0o666)
        os.chmod(root / "ns" / ALICE.dirname, 0o000)  # another user's, unreadable to "nobody"
        result = subprocess.run(
            [sys.executable, "-c", OPEN_AND_STAT_AS_NOBODY, str(root)],
            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["unreadable_dirs"] >= 1
        assert "skipping" in result.stderr and "Traceback" not in result.stderr
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)


def test_a_deleted_or_edited_description_is_put_back_by_a_running_store(
    store_factory, tmp_path, monkeypatch
):
    root = str(tmp_path / "store")
    monkeypatch.setattr(namespaces, "DESCRIPTION_CHECK_INTERVAL_S", 0.0)
    with store_factory(root, durability="none") as store:
        fill(store, ALICE, 1)
        description = Path(root) / "ns" / ALICE.dirname / "namespace.json"
        description.unlink()
        assert store.put(ALICE, key(2), page(2))
        assert store.layout.load_namespace(ALICE.dirname) == ALICE
        description.write_text('{"tenant": "mallory"}')
        assert store.put(ALICE, key(3), page(3))
        assert store.layout.load_namespace(ALICE.dirname) == ALICE


# ----------------------------------------------------------------------------- 11. full disk


def test_a_full_disk_at_start_degrades_to_misses_and_cleans_up(tmp_path):
    with tmpfs(tmp_path / "fs", "1m") as root, RecordStore(str(root), durability="none") as store:
        filler = root / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as handle:
            while True:
                handle.write(b"\0" * 65536)
        namespace = store.register_namespace(ALICE)  # cannot write its description
        assert store.stats().counter("namespace_write_failures") == 1
        assert not store.put(namespace, key(1), page(1))
        assert store.get(namespace, key(1), PAGE) is None
        leftovers = [p.name for p in root.rglob("namespace.json.*")]
        assert leftovers == []
        filler.unlink()
        assert store.put(namespace, key(1), page(1))
        assert store.get(namespace, key(1), PAGE) == page(1)


# ----------------------------------------------------------------------------- 12-13. config


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_bytes": int("9" * 400)}, "max_bytes"),
        ({"max_bytes": "9" * 400}, "max_bytes"),
        ({"encryption_key_file": "/tmp/k\0ey"}, "encryption_key_file"),
        ({"io_threads": 0}, "io_threads"),
    ],
)
def test_bad_store_options_are_config_errors_naming_the_key(tmp_path, options, named):
    with pytest.raises(ConfigError, match=named):
        StoreOptions(str(tmp_path), **options)


def test_bad_roots_are_config_errors_naming_root(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    ns_is_a_file = tmp_path / "ns-file"
    ns_is_a_file.mkdir()
    (ns_is_a_file / "ns").write_text("x")
    for root in (str(a_file), str(dangling), str(ns_is_a_file), "/tmp/r\0oot"):
        with pytest.raises(ConfigError, match="root"):
            RecordStore(root)


def test_the_default_root_is_the_stores_own_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_root() == str(tmp_path / "galahad-kv")
    env_cache = Path(os.environ.get("GALAHAD_ENV_CACHE", Path.home() / ".cache/hicache-galahad"))
    assert not Path(default_root()).is_relative_to(env_cache)
