"""Fixtures for source tests: a real GStreamer RTSP server subprocess, a silent server, a consumer.

The RTSP server is ``tests/sources/rtsp_server.py`` run by the system Python (PyGObject and GStreamer's RTSP
server are Debian packages, installed in CI by ``.ci/system-packages``). Without them the RTSP tests skip
with the reason; in CI they run.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import pytest

from streamd.config.streams import StreamConfig
from streamd.ingest.reader import StreamReader
from streamd.pipeline.batcher import Batcher

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SERVER = HERE / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"
CLIP = ROOT / "samples" / "vtest.mp4"
CLIP_HEVC = ROOT / "samples" / "vtest-hevc.mp4"
DATA = HERE / "data"


def ffprobe_pts(clip: Path) -> list[float]:
    """ffprobe's ``pts_time`` of every frame of a bundled clip, recorded in tests/sources/data/ by
    ``ffprobe -v error -select_streams v:0 -show_entries frame=pts_time -of default=nw=1:nk=1 CLIP``
    (FFmpeg 5.1, Debian 12)."""
    return [float(x) for x in (DATA / f"{clip.stem}.pts_time").read_text().split()]


def make_camera_clip(path: Path, frames: int, fps: int, *, bframes: int) -> Path:
    """An H.264 MP4 of the first ``frames`` pictures of the bundled footage at ``fps`` (like a camera:
    ``bframes=0``, key frame every second), encoded with PyAV's libx264."""
    import av

    src = av.open(str(CLIP))
    out = av.open(str(path), "w")
    stream = out.add_stream("libx264", rate=fps)
    stream.width, stream.height, stream.pix_fmt = 768, 576, "yuv420p"
    stream.options = {"preset": "veryfast", "x264-params": f"bframes={bframes}:keyint={fps}:log-level=none"}
    for i, picture in enumerate(src.decode(video=0)):
        if i == frames:
            break
        picture.pts, picture.time_base = i, Fraction(1, fps)
        for packet in stream.encode(picture):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()
    src.close()
    return path


@pytest.fixture(scope="session")
def camera_clips(tmp_path_factory) -> dict[str, Path]:
    """``b``: 250 frames, 25 fps, with B-frames (x264 defaults); ``ipp``: 125 frames, 25 fps, no B-frames."""
    folder = tmp_path_factory.mktemp("clips")
    return {
        "b": make_camera_clip(folder / "cam25-b.mp4", 250, 25, bframes=3),
        "ipp": make_camera_clip(folder / "cam25-ipp.mp4", 125, 25, bframes=0),
    }


_CHECK = """
import gi
gi.require_version("Gst", "1.0"); gi.require_version("GstRtspServer", "1.0")
from gi.repository import Gst, GstRtspServer
Gst.init(None)
missing = [e for e in ("qtdemux", "h264parse", "h265parse", "rtph264pay", "rtph265pay", "filesrc")
           if Gst.ElementFactory.find(e) is None]
if missing: raise SystemExit("GStreamer elements missing: " + " ".join(missing))
"""


def _rtsp_server_missing() -> str | None:
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} not found"
    proc = subprocess.run([SYSTEM_PYTHON, "-c", _CHECK], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        return (
            "GStreamer RTSP server not installed (Debian: gir1.2-gst-rtsp-server-1.0 python3-gi "
            "gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad; "
            f".ci/system-packages installs them): {(proc.stderr or proc.stdout).strip()[-300:]}"
        )
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RtspServer:
    """GStreamer's RTSP server on 127.0.0.1:port serving one clip; start/kill/restart like a camera."""

    def __init__(
        self, clip: Path, codec: str = "h264", port: int | None = None, args: tuple[str, ...] = ()
    ) -> None:
        self.clip, self.codec = clip, codec
        self.port = port or free_port()
        self.args = args  # more rtsp_server.py options (--user/--password)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"rtsp://127.0.0.1:{self.port}/test"

    def start(self, timeout: float = 15.0) -> float:
        """Start and wait until it listens; returns time.monotonic() of READY."""
        cmd = [
            SYSTEM_PYTHON,
            str(SERVER),
            "--port",
            str(self.port),
            "--clip",
            str(self.clip),
            "--codec",
            self.codec,
            *self.args,
        ]
        deadline = time.monotonic() + timeout
        while True:  # the port can stay busy for a moment after a kill
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.1, deadline - time.monotonic()))
            line = self.proc.stdout.readline() if ready else ""
            if line.startswith("READY"):
                return time.monotonic()
            self.proc.kill()
            err = self.proc.communicate(timeout=5)[1]
            if time.monotonic() > deadline:
                raise RuntimeError(f"RTSP server did not start: {line!r} {err[-500:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL, like a camera losing power."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered or sent (a hung camera)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture(scope="session")
def rtsp_available() -> None:
    why = _rtsp_server_missing()
    if why:
        pytest.skip(why)


@pytest.fixture
def rtsp_server(rtsp_available):
    """Start one server per test on the H.264 clip (``rtsp_server.url``); stopped after the test."""
    servers: list[RtspServer] = []

    def make(clip: Path = CLIP, codec: str = "h264") -> RtspServer:
        server = RtspServer(clip, codec)
        server.start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


class SilentServer:
    """A TCP server that accepts connections and never says a word."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self._conns:
            c.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


@dataclass
class Seen:
    """What the consumer saw of one stream: per frame (index, pts, width, height, arrival monotonic time)."""

    frames: list[tuple[int, float | None, int, int, float]] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)  # packet arrival -> consumed, per frame

    @property
    def indices(self) -> list[int]:
        return [f[0] for f in self.frames]

    def first_after(self, t: float) -> float | None:
        return next((f[4] for f in self.frames if f[4] > t), None)


class Pipeline:
    """Workers feeding a real Batcher, and a consumer thread that records frames (and drops the pixels)."""

    def __init__(self, capacity: int = 4, work_s: float = 0.0) -> None:
        self.batcher = Batcher(8, 0.01)
        self.work_s = work_s  # simulated processing time per frame (a detector)
        self.stop = threading.Event()
        self.capacity = capacity
        self.workers: dict[str, StreamReader] = {}
        self.seen: dict[str, Seen] = {}
        self._consumer_stop = threading.Event()
        self._consumer = threading.Thread(target=self._consume, daemon=True)

    def add(self, cfg: StreamConfig, policy: str = "latest", **kw) -> StreamReader:
        q = self.batcher.add_stream(cfg.id, self.capacity, policy)
        worker = StreamReader(cfg, q, self.stop, **kw)
        self.workers[cfg.id] = worker
        self.seen[cfg.id] = Seen()
        return worker

    def start(self) -> Pipeline:
        self._consumer.start()
        for w in self.workers.values():
            w.start()
        return self

    def _consume(self) -> None:
        while not self._consumer_stop.is_set():
            batch = self.batcher.next_batch(self._consumer_stop)
            if batch is None:
                if self.batcher.finished():
                    return
                continue
            if self.work_s:
                time.sleep(self.work_s * len(batch))
            now, done = time.monotonic(), time.perf_counter()
            for f in batch:
                self.seen[f.stream_id].frames.append((f.index, f.pts, f.width, f.height, now))
                self.seen[f.stream_id].latency_s.append(done - f.t_arrival)

    def wait_frames(self, stream_id: str, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.seen[stream_id].frames) >= count:
                return True
            time.sleep(0.02)
        return False

    def wait_until(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return False

    def close(self, timeout: float = 10.0) -> float:
        """Set stop, join every worker; returns how long the joins took."""
        self.stop.set()
        t0 = time.monotonic()
        for w in self.workers.values():
            w.join(timeout)
        took = time.monotonic() - t0
        # The workers closed their queues: the consumer ends by itself once it has taken every frame still
        # queued (a session's end flushes the decoder's last pictures); stopping it first lost those.
        self._consumer.join(5)
        self._consumer_stop.set()
        self._consumer.join(5)
        return took


@pytest.fixture
def pipeline():
    pipes: list[Pipeline] = []

    def make(capacity: int = 4, work_s: float = 0.0) -> Pipeline:
        p = Pipeline(capacity, work_s)
        pipes.append(p)
        return p

    yield make
    for p in pipes:
        p.close()


def live_config(url: str, sid: str = "cam", **kw) -> StreamConfig:
    """A live stream with test-sized timeouts (fast failure detection, short backoff)."""
    opts = {
        "open_timeout_s": 2.0,
        "read_timeout_s": 1.0,
        "stall_timeout_s": 2.0,
        "reconnect_initial_s": 0.25,
        "reconnect_max_s": 1.0,
    }
    opts.update(kw)
    return StreamConfig(id=sid, url=url, **opts)
