#!/usr/bin/env bash
# One live row with this tree and with some files as another commit had them, on one GPU machine, in one
# call (a machine's own speed varies from one start to the next: compare only rows of the same call).
#
#   tools/gpu_ab.sh prepare COMMIT FILE...   # here: the files as COMMIT had them, into out/ab-old/
#   ROW="mps:rtdetr-l 168 --workers 6 --detect-fps 10 …" [AB_ORDER="old new"] tools/gpu_ab.sh run
#                                            # on the GPU box: tools/gpu_models.sh rows for each side,
#                                            # results in $OUT/new and $OUT/old
# Carry out/ab-old beside what tools/gpu_models.sh rows needs (.whl-zoo .whl-live .whl-lap and the clip);
# CLIP, ROWS_MODELS, LIVE_* and GPU_TESTS pass through to gpu_models.sh (GPU tests run with the new side).
# The twenty-seventh session measured the deferred NVDEC copy with it (bench/RESULTS.md "Skipped frames
# uncopied").
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
OLD=out/ab-old

case "${1:-}" in
prepare)
    commit="${2:?COMMIT}"; shift 2
    rm -rf "$OLD" && mkdir -p "$OLD"
    echo "$commit" >"$OLD/COMMIT"
    for f in "$@"; do
        mkdir -p "$OLD/$(dirname "$f")"
        git show "$commit:$f" >"$OLD/$f" || exit 2
        echo "$f" >>"$OLD/FILES"
    done
    echo "out/ab-old: $(wc -l <"$OLD/FILES") file(s) as $commit had them; carry it"
    ;;
run)
    [[ -f "$OLD/FILES" ]] || { echo "not carried: $OLD (tools/gpu_ab.sh prepare COMMIT FILE...)"; exit 2; }
    : "${ROW:?ROW=\"MODEL N bench_live args\"}" "${OUT:?}"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    mkdir -p /tmp/ab-new
    while read -r f; do mkdir -p "/tmp/ab-new/$(dirname "$f")"; cp "$f" "/tmp/ab-new/$f"; done <"$OLD/FILES"
    for side in ${AB_ORDER:-new old}; do
        src=/tmp/ab-new; [[ "$side" == old ]] && src="$OLD"
        while read -r f; do cp "$src/$f" "$f"; done <"$OLD/FILES"
        tests="${GPU_TESTS:-}"; [[ "$side" == old ]] && tests=""
        GPU_TESTS="$tests" OUT="$OUT/$side" ROWS="$ROW" tools/gpu_models.sh rows >/dev/null 2>&1
        echo "$side ($( [[ "$side" == old ]] && cat "$OLD/COMMIT" || echo this tree )):"
        grep -E "GPU tests|passed|failed|^row" "$OUT/$side/rows.summary" | tail -3 | cut -c1-1800
    done
    while read -r f; do cp "/tmp/ab-new/$f" "$f"; done <"$OLD/FILES"  # the tree as it came
    ;;
*)
    sed -n 2,13p "$0"
    exit 2
    ;;
esac
