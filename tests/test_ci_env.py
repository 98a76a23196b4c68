"""The first run of `.ci/env` on a machine with an empty environment cache (what a new user and a
fresh CI machine meet), with a stand-in for pip so that it takes seconds instead of minutes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

STAND_IN_PIP = """#!/bin/sh
echo "$@" >> "$PIP_LOG"
"""


def _checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(REPO_ROOT / ".ci" / "env", repo / ".ci" / "env")
    shutil.copy(REPO_ROOT / "pyproject.toml", repo / "pyproject.toml")
    return repo


def _run_env(repo: Path, cache: Path, tmp_path: Path, python: str = sys.executable):
    pip = tmp_path / "pip"
    pip.write_text(STAND_IN_PIP)
    pip.chmod(0o755)
    env = dict(
        os.environ,
        GALAHAD_ENV_CACHE=str(cache),
        GALAHAD_PIP=str(pip),
        PIP_LOG=str(tmp_path / "pip.log"),
        PYTHON=python,
    )
    return subprocess.run(
        ["bash", str(repo / ".ci" / "env")], env=env, capture_output=True, text=True, timeout=300
    )


def test_first_run_on_an_empty_cache_succeeds_and_says_what_it_does(tmp_path):
    repo, cache = _checkout(tmp_path), tmp_path / "cache"
    result = _run_env(repo, cache, tmp_path)
    assert result.returncode == 0, result.stderr
    environments = list(cache.glob("venv-*"))
    assert len(environments) == 1 and (environments[0] / ".complete").is_file()
    assert (repo / ".venv").resolve() == environments[0].resolve()
    assert "building" in result.stderr and "environment ready" in result.stderr
    installs = (tmp_path / "pip.log").read_text().splitlines()
    assert any(line.startswith("install -q -r ") for line in installs)
    assert any("-e ." in line for line in installs)

    again = _run_env(repo, cache, tmp_path)  # a second run reuses the environment
    assert again.returncode == 0, again.stderr
    assert "building" not in again.stderr


def test_a_spec_change_keeps_only_the_newest_older_environment(tmp_path):
    repo, cache = _checkout(tmp_path), tmp_path / "cache"
    for age, name in enumerate(["venv-old2", "venv-old1"]):
        (cache / name).mkdir(parents=True)
        os.utime(cache / name, (1_000_000 + age, 1_000_000 + age))
    result = _run_env(repo, cache, tmp_path)
    assert result.returncode == 0, result.stderr
    names = sorted(path.name for path in cache.glob("venv-*"))
    assert "venv-old1" in names and "venv-old2" not in names and len(names) == 2


def test_an_old_python_is_refused_in_one_clear_line(tmp_path):
    old_python = tmp_path / "python3.9"
    old_python.write_text('#!/bin/sh\n[ "$1" = "-V" ] && echo "Python 3.9.18"\nexit 1\n')
    old_python.chmod(0o755)
    result = _run_env(_checkout(tmp_path), tmp_path / "cache", tmp_path, str(old_python))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Python 3.11 or newer" in lines[0] and "3.9.18" in lines[0]
