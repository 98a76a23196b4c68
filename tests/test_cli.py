"""The `galahad` command, through subprocesses, on real stores written by the real backend:
healthy, damaged, empty, missing and encrypted; read-only commands change nothing on disk."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sglang.srt.mem_cache.hicache_storage import PoolName
from support.records import chain_keys, write_key_file
from support.sglang_pools import create_galahad, mamba_pool, mha_pool, slots_of, transfer

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_galahad(*args, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hicache_galahad", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
    )


def as_json(result: subprocess.CompletedProcess) -> dict:
    assert result.stderr.strip() == "" or "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def write_store(root: Path, tenant: str = "alice", pages: int = 6, **options):
    """Records written by GalahadStorage itself: KV pages and Mamba states."""
    kv = mha_pool()
    backend = create_galahad(root, kv, {PoolName.MAMBA: mamba_pool()}, tenant=tenant, **options)
    keys = chain_keys(pages, tenant)
    assert backend.batch_set_v1(keys, slots_of(range(pages), 4)) == [True] * pages
    assert backend.batch_set_v2([transfer(PoolName.MAMBA, keys[:2], [0, 1])]) == {
        "mamba": [True, True]
    }
    backend.close()
    return keys


def snapshot(root: Path) -> dict:
    """Every file's bytes and modification time (what a read-only command must not change)."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        found[str(path.relative_to(root))] = (digest, info.st_mtime_ns, info.st_mode)
    return found


def records(root: Path) -> list[Path]:
    return sorted(p for p in (root / "ns").rglob("*.rec") if not p.name.startswith("."))


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- healthy


def test_stats_on_a_healthy_store(tmp_path):
    root = tmp_path / "store"
    write_store(root, "alice")
    write_store(root, "bob", pages=3)
    report = as_json(run_galahad("stats", "--root", root, "--json"))
    by_tenant = {}
    for ns in report["namespaces"]:
        by_tenant.setdefault(ns["tenant"], {})[ns["pool"]] = ns
    assert by_tenant["alice"]["kv"]["records"] == 6 and by_tenant["bob"]["kv"]["records"] == 3
    assert by_tenant["alice"]["mamba"]["records"] == 2
    kv = by_tenant["alice"]["kv"]
    assert kv["logical_bytes"] == 6 * mha_pool().get_dummy_flat_data_page().numel() * 2
    assert kv["disk_bytes"] > kv["logical_bytes"] and kv["newest_record_s"] <= time.time()
    assert report["counts"] == "ledger" and kv["oldest_record_s"] is None  # not kept
    assert report["records"] == 6 + 2 + 3 + 2
    assert report["lifetime_counters"]["puts"] == 13
    text = run_galahad("stats", "--root", root)
    assert text.returncode == 0 and "alice" in text.stdout and "budget:" in text.stdout
    # --exact reads every record: the same counts, and the oldest record of each namespace.
    exact = as_json(run_galahad("stats", "--root", root, "--json", "--exact"))
    assert exact["counts"] == "walk"
    figures = ("records", "disk_bytes", "logical_bytes", "rank")
    assert [{k: ns[k] for k in figures} for ns in exact["namespaces"]] == [
        {k: ns[k] for k in figures} for ns in report["namespaces"]
    ]
    assert all(ns["oldest_record_s"] <= ns["newest_record_s"] for ns in exact["namespaces"])


def test_read_only_commands_leave_every_byte_and_mtime_unchanged(tmp_path):
    root = tmp_path / "store"
    keys = write_store(root)
    damage(records(root)[0])
    before = snapshot(root)
    assert run_galahad("stats", "--root", root).returncode == 0
    assert run_galahad("verify", "--root", root).returncode == 1
    assert run_galahad("inspect", "--root", root, keys[1]).returncode in (0, 1)
    assert run_galahad("purge", "--root", root, "--tenant", "alice", "--dry-run").returncode == 0
    assert snapshot(root) == before


def test_read_only_commands_work_on_a_store_they_cannot_write(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to run the command as another user")
    shared = Path(tempfile.mkdtemp(prefix="galahad-ro-"))
    os.chmod(shared, 0o755)
    try:
        _read_only_as_nobody(shared / "store")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _read_only_as_nobody(root: Path) -> None:
    write_store(root)
    script = (  # everything imported first (the interpreter lives under /root), then drop root
        "import datetime, os, sys; from hicache_galahad.ops.cli import build_parser, main;"
        "build_parser(); os.setgid(65534); os.setuid(65534); sys.exit(main(sys.argv[1:]))"
    )
    for path in [root, *root.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    for command in (["stats"], ["verify"]):
        result = subprocess.run(
            [sys.executable, "-c", script, *command, "--root", str(root)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        )
        assert result.returncode == 0, result.stderr
    fixing = subprocess.run(
        [sys.executable, "-c", script, "verify", "--fix", "--root", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert fixing.returncode == 2 and "not writable" in fixing.stderr
    assert "Traceback" not in fixing.stderr


# ----------------------------------------------------------------------------- damaged


def test_verify_finds_damage_fix_quarantines_it_and_then_verify_is_clean(tmp_path):
    root = tmp_path / "store"
    write_store(root)
    victim = records(root)[2]
    damage(victim)
    stray = victim.parent / ".tmp-7fffffff0000dead-00000000-x.part"  # a dead writer's
    stray.write_bytes(b"partial")
    found = run_galahad("verify", "--root", root, "--json")
    assert found.returncode == 1
    report = json.loads(found.stdout)
    assert [path for path, _ in report["damaged"]] == [str(victim)]
    assert report["damaged_by_rule"] == {"V13": 1} and report["stray_temp_files"] == [str(stray)]
    fixed = run_galahad("verify", "--root", root, "--fix")
    assert fixed.returncode == 1 and "fixed" in fixed.stdout
    assert not victim.exists() and not stray.exists()
    assert len(list((root / "quarantine").iterdir())) == 1
    clean = run_galahad("verify", "--root", root, "--json")
    assert clean.returncode == 0, clean.stdout
    assert json.loads(clean.stdout)["clean"]
    counted = json.loads(clean.stdout)  # its rate, in the JSON and in the table
    assert counted["scanned_records"] == len(records(root)) and counted["records_per_s"] > 0
    assert counted["mb_per_s"] > 0 and counted["elapsed_s"] > 0
    assert "records/s" in run_galahad("verify", "--root", root).stdout


def test_verify_fix_for_one_tenant_leaves_other_tenants_alone(tmp_path):
    root = tmp_path / "store"
    write_store(root, "alice")
    write_store(root, "bob")
    alice = as_json(run_galahad("stats", "--root", root, "--json"))
    alice_dirs = {ns["namespace"] for ns in alice["namespaces"] if ns["tenant"] == "alice"}
    bob_damaged = next(p for p in records(root) if p.parent.name not in alice_dirs)
    damage(bob_damaged)
    result = run_galahad("verify", "--root", root, "--fix", "--tenant", "alice")
    assert result.returncode == 0 and bob_damaged.exists()


def test_inspect_explains_a_record_and_names_its_damage(tmp_path):
    root = tmp_path / "store"
    keys = write_store(root)
    info = as_json(run_galahad("inspect", "--root", root, keys[0], "--json"))
    assert info["valid"] and info["key"] == keys[0] and info["flags"] == ["plain"]
    assert info["namespace"]["tenant"] == "alice" and info["digest"] == "xxh3_128"
    path = Path(info["path"])
    damage(path)
    broken = run_galahad("inspect", "--root", root, str(path), "--json")
    assert broken.returncode == 1 and json.loads(broken.stdout)["problem"].startswith("V13")


# ----------------------------------------------------------------------------- empty, missing


def test_an_empty_store(tmp_path):
    root = tmp_path / "store"
    create_galahad(root, mha_pool()).close()
    assert as_json(run_galahad("stats", "--root", root, "--json"))["records"] == 0
    assert run_galahad("verify", "--root", root).returncode == 0
    assert run_galahad("purge", "--root", root, "--tenant", "x").returncode == 0


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["stats"], "no directory"),
        (["verify"], "no directory"),
        (["purge", "--tenant", "a"], "no directory"),
        (["gc", "--max-bytes", "1MB"], "no directory"),
    ],
)
def test_a_missing_store_is_one_line_and_exit_2(tmp_path, command, expected):
    result = run_galahad(command[0], "--root", tmp_path / "absent", *command[1:])
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and expected in result.stderr


def test_not_a_store_and_bad_arguments_are_one_line(tmp_path):
    (tmp_path / "plain").mkdir()
    result = run_galahad("stats", "--root", tmp_path / "plain")
    assert result.returncode == 2 and "not a hicache-galahad store" in result.stderr
    write_store(tmp_path / "store")
    result = run_galahad("purge", "--root", tmp_path / "store")
    assert result.returncode == 2 and "--tenant" in result.stderr
    result = run_galahad("purge", "--root", tmp_path / "store", "--older-than", "soon")
    assert result.returncode == 2 and "duration" in result.stderr


# ----------------------------------------------------------------------------- encrypted


def test_an_encrypted_store_needs_its_key_to_be_verified(tmp_path):
    root = tmp_path / "store"
    key = write_key_file(tmp_path / "master.key", os.urandom(32))
    write_store(root, encryption_key_file=key)
    assert run_galahad("verify", "--root", root, "--encryption-key-file", key).returncode == 0
    without = run_galahad("verify", "--root", root)
    assert without.returncode == 3 and "could not be verified" in without.stdout
    wrong = write_key_file(tmp_path / "wrong.key", os.urandom(32))
    other = run_galahad("verify", "--root", root, "--encryption-key-file", wrong, "--fix")
    assert other.returncode == 3 and len(records(root)) == 8  # a wrong key destroys nothing
    open_key = write_key_file(tmp_path / "open.key", os.urandom(32), mode=0o644)
    too_open = run_galahad("verify", "--root", root, "--encryption-key-file", open_key)
    assert too_open.returncode == 2 and "chmod 600" in too_open.stderr
    missing = run_galahad("verify", "--root", root, "--encryption-key-file", tmp_path / "none")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


# ----------------------------------------------------------------------------- purge and gc

WRITER = """
import sys, time
from sglang.srt.mem_cache.hicache_storage import PoolName
sys.path.insert(0, "tests")
from support.records import chain_keys
from support.sglang_pools import create_galahad, mha_pool, slots_of
backend = create_galahad(sys.argv[1], mha_pool(), tenant="bob")
deadline = time.time() + float(sys.argv[2])
round_ = 0
while time.time() < deadline:
    keys = chain_keys(4, f"bob-{round_}")
    assert backend.batch_set_v1(keys, slots_of(range(4), 4)) == [True] * 4
    round_ += 1
print(round_ * 4, flush=True)
backend.close()
"""


@pytest.mark.slow
def test_purge_a_tenant_while_another_tenant_writes(tmp_path):
    root = tmp_path / "store"
    write_store(root, "alice")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), "6"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2)
        purged = as_json(run_galahad("purge", "--root", root, "--tenant", "alice", "--json"))
        out, err = writer.communicate(timeout=180)
    finally:
        writer.kill()
    assert writer.returncode == 0, err[-3000:]
    written = int(out)
    assert purged["removed_records"] == 8
    report = as_json(run_galahad("stats", "--root", root, "--json"))
    assert {ns["tenant"] for ns in report["namespaces"] if ns["records"]} == {"bob"}
    assert report["records"] == written
    check = as_json(run_galahad("verify", "--root", root, "--json"))
    assert check["clean"] and check["ledger_bytes"] == check["actual_bytes"]


def test_purge_by_model_and_age_and_unattributable_namespaces(tmp_path):
    root = tmp_path / "store"
    write_store(root, "alice")
    old = records(root)[0]
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    aged = as_json(run_galahad("purge", "--root", root, "--older-than", "2d", "--json"))
    assert aged["removed_records"] == 1 and not old.exists()
    by_model = as_json(
        run_galahad("purge", "--root", root, "--model-fingerprint", "other", "--json")
    )
    assert by_model["removed_records"] == 0
    description = next((root / "ns").rglob("namespace.json"))
    description.unlink()
    result = as_json(run_galahad("purge", "--root", root, "--tenant", "alice", "--json"))
    assert result["unattributable_namespaces"] == [description.parent.name]
    assert result["removed_records"] >= 1
    assert any(p.parent == description.parent for p in records(root))  # left alone


def test_gc_applies_a_budget_now(tmp_path):
    root = tmp_path / "store"
    write_store(root, pages=6)
    before = as_json(run_galahad("stats", "--root", root, "--json"))["disk_bytes"]
    result = as_json(run_galahad("gc", "--root", root, "--max-bytes", str(before // 2), "--json"))
    assert result["evicted_files"] >= 1 and result["ledger_bytes"] <= before // 2
    assert run_galahad("verify", "--root", root).returncode == 0


def test_fingerprint_prints_what_the_backend_computes(tmp_path):
    from hicache_galahad.config.fingerprint import fingerprint_model_dir

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    result = run_galahad("fingerprint", model)
    assert result.returncode == 0 and result.stdout.strip() == fingerprint_model_dir(str(model))
    assert run_galahad("fingerprint", tmp_path / "absent").returncode == 2


def test_verify_on_a_terminal_shows_a_bar_sized_from_the_ledger(tmp_path):
    """On a terminal (a real pseudo-terminal here) verify's progress bar is sized from the
    ledger's counts, not from a walk before the walk, and reaches exactly that total."""
    import fcntl
    import pty
    import struct
    import termios

    root = tmp_path / "store"
    write_store(root)
    total = sum(
        ns["disk_bytes"]
        for ns in as_json(run_galahad("stats", "--root", root, "--json"))["namespaces"]
    )
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 120 columns
    try:
        result = subprocess.run(
            [sys.executable, "-m", "hicache_galahad", "verify", "--root", str(root)],
            stdout=subprocess.PIPE,
            stderr=slave,
            timeout=120,
            cwd=REPO_ROOT,
        )
        os.close(slave)
        slave = None
        shown = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                shown += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert result.returncode == 0, result.stdout
    text = shown.decode("utf-8", "replace")
    assert "verify: 100%" in text, text
    from tqdm import tqdm

    size = tqdm.format_sizeof(total)
    assert f"0.00/{size}" in text and f"{size}/{size}" in text, (text, total)  # known at 0%
