# TEST HARNESS ONLY -- never shipped in the hicache_galahad package.
#
# Builds the Python-only `sgl_kernel` stand-in that lets a real SGLang server run on a CPU-only
# machine (see tests/sglang_cpu/README.md and /work/shared/reference/sglang-on-cpu.md section 4.3).
#
# The installed `sgl_kernel` (PyPI `sglang-kernel`) only ships CUDA builds of its compiled
# `common_ops` library; importing it without an NVIDIA driver fails. SGLang imports the package
# for its Python-level helpers too, so a copy holding only the package's `.py` files, whose loader
# hooks load nothing compiled, satisfies every import. Calls into `torch.ops.sgl_kernel.*` still
# fail, lazily, at call time; on a non-AMX CPU SGLang takes torch-native paths instead.
#
# Usage: python build_stand_in.py OUT_DIR
#   Writes OUT_DIR/sgl_kernel/... and OUT_DIR/STAMP. Rebuilds only when the installed
#   sgl_kernel (version, location, file list) changed. Safe against concurrent builders: the
#   new tree is assembled in a temporary directory and renamed into place.
"""Build the Python-only sgl_kernel stand-in (test harness only)."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

LOADER_OVERRIDES = """

# --- appended by tests/sglang_cpu/build_stand_in.py (CPU test stand-in only) ---
# Load no compiled library: an empty namespace replaces common_ops, and there is no CUDA
# runtime to preload. torch.ops.sgl_kernel.* calls then fail lazily, at call time.
import types as _types


def _load_architecture_specific_ops():
    return _types.ModuleType("sgl_kernel_no_compiled_ops")


def _preload_cuda_library():
    return None
"""


def installed_package_dir() -> Path:
    spec = importlib.util.find_spec("sgl_kernel")  # does not execute the package
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("build_stand_in: the sgl_kernel package is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def source_files(package_dir: Path) -> list[Path]:
    return sorted(
        p.relative_to(package_dir)
        for p in package_dir.rglob("*.py")
        if "__pycache__" not in p.parts
    )


def stamp_for(package_dir: Path, files: list[Path]) -> str:
    try:
        version = importlib.metadata.version("sglang-kernel")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    digest = hashlib.sha256()
    digest.update(LOADER_OVERRIDES.encode())
    for rel in files:
        digest.update(str(rel).encode())
        digest.update(str((package_dir / rel).stat().st_size).encode())
    return f"sgl_kernel {version} {package_dir} {digest.hexdigest()[:16]}\n"


def build(out_dir: Path) -> bool:
    """Build the stand-in into out_dir if missing or stale. Returns True when it built."""
    package_dir = installed_package_dir()
    files = source_files(package_dir)
    stamp = stamp_for(package_dir, files)
    stamp_path = out_dir / "STAMP"
    if stamp_path.is_file() and stamp_path.read_text() == stamp:
        return False
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; released on close
        if stamp_path.is_file() and stamp_path.read_text() == stamp:
            return False  # another process built it while we waited
        _build_locked(package_dir, files, stamp, out_dir)
    return True


def _build_locked(package_dir: Path, files: list[Path], stamp: str, out_dir: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".stand-in-", dir=out_dir.parent))
    try:
        for rel in files:
            target = tmp / "sgl_kernel" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(package_dir / rel, target)
        load_utils = tmp / "sgl_kernel" / "load_utils.py"
        if not load_utils.is_file():
            raise SystemExit(f"build_stand_in: {package_dir}/load_utils.py not found")
        with load_utils.open("a") as f:
            f.write(LOADER_OVERRIDES)
        (tmp / "STAMP").write_text(stamp)
        # Swap the finished tree in with renames, so no reader sees a half-copied package.
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=".stand-in-old-", dir=out_dir.parent))
            os.rename(out_dir, old / "tree")
        os.rename(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build_stand_in.py OUT_DIR", file=sys.stderr)
        return 2
    if build(Path(argv[1]).resolve()):
        print(f"build_stand_in: built the sgl_kernel stand-in in {argv[1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
