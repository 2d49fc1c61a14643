"""What event clips cost, on a camera-like 1080p30 H.264 stream (made here with ffmpeg's libx264: 4 Mbit/s, a
key frame every second, moving noise so the bitrate is real):

- the stream thread's share: CPU time of ``ClipRecorder.packet`` (copy into the ring, trim) per packet, the
  only work clips add before decode, as µs and as a share of the 33 ms frame period;
- the writer's share: CPU time of the background writer thread per clip (``ClipWriter.cpu_s``: remux to MP4
  with PyAV, retention), the clip's bytes and its wall time;
- GPU work: none. The clip path takes demuxed packets only (``tests/clips/test_clip_files.py::
  test_the_writer_gets_packets_only``): no decoded picture, no device memory, no encode.

    python bench/bench_clips.py [--seconds 60] [--every 12] [--pre 5] [--post 5] [--out DIR]

Writes DIR/bench_clips.{json,md} when --out is given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamd.clips import ClipRecorder, ClipWriter  # noqa: E402
from streamd.config.clips import ClipsConfig  # noqa: E402
from streamd.ingest.sources import DemuxOptions, open_demuxer  # noqa: E402


def make_source(path: Path, seconds: int) -> Path:
    lavfi = f"testsrc2=size=1920x1080:rate=30:duration={seconds}"
    x264 = ["-c:v", "libx264", "-preset", "ultrafast", "-b:v", "4M", "-maxrate", "4M", "-bufsize", "4M"]
    gop = ["-g", "30", "-keyint_min", "30", "-sc_threshold", "0", "-pix_fmt", "yuv420p"]
    noise = ["-vf", "noise=alls=12:allf=t"]
    cmd = ["ffmpeg", "-y", "-v", "error", "-f", "lavfi", "-i", lavfi, *noise, *x264, *gop, str(path)]
    subprocess.run(cmd, check=True, timeout=1200)
    return path


def run(source: Path, folder: Path, every_s: float, pre: float, post: float, backend: str) -> dict:
    cfg = ClipsConfig(enabled=True, dir=str(folder), pre_roll_s=pre, post_roll_s=post)
    writer = ClipWriter()
    writer.start()
    rec = ClipRecorder("bench", cfg, writer)
    demuxer = open_demuxer(str(source), DemuxOptions(backend=backend))
    rec.begin(demuxer.info)
    rec.place(0.0)
    tap_s, count, size, next_event = 0.0, 0, 0, every_s
    for packet in demuxer.packets():  # demux only: no decode, as fast as the file reads
        started = time.thread_time()
        rec.packet(packet)
        t = rec.ring.newest
        if t is not None:
            rec.seen(t)  # the detector keeps up
            if t >= next_event:
                rec.trigger(t, "enter")
                next_event += every_s
        tap_s += time.thread_time() - started
        count += 1
        size += packet.size
    demuxer.close()
    rec.end()
    rec.finish_all()
    wall = time.perf_counter()
    writer.close(60)
    clips = sorted((folder / "bench").glob("*.mp4"))
    fps = demuxer.info.fps or 30.0
    return {
        "backend": backend,
        "packets": count,
        "mbit_s": round(size * 8 / (count / fps) / 1e6, 2),
        "tap_us_per_packet": round(tap_s / count * 1e6, 1),
        "tap_share_of_frame_period_pct": round(tap_s / count * fps * 100, 3),
        "clips": writer.written,
        "failed": writer.failed,
        "dropped": writer.dropped,
        "writer_cpu_ms_per_clip": round(writer.cpu_s / max(1, writer.written) * 1e3, 1),
        "mb_per_clip": round(sum(c.stat().st_size for c in clips) / max(1, len(clips)) / 1e6, 2),
        "clip_s_asked": pre + post,
        "ring_mb": round(rec.ring.bytes / 1e6, 2),
        "drain_wall_s": round(time.perf_counter() - wall, 2),
        "gpu_work": 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--every", type=float, default=12.0, help="seconds between events (12 > pre + post)")
    ap.add_argument("--pre", type=float, default=5.0)
    ap.add_argument("--post", type=float, default=5.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = make_source(Path(tmp) / "cam1080p30.mp4", args.seconds)
        rows = [
            run(source, Path(tmp) / backend, args.every, args.pre, args.post, backend)
            for backend in ("pyav", "opencv")
        ]
    keys = list(rows[0])
    table = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    table += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    print("\n".join(table))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_clips.json").write_text(json.dumps(rows, indent=1))
        (args.out / "bench_clips.md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
