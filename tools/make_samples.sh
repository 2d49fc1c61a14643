#!/usr/bin/env bash
# Reproduce samples/vtest.mp4 and samples/vtest-hevc.mp4 from Debian's opencv-doc package.
#
#   tools/make_samples.sh            # from the repo root (needs apt-get; installs ffmpeg if missing)
#
# Source: usr/share/doc/opencv-doc/examples/data/vtest.avi in the Debian package opencv-doc
# (768x576, 10 fps, 795 frames, msmpeg4v3). License: Apache-2.0 AND BSD-3-Clause (Debian copyright,
# copied to samples/LICENSE). Work files go to .assets-work/ (gitignored).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-$REPO/.assets-work/samples}"
OUT="$REPO/samples"
PY="${PY:-$REPO/.venv/bin/python}"
DEB_VERSION="${OPENCV_DOC_VERSION:-4.6.0+dfsg-12}"
# sha256 of opencv-doc_4.6.0+dfsg-12_all.deb (Debian 12 "bookworm") as recorded in samples/README.md.
DEB_SHA256="${OPENCV_DOC_SHA256:-4b12681df35878207ac7097dc66184b2ae552e4bf4ddd2af04a0f03ed0b8682a}"
HEVC_FRAMES=100

log() { printf '[make_samples] %s\n' "$*" >&2; }

if ! command -v ffmpeg >/dev/null || ! command -v ffprobe >/dev/null; then
    log "ffmpeg missing: installing from Debian"
    apt-get update
    apt-get install -y --no-install-recommends ffmpeg
fi

mkdir -p "$WORK" "$OUT"
cd "$WORK"

DEB="opencv-doc_${DEB_VERSION}_all.deb"
if [[ ! -f "$DEB" ]]; then
    log "apt-get download opencv-doc=$DEB_VERSION"
    apt-get download "opencv-doc=$DEB_VERSION"
fi
got="$(sha256sum "$DEB" | cut -d' ' -f1)"
log "$DEB sha256 $got"
if [[ "$got" != "$DEB_SHA256" ]]; then
    log "ERROR: sha256 differs from the recorded $DEB_SHA256 (set OPENCV_DOC_SHA256 to accept a new one)"
    exit 1
fi

rm -rf deb && mkdir deb
dpkg -x "$DEB" deb
DATA=deb/usr/share/doc/opencv-doc/examples/data
if [[ -f "$DATA/vtest.avi" ]]; then
    SRC="$DATA/vtest.avi"
elif [[ -f "$DATA/vtest.avi.gz" ]]; then
    gzip -dc "$DATA/vtest.avi.gz" > vtest.avi
    SRC="$WORK/vtest.avi"
else
    log "ERROR: vtest.avi not found in $DEB"; exit 1
fi
log "source $SRC sha256 $(sha256sum "$SRC" | cut -d' ' -f1)"

# Fixed thread counts and bitexact muxing so that the same ffmpeg/x264/x265 build gives the same bytes.
set -x
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$SRC" \
    -map 0:v:0 -an -sn -map_metadata -1 \
    -c:v libx264 -preset slow -crf 25 -pix_fmt yuv420p -r 10 -threads 2 \
    -movflags +faststart -fflags +bitexact -flags:v +bitexact \
    "$OUT/vtest.mp4"
ffmpeg -nostdin -hide_banner -loglevel error -y -i "$SRC" \
    -map 0:v:0 -an -sn -map_metadata -1 -frames:v "$HEVC_FRAMES" \
    -c:v libx265 -preset medium -crf 28 -pix_fmt yuv420p -r 10 \
    -x265-params log-level=error:pools=2:frame-threads=1 -tag:v hvc1 \
    -movflags +faststart -fflags +bitexact -flags:v +bitexact \
    "$OUT/vtest-hevc.mp4"
{ set +x; } 2>/dev/null

# Debian copyright of opencv-doc (vtest.avi is under "Files: *": Apache-2.0 AND BSD-3-Clause), verbatim,
# followed by the full Apache-2.0 text it refers to.
{
    echo "samples/vtest.mp4 and samples/vtest-hevc.mp4 are transcodes of vtest.avi from the Debian package"
    echo "opencv-doc $DEB_VERSION (usr/share/doc/opencv-doc/examples/data/vtest.avi, upstream OpenCV"
    echo "samples/data/vtest.avi), covered by the \"Files: *\" stanza below: Apache-2.0 AND BSD-3-Clause."
    echo
    echo "===== usr/share/doc/opencv-doc/copyright (verbatim) ====="
    cat deb/usr/share/doc/opencv-doc/copyright
    echo
    echo "===== Apache License 2.0 (full text, from Debian /usr/share/common-licenses/Apache-2.0) ====="
    cat /usr/share/common-licenses/Apache-2.0
} > "$OUT/LICENSE"

# Verify: frame counts with ffprobe (-count_frames) and by decoding every frame with PyAV.
status=0
for f in vtest.mp4:795 vtest-hevc.mp4:$HEVC_FRAMES; do
    name="${f%%:*}"; want="${f##*:}"
    probe="$(ffprobe -v error -count_frames -select_streams v:0 \
        -show_entries stream=codec_name,codec_tag_string,width,height,pix_fmt,r_frame_rate,nb_read_frames \
        -of compact=p=0 "$OUT/$name")"
    n_probe="$(sed -n 's/.*nb_read_frames=\([0-9]*\).*/\1/p' <<<"$probe")"
    n_av="$("$PY" -c 'import av,sys
with av.open(sys.argv[1]) as c:
    print(sum(1 for _ in c.decode(video=0)))' "$OUT/$name")"
    size="$(stat -c %s "$OUT/$name")"
    echo "$name: $probe | pyav_frames=$n_av | bytes=$size | sha256=$(sha256sum "$OUT/$name" | cut -d' ' -f1)"
    if [[ "$n_probe" != "$want" || "$n_av" != "$want" ]]; then
        log "ERROR: $name has ffprobe=$n_probe pyav=$n_av frames, want $want"; status=1
    fi
done
ffmpeg -version | head -1
exit $status
