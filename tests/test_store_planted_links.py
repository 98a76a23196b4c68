"""Regression tests for issue 32, item 1 (the ledger's and the process locks' parts): a
co-tenant who can write in the root plants a hard link, at the name of a temp file the store is
about to create, to a file outside the root. O_NOFOLLOW stops a symbolic link, not a hard link;
before the fix the ledger's temp (`ledger.<token>.new`), a process lock being made
(`procs/<token>.lock.new`) and namespace.json's temp were opened with O_CREAT|O_TRUNC, so the
file outside was truncated, and in the ledger's case became the live ledger. Every temp file is
now created exclusively (O_EXCL) under an unpredictable name.

Everything is real: files, hard links, a FIFO where the ledger should be. The only thing put in
by hand is the name a temp file will take (os.urandom made predictable), which a real attacker
can only guess: that is the injected fault of the namespace.json test."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.layout import StoreLayout
from hicache_galahad.store.ledger import Ledger
from hicache_galahad.store.ledger_file import ABANDONED_TEMP_AGE_S
from hicache_galahad.store.liveness import ABANDONED_LOCK_AGE_S, ProcessLock

ALICE = Namespace("alice", "model", "kv", {"page_bytes": 4096})
SECRET = b"the operator's file outside the store root\n" * 10


def outside_file(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(SECRET)
    return victim


def test_a_hard_link_at_the_ledgers_temp_name_is_never_truncated_nor_made_the_ledger(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    victim = outside_file(tmp_path)
    process = ProcessLock(str(root))  # its token is readable by anyone in procs/
    try:
        os.link(victim, root / f"ledger.{process.token}.new")  # the old temp's name
        os.mkfifo(root / "ledger")  # something that is no ledger: the ledger is replaced
        ledger = Ledger(str(root / "ledger"), process)
        try:
            assert ledger.reserve(12345, None)
        finally:
            ledger.close()
        assert victim.read_bytes() == SECRET
        assert os.stat(root / "ledger").st_ino != os.stat(victim).st_ino
        assert sorted(p.name for p in root.iterdir() if p.name.startswith("ledger.")) == [
            f"ledger.{process.token}.new"  # the planted link, left as it was
        ]
    finally:
        process.close()


def test_a_hard_link_at_a_process_locks_temp_name_is_never_truncated(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    victim = outside_file(tmp_path)
    process = ProcessLock(str(root))
    try:
        procs = root / "procs"
        (procs / f"{process.token}.lock").unlink()  # a co-tenant deletes the live lock...
        os.link(victim, procs / f"{process.token}.lock.new")  # ...and plants the old temp name
        process.ensure()  # the lock is made again (as at every rebuild)
        assert victim.read_bytes() == SECRET
        lock = procs / f"{process.token}.lock"
        assert lock.is_file() and os.stat(lock).st_ino != os.stat(victim).st_ino
        assert process.is_alive(process.token)
        assert ProcessLock(str(root)).is_alive(process.token)  # another process sees it held
    finally:
        process.close()


def test_a_process_lock_abandoned_while_being_made_is_removed(tmp_path):
    """A process killed between creating its lock's temp file and renaming it leaves a
    `<token>.<random>.lock.new`: removed once a minute old and unlocked, never before."""
    root = tmp_path / "root"
    root.mkdir()
    process = ProcessLock(str(root))
    try:
        procs = root / "procs"
        old = procs / f"{'0badc0de5eed5eed'}.{'ab' * 8}.lock.new"
        fresh = procs / f"{'0badc0de5eed5eee'}.{'cd' * 8}.lock.new"
        old.write_bytes(b"")
        fresh.write_bytes(b"")
        past_s = time.time() - ABANDONED_LOCK_AGE_S - 5
        os.utime(old, (past_s, past_s))
        process.remove_abandoned()
        assert not old.exists() and fresh.exists()
        assert (procs / f"{process.token}.lock").exists()
    finally:
        process.close()


def test_a_hard_link_at_namespace_json_temp_name_is_never_written_through(tmp_path, monkeypatch):
    """namespace.json's temp name was already random but opened without O_EXCL: a name that
    exists (guessed, or planted by a co-tenant who learned it) was truncated and written."""
    root = tmp_path / "root"
    victim = outside_file(tmp_path)
    layout = StoreLayout(str(root))
    layout.prepare(read_only=False, min_free_bytes=0)
    directory = root / "ns" / ALICE.dirname
    directory.mkdir()
    guessed = bytes(8)
    os.link(victim, directory / f"namespace.json.{guessed.hex()}.tmp")
    counter = itertools.count(1)
    monkeypatch.setattr(os, "urandom", lambda n: guessed if next(counter) == 1 else os.getrandom(n))
    try:
        layout.write_namespace(ALICE, durable=False)
    finally:
        monkeypatch.undo()
        layout.close()
    assert victim.read_bytes() == SECRET
    assert StoreLayout(str(root)).load_namespace(ALICE.dirname) == ALICE
    with RecordStore(str(root), durability="none") as store:  # a store still serves it
        store.register_namespace(ALICE)
        assert store.put(ALICE, "k", b"x" * 4096)
        assert store.get(ALICE, "k", 4096) == b"x" * 4096


def test_a_ledger_temp_abandoned_by_a_dead_process_is_removed_at_a_rebuild(tmp_path):
    """A process killed between creating the ledger's temp and renaming it over what was at
    `ledger` leaves `ledger.<token>.<random>.new`: removed by a rebuild once a minute old,
    never before (another process may be renaming its own right now)."""
    root = tmp_path / "root"
    with RecordStore(str(root), durability="none") as store:
        old = root / f"ledger.0badc0de5eed5eed.{'ab' * 8}.new"
        fresh = root / f"ledger.0badc0de5eed5eee.{'cd' * 8}.new"
        old.write_bytes(b"")
        fresh.write_bytes(b"")
        past_s = time.time() - ABANDONED_TEMP_AGE_S - 5
        os.utime(old, (past_s, past_s))
        StoreAdmin(store).rebuild_ledger()
        assert not old.exists() and fresh.exists()
