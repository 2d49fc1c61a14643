"""Issue 12 acceptance, daemon level: arrival-to-result latency (``latency_ms.arrival``) of the real daemon
(``python -m streamd run``, the bundled demo config and model on ONNX Runtime CPU) on a live camera served by
the real RTSP server (GStreamer), read back from the JSONL output. About 25 s.

The bound: p50(arrival) <= one frame period x (1 + the stream's reorder depth) + p50(processing), where
processing is ``latency_ms.batch`` of the same lines (preprocess + infer + postprocess of the frame's batch,
from the batch leaving the batcher to its results being collected: ``Scheduler._collect``). What is left,
arrival - batch, is the packet waiting inside the decoder, decoding, and waiting in the stream's queue; with a
low-delay decoder and a pipeline that keeps up that is a few ms, so a decoder holding pictures (frame
threading: 4 pictures = 4 periods) or a queue that never drains fails the test.

Rate: the detector runs on every 5th frame (``detect_fps``; the stream is still received and decoded at
25 fps). The bound only means something while the box keeps up, and a 2-core CI box shared with other jobs
does not keep up with the demo model on every frame at 25 fps: measured there, the queue grows after the
start-up burst until the latest policy's 1 s age limit (p50 arrival 0.9-1.2 s, processing 0.5 s with
batches of 4; 0.14 s with batches of 1 under load). That is the drop rule working as documented
(docs/config.md, ``pipeline.frame_queue``), not a decoder delay, and it is not what this test measures.
"""

from __future__ import annotations

import json
import signal
import statistics
import time
from pathlib import Path

import av
import pytest
import yaml

from tests.conftest import start_streamd
from tests.sources.conftest import CLIP, ROOT, RtspServer

DEMO = ROOT / "configs" / "demo.yaml"
START_S = 1.0  # skip the start-up burst (the first ~0.5 s of an RTSP session arrives at once)


def reorder_depth(clip: Path) -> int:
    """Pictures the decoder must hold back for reordering (ffprobe's ``has_b_frames``; 0 without B-frames):
    the most any packet comes, in decode order, after pictures that are shown later than it."""
    with av.open(str(clip)) as container:
        pts = [p.pts for p in container.demux(video=0) if p.pts is not None]
    rank = {p: i for i, p in enumerate(sorted(pts))}
    return max(k - rank[p] for k, p in enumerate(pts))


def frame_rate(clip: Path) -> float:
    with av.open(str(clip)) as container:
        return float(container.streams.video[0].average_rate)


def run_daemon(url: str, tmp_path: Path, detect_fps: float, until_pts: float) -> tuple[list[dict], str]:
    """The bundled demo config with the camera as its stream, ONNX Runtime, a JSONL sink; runs until a line
    with pts >= ``until_pts`` is written, then SIGTERM. Returns the lines and stderr."""
    cfg = yaml.safe_load(DEMO.read_text())
    cfg["model"]["path"] = str((DEMO.parent / cfg["model"]["path"]).resolve())
    cfg["engine"]["type"] = "onnxruntime"
    cfg["streams"] = [{"id": "cam", "url": url, "detect_fps": detect_fps}]
    out = tmp_path / "out.jsonl"
    cfg["sinks"] = [{"type": "jsonl", "path": str(out)}]
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = start_streamd(path)
    try:
        deadline = time.monotonic() + 20 + until_pts
        while time.monotonic() < deadline and proc.poll() is None:
            # complete lines only: the sink may be halfway through writing the last one
            lines = out.read_text().split("\n")[:-1] if out.exists() else []
            if any((json.loads(x).get("pts") or 0) >= until_pts for x in lines[-3:]):
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    return [json.loads(x) for x in out.read_text().splitlines()], err


def check_latency(clip: Path, tmp_path: Path, step: int, until_pts: float) -> None:
    """Serve ``clip`` (native rate), run the daemon detecting every ``step``-th frame, and assert
    p50(arrival) <= period x (1 + reorder depth) + p50(batch) over the lines with pts from ``START_S`` to
    ``until_pts``."""
    fps, depth = frame_rate(clip), reorder_depth(clip)
    period_ms = 1e3 / fps
    server = RtspServer(clip)
    server.start()
    try:
        records, err = run_daemon(server.url, tmp_path, fps / step, until_pts)
    finally:
        server.stop()
    frames = [r for r in records if r.get("type") is None]
    window = [r for r in frames if START_S <= r["pts"] < until_pts]
    arrival = statistics.median(r["latency_ms"]["arrival"] for r in window)
    batch = statistics.median(r["latency_ms"]["batch"] for r in window)
    per_line = [round(r["latency_ms"]["arrival"] - r["latency_ms"]["batch"]) for r in window]
    waited = statistics.median(r["latency_ms"]["arrival"] - r["latency_ms"]["batch"] for r in window)
    bound = period_ms * (1 + depth) + batch
    print(
        f"{clip.name}: {fps:g} fps, reorder depth {depth}, {len(window)} lines (1 frame in {step}, "
        f"pts {START_S}-{until_pts} s): p50 arrival {arrival:.1f} ms, p50 batch {batch:.1f} ms, "
        f"p50 arrival-batch {waited:.1f} ms, bound {bound:.1f} ms; "
        f"arrival-batch per line {per_line}"
    )
    assert len(window) >= 12, (len(frames), err[-2000:])
    assert [r["frame"] for r in frames] == sorted({r["frame"] for r in frames})  # in order, once each
    assert " 0 dropped after decode" in err, err[-2000:]  # the box kept up: nothing waited 1 s
    assert arrival <= bound, f"p50 arrival {arrival:.1f} ms > bound {bound:.1f} ms"


def test_arrival_latency_of_a_live_camera_without_b_frames(rtsp_available, camera_clips, tmp_path) -> None:
    """25 fps camera-like H.264 (no B-frames, key frame every second): p50 arrival <= 40 ms + p50 batch."""
    clip = camera_clips["ipp"]
    assert reorder_depth(clip) == 0
    check_latency(clip, tmp_path, step=5, until_pts=4.6)


@pytest.mark.parametrize("which", ["cam25-b", "vtest"])
def test_arrival_latency_includes_the_reorder_delay(rtsp_available, camera_clips, tmp_path, which) -> None:
    """Streams with B-frames: the decoder holds pictures until the ones shown before them are decoded, so
    arrival latency includes about reorder depth x period (25 fps x264 with 3 B-frames: depth 2, 80 ms; the
    bundled 10 fps clip: depth 2, 200 ms). p50 arrival <= period x (1 + depth) + p50 batch."""
    clip, step = (camera_clips["b"], 5) if which == "cam25-b" else (CLIP, 3)
    assert reorder_depth(clip) == 2  # = ffprobe -show_entries stream=has_b_frames
    check_latency(clip, tmp_path, step=step, until_pts=5.0 if which == "cam25-b" else 6.0)
