#!/usr/bin/env bash
# Issues 25/26 on the GPU box, session 9 onwards: each mode sized for one `device run` call (< 600 s); the
# results go into one archive, $OUT/MODE.tgz, plus MODE.summary (the tool brings back at most 8 files).
#
#   tools/gpu_models.sh families   # the zoo; GPU tests beside it (torch engine incl. RT-DETR in CUDA graphs,
#                                  # op coverage, heads); every family through engine.type auto at the default
#                                  # fp16 (its fp32 rungs when the check refuses) vs ONNX Runtime CPU;
#                                  # RT-DETR-l's engine ceiling with graphs (~9 min)
#   tools/gpu_models.sh live       # YOLOv8s and RT-DETR-l at 640, live 1080p30: largest clean N (0 drops,
#                                  # p99 <= 100 ms) near the engine ceiling, and RT-DETR with detect_fps 10
#                                  # (LIVE_Y="112 120", LIVE_R="30 34", LIVE_R10="90 100" override) (~9 min)
#   ROWS="…" tools/gpu_models.sh rows   # live rows as written (see the mode), e.g. worker counts, MPS
#   tools/gpu_models.sh gil      # py-spy --gil of one worker at GIL_N cameras (the per-worker host limit)
#   tools/gpu_models.sh ramp     # the start-up ramp: RAMP_N cameras (24) in RAMP_WORKERS (1), py-spy (GIL and
#                                # all threads) over the 12 s after "ready", each stream's first line (~1 min)
#   tools/gpu_models.sh host     # bench_host.py on the GPU path: the null detector (no inference cost), one
#                                # worker, HOST_N cameras of the 1080p clip, py-spy --gil each (~6 min)
#   tools/gpu_models.sh ceiling    # bench_engines of CEIL_MODELS (yolov8s rtdetr-l): CEIL_VARIANTS (graphs compile)
#                                  # at CEIL_B (1 8 32 64) within CEIL_BUDGET_S (540)
#   tools/gpu_models.sh profile    # tools/kernel_profile.py: where RT-DETR-l's GPU time goes, by kernel family
#   tools/gpu_models.sh contend    # tools/engine_under_load.py: RT-DETR-l's img/s alone and beside a daemon
#                                  # decoding 168 cameras (null detector), plain, SM-capped or off its cores
#   tools/gpu_models.sh memory     # bench_memory: bundled NanoDet (keep-cache = before, baseline = after the start-up
#                                  # memory release; MEM_VARIANTS) and YOLOv8s (baseline) at
#                                  # MEM_N cameras ("": none) (~8 min)
#
# Env: FAMILY_TESTS (GPU tests run beside the zoo build; "" = none), GPU_TESTS (rows, ceiling: the same beside its build), SKIP_AUDIT=1, FAMILY_CONFIGS (configs beside
# the zoo, e.g. configs/demo.yaml), CEILING=1 (RT-DETR-l bench_engines), LIVE_AFTER="yolov8s 120 --batch 64
# --lanes 2" (one live row at the end), BENCH_S, LIVE_BUDGET_S.
# Env for live rows: TASKSET (cores the daemon is pinned to), ROWS_MODELS (zoo families to build; default
# yolov8s rtdetr-l); bench_live's --pipeline-key ring_slots=2 (key=value: ROWS splits on spaces) sets a
# pipeline key; --shared runs engine.shared (one engine process per GPU). The sixteenth session measured the
# shared engine with RT-DETR-l (bench/RESULTS.md "One engine process per GPU"): 132 cameras at detect_fps 10
# p99 71 ms (5 workers x batch 8, compiled, MPS), 48 full rate p99 57 ms, 1.3x overload 0.944 of the engine.
# The seventeenth session (bench/RESULTS.md "Shared engine: memory at 16 / 64 / 120 cameras"): memory with
# MEM_VARIANTS="baseline shared", 8-core shared rows (96 YOLOv8s clean), RT-DETR 144 at detect_fps 10 (p99
# 195 ms) and 52 full rate (past the engine). Carry .whl-zoo .whl-live .whl-lap and
# .assets-work/live1080_50.mp4 (the 60-s clip cut to 50 s: `ffmpeg -i live1080.mp4 -t 50 -c copy`, it fits
# beside lap; CLIP=$PWD/.assets-work/live1080_50.mp4; 63.3 MiB with the tree). A warm machine keeps
# Inductor's cache: a second compiled RT-DETR row compiles in ~73 s instead of ~175 s. The eighteenth session
# (RESULTS "RT-DETR-l's deformable attention off Inductor's gathers"): profile mode, engine 1,920 img/s, 52 clean.
# The nineteenth session (RESULTS "Only the batch symbolic"): engine.compile with only the batch dynamic,
# 2,010 / 2,118 img/s at b32 / b64 (CEIL_VARIANTS="compile compile+alldyn" side by side), tools/stem_bench.py,
# 60 clean (3 x 8, --pipeline-key ring_slots=6), 64 every frame at p99 171-252 ms, 168 at detect_fps 10
# decode-bound (4,555 of 5,040 fps).
# The twentieth session (RESULTS "`engine.compile` on by default"): YOLOv8s compiled 7,186 img/s at b64, 144
# live clean (6 x 16, shared, MPS), 168 decode-bound; RT-DETR-l 64 at p99 136 ms; cdt, 1x1mm, freezing,
# max-autotune and lanes 2 give RT-DETR-l's engine nothing. Since then engine.compile defaults to true and
# bench_live writes `compile: true|false` always (--no-compile for uncompiled rows; the rows of earlier
# sessions without --compile ran uncompiled).
# The twenty-fourth session (RESULTS "RT-DETR-l on an H100"; 10 calls: two refused at a start, four in a
# cool-down, the seventh (no kind named) started an H100 for ~4.5 min of the budget, three more ran warm):
# RT-DETR-l 56 clean at p99 75 ms on the H100 (52 at 58 ms; 64 past its engine, batch_step 8 +1.7 % there),
# and a compiled YOLOv8s worker 4,148 MB against 4,662 uncompiled (memory with MEM_XY="NAME:K=V,K=V
# NAME:K=V,K=V": a --variant each for the YOLOv8s half): COMPILE_MB is gone.
# The twenty-fifth session (RESULTS "`detect_fps: 10` at scale on HEVC cameras"; an H100 again, started at
# the first call, six calls): point 4 on the H100 with the HEVC clip, 56 full rate (p99 92 ms) against 156 at
# detect_fps 10 (6 x 8, ring_slots 6: p99 89 ms), 2.79x; 162 at 113 ms, 168 at 304 ms; and the compiled
# first start under the unit's strict seccomp filter on the GPU (gpu_session.sh service): nothing denied.
# The twenty-sixth session (RESULTS "Point 4's engine counted"; one call ran on an H100 after five refusals):
# the engine's rows per batch counted, 63.7 at 168 on detect_fps 10 (saturated) against 32.1 at 56 full rate;
# this H100 ran slower (56 at p99 107 ms, 168 at 1,050 ms); 56 in 6 workers did not fit the call.
# The twenty-seventh session (RESULTS "Skipped frames uncopied"; four calls on two H100s): 56 full rate in 6
# workers as good as in 3 (p99 74.5 / 79.8 ms: MPS clients cost the engine nothing); the deferred NVDEC copy
# (skipped frames never copied) side by side at 168 on detect_fps 10 with tools/gpu_ab.sh: host CPU -4-7 %,
# the engine and latency unchanged (p99 272-277 ms either way): the decoded frames' cost is NVDEC's and
# PyNvVideoCodec's own.
# The twenty-eighth session (RESULTS "The engine beside 168 decoding cameras"; eleven calls, the eleventh got an
# H200 with 434 s left): `contend` mode, tools/engine_under_load.py: uncompiled RT-DETR-l at batch 56 in a
# process of its own, 1,019-1,026 img/s alone, 919-923 beside a null-detector daemon decoding 168 HEVC cameras
# on detect_fps 10 (-10 %, the live rows' loss), SM clock 1,980 MHz throughout; each load process capped at
# 10 % of the SMs (MPS): the same 922 (the cap's hold unchecked). Host CPU (the `cpu` load) did not fit.
# Next, in this order (a cold start costs 1-5 min of device time; chain calls: idle-out after 30 s; the
# twenty-second session got no machine in 18 calls (one started and was taken back before its command
# finished), the twenty-third none in 13 (8 refused at a start, 5 inside a cool-down), each refusal at a start
# costing 90-195 s of the budget: space tries 10+ min apart, keep the calls below ready; below ~650 s left a
# call 1 no longer fits: LIVE_BUDGET_S=150 LIVE_TIMEOUT_S=255 and one row is the smallest that does; an
# H100 (nvidia-h100-x1, when the H200 is in a cool-down) answers the H100 questions, not point 2's H200 goal):
#   1. RT-DETR-l 64 (3 x 8, ring_slots 6, shared, MPS) with engine.batch_step 8 (the engine runs a merged 40-56
#        rows as it is; with powers of two only fullest_prefix cut them to 32, holding the engine at 0.951 of
#        its batch-32 rate, p99 136 ms), with the GPU tests at the new default beside the build on an H200
#        (the pair ran on an H100 in the twenty-fourth session: +1.7 %, both past that GPU's engine):
#        g=$(nvidia-smi --query-gpu=name --format=csv,noheader); if [[ "$g" == *H200* ]]; then export
#        GPU_TESTS="tests/pipeline/gpu tests/engines/gpu tests/analytics/gpu" GPU_TESTS_S=250 LIVE_BUDGET_S=420;
#        else export LIVE_BUDGET_S=470; fi; ROWS_MODELS=rtdetr-l ROWS="mps:rtdetr-l 64 --workers 3 --batch 8
#        --shared --pipeline-key ring_slots=6 --engine-key batch_step=8 --engine-img-s 2118 --warmup 30
#        --start-timeout 220; mps:rtdetr-l 64 … (the same without --engine-key)" tools/gpu_models.sh rows
#        (then engine.max_batch 48: --engine-key max_batch=48; the engine's log line "engine: stopping after
#        N batches (R rows)" in the row's archive gives the rows per merged batch)
#   2. point 4: where the engine's margin goes at 168 HEVC cameras on detect_fps 10 (not the worker count,
#        not streamd's copy: twenty-seventh session; not clocks, not SM occupancy as far as an MPS cap held:
#        twenty-eighth): the host first, ~400 s cold: CLIP=$PWD/.assets-work/live1080_hevc_50.mp4
#        CONTEND_FLAGS=--no-compile CONTEND_LOADS="plain cpu sm10" CONTEND_WINDOW_S=16 tools/gpu_models.sh
#        contend (carry .whl-zoo .whl-live .whl-lap and the HEVC clip); if `cpu` gives the engine its 10 %
#        back, pin the engine process to cores of its own. Then tools/kernel_profile.py beside the load (engine
#        kernels slower, i.e. memory/L2, or gaps between them). Stream priority
#        is no lever: the engine's inference streams already run above every decoder and preprocess stream
#        (stages/cuda.py: the device's middle and highest priorities against the lowest, 0)
#   3. point 4 on HEVC cameras (H.264's NVDEC limit, ~168 live 1080p streams, is below 3 x 60): carry
#        .assets-work/live1080_hevc_50.mp4 (tools/gpu_carry.sh hevc) instead of the H.264 clip, then
#        CLIP=$PWD/.assets-work/live1080_hevc_50.mp4 ROWS_MODELS=rtdetr-l ROWS="mps:rtdetr-l 60 --workers 3
#        --batch 8 --shared --pipeline-key ring_slots=6 --engine-img-s 2118 --warmup 30 --start-timeout 220;
#        mps:rtdetr-l 180 --workers 6 --batch 8 --shared --detect-fps 10 --engine-img-s 2118 --warmup 30"
#        tools/gpu_models.sh rows: full rate and detect_fps 10 on the same HEVC clip, side by side
# Carry (tools/gpu_carry.sh makes them; each mode checks its pieces first, preflight()): .whl-zoo
# (tools/zoo_wheels.txt, for zoo builds) or .whl-torch (onnx2torch + onnxslim only: the torch engine where no
# zoo is built), .whl-live (PyNvVideoCodec slimmed, orjson), .whl-lap (rows with detect_fps), .whl-spy
# (gil, host, ramp), .assets-work/live1080.mp4 or CLIP=… . STREAMD_COMMIT=<hash>.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
MODE="${1:-}"
OUT="${OUT:-$REPO/out/gpu-models}"
RES="/tmp/res-$MODE"
ZOO=/tmp/zoo
CLIP="${CLIP:-$REPO/.assets-work/live1080.mp4}"  # CLIP=… (e.g. ramp1080.mp4) where the carry is short of room
export PYTHONUNBUFFERED=1 YOLO_CONFIG_DIR=/tmp/ultralytics PYTHONPATH="/tmp/site:$REPO"
mkdir -p "$OUT" "$RES"
trap 'tar czf "$OUT/$MODE.tgz" -C "$RES" . 2>/dev/null; cp "$RES/summary.txt" "$OUT/$MODE.summary" 2>/dev/null' EXIT

say() { echo "$@" | tee -a "$RES/summary.txt"; }

preflight() {  # what the mode needs carried, checked before a device minute goes into it (the fifteenth
    # session lost 4 calls to a missing onnx2torch, /tmp/site and lap)
    local missing=() clip="$CLIP"
    [[ "$MODE" == ramp ]] && clip="${RAMP_CLIP:-$CLIP}"
    has() { compgen -G "$1" >/dev/null || python3 -c "import $2" 2>/dev/null; }  # carried, or importable already
    has ".whl-zoo/onnx2torch-*.whl" onnx2torch || has ".whl-torch/onnx2torch-*.whl" onnx2torch \
        || missing+=(".whl-zoo or .whl-torch (onnx2torch, onnxslim: the torch engine; tools/gpu_carry.sh torch)")
    case "$MODE" in
    live | rows | memory | gil | host | ramp | contend)
        [[ -f "$clip" ]] || missing+=("$clip (tools/gpu_carry.sh clip; CLIP=... names another)")
        has ".whl-live/*.tar.xz" PyNvVideoCodec || missing+=(".whl-live (PyNvVideoCodec; tools/gpu_carry.sh live)")
        ;;
    esac
    if [[ "$MODE" == live || "$MODE" == contend || "${ROWS:-}" == *detect-fps* || -n "${GIL_DETECT_FPS:-}" ]]; then  # tracking fills
        has ".whl-lap/lap-*.whl" lap || missing+=(".whl-lap (tracking; tools/gpu_carry.sh lap)")
    fi
    case "$MODE" in
    gil | ramp | host) compgen -G ".whl-spy/*.whl" >/dev/null || missing+=(".whl-spy (py-spy; tools/gpu_carry.sh spy)") ;;
    esac
    if ((${#missing[@]})); then
        say "not carried: ${missing[*]}"
        exit 2
    fi
}

install() {
    preflight
    mkdir -p /tmp/site  # the zoo wheels make it; host and gil modes carry none
    if [[ ! -d /tmp/site/ultralytics ]] && ls .whl-zoo/*.whl >/dev/null 2>&1; then  # host, gil: no zoo needed
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-zoo/*.whl \
            >"$RES/pip.txt" 2>&1 || { say "pip install failed: $(tail -3 "$RES/pip.txt")"; exit 2; }
    fi
    if [[ ! -d /tmp/site/onnx2torch ]] && ls .whl-torch/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-torch/*.whl \
            >>"$RES/pip.txt" 2>&1 || { say "pip install failed: $(tail -3 "$RES/pip.txt")"; exit 2; }
    fi
    for t in .whl-live/*.tar.xz; do [[ -f "$t" && ! -d /tmp/site/PyNvVideoCodec ]] && tar xJf "$t" -C /tmp/site; done
    if ls .whl-live/*.whl >/dev/null 2>&1 && [[ ! -d /tmp/site/orjson ]]; then  # orjson (cp312, 130 kB)
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-live/*.whl \
            >>"$RES/pip.txt" 2>&1 || say "orjson install failed: lines through stdlib json"
    fi
    if ls .whl-lap/*.whl >/dev/null 2>&1 && [[ ! -d /tmp/site/lap ]]; then  # a warm machine may lack it
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-lap/*.whl \
            >>"$RES/pip.txt" 2>&1 || { say "lap install failed: $(tail -3 "$RES/pip.txt")"; exit 2; }
    fi
    python3 -c "import orjson" 2>/dev/null || say "no orjson: the JSON lines go through stdlib json"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$RES/gpu.txt"
}

build() {  # families... (skipped when already built on this machine)
    [[ -d /tmp/site/ultralytics ]] || say "no .whl-zoo carried (tools/gpu_carry.sh zoo): the zoo cannot be built"
    local want=() f
    for f in "$@"; do ls "$ZOO"/"$f"-640-dyn*.onnx >/dev/null 2>&1 || want+=("$f"); done
    [[ ${#want[@]} -eq 0 ]] && return
    local t0=$(date +%s)
    for f in "${want[@]}"; do
        timeout 200 python3 tools/model_zoo.py build "$f" --static-batch 0 --manifest --out "$ZOO" \
            --sdist-dir .whl-zoo >>"$RES/zoo-build.txt" 2>&1 || say "zoo build $f failed"
    done
    say "zoo ${want[*]} built in $(( $(date +%s) - t0 )) s"
}

mps_on() {  # NVIDIA MPS for what starts next in this shell (its pipe and log under /tmp)
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p /tmp/mps-pipe /tmp/mps-log
    nvidia-cuda-mps-control -d >>"$RES/summary.txt" 2>&1 || say "MPS did not start"
}

mps_off() {
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

threshold() {  # the manifest's score threshold for a zoo file (random weights: one that leaves detections)
    python3 -c "import json,sys; sys.path.insert(0,'bench'); from bench_families import _threshold; \
print(_threshold(json.load(open('$ZOO/MANIFEST.json'))['files']['$(basename "$1")']))"
}

live() {  # NAME MODEL N [bench_live args...]: one live row; prints it; 0 when clean (0 drops, p99 <= 100)
    local name="$1" model="$2" n="$3"; shift 3
    local dir="$RES/$name-$n"
    if (( SECONDS > ${LIVE_BUDGET_S:-430} )); then say "$name $n skipped: the call's time is spent"; return 2; fi
    # TASKSET=0-7: the daemon (and bench) pinned to those cores, as on an 8-core edge box (issue 26 point 6)
    timeout "${LIVE_TIMEOUT_S:-300}" ${TASKSET:+taskset -c "$TASKSET"} python3 bench/bench_live.py --clip "$CLIP" --model "$model" --input-size 640 640 \
        --model-key 'channel_order: rgb' --model-key 'mean: [0, 0, 0]' --model-key 'std: [255, 255, 255]' \
        --model-key "score_threshold: $(threshold "$model")" --streams "$n" --p99-ms 100 \
        --ceiling-threads 0 --ceiling-processes 0 --out "$dir" "$@" >"$dir.log" 2>&1
    python3 - "$dir/bench_live.json" "$name" "$n" <<'PY' | tee -a "$RES/summary.txt"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as exc:
    print(sys.argv[2], sys.argv[3], "no result:", exc); raise SystemExit(1)
row = r["ramp"][0]
keys = ("streams", "delivered_fps", "detected_fps", "drops_in_window", "p50_ms", "p99_ms", "min_stream_share",
        "min_fair_share", "engine_efficiency", "workers_started", "warmup_s", "gpu_mb_per_process", "error",
        "per_second_fps", "start", "ready_after_s", "compile_s", "stage_p50_ms", "stage_p99_ms",
        "engine_rows_per_batch", "engine_rows_per_s", "gpu_util_pct")
print(sys.argv[2], {k: row.get(k) for k in keys}, list(row.get("warnings", {}))[:3])
raise SystemExit(0 if r.get("largest_clean_streams") == int(sys.argv[3]) else 1)
PY
}

case "$MODE" in
families)
    install
    cat "$RES/gpu.txt" >>"$RES/summary.txt"
    t0=$(date +%s)
    timeout 200 python3 tools/model_zoo.py build all --static-batch 0 --manifest --out "$ZOO" \
        --sdist-dir .whl-zoo >"$RES/zoo-build.txt" 2>&1 &
    if [[ "${FAMILY_TESTS-x}" != "" ]]; then
        timeout 200 python3 -m pytest -q -p no:cacheprovider ${FAMILY_TESTS:-tests/engines/gpu/test_torch_engine_gpu.py} \
            >"$RES/gpu-tests.txt" 2>&1
    fi
    wait
    say "zoo + GPU tests in $(( $(date +%s) - t0 )) s"; tail -8 "$RES/gpu-tests.txt" | tee -a "$RES/summary.txt"
    cp "$ZOO/MANIFEST.json" "$RES/zoo-manifest.json" 2>/dev/null
    # what breaks eager runs or capture, by node, for every family (four at a time)
    [[ -z "${SKIP_AUDIT:-}" ]] && python3 -c "import json; [print(k, v['input_size'][0]) for k, v in json.load(open('$ZOO/MANIFEST.json'))['files'].items() \
if v.get('variant') != 'standard']" | xargs -P 4 -L 1 sh -c 'timeout 120 python3 tools/torch_graph_audit.py \
        '"$ZOO"'/$0 --input-size $1 $1 --cuda >'"$RES"'/audit-$0.txt 2>&1'
    for f in "$RES"/audit-*.txt; do
        say "$(basename "$f" .txt): $(grep -v 'Warning\|x = x\[' "$f" | grep -v '^ *$' | tail -2 | cut -c1-300)"
    done
    t0=$(date +%s)
    # one process per model (a failed capture or a refused engine must not touch the next model's run),
    # five at a time
    n=$(python3 -c "import json; print(sum(1 for e in json.load(open('$ZOO/MANIFEST.json'))['files'].values() \
if e.get('variant') != 'standard'))")
    n=$(( n + $(echo ${FAMILY_CONFIGS:-} | wc -w) ))  # configs beside the zoo (the bundled NanoDet: demo.yaml)
    seq 0 $(( n - 1 )) | xargs -P 5 -I{} sh -c "timeout ${BENCH_S:-260} python3 bench/bench_families.py \
        ${FAMILY_CONFIGS:-} --zoo $ZOO --frames 100 --engine auto --precisions fp16 strict --shard {}/$n --json $RES/families-{}.json \
        >$RES/families-{}.txt 2>$RES/families-{}-stderr.txt"
    say "bench_families done in $(( $(date +%s) - t0 )) s"
    grep -h "auto tries\|falls back\|capture failed\|do not fit" "$RES"/families-*-stderr.txt | cut -c1-300 \
        | tee -a "$RES/summary.txt"
    python3 - "$RES"/families-*.json <<'PY' | tee -a "$RES/summary.txt"
import json, sys
for path in sys.argv[1:]:
    for r in json.load(open(path)):
        print(r.get("model"), r.get("precision"), r.get("engine"), "tf32", r.get("tf32"), r.get("layout"), "verified", r.get("verified"),
              "matched", r.get("matched"), "above_edge", r.get("matched_above_edge"), "ref", r.get("ref_detections"),
              "gpu", r.get("gpu_detections"), "worst_iou", r.get("worst_iou"), "start", r.get("start_s"),
              "min1px", r.get("matched_min_1px"), "unmatched_px", r.get("unmatched_median_box_px"),
              (r.get("error") or r.get("refused") or "")[:200])
PY
    if [[ -n "${LIVE_AFTER:-}" ]]; then  # one live row (machine warm, models built): "yolov8s 120 --batch 64 …"
        set -- $LIVE_AFTER
        name="$1"; n="$2"; shift 2
        live "$name" "$(ls "$ZOO"/"$name"-640-dyn*.onnx | head -1)" "$n" "$@"
    fi
    if [[ -n "${CEILING:-}" ]] && (( SECONDS < ${CEILING_AFTER_S:-430} )); then
        f=$(ls "$ZOO"/rtdetr-l-640-dyn*.onnx | head -1)
        timeout 150 python3 bench/bench_engines.py --model "$f" --input-size 640 640 --precisions fp16 \
            --variants graphs lanes2 --batches 1 8 32 64 --budget-s 120 --out "$RES/rtdetr" >"$RES/rtdetr.txt" 2>&1
        say "rtdetr ceiling rc=$?"; tail -12 "$RES/rtdetr.txt" >>"$RES/summary.txt"
    fi
    ;;
live)
    install
    t0=$(date +%s)
    build yolov8s rtdetr-l &
    if [[ -n "${FAMILY_TESTS:-}" ]]; then  # GPU tests beside the build (before any live row: no contention)
        timeout 200 python3 -m pytest -q -p no:cacheprovider $FAMILY_TESTS >"$RES/gpu-tests.txt" 2>&1
        tail -6 "$RES/gpu-tests.txt" | tee -a "$RES/summary.txt"
    fi
    wait
    say "build + GPU tests in $(( $(date +%s) - t0 )) s"
    y=$(ls "$ZOO"/yolov8s-640-dyn*.onnx | head -1); r=$(ls "$ZOO"/rtdetr-l-640-dyn*.onnx | head -1)
    # --engine-img-s: bench_engines' rate at the same batch, precision and lanes (bench/RESULTS.md): each row's
    # detected fps as a share of it (issue 26 point 3)
    for n in ${LIVE_Y:-112 120}; do
        live yolov8s "$y" "$n" --batch 64 --lanes 2 --engine-img-s "${ENGINE_Y:-3521}" || break
    done
    for n in ${LIVE_R:-30 34}; do
        live rtdetr "$r" "$n" --batch 32 --lanes 2 --engine-img-s "${ENGINE_R:-1038}" || break
    done
    for n in ${LIVE_R10:-90 100}; do
        live rtdetr-d10 "$r" "$n" --batch 32 --lanes 2 --detect-fps 10 --engine-img-s "${ENGINE_R:-1038}" || break
    done
    ;;
rows)  # ROWS="yolov8s 112 --workers 2 --batch 64; mps:yolov8s 112 --batch 64; …": one live row each, no spare
    # worker (its engine build under load takes minutes); "mps:" runs the row under NVIDIA MPS
    install
    build ${ROWS_MODELS:-yolov8s rtdetr-l} &
    if [[ -n "${GPU_TESTS:-}" ]]; then  # GPU tests beside the build, before any live row (no contention)
        timeout "${GPU_TESTS_S:-240}" python3 -m pytest -v -p no:cacheprovider $GPU_TESTS >"$RES/gpu-tests.txt" 2>&1
        say "GPU tests rc=$? in $SECONDS s"; tail -8 "$RES/gpu-tests.txt" | tee -a "$RES/summary.txt"
    fi
    wait
    (which nvidia-cuda-mps-control && nvidia-smi -q | grep -i "compute mode") >>"$RES/summary.txt" 2>&1
    IFS=';' read -ra rows <<<"${ROWS:-}"
    for row in "${rows[@]}"; do
        [[ -z "${row// }" ]] && continue  # a trailing "; "
        set -- $row
        name="$1"; n="$2"; shift 2
        mps=""; [[ "$name" == mps:* ]] && { mps=1; name="${name#mps:}"; }
        if [[ -n "$mps" ]]; then
            mps_on
        fi
        k=$(( ${k:-0} + 1 ))
        # random weights: RT-DETR's fp16 detections differ from fp32 (the check refuses it); its cost is measured
        [[ "$name" == rtdetr* ]] && set -- "$@" --engine-key "verify: false"
        live "row$k-${mps:+mps-}$name" "$(ls "$ZOO"/"$name"-640-dyn*.onnx | head -1)" "$n" --no-spare "$@"
        if [[ -n "$mps" ]]; then
            mps_off
        fi
    done
    ;;
gil)  # who holds the GIL in one worker at GIL_N cameras (bundled NanoDet, one worker, live, fp16; GIL_DETECT_FPS=10
    # detects a third of the frames and tracking fills the rest): the host
    # limit of a worker (RESULTS "Live density with real-size detectors": 1 ms of host CPU per frame at 24-30
    # cameras, 7 ms at 112). Carry .whl-live, .whl-spy, .whl-torch (no zoo needed) and the clip.
    install
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl-spy/*.whl >>"$RES/pip.txt" 2>&1 \
        || { say "py-spy install failed"; exit 2; }
    for n in ${GIL_N:-24 56}; do
        python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from bench_live import \
config_text; print(config_text(Path('$CLIP'), $n, Path('/tmp/gil-$n.jsonl'), batch=16, workers='1', engine='${GIL_ENGINE:-torch}', \
detect_fps=${GIL_DETECT_FPS:-None}, extra='  spare_worker: false\n'))" >"/tmp/gil-$n.yaml"
        python3 -m streamd run "/tmp/gil-$n.yaml" >"$RES/gil-$n-daemon.log" 2>&1 &
        pid=$!
        sleep "${GIL_WARM_S:-35}"
        /tmp/spy/bin/py-spy record --gil --subprocesses --nonblocking -r 100 -d "${GIL_S:-20}" -f raw \
            -o "$RES/gil-$n.txt" --pid "$pid" >"$RES/gil-$n-spy.log" 2>&1
        /tmp/spy/bin/py-spy record --subprocesses --nonblocking -r 100 -d 10 -f raw -o "$RES/all-$n.txt" \
            --pid "$pid" >>"$RES/gil-$n-spy.log" 2>&1
        kill -INT "$pid"; timeout 30 tail --pid="$pid" -f /dev/null || kill -9 "$pid"; wait "$pid"
        say "gil $n: $(grep -h 'done:' "$RES/gil-$n-daemon.log" | tail -1 | cut -c1-200)"
        python3 - "$RES/gil-$n.txt" <<'PY' | tee -a "$RES/summary.txt"
import collections, re, sys
incl, own, total = collections.Counter(), collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, n = line.rsplit(" ", 1)
    frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if "(" in f]
    total += int(n)
    if frames:
        own[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
print("GIL samples", total)
for k, v in incl.most_common(30):
    print(f"{v:6d} {100 * v / max(total, 1):5.1f}% incl {k[:140]}")
for k, v in own.most_common(20):
    print(f"{v:6d} {100 * v / max(total, 1):5.1f}% self {k[:140]}")
PY
    done
    ;;
ramp)  # the start-up ramp (thirteenth session: last stream's first line 7.5-10 s after READY at 24 cameras a
    # worker): one worker, RAMP_N cameras of the 1080p clip, bundled NanoDet; py-spy samples the 12 s after
    # "ready" twice at once, GIL holders and every running thread (--threads), so the ramp's own cost shows
    install
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl-spy/*.whl >>"$RES/pip.txt" 2>&1 \
        || { say "py-spy install failed"; exit 2; }
    for n in ${RAMP_N:-24}; do
        python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from bench_live import \
config_text; print(config_text(Path('${RAMP_CLIP:-$CLIP}'), $n, Path('/tmp/ramp-$n.jsonl'), batch=16, workers='${RAMP_WORKERS:-1}', engine='torch', \
extra='  spare_worker: false\n'))" >"/tmp/ramp-$n.yaml"
        t0=$(date +%s.%N)
        python3 -m streamd run "/tmp/ramp-$n.yaml" >"$RES/ramp-$n-daemon.log" 2>&1 &
        pid=$!
        until grep -q "streamd: ready" "$RES/ramp-$n-daemon.log" || ! kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
        t1=$(date +%s.%N)
        /tmp/spy/bin/py-spy record --gil --threads --subprocesses --nonblocking -r 200 -d "${RAMP_S:-12}" -f raw \
            -o "$RES/ramp-$n-gil.txt" --pid "$pid" >"$RES/ramp-$n-spy.log" 2>&1 &
        /tmp/spy/bin/py-spy record --threads --subprocesses --nonblocking -r 200 -d "${RAMP_S:-12}" -f raw \
            -o "$RES/ramp-$n-all.txt" --pid "$pid" >>"$RES/ramp-$n-spy.log" 2>&1
        wait %2 2>/dev/null
        sleep 3
        kill -INT "$pid"; timeout 30 tail --pid="$pid" -f /dev/null || kill -9 "$pid"; wait "$pid"
        say "ramp $n: ready after $(python3 -c "print(round($t1 - $t0, 1))") s; $(grep -h 'done:' "$RES/ramp-$n-daemon.log" | tail -1 | cut -c1-200)"
        # each stream's first line after ready (wall clock in the lines: bench_live's own reading)
        python3 - "/tmp/ramp-$n.jsonl" "$t1" <<'PY' | tee -a "$RES/summary.txt"
import json, sys
first = {}
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    sid, t = d.get("stream"), d.get("wall_time") or d.get("time")
    if sid is not None and t is not None and sid not in first:
        first[sid] = float(t)
ready = float(sys.argv[2])
ts = sorted(t - ready for t in first.values())
print("first lines after ready (s):", [round(t, 2) for t in ts])
PY
        for kind in gil all; do
            python3 - "$RES/ramp-$n-$kind.txt" "$kind" <<'PY' | tee -a "$RES/summary.txt"
import collections, re, sys
incl, own, threads, total = collections.Counter(), collections.Counter(), collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, n = line.rsplit(" ", 1)
    parts = stack.split(";")
    thread = re.sub(r"[-_ ]?\d+", "#", parts[1] if len(parts) > 1 else "?")  # "process;thread;frames…"
    frames = [re.sub(r":\d+\)$", ")", f) for f in parts if "(" in f]
    total += int(n)
    threads[thread] += int(n)
    if frames:
        own[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
print(sys.argv[2], "samples", total, "by thread:", threads.most_common(8))
for k, v in incl.most_common(25):
    print(f"{v:6d} {100 * v / max(total, 1):5.1f}% incl {k[:150]}")
for k, v in own.most_common(15):
    print(f"{v:6d} {100 * v / max(total, 1):5.1f}% self {k[:150]}")
PY
        done
    done
    ;;
host)  # a worker's own host cost per frame on the GPU path, with a detector that costs nothing (bench_host.py)
    install
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl-spy/*.whl >>"$RES/pip.txt" 2>&1 \
        || { say "py-spy install failed"; exit 2; }
    PATH="/tmp/spy/bin:$PATH" timeout 480 python3 bench/bench_host.py --engine torch --clip "$CLIP" \
        --streams ${HOST_N:-24 56 112} --window 15 --profile --out "$RES/host" >"$RES/host.log" 2>&1
    say "host rc=$?"
    for f in "$RES"/host/bench_live-*.md; do tail -1 "$f" >>"$RES/summary.txt"; done
    grep -h -A12 "GIL holders" "$RES/host.log" >>"$RES/summary.txt"
    ;;
ceiling)  # bench_engines for zoo models (CEIL_MODELS), CEIL_VARIANTS side by side in one process each: issue 26
    # point 1's `engine.compile` (never measured before the twelfth session) beside CUDA graphs
    install
    build ${CEIL_MODELS:-yolov8s rtdetr-l} &
    if [[ -n "${GPU_TESTS:-}" ]]; then  # GPU tests beside the (CPU-bound) build, before any timing
        timeout "${GPU_TESTS_S:-240}" python3 -m pytest -v -p no:cacheprovider $GPU_TESTS >"$RES/gpu-tests.txt" 2>&1
        say "GPU tests rc=$? in $SECONDS s"; tail -8 "$RES/gpu-tests.txt" | tee -a "$RES/summary.txt"
    fi
    wait
    for m in ${CEIL_MODELS:-yolov8s rtdetr-l}; do
        f=$(ls "$ZOO"/"$m"-640-dyn*.onnx | head -1)
        left=$(( ${CEIL_BUDGET_S:-540} - SECONDS - 20 ))
        if (( left < 90 )); then say "ceiling $m skipped: the call's time is spent"; continue; fi
        timeout "$left" python3 bench/bench_engines.py --model "$f" --input-size 640 640 --precisions fp16 \
            --variants ${CEIL_VARIANTS:-graphs compile} --batches ${CEIL_B:-1 8 32 64} --budget-s $(( left - 30 )) \
            --out "$RES/ceiling-$m" >"$RES/ceiling-$m.txt" 2>&1
        say "ceiling $m rc=$?"; cat "$RES/ceiling-$m/bench_engines.md" >>"$RES/summary.txt" 2>/dev/null \
            || tail -12 "$RES/ceiling-$m.txt" >>"$RES/summary.txt"
    done
    ;;
contend)  # tools/engine_under_load.py: RT-DETR-l's img/s at batch CONTEND_B (56) alone, then beside each load
    # of CONTEND_LOADS ("plain sm10 cpu"): a daemon decoding CONTEND_N (168) cameras of $CLIP on detect_fps 10
    # under a null detector (bench_host.py, 6 workers), all under MPS. plain = as it is; smK = each of the load's
    # processes capped at K % of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps each MPS client, not their sum:
    # 6 x 10 % leaves the engine 40 % at least); cpu = the load kept off the engine's two cores (taskset);
    # smKcpu = both. The engine always runs on cores 14-15. nvidia-smi logs the SM clock, power and NVDEC every
    # 2 s (is it clocks, SMs or the host?). CONTEND_FLAGS="--no-compile": an engine built in seconds (a short
    # call; the interference, not the ceiling, is the question).
    install
    build rtdetr-l
    f=$(ls "$ZOO"/rtdetr-l-640-dyn*.onnx | head -1)
    mps_on
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,utilization.decoder,temperature.gpu \
        --format=csv -l 2 >"$RES/smi.csv" 2>&1 &
    smi=$!
    rm -f /tmp/engine-ready /tmp/engine-stop; echo build >/tmp/phase
    taskset -c 14-15 python3 tools/engine_under_load.py --model "$f" --batch "${CONTEND_B:-56}" ${CONTEND_FLAGS:-} \
        --phase-file /tmp/phase --ready-file /tmp/engine-ready --stop-file /tmp/engine-stop \
        >"$RES/engine.jsonl" 2>"$RES/engine.err" &
    eng=$!
    for _ in $(seq 240); do [[ -f /tmp/engine-ready ]] && break; sleep 1; done
    say "engine ready at $SECONDS s: $(head -1 "$RES/engine.jsonl")"
    echo alone >/tmp/phase; sleep "${CONTEND_ALONE_S:-16}"
    for load in ${CONTEND_LOADS:-plain sm10 cpu}; do
        if (( SECONDS > ${CONTEND_BUDGET_S:-470} )); then say "load $load skipped: the call's time is spent"; continue; fi
        pct=""; cores=0-15
        [[ "$load" =~ ^sm([0-9]+) ]] && pct="${BASH_REMATCH[1]}"
        [[ "$load" == *cpu ]] && cores=0-13
        # the SM count a capped client reads: whether MPS shows its cap there is not known here (the cap's hold
        # was unchecked in the twenty-eighth session's run)
        [[ -n "$pct" ]] && say "SMs a client sees at $pct %: $(env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct \
            python3 -c 'import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)' 2>&1 | tail -1)"
        echo "start $load" >/tmp/phase
        env BENCH_PHASE_FILE=/tmp/phase BENCH_PHASE_LABEL="$load" ${pct:+CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct} \
            timeout 200 taskset -c "$cores" python3 bench/bench_host.py --engine torch --clip "$CLIP" \
            --streams "${CONTEND_N:-168}" --workers 6 --detect-fps 10 --window "${CONTEND_WINDOW_S:-30}" \
            --warmup "${CONTEND_WARMUP_S:-20}" --out "$RES/host-$load" >"$RES/host-$load.log" 2>&1
        say "load $load rc=$? at $SECONDS s: $(tail -1 "$RES/host-$load/bench_live.md" 2>/dev/null)"
        echo "alone after $load" >/tmp/phase; sleep 6
    done
    touch /tmp/engine-stop; wait $eng; kill $smi 2>/dev/null
    sed -n '/^# medians/,$p' "$RES/engine.jsonl" | tee -a "$RES/summary.txt"
    tail -3 "$RES/engine.err" >>"$RES/summary.txt"
    mps_off
    ;;
profile)  # tools/kernel_profile.py: GPU time by kernel family for PROF_MODELS (rtdetr-l) at PROF_B (32),
    # uncompiled (with the ATen operators) and compiled (PROF_HOW); no CUDA graphs, so every kernel shows;
    # PROF_TESTS: GPU tests run beside the zoo build
    install
    if [[ -n "${PROF_TESTS:-}" ]]; then  # GPU tests beside the zoo build (CPU-bound export)
        timeout "${PROF_TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider $PROF_TESTS >"$RES/gpu-tests.txt" 2>&1 &
    fi
    build ${PROF_MODELS:-rtdetr-l}
    wait
    [[ -n "${PROF_TESTS:-}" ]] && tail -4 "$RES/gpu-tests.txt" | tee -a "$RES/summary.txt"
    for m in ${PROF_MODELS:-rtdetr-l}; do
        f=$(ls "$ZOO"/"$m"-640-dyn*.onnx | head -1)
        for how in ${PROF_HOW:-eager compiled}; do
            flag=""; [[ "$how" == compiled ]] && flag=--compile
            timeout "${PROF_S:-330}" python3 tools/kernel_profile.py --model "$f" --batch "${PROF_B:-32}" $flag \
                >"$RES/profile-$m-$how.txt" 2>&1
            say "profile $m $how rc=$?"
            grep -v "Warning\|warn(" "$RES/profile-$m-$how.txt" | head -${PROF_LINES:-60} >>"$RES/summary.txt"
        done
    done
    ;;
memory)  # MEM_VARIANTS (keep-cache baseline) at MEM_N, then YOLOv8s's MEM_VY (baseline) at MEM_NY (16 64);
    # `shared` = engine.shared (the engine process reported apart); MEM_S / MEM_SY bound each half
    install
    build yolov8s >/dev/null &  # a CPU export beside the NanoDet runs (memory is what they measure)
    if [[ -n "${MEM_N-16 64 120}" ]]; then  # MEM_N="": YOLOv8s only
        timeout "${MEM_S:-330}" python3 bench/bench_memory.py --clip "$CLIP" --streams ${MEM_N:-16 64 120} \
            --variants ${MEM_VARIANTS:-keep-cache baseline} --warmup 10 --window 10 --out "$RES/nanodet" >"$RES/nanodet.log" 2>&1
        say "nanodet rc=$?"; cat "$RES/nanodet/bench_memory.md" >>"$RES/summary.txt" 2>/dev/null
    fi
    wait
    y=$(ls "$ZOO"/yolov8s-640-dyn*.onnx | head -1)
    extra=(); for v in ${MEM_XY-}; do extra+=(--variant "$v"); done  # MEM_XY: any number of NAME:K=V,K=V
    timeout "${MEM_SY:-200}" python3 bench/bench_memory.py --clip "$CLIP" --model "$y" --input-size 640 640 \
        --model-key 'channel_order: rgb' --model-key 'mean: [0, 0, 0]' --model-key 'std: [255, 255, 255]' \
        --streams ${MEM_NY:-16 64} --variants ${MEM_VY:-baseline} "${extra[@]}" --warmup 10 --window 10 \
        --out "$RES/yolov8s" \
        >"$RES/yolov8s.log" 2>&1
    say "yolov8s rc=$?"; cat "$RES/yolov8s/bench_memory.md" >>"$RES/summary.txt" 2>/dev/null
    ;;
*)
    echo "usage: $0 families|live|memory" >&2
    exit 2
    ;;
esac
