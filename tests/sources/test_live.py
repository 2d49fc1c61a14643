"""Issue 12 acceptance against the real RTSP server (GStreamer): every decoded frame delivered while the
consumer keeps up, pts as the source says them, the real outage in the pts jump, arrival latency, and
``reconnect_attempts`` as documented. About a minute and a half."""

from __future__ import annotations

import itertools
import statistics
import time

import pytest

from streamd.ingest.sources import available_backends
from tests.sources.conftest import CLIP, CLIP_HEVC, RtspServer, ffprobe_pts, live_config

PERIOD = 0.04  # the camera clips are 25 fps


def test_clean_sessions_deliver_every_frame_twice(rtsp_available, camera_clips, pipeline) -> None:
    """A 250-frame clip (B-frames, multi-slice key frames) served twice: frames 0..499, none dropped, each
    session's pts equal the clip's, the second session stamped the real gap after the first."""
    server = RtspServer(camera_clips["b"])
    server.start()
    try:
        pipe = pipeline(capacity=2, work_s=0.002)  # the daemon's default frame_queue
        worker = pipe.add(live_config(server.url, reconnect_initial_s=0.5, reconnect_max_s=0.5))
        pipe.start()
        assert pipe.wait_frames("cam", 500, timeout=45), worker.stats
        stats, dropped = worker.stats, pipe.batcher.queues[0].dropped
    finally:
        server.stop()
    frames = pipe.seen["cam"].frames[:500]
    print(f"stats {stats}; dropped {dropped}")
    assert [f[0] for f in frames] == list(range(500))
    assert dropped == 0 and stats.decode_errors == 0 and stats.decoders_created == 1
    pts = [f[1] for f in frames]
    assert pts[:250] == pytest.approx([k * PERIOD for k in range(250)], abs=1e-6)  # the clip's own pts
    gap = frames[250][4] - frames[249][4]  # consumer-side time between the sessions
    assert pts[250] - pts[249] == pytest.approx(gap, abs=0.3) and pts[250] - pts[249] > 0.5
    assert [b - a for a, b in itertools.pairwise(pts[250:])] == pytest.approx([PERIOD] * 249, abs=1e-6)


def test_three_server_kills_lose_only_what_was_not_sent(rtsp_available, camera_clips, pipeline) -> None:
    """Three 5 s camera outages: every decoded frame reaches the consumer (0 dropped), indices contiguous,
    pts increasing, and the first frame after each outage carries the real gap."""
    server = RtspServer(camera_clips["b"])
    cfg = live_config(server.url)
    server.start()
    pipe = pipeline(capacity=2, work_s=0.002)
    worker = pipe.add(cfg)
    pipe.start()
    resume_s: list[float] = []
    boundaries: list[int] = []
    try:
        assert pipe.wait_frames("cam", 10, timeout=15), worker.stats
        for cycle in range(3):
            server.kill()
            killed = time.monotonic()
            assert pipe.wait_until(lambda: worker.stats.state == "reconnecting", timeout=5), worker.stats
            pipe.wait_until(lambda: False, timeout=max(0.0, killed + 5.0 - time.monotonic()))
            boundaries.append(len(pipe.seen["cam"].frames))
            ready = server.start()
            assert pipe.wait_until(lambda t=ready: pipe.seen["cam"].first_after(t) is not None, timeout=15), (
                f"cycle {cycle}: no frame after restart; {worker.stats}"
            )
            resume_s.append(pipe.seen["cam"].first_after(ready) - ready)
            pipe.wait_frames("cam", len(pipe.seen["cam"].frames) + 10, timeout=5)
        state, reconnects = worker.stats.state, worker.stats.reconnects
    finally:
        server.stop()
    pipe.close()
    frames = pipe.seen["cam"].frames
    dropped = pipe.batcher.queues[0].dropped
    print(f"resume after restart (s): {[round(r, 2) for r in resume_s]}; dropped {dropped}; {worker.stats}")
    assert max(resume_s) <= cfg.reconnect_max_s + 2.0, resume_s
    assert [f[0] for f in frames] == list(range(len(frames)))  # no gaps
    assert dropped == 0 and worker.stats.decoded == len(frames)  # 0 decoded-but-dropped
    pts = [f[1] for f in frames]
    assert None not in pts and all(b > a for a, b in itertools.pairwise(pts))
    for k in boundaries:  # the jump on the first frame after an outage is the real time between them
        jump, seen_gap = pts[k] - pts[k - 1], frames[k][4] - frames[k - 1][4]
        assert jump > 5.0 and jump == pytest.approx(seen_gap, abs=0.5), (k, jump, seen_gap)
    assert reconnects >= 3 and state == "running"


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize(("clip", "codec"), [(CLIP, "h264"), (CLIP_HEVC, "h265")])
def test_rtsp_pts_equal_ffprobe(rtsp_available, pipeline, clip, codec, backend) -> None:
    """Over RTSP the pts of every frame equal ffprobe's pts_time of the served file (frame 0 included)."""
    server = RtspServer(clip, codec)
    server.start()
    try:
        pipe = pipeline()
        worker = pipe.add(live_config(server.url), demux=backend)
        pipe.start()
        assert pipe.wait_frames("cam", 25, timeout=15), worker.stats
    finally:
        server.stop()
    pts = [f[1] for f in pipe.seen["cam"].frames[:25]]
    assert pts == pytest.approx(ffprobe_pts(clip)[:25], abs=1e-6)


def test_arrival_latency_of_a_live_camera(rtsp_available, camera_clips, pipeline) -> None:
    """25 fps camera without B-frames: packet arrival -> consumed, p50 within one frame period plus the
    consumer's processing time (low-delay decoding: no frame threading holding pictures)."""
    server = RtspServer(camera_clips["ipp"])
    server.start()
    work_s = 0.005
    try:
        pipe = pipeline(capacity=2, work_s=work_s)
        worker = pipe.add(live_config(server.url))
        pipe.start()
        assert pipe.wait_frames("cam", 100, timeout=20), worker.stats
    finally:
        server.stop()
    latency = pipe.seen["cam"].latency_s[25:100]  # after the start-up burst
    p50 = statistics.median(latency)
    print(f"arrival -> consumed p50 {p50 * 1e3:.1f} ms, max {max(latency) * 1e3:.1f} ms")
    assert p50 <= PERIOD + work_s, f"p50 {p50 * 1e3:.1f} ms"


def _wait_ended(worker, timeout: float) -> bool:
    return worker.join(timeout)


@pytest.mark.parametrize("attempts", [1, 3])
def test_reconnect_attempts_reopens_n_times_then_gives_up(rtsp_available, pipeline, attempts) -> None:
    """reconnect_attempts N: after the camera goes away, N reopen attempts, then the stream is given up."""
    server = RtspServer(CLIP)
    server.start()
    pipe = pipeline()
    worker = pipe.add(
        live_config(server.url, reconnect_attempts=attempts, reconnect_initial_s=0.1, reconnect_max_s=0.2)
    )
    pipe.start()
    try:
        assert pipe.wait_frames("cam", 5, timeout=15), worker.stats
        server.kill()
        assert worker.join(timeout=10), worker.stats
    finally:
        server.stop()
    assert worker.stats.state == "failed", worker.stats
    assert worker.stats.opens == 1 + attempts, worker.stats  # the first open, then N reopens


def test_reconnect_attempts_one_is_one_reopen(rtsp_available, pipeline) -> None:
    """With 1, the one reopen that follows a drop reconnects when the camera is back by then."""
    server = RtspServer(CLIP)
    server.start()
    pipe = pipeline()
    worker = pipe.add(
        live_config(server.url, reconnect_attempts=1, reconnect_initial_s=2.0, reconnect_max_s=2.0)
    )
    pipe.start()
    try:
        assert pipe.wait_frames("cam", 5, timeout=15), worker.stats
        server.kill()
        ready = server.start()  # back within the 1.6-2 s wait
        assert pipe.wait_until(lambda: pipe.seen["cam"].first_after(ready) is not None, timeout=10), (
            worker.stats
        )
        opens, reconnects = worker.stats.opens, worker.stats.reconnects  # before the server goes away again
    finally:
        server.stop()
    assert opens == 2 and reconnects == 1


def test_reconnect_attempts_zero_retries_forever(rtsp_available, pipeline) -> None:
    """With 0 the stream keeps trying through many failed reopens and resumes when the camera is back."""
    server = RtspServer(CLIP)
    server.start()
    pipe = pipeline()
    worker = pipe.add(
        live_config(server.url, reconnect_attempts=0, reconnect_initial_s=0.05, reconnect_max_s=0.2)
    )
    pipe.start()
    try:
        assert pipe.wait_frames("cam", 5, timeout=15), worker.stats
        server.kill()
        assert pipe.wait_until(lambda: worker.stats.opens >= 8, timeout=10), worker.stats  # 7 failed reopens
        ready = server.start()
        assert pipe.wait_until(lambda: pipe.seen["cam"].first_after(ready) is not None, timeout=10), (
            worker.stats
        )
        state = worker.stats.state  # before the server goes away again
    finally:
        server.stop()
    assert state == "running" and worker.stats.read_errors >= 7
