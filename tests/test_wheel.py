"""hicache_galahad as a user installs it: built as an sdist and a wheel (the wheel built from the
sdist), installed into a fresh virtual environment that has SGLang but not this checkout, and
used from there: every `galahad` subcommand, and a real SGLang server (CPU harness) loading
GalahadStorage through the `dynamic` backend by `module_path`.

The fresh environment reaches SGLang and its dependencies (about 11 GB) through one `.pth` line
naming the project venv's site-packages. Python reads `.pth` files only in site directories, so
the project venv's own `.pth` files, among them the editable install of this checkout, are not
run there: the test checks that `hicache_galahad` is imported from the fresh environment, and
installs with `--no-compile` so that the server's import leaves `.pyc` files behind in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from bench import sglang_server as e2e

slow = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent


def run(cmd, *, cwd, env=None, timeout=600, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(part) for part in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{cmd} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def clean_env(venv: Path) -> dict[str, str]:
    """An environment with nothing of this checkout: no PYTHONPATH, the fresh venv first on
    PATH, the working directory never on sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONSAFEPATH"] = "1"
    return env


def test_demo_is_offered_from_a_checkout_and_finds_bench_demo():
    """From a checkout `galahad demo` runs bench/demo.py (cli.py sits in hicache_galahad/ops/:
    the checkout root is three levels up); an installed package does not offer it (below)."""
    from hicache_galahad.ops import cli

    assert cli.demo_script() == REPO_ROOT / "bench" / "demo.py"
    parser = cli.build_parser()
    assert parser.parse_args(["demo", "quick"]).demo_args == ["quick"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, wheel): the wheel built from the sdist, installed into a fresh venv."""
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    # sdist first, then the wheel from the unpacked sdist: what the sdist lacks, the wheel lacks
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, REPO_ROOT], cwd=work)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work)
    python = venv / "bin" / "python"
    site = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=work
        ).stdout.strip()
    )
    # SGLang, torch and the rest from the project venv, read-only, behind the fresh venv's own
    (site / "project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # Without PYTHONPATH: a checkout on it (its egg-info) reads to pip as hicache-galahad
    # installed already, and the wheel was not installed into the fresh venv.
    run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
         "--no-compile", wheels[0]],
        cwd=work,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    return venv, wheels[0], site


@slow
def test_the_wheel_holds_the_package_and_nothing_of_tests_or_bench(installed):
    _, wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert "hicache_galahad" in tops and not tops & {"tests", "bench", "docs"}, sorted(tops)
    assert "hicache_galahad/serving/adapter.py" in names
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "galahad = hicache_galahad.ops.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@slow
def test_installed_package_is_imported_from_the_fresh_venv(installed, tmp_path):
    venv, _, site = installed
    env = clean_env(venv)
    probe = run(
        [venv / "bin" / "python", "-c",
         "import json, hicache_galahad, sglang; "
         "print(json.dumps([hicache_galahad.__file__, sglang.__version__]))"],
        cwd=tmp_path, env=env,
    )  # fmt: skip
    where, sglang_version = json.loads(probe.stdout.strip().splitlines()[-1])
    assert Path(where).resolve().is_relative_to(site.resolve()), where
    assert not Path(where).resolve().is_relative_to(REPO_ROOT), where
    assert sglang_version == "0.5.23"


LIST_COMMANDS = """
import argparse, json
from hicache_galahad.ops.cli import build_parser

def commands(parser):
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = commands(sub)
    return found

print(json.dumps(commands(build_parser())))
"""


FILL = """
import sys
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore

with RecordStore(sys.argv[1]) as store:
    namespace = Namespace("t", "model-fp", "kv", {"page_size": 4})
    assert store.put(namespace, "0" * 64, b"page" * 64)
"""


@slow
def test_every_subcommand_works_when_installed(installed, tmp_path, tiny_model):
    venv, _, _ = installed
    env = clean_env(venv)
    galahad = venv / "bin" / "galahad"
    run([galahad, "--help"], cwd=tmp_path, env=env)
    tree = json.loads(
        run([venv / "bin" / "python", "-c", LIST_COMMANDS], cwd=tmp_path, env=env).stdout
    )
    assert {"stats", "verify", "purge", "gc", "inspect", "fingerprint", "blaise"} <= set(tree)
    for command, subcommands in tree.items():
        run([galahad, command, "--help"], cwd=tmp_path, env=env)
        for sub in subcommands:
            run([galahad, command, sub, "--help"], cwd=tmp_path, env=env)
    # `demo` runs bench/demo.py of a checkout: an installed package does not offer it
    assert "demo" not in tree
    refused = run([galahad, "demo"], cwd=tmp_path, env=env, check=False)
    assert refused.returncode == 2 and "invalid choice" in refused.stderr
    # each command that reads or changes a store, on one the installed package writes
    root = tmp_path / "store"
    run([venv / "bin" / "python", "-c", FILL, root], cwd=tmp_path, env=env)
    for command in (
        ["stats"], ["stats", "--json"], ["verify"], ["verify", "--fix"], ["gc", "--max-bytes", "1MiB"],
        ["purge", "--tenant", "nobody", "--dry-run"], ["inspect", "0" * 64],
    ):  # fmt: skip
        done = run([galahad, *command, "--root", root], cwd=tmp_path, env=env)
        assert "Traceback" not in done.stderr
    assert "1 records" in run([galahad, "stats", "--root", root], cwd=tmp_path, env=env).stdout
    purged = run([galahad, "purge", "--tenant", "t", "--root", root], cwd=tmp_path, env=env)
    assert "Traceback" not in purged.stderr
    fingerprint = run([galahad, "fingerprint", tiny_model], cwd=tmp_path, env=env).stdout
    assert fingerprint.startswith("dir-sha256:"), fingerprint


@slow
@pytest.mark.e2e
def test_a_server_loads_the_installed_backend_by_module_path(installed, tmp_path, tiny_model):
    venv, _, site = installed
    root = tmp_path / "store"
    env = clean_env(venv)
    # start_server adds our environment under `env`: empty PYTHONPATH, bytecode written
    env.update(
        SGLANG_CPU_REPO_ON_PATH="0", SGLANG_CPU_PYTHON=sys.executable, PYTHONPATH="",
        PYTHONDONTWRITEBYTECODE="",
    )  # fmt: skip
    adapter_cache = site / "hicache_galahad" / "serving" / "__pycache__"
    assert not adapter_cache.exists()  # installed with --no-compile
    prompt = list(range(10, 53))
    server = e2e.start_server(
        tiny_model,
        e2e.galahad_args(root, page_size=4),
        env=env,
        log_path=tmp_path / "server.log",
        python=str(venv / "bin" / "python"),
    )
    try:
        cold = e2e.generate(server, prompt, 4)
        e2e.wait_for(lambda: len(list(root.glob("ns/*/*.rec"))) >= 10, 60, "write-through")
        e2e.flush_cache(server)
        warm = e2e.generate(server, prompt, 4)
        e2e.assert_cached(warm, storage=40)
        e2e.assert_same_output(warm, cold)
        e2e.assert_storage_healthy(server)
    finally:
        server.stop()
    # the scheduler imported the adapter from the fresh venv (the checkout was not on its path)
    assert any(adapter_cache.glob("adapter.*.pyc")), sorted(site.glob("hicache_galahad/**/*"))
    verify = run([venv / "bin" / "galahad", "verify", "--root", root], cwd=tmp_path, env=env)
    assert "Traceback" not in verify.stderr
