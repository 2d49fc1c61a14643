#!/usr/bin/env bash
# The GPU calls of one session, each sized for one `device run` call (< 600 s), results under $OUT.
#
#   tools/gpu_session.sh live               # bench_live: ceiling, 1 stream, 120 (auto and 12 workers), 175,
#                                           # kill -9 (spare), pipelined; then tests/gpu, tests/engines/gpu
#   tools/gpu_session.sh soak-start S WAIT  # a soak of 64 live streams for S s in its own process session (setsid:
#                                           # it outlives the call), then waits WAIT s and prints its samples so far
#   tools/gpu_session.sh soak-collect       # (next call, machine still warm) waits for it, results to $OUT
#   tools/gpu_session.sh rest               # tests/{decode,pipeline,analytics,web}/gpu, bench_kernels
#
# Needs .whl/ (pynvvideocodec, onnx2torch, onnxslim, lap) and .assets-work/live1080.mp4 carried (see
# bench/RESULTS.md for how the clip is made). STREAMD_COMMIT: the commit the tree is (the box gets no .git).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
OUT="${OUT:-$REPO/out/gpu-session}"
CLIP="$REPO/.assets-work/live1080.mp4"
SOAK=/tmp/streamd-soak
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl >/dev/null 2>&1 || { echo "pip install failed" >&2; exit 2; }
    export PYTHONPATH="/tmp/site:$REPO"
}

pack() {  # logs into one archive: the device tool brings back at most 8 files
    tar czf "$OUT/logs.tgz" -C "$1" . 2>/dev/null
}

case "${1:-}" in
    live)
        work="$OUT/run"; mkdir -p "$work"
        OUT="$work" BENCHES="bench/bench_live.py --clip $CLIP --out \$OUT --single --streams 120 --also-workers 12 --overload 175 \
--restart 64 --pipelined 1 32" STEP_TIMEOUT=400 tools/gpu_run.sh --bench-only
        OUT="$work/t" TEST_DIRS="tests/gpu tests/engines/gpu" STEP_TIMEOUT=100 \
            tools/gpu_run.sh --tests-only
        cp "$work"/bench_live.md "$work"/bench_live.json "$work/t/summary.md" "$OUT"/ 2>/dev/null
        pack "$work"
        ;;
    soak-start)
        install
        rm -rf "$SOAK"; mkdir -p "$SOAK/tmp"
        setsid nohup python3 bench/bench_live.py --clip "$CLIP" --streams 64 --soak "${2:-600}" \
            --ceiling-threads 0 --out "$SOAK" --tmp "$SOAK/tmp" >"$SOAK/log" 2>&1 < /dev/null &
        echo "soak started (pid $!)"
        end=$((SECONDS + ${3:-500}))
        while ((SECONDS < end)); do sleep 30; tail -c 300 "$SOAK/soak_partial.json" 2>/dev/null; echo; done
        cp "$SOAK/soak_partial.json" "$SOAK/log" "$OUT"/ 2>/dev/null
        ;;
    soak-collect)
        end=$((SECONDS + ${2:-240}))
        while ((SECONDS < end)) && pgrep -f "bench_live.py.*--soak" >/dev/null; do sleep 5; done
        pgrep -f "bench_live.py.*--soak" >/dev/null && echo "soak still running"
        cp "$SOAK"/bench_live.md "$SOAK"/bench_live.json "$SOAK/soak_partial.json" "$SOAK/log" "$OUT"/ 2>/dev/null
        cat "$SOAK/bench_live.md" 2>/dev/null || tail -30 "$SOAK/log"
        ;;
    rest)
        OUT="$OUT/run" TEST_DIRS="tests/decode/gpu tests/pipeline/gpu tests/analytics/gpu tests/web/gpu" BENCHES="bench/bench_kernels.py --out \$OUT" \
            STEP_TIMEOUT=200 tools/gpu_run.sh
        cp "$OUT/run/summary.md" "$OUT"/; pack "$OUT/run"
        ;;
    *) echo "usage: $0 live | soak-start [S] [WAIT] | soak-collect [WAIT] | rest" >&2; exit 2 ;;
esac
