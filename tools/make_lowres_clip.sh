#!/usr/bin/env bash
# Low-resolution H.264 clips with B-frames, made from the bundled vtest.mp4, for the GPU-vs-CPU preprocess
# comparison (bench/bench_preprocess_f1.py, issue 25 point 5). Three variants, 384x288, 3 B-frames:
#
#   vtest-384-bt601.mp4     BT.601 limited range (colour description written: smpte170m, tv)
#   vtest-384-bt709.mp4     BT.709 limited range (bt709, tv)
#   vtest-384-full.mp4      BT.601 full range (smpte170m, pc: the VUI's video_full_range_flag = 1)
#
#   tools/make_lowres_clip.sh [OUT_DIR]     # default .assets-work/lowres (gitignored); needs ffmpeg + libx264
#
# The scaler converts the source's BT.601 limited pictures into each target matrix/range (so the pictures
# look the same; only the signalled coding differs), and x264 writes the matching VUI colour description.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO/.assets-work/lowres}"
SRC="$REPO/streamd/bundled/samples/vtest.mp4"
mkdir -p "$OUT"

make() {  # name matrix(swscale) range(tv|pc) colorspace-tag
    local name=$1 matrix=$2 range=$3 tag=$4
    local pix=yuv420p
    ffmpeg -nostdin -hide_banner -loglevel error -y -i "$SRC" -an -map_metadata -1 \
        -vf "scale=384:288:flags=bicubic:in_color_matrix=bt601:in_range=tv:out_color_matrix=$matrix:out_range=$range,format=$pix" \
        -c:v libx264 -preset medium -crf 23 -bf 3 -b_strategy 0 -g 50 -threads 2 \
        -colorspace "$tag" -color_primaries "$tag" -color_trc "$tag" -color_range "$range" \
        -x264-params "colormatrix=$tag:range=$range" -fflags +bitexact "$OUT/$name"
    echo "$OUT/$name $(ffprobe -v error -select_streams v:0 -show_entries \
        stream=width,height,has_b_frames,pix_fmt,color_range,color_space -of csv=p=0 "$OUT/$name")"
}

make vtest-384-bt601.mp4 bt601 tv smpte170m
make vtest-384-bt709.mp4 bt709 tv bt709
make vtest-384-full.mp4 bt601 pc smpte170m
