#!/usr/bin/env bash
# The restart demo and the TTFT benchmark on one NVIDIA GPU with stock SGLang (no CPU harness),
# on the locally made demo model, inside a time limit; the tables go to $OUT.
#
#   OUT=/some/dir bench/gpu_check.sh [LIMIT_S]        (LIMIT_S: default 540, all steps together)
#
# Needs: an NVIDIA GPU that torch sees, and a Python with sglang 0.5.23 (and its CUDA kernels),
# torch, transformers, tokenizers, safetensors, requests, xxhash, zstandard, cryptography and
# PyStemmer. The interpreter is $PYTHON, else .venv/bin/python, else python3, else python: the
# first one that imports sglang. Nothing is downloaded: the model is built from
# tests/sglang_cpu/make_model.py (seeded weights, locally trained tokenizer).
#
# Steps, each under what is left of the limit (SIGINT first, so the benchmarks stop their
# servers in their `finally` blocks; SIGKILL 30 s later):
#   1. prerequisites and the machine    -> $OUT/env.txt (the script stops here if one is missing)
#   2. the demo model (bf16, 101M)      -> $OUT/env.txt
#   3. bench/demo.py                    -> $OUT/demo.txt
#   4. bench/bench_ttft.py              -> $OUT/ttft.txt, $OUT/ttft.png
#   5. bench/bench_serving.py, if at least GPU_CHECK_SERVING_MIN_S (default 200) are left
#                                       -> $OUT/serving.txt
# then $OUT/summary.txt (each step's exit status and seconds) and $OUT/logs.tgz (server logs
# of the demo and of bench_serving).
#
# Every server runs with the flags in $GALAHAD_BENCH_SERVER_ARGS added (default
# `--disable-cuda-graph`: TTFT is a prefill, which SGLang never runs in a CUDA graph, and graph
# capture would cost each of the ~10 server starts time the limit cannot spare).
# Processes left behind by a step (servers run in their own sessions) are found by a marker in
# their environment (set for the steps' commands only) and stopped by PID.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$PWD"
OUT="${OUT:-$REPO/gpu-check-out}"
mkdir -p "$OUT"
LIMIT_S="${1:-${GPU_CHECK_LIMIT_S:-540}}"
SERVING_MIN_S="${GPU_CHECK_SERVING_MIN_S:-200}"
DEADLINE=$((SECONDS + LIMIT_S))
WORK="$(mktemp -d /tmp/galahad-gpu-check.XXXXXX)"
MARKER="galahad-gpu-check-$$-$RANDOM"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export GALAHAD_BENCH_SERVER_ARGS="${GALAHAD_BENCH_SERVER_ARGS---disable-cuda-graph}"

note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((DEADLINE - SECONDS)); }

# Stop, by PID, every process whose environment carries this run's marker (servers started
# in their own sessions outlive the benchmark that started them if it is killed).
stop_marked() {
    local pid pids=()
    for environ in /proc/[0-9]*/environ; do
        pid="${environ#/proc/}"
        pid="${pid%/environ}"
        if tr '\0' '\n' <"$environ" 2>/dev/null | grep -qx "GALAHAD_GPU_CHECK_MARKER=$MARKER"; then
            pids+=("$pid")
        fi
    done
    [ "${#pids[@]}" -eq 0 ] && return 0
    note "stopping ${#pids[@]} leftover process(es): ${pids[*]}"
    kill -TERM "${pids[@]}" 2>/dev/null
    sleep 10
    kill -KILL "${pids[@]}" 2>/dev/null
    return 0
}

finish() {
    stop_marked
    (cd "$WORK" && find . -name '*.log' -print0 | tar -czf "$OUT/logs.tgz" --null -T - 2>/dev/null)
    rm -rf "$WORK"
    note "total $SECONDS s of a $LIMIT_S s limit"
}
trap finish EXIT

# run_step NAME OUTFILE CMD...: CMD under what is left of the limit, output to OUTFILE.
run_step() {
    local name="$1" outfile="$2" budget code start
    shift 2
    budget=$(left)
    if [ "$budget" -lt 30 ]; then
        note "$name: skipped, ${budget} s left"
        return 1
    fi
    start=$SECONDS
    env GALAHAD_GPU_CHECK_MARKER="$MARKER" timeout -s INT -k 30 "$budget" "$@" 2>&1 | tee "$outfile"
    code=${PIPESTATUS[0]}
    stop_marked
    note "$name: exit $code after $((SECONDS - start)) s$([ "$code" = 124 ] && echo ' (time limit)')"
    return "$code"
}

# 1. prerequisites
PY=""
for candidate in "${PYTHON:-}" "$REPO/.venv/bin/python" python3 python; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sglang' >/dev/null 2>&1; then
        PY="$candidate"
        break
    fi
done
{
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "python: ${PY:-none imports sglang (tried \$PYTHON, .venv/bin/python, python3, python)}"
} | tee "$OUT/env.txt"
if [ -z "$PY" ]; then
    note "prerequisites: no Python with sglang; stock SGLang 0.5.23 is needed (see the header)"
    exit 2
fi
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT/env.txt"
import importlib
import sys

missing = []
for name in ("torch", "sglang", "transformers", "tokenizers", "safetensors", "requests",
             "xxhash", "zstandard", "cryptography", "Stemmer", "sgl_kernel"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '')}")
    except Exception as error:
        missing.append(f"{name} ({error!r})")
import torch

if not torch.cuda.is_available():
    missing.append("a CUDA device (torch.cuda.is_available() is False)")
else:
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch CUDA {torch.version.cuda}")
try:
    from hicache_galahad.serving.adapter import GalahadStorage  # noqa: F401
except Exception as error:
    missing.append(f"hicache_galahad.serving.adapter ({error!r})")
if missing:
    print("MISSING: " + "; ".join(missing))
    sys.exit(3)
EOF
if [ "${PIPESTATUS[0]}" != 0 ]; then
    note "prerequisites: missing (see env.txt); nothing run"
    exit 3
fi
note "prerequisites: ok ($PY)"

# 2. the demo model, built locally (cached under tests/sglang_cpu/.build/models)
run_step model "$WORK/model.txt" "$PY" -c \
    'import sys; sys.path.insert(0, "tests"); import e2e_support as e; print("model:", e.ensure_model("llama", "demo"))' \
    || exit 4
cat "$WORK/model.txt" >>"$OUT/env.txt"

# 3. the restart demo (its servers' logs are kept for logs.tgz)
run_step demo "$OUT/demo.txt" "$PY" bench/demo.py --keep "$WORK/demo"

# 4. TTFT after a restart: recompute vs SGLang's file backend vs GalahadStorage
run_step ttft "$OUT/ttft.txt" "$PY" bench/bench_ttft.py --rounds 1 --plot "$OUT/ttft.png"

# 5. SGLang's own client, if time is left
if [ "$(left)" -ge "$SERVING_MIN_S" ]; then
    run_step serving "$OUT/serving.txt" "$PY" bench/bench_serving.py --rounds 1 \
        --keep "$WORK/serving"
else
    note "serving: skipped, $(left) s left (needs $SERVING_MIN_S)"
fi
exit 0
