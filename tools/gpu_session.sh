#!/usr/bin/env bash
# The GPU calls of one session, each sized for one `device run` call (< 600 s), results under $OUT.
# Since the twenty-first session engine.compile is on by default: the bench_live rows below run compiled
# (a first start compiles in every worker; add --no-compile to a row to reproduce an earlier session's), and
# the service sandbox compiles under the filter (SANDBOX_COMPILE=false: as before).
#
#   tools/gpu_session.sh live               # bench_live: ceilings, 1 stream, 120, 260 (past what 175 showed),
#                                           # kill -9 (spare), pipelined (~9 min)
#   tools/gpu_session.sh soak-start S WAIT  # a soak of 64 live streams for S s (then kill -9 of a worker) in its
#                                           # own process session (setsid: it outlives the call); nothing runs
#                                           # beside it (SOAK_TESTS="tests/..." runs those suites beside it);
#                                           # returns after WAIT s with its samples so far
#   tools/gpu_session.sh soak-collect W     # (next call, machine still warm) waits up to W s for the soak,
#                                           # results to $OUT, then `past-capacity` (not with SOAK_ONLY=1)
#   tools/gpu_session.sh past-capacity      # decode-only ceiling (16 processes x 16 decoders), streamd unpaced
#                                           # at 256 streams, then live streams offered 1.3x the higher (~6 min)
#   tools/gpu_session.sh overload N...     # live rows at N streams (no spare), 40 s warm-up each: the ramp's
#                                           # plateau is the capacity; a row >= 1.3x it is past capacity; and
#                                           # the torch engine's GPU test (~6 min for 3 rows); WARMUP=s
#                                           # overrides the 40 s warm-up
#   tools/gpu_session.sh decoders           # how many NVDEC decoders fit: 8 x 48, 16 x 24 and 1 x 64 (per process
#                                           # or per GPU?), output kept in $OUT/decoders.txt (~2 min)
#   tools/gpu_session.sh pipelined          # only the pipelined-vs-serialized rows (PIPELINED="1 32",
#                                           # PIPELINED_FRAMES="device", PIPELINED_ENGINES="1 2 2c" by default;
#                                           # ~7 min with 2c, ~2 min without)
#   tools/gpu_session.sh profile            # the pipelined rows PROFILE="1:2 32:2" (batch:engine) under
#                                           # py-spy --gil (its wheel in .prof/, carried): $OUT/gil-*.txt.gz
#   tools/gpu_session.sh multi-gpu [N...]  # on a 2-GPU box: tests/pipeline/gpu/test_multi_gpu_gpu.py (TEST_DIRS
#                                           # replaces it), live rows at N streams (default 240; OVERLOAD="M" adds
#                                           # rows without a spare) with the workers over GPUs 0 and 1, and kill -9
#                                           # of worker 1 (on GPU 1: its spare) at RESTART=64 streams (~8 min)
#   tools/gpu_session.sh rest               # 1 stream, pipelined (device + host frames, engine lanes 1 and
#                                           # 2, lanes 2 compiled), tests/gpu, tests/engines/gpu and
#                                           # tests/pipeline/gpu
#                                           # (TEST_DIRS, PIPELINED="1 8 32" replace them) (~7 min)
#   tools/gpu_session.sh service            # the unit's sandbox on the GPU path: 16 live 1080p streams (2 workers +
#                                           # spare, metrics on) under tools/seccomp_run.py, strict (a call off the
#                                           # allow list kills) then --errno (each denied call named), each 60 s
#                                           # after READY (SANDBOX_MODES="strict" for one), with --check-devices;
#                                           # then the GPU reload test
#                                           # (tests/pipeline/gpu/test_reload_gpu.py) and the wedged-worker test
#                                           # (SERVICE_TESTS replaces them, "" for none) (~8 min)
#
# Needs .whl/ (pynvvideocodec, onnx2torch, onnxslim, lap), or tools/gpu_models.sh's .whl-live, .whl-lap and
# .whl-zoo (or .whl-torch), and .assets-work/live1080.mp4 (or CLIP=…) carried (see
# bench/RESULTS.md for how the clip is made). STREAMD_COMMIT: the commit the tree is (the box gets no .git).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
OUT="${OUT:-$REPO/out/gpu-session}"
CLIP="${CLIP:-$REPO/.assets-work/live1080.mp4}"  # CLIP=… where the carry is short of room
SOAK=/tmp/streamd-soak
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

install() {  # once per machine: never under a running soak (it imports from /tmp/site)
    export PYTHONPATH="/tmp/site:$REPO"
    [[ -d /tmp/site/PyNvVideoCodec ]] && return
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl >/dev/null 2>&1 || { echo "pip install failed" >&2; exit 2; }
    else  # tools/gpu_models.sh's carry (tools/gpu_carry.sh live lap and zoo or torch): slim PyNvVideoCodec
        mkdir -p /tmp/site
        for t in .whl-live/*.tar.xz; do [[ -f "$t" ]] && tar xJf "$t" -C /tmp/site; done
        local w=(.whl-live/*.whl .whl-lap/*.whl .whl-torch/*.whl .whl-zoo/onnx2torch-*.whl .whl-zoo/onnxslim-*.whl)
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
            $(ls "${w[@]}" 2>/dev/null) >/dev/null 2>&1 || { echo "pip install failed" >&2; exit 2; }
    fi
    export PYTHONPATH="/tmp/site:$REPO"
}

pack() {  # logs into one archive: the device tool brings back at most 8 files
    tar czf "$OUT/logs.tgz" -C "$1" . 2>/dev/null
}

case "${1:-}" in
    live)
        install
        work=/tmp/gs-live; mkdir -p "$work"
        OUT="$work" WHEEL_DIR=/nonexistent BENCHES="bench/bench_live.py --clip $CLIP --out \$OUT --single --streams 120 \
--overload 260 --restart 64 --pipelined 1 32 --pipelined-frames host device" STEP_TIMEOUT=540 tools/gpu_run.sh --bench-only
        cp "$work"/bench_live.md "$work"/bench_live.json "$work/summary.md" "$OUT"/ 2>/dev/null
        pack "$work"
        ;;
    soak-start)
        install
        rm -rf "$SOAK"; mkdir -p "$SOAK/tmp"
        setsid nohup python3 bench/bench_live.py --clip "$CLIP" --streams 64 --soak "${2:-600}" --soak-kill \
            --ceiling-threads 0 --ceiling-processes 0 --out "$SOAK" --tmp "$SOAK/tmp" >"$SOAK/log" 2>&1 < /dev/null &
        echo $! >"$SOAK/sid"  # setsid without a fork: the pid is the session's id (its streamd run is in it)
        echo "soak started (session $!)"
        end=$((SECONDS + ${3:-560}))
        if [[ -n "${SOAK_TESTS:-}" ]]; then  # a harder soak, but its drops then count the suites' load too
            OUT=/tmp/gs-soak-tests TEST_DIRS="$SOAK_TESTS" STEP_TIMEOUT=150 WHEEL_DIR=/nonexistent \
                timeout $((end - SECONDS - 20)) tools/gpu_run.sh --tests-only
            cp /tmp/gs-soak-tests/summary.md "$OUT"/; pack /tmp/gs-soak-tests
        fi
        while ((SECONDS < end)); do cp "$SOAK/soak_partial.json" "$OUT"/ 2>/dev/null; sleep 10; done
        cp "$SOAK/soak_partial.json" "$SOAK/log" "$OUT"/ 2>/dev/null
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r.get(k) for k in ('streams','growth', \
'so_far')}, len(r['samples']), 'samples')" "$SOAK/soak_partial.json"
        ;;
    soak-collect)
        install
        end=$((SECONDS + ${2:-300}))
        running() { pgrep -s "$(cat "$SOAK/sid" 2>/dev/null || echo 0)" >/dev/null; }  # the bench or its streamd
        while ((SECONDS < end)) && running; do sleep 3; done
        if running; then  # never measure beside it (2026-11-30 did)
            echo "soak still running: no other bench in this call"; cp "$SOAK/soak_partial.json" "$OUT"/; exit 1
        fi
        cp "$SOAK"/bench_live.md "$OUT"/soak.md; cp "$SOAK"/bench_live.json "$OUT"/soak.json
        cp "$SOAK/log" "$OUT"/soak.log
        cat "$SOAK/bench_live.md" 2>/dev/null || tail -30 "$SOAK/log"
        [[ -n "${SOAK_ONLY:-}" ]] && exit 0  # SOAK_ONLY=1: not past-capacity after it
        if ((SECONDS > 200)); then echo "past-capacity left for the next call (${SECONDS} s used)"; exit 0; fi
        STEP_TIMEOUT=$((585 - SECONDS)) exec "$0" past-capacity
        ;;
    past-capacity)
        install
        work=/tmp/gs-capacity; mkdir -p "$work"
        OUT="$work" BENCHES="bench/bench_live.py --clip $CLIP --out \$OUT --ceiling-threads 0 --ceiling-processes 16 \
--ceiling-process-threads 16 --capacity 256 --overload-factor 1.3 --streams" STEP_TIMEOUT=${STEP_TIMEOUT:-480} \
            WHEEL_DIR=/nonexistent \
            tools/gpu_run.sh --bench-only
        cp "$work"/bench_live.md "$OUT"/capacity.md; cp "$work"/bench_live.json "$OUT"/capacity.json
        pack "$work"
        ;;
    overload)
        install; shift
        work=/tmp/gs-overload; mkdir -p "$work"
        OUT="$work" TEST_DIRS="tests/engines/gpu/test_torch_engine_gpu.py::test_torch_matches_onnxruntime_on_real_frames[fp16]" \
            BENCHES="bench/bench_live.py --clip $CLIP \
--out \$OUT --ceiling-threads 0 --ceiling-processes 0 --warmup ${WARMUP:-40} --streams --overload ${*:-200 260 320}" \
            STEP_TIMEOUT=540 WHEEL_DIR=/nonexistent tools/gpu_run.sh
        cp "$work"/bench_live.md "$work"/bench_live.json "$work"/summary.md "$OUT"/ 2>/dev/null
        pack "$work"
        ;;
    decoders)
        install
        for shape in "8 48" "16 24" "1 64"; do
            set -- $shape
            echo "== $1 processes x $2 decoders" | tee -a "$OUT/decoders.txt"
            timeout 150 python3 tools/nvdec_sessions.py "$CLIP" --processes "$1" --decoders "$2" 2>&1 | tail -1 \
                | tee -a "$OUT/decoders.txt"
        done
        ;;
    rest)
        install
        work=/tmp/gs-rest; mkdir -p "$work"
        OUT="$work" WHEEL_DIR=/nonexistent TEST_DIRS="${TEST_DIRS:-tests/gpu tests/engines/gpu tests/pipeline/gpu}" \
BENCHES="bench/bench_live.py --clip $CLIP --out \$OUT --ceiling-threads 0 --ceiling-processes 0 --single --streams \
--pipelined ${PIPELINED:-1 32} --pipelined-frames ${PIPELINED_FRAMES:-device host} --pipelined-engines ${PIPELINED_ENGINES:-1 2 2c}" STEP_TIMEOUT=${STEP_TIMEOUT:-300} \
            tools/gpu_run.sh
        cp "$work"/bench_live.md "$work"/bench_live.json "$work"/summary.md "$OUT"/ 2>/dev/null
        pack "$work"
        ;;
    pipelined)
        install
        work=/tmp/gs-pipelined; mkdir -p "$work"
        timeout "${STEP_TIMEOUT:-570}" python3 bench/bench_live.py --clip "$CLIP" --out "$work" --ceiling-threads 0 \
            --ceiling-processes 0 --streams --pipelined ${PIPELINED:-1 32} --pipelined-frames ${PIPELINED_FRAMES:-device} \
            --pipelined-engines ${PIPELINED_ENGINES:-1 2 2c} 2>&1 | tail -40
        cp "$work"/bench_live.md "$work"/bench_live.json "$OUT"/ 2>/dev/null
        ;;
    profile)  # who holds the GIL in the ring's threads: py-spy --gil (its wheel in .prof/, carried)
        install
        python3 -m pip install -q --no-index --no-deps --target /tmp/spy .prof/py_spy-*.whl >/dev/null 2>&1
        for spec in ${PROFILE:-1:2 32:2}; do  # batch:engine
            timeout "${PROFILE_TIMEOUT:-150}" /tmp/spy/bin/py-spy record --gil --threads --nonblocking --format raw \
                --rate 200 -o "$OUT/gil-${spec/:/-}.txt" -- python3 bench/bench_live.py --clip "$CLIP" \
                --out /tmp/gs-prof --ceiling-threads 0 --ceiling-processes 0 --streams --pipelined "${spec%%:*}" \
                --pipelined-frames device --pipelined-engines "${spec#*:}" 2>&1 | grep -Ev "^W[0-9]{4} " | tail -3
            gzip -f "$OUT/gil-${spec/:/-}.txt"
        done
        ;;
    multi-gpu)  # on a 2-GPU box (device kind nvidia-h200-x2): live rows with the workers over GPUs 0 and 1
        install; shift
        work=/tmp/gs-multi; mkdir -p "$work"
        OUT="$work" WHEEL_DIR=/nonexistent TEST_DIRS="${TEST_DIRS:-tests/pipeline/gpu/test_multi_gpu_gpu.py}" \
BENCHES="bench/bench_live.py --clip $CLIP --out \$OUT --ceiling-threads 0 --ceiling-processes 0 --devices 0 1 \
--warmup ${WARMUP:-40} --streams ${*:-240} --overload ${OVERLOAD:-} --restart ${RESTART:-64} --restart-worker 1" \
            STEP_TIMEOUT=${STEP_TIMEOUT:-540} tools/gpu_run.sh
        cp "$work"/bench_live.md "$work"/bench_live.json "$work"/summary.md "$OUT"/ 2>/dev/null
        pack "$work"
        ;;
    service)
        install
        work=/tmp/gs-service; mkdir -p "$work"
        if ! python3 -c "import ctypes; ctypes.CDLL('libseccomp.so.2')" 2>/dev/null; then
            export LD_LIBRARY_PATH="$REPO/.assets-work/lib"  # Debian 12's libseccomp 2.5.4, carried
            echo "libseccomp.so.2: the box has none; using the carried one" | tee -a "$OUT/service.txt"
        fi
        for mode in ${SANDBOX_MODES:-strict errno}; do
            cfg="$work/sandbox-$mode.yaml"; out="$work/sandbox-$mode.jsonl"
            {
                echo "streams:"
                for k in $(seq 0 15); do printf '  - id: cam%02d\n    url: %s\n    realtime: true\n    loop: true\n' "$k" "$CLIP"; done
                printf 'model:\n  path: %s/models/nanodet-coco.onnx\n  input_size: [416, 416]\n' "$REPO"
                printf 'engine:\n  type: torch\n  precision: fp16\n  max_batch: 16\n  compile: %s\n' "${SANDBOX_COMPILE:-true}"
                printf 'pipeline:\n  workers: 2\n  batch_size: 16\n'
                printf 'metrics:\n  enabled: true\n  port: 9108\n'
                printf 'sinks:\n  - type: jsonl\n    path: %s\n' "$out"
            } >"$cfg"
            flag=(); [[ $mode == errno ]] && flag=(--errno)
            # READY comes after the engine build (~20 s; + NanoDet's compile, ~55 s on a cold Inductor cache,
            # the default since the twenty-first session, its Triton launchers built with gcc under the
            # filter): 160 s leaves >= 60 s of running after it
            timeout 220 python3 tools/seccomp_run.py "${flag[@]}" --check-devices --duration "${SANDBOX_S:-160}" \
                --report "$work/sandbox-$mode.json" -- python3 -m streamd run "$cfg" --no-status \
                >"$work/sandbox-$mode.log" 2>&1
            echo "sandbox $mode: exit $?" | tee -a "$OUT/service.txt"
            python3 tools/sandbox_window.py "$out" --window 60 --fps 30 | tee -a "$OUT/service.txt"
            tail -5 "$work/sandbox-$mode.log" | tee -a "$OUT/service.txt"
            cat "$work/sandbox-$mode.json" >>"$OUT/service.txt" 2>/dev/null; echo >>"$OUT/service.txt"
        done
        tests=${SERVICE_TESTS-tests/pipeline/gpu/test_reload_gpu.py tests/test_wedged_worker.py}  # "": none
        [[ -n "$tests" ]] && timeout 240 python3 -m pytest -q -s -p no:cacheprovider $tests 2>&1 \
            | grep -Ev "^W[0-9]{4} " | tail -25 | tee -a "$OUT/service.txt"
        pack "$work"
        ;;
    *) echo "usage: $0 service | live | soak-start [S] [WAIT] | soak-collect [WAIT] | past-capacity | overload [N...] | decoders | pipelined | profile | rest | multi-gpu [N...]" >&2; exit 2 ;;
esac
