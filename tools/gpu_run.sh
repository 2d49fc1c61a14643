#!/usr/bin/env bash
# One-call GPU runner for the air-gapped GPU box (shared/GPU.md): wheels -> GPU tests -> benchmarks -> table.
#
#   tools/gpu_run.sh                 # everything; logs and results under $OUT (default: out/gpu-run)
#   tools/gpu_run.sh --tests-only    # or --bench-only
#
# 1. Installs every wheel in $WHEEL_DIR (default .whl/, brought along: the box has no network) into $SITE (default /tmp/site) with
#    pip --no-index --no-deps --target, and puts $SITE and the repo on PYTHONPATH.
# 2. Writes the GPU, driver, commit and package versions to $OUT/env.txt.
# 3. Runs pytest on each entry of TEST_DIRS (log $OUT/pytest-<dir>.log) and each command of BENCHES
#    (log $OUT/bench-<script>.log; a bench writes its own results into $OUT, e.g. bench_kernels.{json,md}).
#    A test step fails if pytest fails or if nothing passed (all skipped = no usable GPU).
# 4. Prints step / status / seconds / pytest summary (also $OUT/summary.md), then each bench's table;
#    exits non-zero if any step failed.
#
# Extending: add to DEFAULT_TEST_DIRS / DEFAULT_BENCHES below, or at run time (EXTRA_* add, the others replace):
#   EXTRA_TEST_DIRS="tests/decode/gpu tests/engines" EXTRA_BENCHES='bench/bench_nvdec.py --out $OUT'
#   TEST_DIRS="tests/gpu/test_cuda_layer.py" BENCHES='bench/bench_kernels.py --out $OUT --quick'
# Test entries are separated by spaces, bench commands by ';' ($OUT in them is replaced). Keep the files under
# $OUT few: the device tool brings back at most 8.
# STREAMD_COMMIT overrides the commit recorded with the results (the box gets no .git).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
OUT="${OUT:-$REPO/out/gpu-run}"
SITE="${SITE:-/tmp/site}"
WHEEL_DIR="${WHEEL_DIR:-$REPO/.whl}"
PY="${PY:-python3}"
STEP_TIMEOUT="${STEP_TIMEOUT:-900}"

# Defaults; TEST_DIRS / BENCHES in the environment replace them, EXTRA_TEST_DIRS / EXTRA_BENCHES add to them.
DEFAULT_TEST_DIRS="tests/gpu"
DEFAULT_BENCHES='bench/bench_kernels.py --out $OUT'
read -ra TEST_DIRS <<< "${TEST_DIRS:-$DEFAULT_TEST_DIRS} ${EXTRA_TEST_DIRS:-}"
IFS=';' read -ra bench_list <<< "${BENCHES:-$DEFAULT_BENCHES};${EXTRA_BENCHES:-}"
BENCHES=()
for b in "${bench_list[@]}"; do [[ -n "${b// }" ]] && BENCHES+=("${b//\$OUT/$OUT}"); done

run_tests=1 run_bench=1
case "${1:-}" in
    --tests-only) run_bench=0 ;;
    --bench-only) run_tests=0 ;;
    "") ;;
    *) echo "usage: $0 [--tests-only|--bench-only]" >&2; exit 2 ;;
esac

mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { printf '[gpu_run] %s\n' "$*" >&2; }

# 1. Wheels.
shopt -s nullglob
wheels=("$WHEEL_DIR"/*.whl)
if ((${#wheels[@]})); then
    log "installing ${#wheels[@]} wheel(s) into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${wheels[@]}" >"$OUT/pip.log" 2>&1 || { log "pip install failed:"; cat "$OUT/pip.log" >&2; exit 2; }
    rm -f "$OUT/pip.log"
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"

# 2. Environment.
if [[ -z "${STREAMD_COMMIT:-}" ]] && git -C "$REPO" rev-parse --short HEAD >/dev/null 2>&1; then
    STREAMD_COMMIT="$(git -C "$REPO" rev-parse --short HEAD)"
    [[ -n "$(git -C "$REPO" status --porcelain 2>/dev/null)" ]] && STREAMD_COMMIT+=" + uncommitted"
fi
export STREAMD_COMMIT="${STREAMD_COMMIT:-unknown}"
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $STREAMD_COMMIT"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    "$PY" - <<'EOF' 2>&1
import importlib.metadata as md, platform
print("python:", platform.python_version())
for name in ("numpy", "opencv-python-headless", "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc",
             "torch", "onnxruntime", "pytest"):
    try:
        print(f"{name}: {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: -")
EOF
} >"$OUT/env.txt"
cat "$OUT/env.txt" >&2

# 3. Steps.
declare -a rows
failed=0
step() {  # step NAME LOG KIND CMD...
    local name="$1" logfile="$2" kind="$3"; shift 3
    local t0 rc status detail
    log "$name"
    t0=$(date +%s)
    timeout "$STEP_TIMEOUT" "$@" 2>&1 | tee "$logfile"
    rc=${PIPESTATUS[0]}
    status=ok detail=""
    if [[ "$kind" == tests ]]; then
        detail="$(grep -E '[0-9]+ (passed|failed|skipped|error)' "$logfile" | tail -1 | sed 's/=//g; s/^ *//')"
        [[ "$detail" =~ [0-9]+\ passed ]] || { ((rc == 0)) && rc=99; }  # nothing passed: no GPU?
    fi
    ((rc == 124)) && status="TIMEOUT" || { ((rc != 0)) && status="FAILED (rc $rc)"; }
    ((rc == 99)) && status="FAILED (nothing passed)"
    ((rc != 0)) && failed=1
    rows+=("| $name | $status | $(($(date +%s) - t0)) | $detail |")
}

if ((run_tests)); then
    for dir in "${TEST_DIRS[@]}"; do
        [[ -z "$dir" ]] && continue
        step "pytest $dir" "$OUT/pytest-${dir//\//_}.log" tests "$PY" -m pytest "$dir" -q -rs -p no:cacheprovider
    done
fi
if ((run_bench)); then
    for cmd in "${BENCHES[@]}"; do
        read -ra argv <<< "$cmd"
        script="$(basename "${argv[0]}" .py)"
        step "bench $script" "$OUT/bench-$script.log" bench "$PY" "${argv[@]}"
    done
fi

# 4. Summary.
{
    echo "## gpu_run $(date -u '+%Y-%m-%d %H:%M UTC') · commit $STREAMD_COMMIT"
    echo
    echo "| step | status | s | detail |"
    echo "|---|---|---:|---|"
    printf '%s\n' "${rows[@]}"
    for md in "$OUT"/*.md; do
        [[ "$md" == "$OUT/summary.md" ]] && continue
        echo
        echo "### $(basename "$md")"
        echo
        cat "$md"
    done
} >"$OUT/summary.md"
echo
cat "$OUT/summary.md"
exit "$failed"
