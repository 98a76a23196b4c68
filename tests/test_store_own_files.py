"""Regression tests for the second attack pass on the store's own files (issue 20, items 3, 6,
8, 9, 10, 13, 15 and 17): a linked `stats`, liveness across pid namespaces, FIFOs, devices,
links and giant sparse files among the ledger, locks and counter files, the flusher at a FIFO
and at interpreter exit, pids that do not fit, and what `galahad stats` counts.

Everything is real: files, FIFOs (os.mkfifo), symbolic links, device nodes where the tests run
as root, sparse files, subprocesses, a real pid namespace (unshare) where the kernel allows.
Every operation that could hang runs in a subprocess with a timeout or a thread with a join
timeout, so a regression fails instead of hanging the suite."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hicache_galahad.errors import ConfigError
from hicache_galahad.ops import cli
from hicache_galahad.ops import reports as ops
from hicache_galahad.record import format as fmt
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.layout import record_filename
from hicache_galahad.store.ledger_state import ENTRY, HEAD, MAGIC

REPO_ROOT = Path(__file__).resolve().parent.parent
ALICE = Namespace("alice", "model", "kv", {"page_bytes": 4096})
PAGE = 4096
RECORD_BYTES = PAGE + fmt.FIXED_HEADER_BYTES + 64  # one record on disk (64-hex key)
HANG_S = 30  # generous: every one of these operations takes well under a second


def key(index: int) -> str:
    return f"{index:064x}"


def fill(store: RecordStore, count: int, start: int = 0) -> None:
    store.register_namespace(ALICE)
    for index in range(start, start + count):
        assert store.put(ALICE, key(index), bytes([index % 251]) * PAGE)


def make_store(store_factory, count: int = 3, *, check: bool = True) -> Path:
    """A store of `count` records, closed; its root (check as store_factory takes it)."""
    with store_factory(durability="none", check=check) as store:
        fill(store, count)
    return Path(store.root)


def records_of(root: Path) -> list[str]:
    directory = root / "ns" / ALICE.dirname
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".rec"))


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO_ROOT))


def run_python(code: str, *args, timeout_s: float = HANG_S, **kwargs):
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=REPO_ROOT,
            env=_env(),
            **kwargs,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout_s} s (killed)")


def galahad(*args, timeout_s: float = HANG_S, **kwargs):
    return run_python(
        "import sys; from hicache_galahad.ops.cli import main; sys.exit(main(sys.argv[1:]))",
        *args,
        timeout_s=timeout_s,
        **kwargs,
    )


def galahad_json(*args) -> dict:
    result = galahad(*args, "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def snapshot(directory: Path) -> dict:
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.lstat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# Opens the store writable (what a server's start does), puts a record, prints what the
# ledger says and what the disk holds.
OPEN_AND_PUT = """
import json, sys
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
ns = Namespace("alice", "model", "kv", {"page_bytes": 4096})
with RecordStore(sys.argv[1], durability="none") as store:
    store.register_namespace(ns)
    ok = store.put(ns, "ff" * 32, bytes(4096))
    print(json.dumps({"put": ok, "ledger": store.usage_bytes(),
                      "disk": store.parts.checker.disk_bytes()}))
"""


def open_and_put(root: Path) -> dict:
    result = run_python(OPEN_AND_PUT, root)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    data = json.loads(result.stdout)
    assert data["put"] and data["ledger"] == data["disk"]
    return data


# ----------------------------------------------------------------------------- 3. linked stats


@pytest.mark.parametrize("linked", ["stats", "procs"])
def test_a_linked_stats_or_procs_is_refused_and_nothing_outside_is_touched(
    store_factory, tmp_path, linked
):
    root = make_store(store_factory)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("2024.json", "abc.json", "cafe.json", "0123.lock"):
        (outside / name).write_text('{"counters": {"hits": 7}}')
    before = snapshot(outside)
    shutil.rmtree(root / linked)
    (root / linked).symlink_to(outside)
    with pytest.raises(ConfigError, match="symbolic link"):
        RecordStore(str(root))
    for command in (["gc", "--max-bytes", "1"], ["purge", "--tenant", "alice"]):
        result = galahad(command[0], "--root", root, *command[1:])
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "symbolic link" in result.stderr
    # read-only, `stats` reads no counter file through the link
    assert galahad_json("stats", "--root", root)["lifetime_counters"].get("hits", 0) == 0
    assert snapshot(outside) == before
    assert len(records_of(root)) == 3


# ----------------------------------------------------------------------------- 6. liveness


def _forge_counter_file(root: Path, token: str, max_bytes: int, identity: dict | None) -> Path:
    document = {
        "counters": {"hits": 5},
        "updated_s": time.time(),
        "settings": {"pid": 1, "max_bytes": max_bytes, "min_free_bytes": 0},
    }
    if identity is not None:
        document["process"] = identity
    path = root / "stats" / f"{token}.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    "identity", [None, {"pid": 1, "pid_namespace": "pid:[1]", "start_ticks": 1}]
)
def test_the_budget_of_a_past_run_with_pid_1_is_never_applied_to_a_live_server(
    store_factory, tmp_path, identity
):
    """A container's run (pid 1 there) left its counter file and no lock; on the host pid 1
    is alive. Neither `stats` nor `gc` takes it for a live server."""
    root = tmp_path / "store"
    with store_factory(root, max_bytes=1 << 30, durability="none") as server:
        fill(server, 64)
        past = _forge_counter_file(root, "00000001" + "5eed5eed", 64 << 10, identity)
        report = galahad_json("stats", "--root", root)
        assert report["budget"]["max_bytes"] == 1 << 30
        assert [s["max_bytes"] for s in report["budget"]["servers"]] == [1 << 30]
        gc = galahad_json("gc", "--root", root)
        assert gc["evicted_files"] == 0
        assert len(records_of(root)) == 64
        assert not past.exists()  # folded by the writable open: its counters are kept
        assert galahad_json("stats", "--root", root)["lifetime_counters"]["hits"] >= 5


def _unshare_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


CONTAINER_RUN = """
import os, sys
from hicache_galahad.store import RecordStore
assert os.getpid() == 1, os.getpid()
RecordStore(sys.argv[1], max_bytes=64 << 10, durability="none").close()  # a run that ended
"""


def test_a_run_in_a_real_pid_namespace_leaves_no_budget_behind(store_factory, tmp_path):
    if not _unshare_available():
        pytest.skip("no pid namespaces here (unshare --pid needs privileges)")
    root = tmp_path / "store"
    with store_factory(root, max_bytes=1 << 30, durability="none") as server:
        fill(server, 64)
        container = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", CONTAINER_RUN]
            + [str(root)],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            env=_env(),
        )
        assert container.returncode == 0, container.stderr
        report = galahad_json("stats", "--root", root)
        assert [s["max_bytes"] for s in report["budget"]["servers"]] == [1 << 30]
        assert galahad_json("gc", "--root", root)["evicted_files"] == 0
        assert len(records_of(root)) == 64


def test_a_live_server_whose_lock_was_deleted_is_still_a_live_server(store_factory, tmp_path):
    root = tmp_path / "store"
    with store_factory(root, max_bytes=1 << 30, durability="none") as server:
        fill(server, 4)
        for lock in (root / "procs").iterdir():
            lock.unlink()
        report = galahad_json("stats", "--root", root)  # the identity it recorded tells
        assert [s["max_bytes"] for s in report["budget"]["servers"]] == [1 << 30]


# ----------------------------------------------------------------------------- 8. FIFOs


@pytest.mark.parametrize(
    "where",
    [
        "procs/0123456789abcdef.lock",
        "stats/0123456789abcdef.json",
        "stats/x.json",
        "stats/lifetime.json",
        "stats/lifetime.json.lock",
        "ledger",
    ],
)
def test_a_fifo_among_the_stores_files_never_hangs_a_start(store_factory, where):
    root = make_store(store_factory)
    fifo = root / where
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    data = open_and_put(root)  # a hang is a failure after HANG_S, not a hung suite
    assert data["disk"] == 4 * RECORD_BYTES
    if where == "ledger":  # replaced by a regular ledger, recounted from disk
        assert stat.S_ISREG((root / "ledger").lstat().st_mode)


@pytest.mark.parametrize(
    ("command", "where"),
    [
        ("stats", "stats/x.json"),
        ("stats", "stats/0123456789abcdef.json"),
        ("stats", "stats/lifetime.json"),
        ("stats", "ledger"),
        ("verify", "ledger"),
    ],
)
def test_a_fifo_never_hangs_a_read_only_command(store_factory, command, where):
    root = make_store(store_factory, check=False)  # a read-only command leaves the FIFO
    fifo = root / where
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    result = galahad(command, "--root", root)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # read-only: left where it is


# ----------------------------------------------------------------------------- 9. flusher


def test_a_record_replaced_by_a_fifo_in_the_flush_window_never_blocks_the_flusher(
    store_factory, tmp_path
):
    root = tmp_path / "store"
    # check=False: a FIFO is left in a record's place
    store = store_factory(root, check=False, durability="deferred", flush_interval_s=0.2)
    fill(store, 1)
    path = root / "ns" / ALICE.dirname / record_filename(key(0))
    fifo = path.with_name("swap.fifo")
    os.mkfifo(fifo)
    os.replace(fifo, path)
    try:
        deadline_s = time.monotonic() + 5
        while store.flusher.pending and time.monotonic() < deadline_s:
            time.sleep(0.05)
        assert store.flusher.pending == 0, "the flusher is blocked on the FIFO"
        closer = threading.Thread(target=store.close, daemon=True)
        started_s = time.monotonic()
        closer.start()
        closer.join(15)
        assert not closer.is_alive(), "close() blocked"
        assert time.monotonic() - started_s < 5
    finally:  # the old code's flusher waits in open(): a writer lets it go
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_close_is_bounded_even_when_an_fsync_never_returns(tmp_path, monkeypatch):
    """An fsync stuck in the kernel (a dead disk) cannot be made for real: injected."""
    from hicache_galahad.store.flusher import Flusher
    from hicache_galahad.telemetry.metrics import Counters

    (tmp_path / "a.rec").write_bytes(b"x")
    release = threading.Event()
    real_fsync = os.fsync

    def stuck_fsync(fd):
        release.wait(60)
        real_fsync(fd)

    flusher = Flusher(0.05, Counters())
    monkeypatch.setattr(os, "fsync", stuck_fsync)
    try:
        dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        flusher.add(dir_fd, str(tmp_path), ["a.rec"])
        os.close(dir_fd)
        time.sleep(0.3)  # the background flush is now stuck in fsync
        errors = []

        def close():
            try:
                flusher.close(timeout_s=1.0)
            except BaseException as error:
                errors.append(error)

        started_s = time.monotonic()
        closer = threading.Thread(target=close, daemon=True)
        closer.start()
        closer.join(10)
        assert not closer.is_alive() and not errors, errors
        assert time.monotonic() - started_s < 3
    finally:
        release.set()


# ----------------------------------------------------------------------------- 10. exit

# Puts records and exits without close(). The hook printing the counters is registered
# before the store exists, so it runs after the store's own exit hooks (atexit is LIFO).
EXIT_WITHOUT_CLOSE = """
import atexit, json, sys, threading, time
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
held = {}
atexit.register(lambda: print(json.dumps(held["store"].counters.snapshot())))
ns = Namespace("alice", "model", "kv", {"page_bytes": 4096})
store = held["store"] = RecordStore(sys.argv[1], flush_interval_s=float(sys.argv[2]))
store.register_namespace(ns)
def work(count, pause_s):
    for index in range(count):
        assert store.put(ns, f"{index:064x}", bytes([index % 251]) * 4096)
        time.sleep(pause_s)
if sys.argv[3] == "main":
    work(8, 0)
else:  # a thread still writing while the interpreter exits (a server's threads do)
    threading.Thread(target=work, args=(40, 0.01)).start()
"""


@pytest.mark.parametrize(
    ("interval_s", "writer", "records"), [(60.0, "main", 8), (0.05, "thread", 40)]
)
def test_a_process_that_exits_without_close_flushes_its_last_window(
    tmp_path, interval_s, writer, records
):
    result = run_python(EXIT_WITHOUT_CLOSE, tmp_path / "store", interval_s, writer)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "RuntimeError" not in result.stderr, result.stderr
    counters = json.loads(result.stdout.strip().splitlines()[-1])
    assert counters.get("flushed_records", 0) == records  # every record fsynced once
    assert counters.get("flush_errors", 0) == 0


# ----------------------------------------------------------------------------- 13. odd pids


def test_counter_and_temp_files_of_pids_that_do_not_fit_are_junk_not_a_traceback(store_factory):
    root = make_store(store_factory)
    counter = root / "stats" / "ffffffff00000000.json"
    counter.write_text(json.dumps({"counters": {"hits": 3}, "settings": {"max_bytes": 1}}))
    temp = root / "ns" / ALICE.dirname / ".tmp-99999999999-0000-x.part"
    temp.write_bytes(b"left by nobody")
    description_temp = root / "ns" / ALICE.dirname / "namespace.json.99999999999.1.tmp"
    description_temp.write_text("{}")
    verify = galahad("verify", "--root", root, "--json")  # read-only: a stray temp reported
    assert verify.returncode == 1 and "Traceback" not in verify.stderr, verify.stderr
    assert json.loads(verify.stdout)["stray_temp_files"] == [str(temp)]
    assert galahad_json("stats", "--root", root)["budget"]["max_bytes"] is None
    with store_factory(root, durability="none", max_bytes=6 * RECORD_BYTES) as store:
        assert not counter.exists()
        # a recount sweeps them (an open reads no record directory)
        StoreAdmin(store).rebuild_ledger()
        assert not temp.exists()
        temp.write_bytes(b"left by nobody")
        assert StoreAdmin(store).rebuild_ledger() == 3 * RECORD_BYTES
        assert not temp.exists()
        temp.write_bytes(b"left by nobody")
        assert StoreAdmin(store).check(fix=True).stray_temp_files == [str(temp)]
        store.register_namespace(ALICE)
        keys = [key(100 + index) for index in range(5)]
        assert store.put_many(ALICE, keys, [bytes(PAGE)] * 5) == [True] * 5
    assert galahad("verify", "--root", root).returncode == 0


def test_a_namespace_description_temp_is_judged_by_its_age_not_a_pid(store_factory):
    """namespace.json temp files were named and judged by pid: a writer in another pid
    namespace whose pid is dead here had its temp removed while writing it. Now a temp is
    removed only when a minute old (writing one takes milliseconds), whatever its name."""
    root = make_store(store_factory)
    directory = root / "ns" / ALICE.dirname
    fresh = directory / "namespace.json.99999999999.1.tmp"  # a pid that is dead here
    old = directory / "namespace.json.0123456789abcdef.tmp"
    fresh.write_text("{}")
    old.write_text("{}")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    with store_factory(root, durability="none") as store:
        store.register_namespace(ALICE)
    assert fresh.exists() and not old.exists()
    assert not [p for p in directory.glob("namespace.json.*") if p not in (fresh,)]


def _write_ledger(root: Path, committed: int, entries: list[tuple[bytes, int]]) -> None:
    raw = HEAD.pack(MAGIC, committed, len(entries), 0)
    raw += b"".join(ENTRY.pack(token, reserved) for token, reserved in entries)
    (root / "ledger").write_bytes(raw)


@pytest.mark.parametrize(
    "token",
    [
        bytes([b"0"[0] ^ 0x08]) + b"0000000deadbeef",  # one flipped bit: "8000..."
        b"0000/000\x00eadbeef",
        b"\xff" * 16,
    ],
)
def test_a_ledger_token_with_a_flipped_bit_is_damage_recounted(store_factory, token):
    root = make_store(store_factory)
    _write_ledger(root, 3 * RECORD_BYTES, [(token, 1 << 30)])
    result = galahad("stats", "--root", root)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    with store_factory(root, durability="none", max_bytes=8 * RECORD_BYTES) as store:
        assert store.usage_bytes() == 3 * RECORD_BYTES  # the forged reservation is gone
        fill(store, 2, start=10)
        assert store.usage_bytes() == store.parts.checker.disk_bytes() == 5 * RECORD_BYTES


def test_a_ledger_that_is_a_directory_is_a_one_line_refusal(store_factory):
    root = make_store(store_factory, check=False)  # the ledger stays a directory
    (root / "ledger").unlink()
    (root / "ledger").mkdir()
    with pytest.raises(ConfigError, match="ledger"):
        RecordStore(str(root))
    result = galahad("gc", "--root", root, "--max-bytes", "1")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert not list((root / "procs").iterdir())  # its lock did not stay behind


def test_an_unexpected_failure_of_a_command_is_one_line_with_its_own_status(
    store_factory, monkeypatch, capsys
):
    """A bug cannot be produced for real on purpose: injected into `stats`."""
    root = make_store(store_factory)

    def broken(store, **options):
        raise OverflowError("signed integer is greater than maximum")

    monkeypatch.setattr(ops, "stats_report", broken)
    status = cli.main(["stats", "--root", str(root)])
    err = capsys.readouterr().err
    assert status == cli.EXIT_UNEXPECTED == 4
    assert err.count("\n") == 1 and "OverflowError" in err


# ----------------------------------------------------------------------------- 15. bounded reads


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_a_counter_file_linked_to_dev_zero_or_huge_and_sparse_is_never_read_whole(store_factory):
    root = make_store(store_factory)
    (root / "stats" / "z.json").symlink_to("/dev/zero")
    with open(root / "stats" / "big.json", "wb") as big:
        big.truncate(3 << 30)
    with open(root / "stats" / "0123456789abcdef.json", "wb") as big:
        big.truncate(3 << 30)
    result = galahad("stats", "--root", root, "--json", preexec_fn=_limit_memory)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert json.loads(result.stdout)["records"] == 3
    result = run_python(OPEN_AND_PUT, root, preexec_fn=_limit_memory)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert not (root / "stats" / "z.json").is_symlink()  # junk in stats: folded away
    assert Path("/dev/zero").exists()


# ----------------------------------------------------------------------------- 17. what stats counts


def test_stats_counts_regular_records_as_the_ledger_does_and_lists_the_rest_apart(store_factory):
    root = make_store(store_factory, check=False)  # non-records left
    directory = root / "ns" / ALICE.dirname
    os.mkfifo(directory / ("a" * 64 + ".rec"))
    (directory / ("b" * 64 + ".rec")).mkdir()
    (directory / ("c" * 64 + ".rec")).symlink_to(directory / record_filename(key(0)))
    kinds = {"fifo", "directory", "symbolic link"}
    with contextlib.suppress(PermissionError):
        os.mknod(directory / ("d" * 64 + ".rec"), stat.S_IFCHR | 0o600, os.makedev(1, 5))
        kinds.add("character device")
    with open(directory / ("e" * 64 + ".rec"), "wb") as sparse:  # bad magic, 8 GiB claimed
        sparse.write(b"NOTMAGIC" * 512)
        sparse.truncate(8 << 30)
    with store_factory(root, durability="none") as store:  # files put there by hand are
        # known once recounted (an open reads no record directory)
        StoreAdmin(store).rebuild_ledger()
    kept = galahad_json("stats", "--root", root)  # the ledger's counts: regular files only
    assert kept["records"] == 4 and kept["logical_bytes"] == 3 * PAGE
    report = galahad_json("stats", "--root", root, "--exact")  # a walk: it also sees the rest
    assert report["records"] == 4  # 3 records and the damaged regular file
    assert report["disk_bytes"] == report["budget"]["ledger_bytes"] == kept["disk_bytes"]
    assert report["disk_bytes"] < 4 * RECORD_BYTES + 64 * 1024
    assert report["logical_bytes"] == 3 * PAGE
    assert {item["kind"] for item in report["not_records"]} == kinds
    assert report["namespaces"][0]["unreadable_headers"] == 1
    text = galahad("stats", "--root", root, "--exact").stdout
    assert "GiB on disk" not in text.splitlines()[0] and "not a record (fifo)" in text


def test_a_temp_file_is_judged_by_its_writers_token_only():
    """A temp file's writer is the store token in its name, alive while its lock is held; a
    name without a token (a pid, anything else) has no writer: stale at once, even when a
    process of that pid is alive (pids are reused, and are another namespace's)."""
    from hicache_galahad.store.layout import TEMP_PREFIX, FileEntry, temp_is_stale

    def entry(writer: str, age_s: float = 0.0) -> FileEntry:
        name = f"{TEMP_PREFIX}{writer}-{'ab' * 32}.rec"
        mtime_ns = int((time.time() - age_s) * 1e9)
        return FileEntry("d", name, "/x/" + name, 1, 1, mtime_ns, 1)

    token = "0123456789abcdef"
    assert not temp_is_stale(entry(token), lambda t: t == token)
    assert temp_is_stale(entry(token), lambda t: False)
    assert temp_is_stale(entry(token, age_s=2 * 86400), lambda t: True)  # a day old: stale
    assert temp_is_stale(entry(str(os.getpid())), lambda t: True)  # a live pid: no writer
    assert temp_is_stale(entry("not-a-token"), lambda t: True)
