#!/usr/bin/env bash
# Issue 25/26 on the GPU box, each mode sized for one `device run` call (< 600 s), results under $OUT.
#
#   tools/gpu_families.sh zoo        # wheels, the model zoo built at 640 (SSDlite 320) on the box, then
#                                    # bench_families (every family: GPU engine + kernels vs ONNX Runtime CPU
#                                    # on 100 frames, fp16 and fp32), then the GPU twin tests (~8 min)
#   tools/gpu_families.sh ceiling    # (machine still warm: /tmp/zoo) bench_engines for YOLOv8s and RT-DETR-l
#                                    # at 640, fp16 and bf16 (~7 min)
#
# Pass STREAMD_COMMIT=<hash> (the box's copy of the tree may hold a stale .git; bench tables print it).
# Carry: .whl-zoo (tools/zoo_wheels.txt + the YOLOX sdist; add onnx2torch and lap wheels to it: the tree
# with tests/data/zoo leaves no room for .whl and its 27 MB PyNvVideoCodec, which these modes do not use).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
OUT="${OUT:-$REPO/out/gpu-families}"
ZOO=/tmp/zoo
export PYTHONUNBUFFERED=1 YOLO_CONFIG_DIR=/tmp/ultralytics PYTHONPATH="/tmp/site:$REPO"
mkdir -p "$OUT"

install() {
    [[ -d /tmp/site/ultralytics ]] && return
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl 2>/dev/null) .whl-zoo/*.whl \
        >"$OUT/pip.txt" 2>&1 || { echo "pip install failed" >&2; tail -5 "$OUT/pip.txt"; exit 2; }
}

case "${1:-}" in
zoo)
    install
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
    t0=$(date +%s)
    timeout 260 python3 tools/model_zoo.py build all --static-batch 0 --manifest --out "$ZOO" \
        --sdist-dir .whl-zoo >"$OUT/zoo-build.txt" 2>&1
    echo "zoo build rc=$? in $(( $(date +%s) - t0 )) s"; ls -la "$ZOO" | tee "$OUT/zoo-files.txt"
    cp "$ZOO/MANIFEST.json" "$OUT/zoo-manifest.json" 2>/dev/null
    t0=$(date +%s)
    timeout 220 python3 bench/bench_families.py --zoo "$ZOO" --frames 100 --precisions fp16 fp32 \
        --json "$OUT/families.json" >"$OUT/families.txt" 2>"$OUT/families-stderr.txt"
    echo "bench_families rc=$? in $(( $(date +%s) - t0 )) s"
    python3 - "$OUT/families.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r.get("model"), r.get("precision"), r.get("engine"), r.get("layout"), "verified", r.get("verified"),
          "matched", r.get("matched"), "ref", r.get("ref_detections"), "gpu", r.get("gpu_detections"),
          "start", r.get("start_s"), (r.get("error") or "")[:300])
PY
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_heads_gpu.py tests/gpu/test_postprocess_gpu.py \
        tests/engines/gpu/test_op_coverage_gpu.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.txt"
    ;;
zoo2)  # the machine still warm from `zoo`: twin tests, then bench_families with the torch engine (its
    # verdict kept, the rows measured even where it refuses), two shards at once
    install
    if [[ ! -f "$ZOO/MANIFEST.json" ]]; then  # a fresh machine after all: build the zoo again
        timeout 200 python3 tools/model_zoo.py build all --static-batch 0 --manifest --out "$ZOO" \
            --sdist-dir .whl-zoo >"$OUT/zoo-build.txt" 2>&1
        echo "zoo rebuilt rc=$?"
    elif [[ -z "${SKIP_TESTS:-}" ]]; then
        timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_heads_gpu.py \
            tests/gpu/test_postprocess_gpu.py tests/engines/gpu/test_op_coverage_gpu.py 2>&1 | tail -25 \
            | tee "$OUT/gpu-tests.txt"
    fi
    t0=$(date +%s)
    for k in 0 1; do
        timeout "${BENCH_S:-400}" python3 bench/bench_families.py --zoo "$ZOO" --frames 100 --engine torch --precisions fp32 fp16 \
            --shard "$k/2" --json "$OUT/families-$k.json" >"$OUT/families-$k.txt" 2>"$OUT/families-$k-stderr.txt" &
    done
    wait
    echo "bench_families done in $(( $(date +%s) - t0 )) s"
    python3 - "$OUT"/families-*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    for r in json.load(open(path)):
        print(r.get("model"), r.get("precision"), r.get("engine"), r.get("layout"), "verified", r.get("verified"),
              "verify_matched", r.get("verify_matched"), "matched", r.get("matched"), "ref", r.get("ref_detections"),
              "gpu", r.get("gpu_detections"), "start", r.get("start_s"), (r.get("error") or r.get("refused") or "")[:260])
PY
    ;;
ceiling)
    install
    for m in yolov8s-640-dyn rtdetr-l-640-dyn; do
        f=$(ls "$ZOO"/"$m"*.onnx 2>/dev/null | head -1)
        [[ -n "$f" ]] || { echo "no $m in $ZOO (run the zoo mode first, machine warm)"; continue; }
        timeout 280 python3 bench/bench_engines.py --model "$f" --input-size 640 640 --precisions fp16 bf16 \
            --budget-s 200 --out "$OUT/$m" >"$OUT/$m.txt" 2>&1
        echo "$m rc=$?"; tail -40 "$OUT/$m.txt"
    done
    ;;
*)
    echo "usage: $0 zoo|ceiling" >&2
    exit 2
    ;;
esac
