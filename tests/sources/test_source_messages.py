"""A stream that cannot be opened says why in plain words (stats' last_error and the log), never FFmpeg's
exception names or raw errno values, never the URL's credentials: a silent camera, a refused port, an
unknown host, a wrong login or path on a real RTSP server, files that are empty, not video, without video."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from pathlib import Path

import pytest

from streamd.config.streams import StreamConfig
from streamd.ingest.sources import available_backends
from tests.sources.conftest import CLIP, RtspServer, free_port, live_config

BACKENDS = available_backends()
RAW = re.compile(r"Errno|InvalidDataError|HTTP\w*Error|OSError|Input/output error|hunter2")
_IDS = itertools.count()  # a stream id per run: ingest rate-limits repeated warnings per stream


def _first_failure(pipeline, cfg: StreamConfig, backend: str, caplog) -> str:
    """Run the stream until its first failed open; the stats' last_error, checked against the log."""
    caplog.set_level(logging.INFO)
    pipe = pipeline()
    worker = pipe.add(dataclasses.replace(cfg, id=f"s{next(_IDS)}"), demux=backend)
    pipe.start()
    assert pipe.wait_until(lambda: worker.stats.read_errors >= 1, timeout=10), worker.stats
    error = worker.stats.last_error
    assert pipe.wait_until(lambda: error in caplog.text, timeout=5), (error, caplog.text)
    pipe.close()
    assert not RAW.search(error) and "hunter2" not in caplog.text, error
    return error


@pytest.mark.parametrize("backend", BACKENDS)
def test_silent_server_is_no_answer_within_the_open_timeout(
    pipeline, silent_server, caplog, backend: str
) -> None:
    url = f"rtsp://admin:hunter2@127.0.0.1:{silent_server.port}/x"
    error = _first_failure(pipeline, live_config(url, open_timeout_s=1.0), backend, caplog)
    where = f"127.0.0.1:{silent_server.port}"
    assert error == f"cannot open: no answer from the camera at {where} within 1 s (open_timeout_s)"


@pytest.mark.parametrize("backend", BACKENDS)
def test_refused_port_and_unknown_host(pipeline, caplog, backend: str) -> None:
    port = free_port()
    error = _first_failure(pipeline, live_config(f"rtsp://admin:hunter2@127.0.0.1:{port}/x"), backend, caplog)
    assert error.startswith(f"cannot open: connection refused by 127.0.0.1:{port}: nothing listens there")
    error = _first_failure(pipeline, live_config("rtsp://cam.invalid/stream1"), backend, caplog)
    assert error == "cannot open: host not found: 'cam.invalid' (the DNS lookup failed)"


@pytest.fixture
def login_server(rtsp_available):
    server = RtspServer(CLIP, args=("--user", "admin", "--password", "right"))
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_login_and_wrong_path_on_a_real_server(pipeline, login_server, caplog, backend: str) -> None:
    base = f"127.0.0.1:{login_server.port}"
    error = _first_failure(pipeline, live_config(f"rtsp://admin:hunter2@{base}/test"), backend, caplog)
    assert "(401 Unauthorized): check the user name and password in the URL" in error, error
    pipe = pipeline()
    right = pipe.add(live_config(f"rtsp://admin:right@{base}/test", "ok"), demux=backend)
    pipe.start()
    assert pipe.wait_frames("ok", 5, timeout=15), right.stats  # the login itself works


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_path_is_stream_not_found(pipeline, rtsp_server, caplog, backend: str) -> None:
    server = rtsp_server()
    error = _first_failure(pipeline, live_config(server.url.replace("/test", "/nope")), backend, caplog)
    assert error == "cannot open: stream not found (404 Not Found): check the path in the URL"


def _audio_only(path: Path) -> Path:
    import av
    import numpy as np

    out = av.open(str(path), "w")
    stream = out.add_stream("aac", rate=8000)
    for i in range(5):
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 8000, i * 1024
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_files_that_are_not_video(pipeline, tmp_path: Path, caplog, backend: str) -> None:
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "notes.mp4").write_text("camera 3: replace the lens\n" * 50)
    files = {
        "empty.mp4": "cannot open: the file is empty (0 bytes)",
        "notes.mp4": "cannot open: not a video file",
        _audio_only(tmp_path / "audio.m4a").name: "cannot open: no video stream in it (only audio)",
    }
    if backend == "opencv":  # OpenCV does not tell a file without video from one that is no video at all
        files["audio.m4a"] = files["notes.mp4"] = "cannot open: not a video file, or no video stream in it"
    for name, expected in files.items():
        cfg = StreamConfig(id="f", url=str(tmp_path / name))
        assert _first_failure(pipeline, cfg, backend, caplog).startswith(expected)
