"""RTSP against a real server (GStreamer's RTSP server, a subprocess): connect, kill/restart, hang, silence,
refused port, credentials. Every test bounds its waits; the whole file takes about a minute."""

from __future__ import annotations

import logging
import re
import time

import pytest

from streamd.ingest.sources import available_backends
from tests.sources.conftest import CLIP_HEVC, RtspServer, free_port, live_config

BACKENDS = available_backends()


@pytest.mark.parametrize("backend", BACKENDS)
def test_connect_and_stop(rtsp_server, pipeline, backend: str) -> None:
    server = rtsp_server()
    pipe = pipeline()
    worker = pipe.add(live_config(server.url), demux=backend)
    pipe.start()
    assert pipe.wait_frames("cam", 15, timeout=15), worker.stats
    seen = pipe.seen["cam"]
    assert {(w, h) for _, _, w, h, _ in seen.frames} == {(768, 576)}
    assert seen.indices == list(range(len(seen.indices)))
    assert worker.stats.state == "running" and worker.stats.backend == backend
    assert worker.stats.last_packet_age_s is not None and worker.stats.last_packet_age_s < 1.0
    assert pipe.close() < 2.0  # stop honoured at once while packets flow


def test_hevc_and_udp_transport(rtsp_available, pipeline) -> None:
    server = RtspServer(CLIP_HEVC, "h265")
    server.start()
    try:
        pipe = pipeline()
        worker = pipe.add(live_config(server.url, transport="udp"))
        pipe.start()
        assert pipe.wait_frames("cam", 10, timeout=15), worker.stats
        assert worker.stats.decode_errors == 0
    finally:
        server.stop()


def test_hung_server_stalls_then_recovers(rtsp_server, pipeline) -> None:
    """SIGSTOP: the TCP connection stays up but nothing arrives -> timeout/stall -> reconnect -> resume."""
    server = rtsp_server()
    pipe = pipeline()
    worker = pipe.add(live_config(server.url))
    pipe.start()
    assert pipe.wait_frames("cam", 5, timeout=15)
    server.pause()
    paused = time.monotonic()
    assert pipe.wait_until(lambda: worker.stats.read_errors >= 1, timeout=6), worker.stats
    detected = time.monotonic() - paused
    server.resume()
    resumed = time.monotonic()
    assert pipe.wait_until(lambda: pipe.seen["cam"].first_after(resumed) is not None, timeout=10), (
        worker.stats
    )
    print(f"hang detected after {detected:.2f} s; stats {worker.stats}")
    assert detected <= 2 * 1.0 + 1.5  # FFmpeg's RTSP read gives up within twice the read timeout
    # the message names the timeout that fired and how long the read really waited
    error = worker.stats.last_error
    assert "read_timeout_s 1 s" in error, error
    waited = float(re.search(r"no answer for ([0-9.]+) s", error).group(1))
    assert waited == pytest.approx(detected, abs=0.6), (waited, detected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_silent_server_times_out_and_other_streams_flow(
    rtsp_server, silent_server, pipeline, backend
) -> None:
    """A server that accepts and never answers: bounded retries, no hang, a healthy stream unaffected."""
    good = rtsp_server()
    pipe = pipeline()
    mute = pipe.add(
        live_config(
            f"rtsp://127.0.0.1:{silent_server.port}/x", "mute", open_timeout_s=1.0, reconnect_max_s=0.5
        ),
        demux=backend,
    )
    ok = pipe.add(live_config(good.url, "ok"), demux=backend)
    pipe.start()
    t0 = time.monotonic()
    assert pipe.wait_until(lambda: mute.stats.read_errors >= 2, timeout=8), mute.stats
    assert pipe.wait_frames("ok", 20, timeout=10)
    elapsed = time.monotonic() - t0
    assert mute.stats.state == "reconnecting" and "1 s" in mute.stats.last_error, mute.stats
    assert ok.stats.state == "running"
    fps = len(pipe.seen["ok"].frames) / elapsed
    assert fps > 5, f"the healthy 10 fps stream slowed to {fps:.1f} fps"
    took = pipe.close()
    assert took < 1.0 + 1.5, f"stop took {took:.1f} s (open timeout 1 s)"
    assert silent_server.accepted >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_refused_port_gives_up_after_the_configured_attempts(pipeline, backend: str) -> None:
    pipe = pipeline()
    cfg = live_config(f"rtsp://127.0.0.1:{free_port()}/x", reconnect_attempts=3, reconnect_initial_s=0.1)
    worker = pipe.add(cfg, demux=backend)
    t0 = time.monotonic()
    pipe.start()
    assert worker.join(timeout=10)
    took = time.monotonic() - t0
    # reconnect_attempts 3: the failed first open, then 3 reopen attempts
    assert worker.stats.state == "failed" and worker.stats.read_errors == 4, worker.stats
    assert worker.stats.opens == 4
    assert took < 0.1 + 0.2 + 0.4 + 2.0, f"4 refused attempts took {took:.1f} s"
    assert pipe.seen["cam"].frames == []


def test_credentials_never_logged(pipeline, silent_server, caplog, capfd) -> None:
    caplog.set_level(logging.DEBUG)
    pipe = pipeline()
    refused = pipe.add(
        live_config(f"rtsp://admin:hunter2@127.0.0.1:{free_port()}/x?token=s3cr3t", "a", reconnect_attempts=2)
    )
    silent = pipe.add(
        live_config(
            f"rtsp://admin:hunter2@127.0.0.1:{silent_server.port}/x",
            "b",
            open_timeout_s=0.5,
            reconnect_attempts=2,
        ),
        demux=BACKENDS[-1],
    )
    pipe.start()
    assert refused.join(10) and silent.join(10)
    out, err = capfd.readouterr()
    text = "\n".join(
        [out, err, caplog.text, refused.stats.last_error, silent.stats.last_error, repr(refused.cfg)]
    )
    assert "***@127.0.0.1" in caplog.text
    for secret in ("hunter2", "s3cr3t"):
        assert secret not in text
