"""Issue 12 acceptance on the CPU: the real daemon (`python -m streamd run`) on a live RTSP camera.

A GStreamer RTSP server (tests/sources/rtsp_server.py, system python3 + Debian GStreamer packages) serves a
clip made from the bundled footage (25 fps, 250 frames by default, with or without B-frames). streamd runs
the bundled demo model on it and writes JSON lines; the script then reports what came out:

    python bench/bench_rtsp_cpu.py --sessions 2              # two clean sessions of the clip
    python bench/bench_rtsp_cpu.py --kills 3 --down 5        # three 5 s camera outages
    python bench/bench_rtsp_cpu.py --sessions 1 --bframes 0  # arrival latency of a camera without B-frames

Printed: lines, whether frame indices are 0..n-1 without a gap, frames per session (sessions are split where
pts jump), the daemon's "dropped after decode" count, and latency_ms p50/p90: arrival (packet arrival to
result), batch (preprocess + infer + postprocess + batching of its batch) and total.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sources.conftest import RtspServer, make_camera_clip  # noqa: E402


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def wait_lines(path: Path, n: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while (got := count_lines(path)) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--bframes", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=2, help="clean sessions to wait for (no kills)")
    ap.add_argument("--kills", type=int, default=0, help="camera outages (SIGKILL, then restart)")
    ap.add_argument("--down", type=float, default=5.0, help="seconds each outage lasts")
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="streamd-rtsp-"))
    clip = make_camera_clip(work / "cam.mp4", args.frames, args.fps, bframes=args.bframes)
    server = RtspServer(clip)
    server.start()
    out, log = work / "out.jsonl", work / "streamd.log"
    cfg = work / "cam.yaml"
    cfg.write_text(
        f"""streams:
  - id: cam
    url: {server.url}
    open_timeout_s: 2
    read_timeout_s: 1
    stall_timeout_s: 3
    reconnect_initial_s: 0.5
    reconnect_max_s: 1
model:
  path: {ROOT / "models" / "nanodet-coco.onnx"}
engine:
  type: onnxruntime
pipeline:
  batch_size: {args.batch}
sinks:
  - type: jsonl
    path: {out}
"""
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "run", str(cfg)], stderr=err, env=env, cwd=ROOT
        )
    try:
        if args.kills:
            for _ in range(args.kills):
                wait_lines(out, count_lines(out) + 2 * args.fps, 60)
                server.kill()
                time.sleep(args.down)
                server.start()
            wait_lines(out, count_lines(out) + 2 * args.fps, 60)
        else:
            want = args.frames * args.sessions
            got = wait_lines(out, want, 60 + want / args.fps * 2)
            if got < want:
                print(f"only {got} of {want} lines before the timeout")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        server.stop()
    records = [json.loads(x) for x in out.read_text().splitlines()]
    records = [r for r in records if "frame" in r and "latency_ms" in r]
    frames = [r["frame"] for r in records]
    pts = [r["pts"] for r in records]
    sessions, count = [], 1
    for a, b in itertools.pairwise(pts):
        if a is None or b is None or b - a > 0.5:
            sessions.append(count)
            count = 0
        count += 1
    sessions.append(count)
    summary = [x for x in log.read_text().splitlines() if "dropped after decode" in x]
    lat = {
        k: [r["latency_ms"][k] for r in records if k in r["latency_ms"]]
        for k in ("arrival", "batch", "total")
    }
    clip_text = f"{args.frames} frames, {args.fps} fps, bframes={args.bframes}"
    print(f"clip: {clip_text}; outages {args.kills} x {args.down} s")
    contiguous = frames == list(range(len(records)))
    print(f"lines {len(records)}; frames 0..{len(records) - 1} without gaps: {contiguous}")
    print(f"frames per session: {sessions}; pts None: {sum(p is None for p in pts)}")
    print(f"daemon summary: {summary[-1].split(': ', 1)[-1] if summary else '(none)'}")
    for k, v in lat.items():
        if v:
            print(f"latency_ms.{k}: p50 {pct(v, 50):.1f} p90 {pct(v, 90):.1f} max {max(v):.1f}")
    print(f"exit code {proc.returncode}; files in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
