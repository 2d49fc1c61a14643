#!/usr/bin/env bash
# What a GPU session carries beside the tree, made on this (PyPI-connected) machine in one go; every piece is
# gitignored and a new checkout has none of them. The device tool carries 64 MiB with the tree (~55 MB).
#
#   tools/gpu_carry.sh [live] [spy] [zoo] [torch] [lap] [clip] [hevc]   # default: live spy clip
#
#   live  .whl-live/: PyNvVideoCodec slimmed to ~3 MB (tools/slim_pynvvideocodec.sh) + orjson (cp312)
#   lap   .whl-lap/: lap (cp312, 1.7 MB), tracking's assignment: rows with detect_fps need it
#   spy   .whl-spy/: py-spy (~3 MB), for `tools/gpu_models.sh gil|host`
#   zoo   .whl-zoo/: tools/zoo_wheels.txt + the YOLOX sdist (~3.7 MB), for the zoo builds on the box
#   torch .whl-torch/: onnx2torch and onnxslim only (0.3 MB): the torch engine where no zoo is built
#   clip  .assets-work/live1080.mp4: the bundled vtest footage at 1920x1080, 30 fps, 60 s, H.264 with
#         B-frames (~4-5 MB), the clip of the live rows since the tenth session; and ramp1080.mp4, its
#         first 30 s (for the ramp mode)
#   hevc  .assets-work/live1080_hevc_50.mp4: the same at 1080p30 as HEVC, 50 s (~3.2 MB)
# The GPU box runs CPython 3.12 on x86_64 (manylinux_2_28); wheels are fetched for that, not for this machine.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
WANT=("${@:-live spy clip}")
read -r -a WANT <<<"${WANT[*]}"
PY=(--python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --only-binary=:all: --no-deps)

for what in "${WANT[@]}"; do
    case "$what" in
    live)
        mkdir -p .whl .whl-live
        rm -f .whl/pynvvideocodec-* .whl-live/*  # one version only: the slim script and install() take the first
        python3 -m pip download -q "${PY[@]}" -d .whl PyNvVideoCodec
        tools/slim_pynvvideocodec.sh >/dev/null
        python3 -m pip download -q "${PY[@]}" -d .whl-live orjson
        ;;
    lap)  # tracking's assignment (1.7 MB): rows with detect_fps (tracking fills the skipped frames)
        mkdir -p .whl-lap
        python3 -m pip download -q "${PY[@]}" -d .whl-lap "lap>=0.5"
        ;;
    spy)
        mkdir -p .whl-spy
        python3 -m pip download -q "${PY[@]}" -d .whl-spy py-spy
        ;;
    torch)  # the torch engine's converter alone (330 kB), for modes that build no zoo model (gil, host, ramp)
        mkdir -p .whl-torch
        grep -E "^(onnx2torch|onnxslim)==" tools/zoo_wheels.txt | cut -d' ' -f1 >.whl-torch/req.txt
        python3 -m pip download -q "${PY[@]}" -d .whl-torch -r .whl-torch/req.txt
        rm .whl-torch/req.txt
        ;;
    zoo)
        mkdir -p .whl-zoo
        python3 -m pip download -q "${PY[@]}" -d .whl-zoo -r tools/zoo_wheels.txt
        # the YOLOX sdist (only the yolox family needs it): pip runs its setup.py, which imports torch, to read
        # its metadata; without torch here that fails, and the other families still build
        python3 -m pip download -q --no-deps --no-binary=:all: -d .whl-zoo yolox==0.3.0 >/dev/null 2>&1 \
            || echo "gpu_carry.sh: no YOLOX sdist (its setup.py needs torch here); the yolox family cannot build" >&2
        ;;
    clip)
        mkdir -p .assets-work
        if [[ ! -f .assets-work/live1080.mp4 ]]; then  # written aside first: an interrupted encode is no clip
            ffmpeg -nostdin -hide_banner -loglevel error -y -stream_loop 6 -r 30 \
                -i streamd/bundled/samples/vtest.mp4 -frames:v 1800 -vf scale=1920:1080 -c:v libx264 \
                -preset veryfast -crf 32 -bf 2 -g 60 -pix_fmt yuv420p -an .assets-work/live1080.tmp.mp4
            mv .assets-work/live1080.tmp.mp4 .assets-work/live1080.mp4
        fi
        # its first 30 s (2.4 MB), for `gpu_models.sh ramp` (RAMP_CLIP): fits the carry beside py-spy
        [[ -f .assets-work/ramp1080.mp4 ]] || ffmpeg -nostdin -hide_banner -loglevel error -y \
            -i .assets-work/live1080.mp4 -t 30 -c copy .assets-work/ramp1080.mp4
        ;;
    hevc)  # the same footage as HEVC (x265, 2 B-frames, 50 s, ~3.2 MB): issue 26 point 4 on HEVC cameras, where
        # NVDEC leaves room past H.264's ~168 live 1080p streams; carry it instead of the H.264 clip
        mkdir -p .assets-work
        if [[ ! -f .assets-work/live1080_hevc_50.mp4 ]]; then
            ffmpeg -nostdin -hide_banner -loglevel error -y -stream_loop 6 -r 30 \
                -i streamd/bundled/samples/vtest.mp4 -frames:v 1500 -vf scale=1920:1080 -c:v libx265 \
                -preset veryfast -crf 35 -x265-params bframes=2:keyint=60:log-level=none -tag:v hvc1 \
                -pix_fmt yuv420p -an .assets-work/live1080_hevc.tmp.mp4
            mv .assets-work/live1080_hevc.tmp.mp4 .assets-work/live1080_hevc_50.mp4
        fi
        ;;
    *) echo "gpu_carry.sh: unknown piece $what (live, spy, zoo, torch, lap, clip, hevc)" >&2; exit 2 ;;
    esac
done
du -sh .whl-live .whl-spy .whl-zoo .whl-torch .whl-lap .assets-work/*.mp4 2>/dev/null || true
# the device tool carries the tree and the named pieces together, 64 MiB in all (the fourteenth session's
# tree + zoo + live + spy + the 60-s clip was 64.8 MiB: carry py-spy with a shorter clip, RAMP_CLIP)
tree=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "tracked tree: $(( tree / 1048576 )) MiB of the 64 MiB a call carries"
