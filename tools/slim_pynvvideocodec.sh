#!/usr/bin/env bash
# PyNvVideoCodec for the GPU box in 3 MB: the wheel (.whl/pynvvideocodec-*.whl, 27 MB) without its samples,
# FFmpeg sources and the unversioned copies of its libraries (the modules load the sonames). The device
# tool carries 64 MiB with the tree, which already holds ~55 MB. Extract with `tar xJf … -C /tmp/site`.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheel=$(ls "$REPO"/.whl/pynvvideocodec-*.whl | head -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && unzip -q "$wheel" && rm -rf samples pynvvideocodec-*.data \
    PyNvVideoCodec/libavformat.so PyNvVideoCodec/libavformat.so.*.*.* \
    PyNvVideoCodec/libavutil.so PyNvVideoCodec/libavutil.so.*.*.*)
mkdir -p "$REPO/.whl-live"
tar cJf "$REPO/.whl-live/$(basename "$wheel" .whl | cut -d- -f1-2)-slim.tar.xz" -C "$work" .
ls -la "$REPO/.whl-live"
