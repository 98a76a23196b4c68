#!/usr/bin/env bash
# GalahadStorage restoring 4k-32k-token prefixes from disk into GPU memory, measured against the
# raw pinned-host-to-device copy rate and against SGLang's HiCacheFile (bench/gpu_check.py), on
# a machine that has Python and torch with CUDA but no network and possibly no SGLang.
#
#   bench/gpu_check.sh prepare [CARRY_DIR]   here, with pip and its index: the wheels to carry
#   OUT=DIR bench/gpu_check.sh [LIMIT_S]     there (or anywhere): the check, under LIMIT_S
#                                            (default 420 s), results in $OUT
#
# prepare writes into CARRY_DIR (default .gpu-carry/; untracked, it travels with the tree):
#   hicache_galahad-*.whl (built from this checkout) and the wheels of its dependencies for the
#   target interpreter ($GPU_CHECK_PYTHON_VERSION, default 3.12; manylinux x86-64): numpy, xxhash,
#   zstandard, cryptography, cffi, pycparser, PyStemmer: 26 MiB measured; the limit for what a run
#   may carry is 64 MiB, which the script checks. SGLang itself is not carried: its Python
#   package is 34 MiB gzipped (131 MB of files), and importing its host and device pools and its
#   storage factory loads modules of 93 distributions (pydantic, transformers, tokenizers, scipy,
#   flashinfer, triton, pyzmq, ... many compiled, each a wheel for the target Python), far more
#   than 64 MiB. Where SGLang imports, bench/gpu_check.py adds its sglang-* rows (real SGLang
#   pools, GalahadStorage and HiCacheFile through SGLang's factory); where it does not, the
#   "store" rows still measure our path from
#   disk into pinned host pages and on into the device KV buffers.
#
# The check: installs the carried wheels ($GPU_CHECK_CARRY, default .gpu-carry/), if the
# dependencies do not import, into a scratch target directory with pip --no-index, then runs
# bench/gpu_check.py (which imports hicache_galahad from this checkout; extra arguments in
# $GPU_CHECK_ARGS).
# Without CUDA it runs the CPU path (tiny geometry, 1k-2k tokens) under the CPU test harness
# (tests/sglang_cpu/run: SGLang's pools on CPU need its host_unpinned and kv_direct_io patches):
# this is what CI runs (tests/test_gpu_check.py). On a GPU it runs with stock SGLang if SGLang
# imports, never under the CPU harness (which marks the process a CPU engine).
# Output: $OUT/results.json, $OUT/results.md, $OUT/env.txt, $OUT/gpu_check.log.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$PWD"
CARRY_DEFAULT="$REPO/.gpu-carry"

if [ "${1:-}" = "prepare" ]; then
    set -e
    CARRY="${2:-$CARRY_DEFAULT}"
    VERSION="${GPU_CHECK_PYTHON_VERSION:-3.12}"
    PY="${PYTHON:-$REPO/.venv/bin/python}"
    mkdir -p "$CARRY"
    rm -f "$CARRY"/*.whl
    "$PY" -m build --wheel --no-isolation --outdir "$CARRY" "$REPO" >/dev/null
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$VERSION" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$CARRY" \
        numpy "xxhash>=3.4" "zstandard>=0.22" "cryptography>=42" cffi pycparser "PyStemmer==3.1.0"
    size=$(du -sb "$CARRY" | cut -f1)
    ls -l "$CARRY"
    echo "carry: $CARRY, $((size / 1024 / 1024)) MiB"
    if [ "$size" -gt $((64 * 1024 * 1024)) ]; then
        echo "carry is over 64 MiB" >&2
        exit 1
    fi
    exit 0
fi

LIMIT_S="${1:-${GPU_CHECK_LIMIT_S:-420}}"
OUT="${OUT:-$REPO/gpu-check-out}"
CARRY="${GPU_CHECK_CARRY:-$CARRY_DEFAULT}"
mkdir -p "$OUT"
PY=""
for candidate in "${PYTHON:-}" "$REPO/.venv/bin/python" python3 python; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import torch' >/dev/null 2>&1; then
        PY="$candidate"
        break
    fi
done
if [ -z "$PY" ]; then
    echo "gpu_check: no Python with torch (tried \$PYTHON, .venv/bin/python, python3, python)" | tee "$OUT/env.txt"
    exit 2
fi
export PYTHONUNBUFFERED=1
if ! "$PY" -c 'import xxhash, zstandard, cryptography' >/dev/null 2>&1; then
    if ! ls "$CARRY"/*.whl >/dev/null 2>&1; then
        echo "gpu_check: the dependencies do not import and $CARRY holds no wheels (run prepare)" | tee "$OUT/env.txt"
        exit 3
    fi
    TARGET="$(mktemp -d /tmp/galahad-gpu-carry.XXXXXX)"
    "$PY" -m pip install --quiet --no-index --no-deps --target "$TARGET" "$CARRY"/*.whl || exit 3
    export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}"
fi
CUDA=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
COMMAND=("$PY" bench/gpu_check.py --out "$OUT" --limit-s "$((LIMIT_S > 30 ? LIMIT_S - 20 : LIMIT_S))")
if [ "$CUDA" != "1" ] && "$PY" -c 'import sglang' >/dev/null 2>&1; then
    # CPU: SGLang's pools need the harness (unpinned host pools, pure-torch transfers)
    export SGLANG_CPU_TEST_PATCHES="${SGLANG_CPU_TEST_PATCHES-host_unpinned,kv_direct_io}"
    export SGLANG_CPU_PYTHON="$PY"
    COMMAND=(tests/sglang_cpu/run "${COMMAND[@]}")
fi
read -r -a EXTRA <<<"${GPU_CHECK_ARGS:-}"  # e.g. GPU_CHECK_ARGS="--tokens 4096,8192"
timeout -s INT -k 20 "$LIMIT_S" "${COMMAND[@]}" "${EXTRA[@]}" 2>&1 | tee "$OUT/gpu_check.log"
code=${PIPESTATUS[0]}
echo "gpu_check: exit $code after $SECONDS s of a $LIMIT_S s limit (cuda=$CUDA)" | tee -a "$OUT/gpu_check.log"
exit "$code"
