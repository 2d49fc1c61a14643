"""Fixtures for clip tests: sources with short groups of pictures (made with Debian's ffmpeg), a check of a
clip file by ffprobe/ffmpeg (never by streamd's own code), and a stream thread feeding a recorder.

The RTSP fixtures are the sources tests' (a real GStreamer RTSP server on loopback)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamd.config.streams import StreamConfig
from streamd.ingest.reader import StreamReader
from streamd.types import Frame
from tests.conftest import CLIP, build_once
from tests.sources.conftest import rtsp_available, rtsp_server  # noqa: F401 (fixtures used here)

FPS = 10
GOP_S = 1.0  # the test sources' key frame interval


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-y", "-v", "error", *args], check=True, timeout=300)


@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict[str, Path]:
    """20 s of the bundled footage at 10 fps with a key frame every second and B-frames: H.264 and HEVC
    (encoded once per run for all workers, ``build_once``)."""

    def encode(folder: Path) -> None:
        common = ["-i", str(CLIP), "-t", "20", "-an", "-pix_fmt", "yuv420p"]
        x264 = ["-c:v", "libx264", "-g", "10", "-keyint_min", "10", "-sc_threshold", "0", "-bf", "2"]
        _ffmpeg(*common, *x264, str(folder / "gop10-h264.mp4"))
        x265 = "keyint=10:min-keyint=10:scenecut=0:bframes=2:log-level=none"
        hevc = str(folder / "gop10-hevc.mp4")
        # ultrafast: 2 s instead of 7 on an idle CI core (the GOP and B-frames are set explicitly)
        x265_fast = ["-c:v", "libx265", "-preset", "ultrafast", "-x265-params", x265]
        _ffmpeg(*common, *x265_fast, "-tag:v", "hvc1", hevc)

    folder = build_once(tmp_path_factory, "clip-sources", encode)
    return {"h264": folder / "gop10-h264.mp4", "hevc": folder / "gop10-hevc.mp4"}


@dataclass
class ClipFacts:
    """What ffprobe and ffmpeg say about a clip."""

    codec: str
    frames: int
    first_key: bool
    start: float  # the first frame's pts (s)
    duration: float  # last frame's pts - first frame's pts + one frame period (s)
    decode_errors: str  # ffmpeg -v error output of a full decode ("" when clean)
    decode_rc: int
    md5s: list[str]  # per decoded frame


def frame_md5s(path: Path) -> list[str]:
    out = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(path), "-map", "0:v", "-f", "framemd5", "-"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return [line.rsplit(",", 1)[1].strip() for line in out.splitlines() if line and not line.startswith("#")]


def probe(path: Path) -> ClipFacts:
    """ffprobe's packets and ffmpeg's full decode of a clip."""
    info = json.loads(
        subprocess.run(
            ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
             "stream=codec_name:packet=pts_time,flags", "-of", "json", str(path)],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
    )  # fmt: skip
    packets = info["packets"]
    pts = sorted(float(p["pts_time"]) for p in packets)
    decode = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(path), "-f", "null", "-"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return ClipFacts(
        codec=info["streams"][0]["codec_name"],
        frames=len(packets),
        first_key="K" in packets[0]["flags"],
        start=pts[0],
        duration=pts[-1] - pts[0] + 1 / FPS,
        decode_errors=decode.stderr.strip(),
        decode_rc=decode.returncode,
        md5s=frame_md5s(path),
    )


def assert_valid_clip(path: Path, asked_s: float, source: Path | None = None) -> ClipFacts:
    """The acceptance checks: starts on a key frame, decodes fully without an error, lasts what was asked
    within one group of pictures, and (given the source) its pictures are the source's, in a row."""
    facts = probe(path)
    assert facts.first_key, f"{path.name}: the first packet is not a key frame"
    assert facts.decode_rc == 0 and not facts.decode_errors, f"{path.name}: {facts.decode_errors}"
    assert abs(facts.duration - asked_s) <= GOP_S + 1e-6, f"{path.name}: {facts.duration} s for {asked_s} s"
    if source is not None:
        whole = frame_md5s(source)
        first = whole.index(facts.md5s[0])
        assert whole[first : first + len(facts.md5s)] == facts.md5s, f"{path.name}: not the source's pictures"
    return facts


class ListQueue:
    """A stream thread's frame queue that hands each frame to ``on_frame`` (in the stream thread); a False
    from it stops the stream."""

    policy, capacity, hard_limit = "block", 4, 4

    def __init__(self, on_frame: Callable[[Frame], bool | None]) -> None:
        self.on_frame = on_frame
        self.closed = threading.Event()
        self.done = threading.Event()  # on_frame said stop

    def put(self, frame: Frame, stop: threading.Event) -> bool:
        """False (the stream thread stops) when ``on_frame`` returns False or ``stop`` is set."""
        if self.on_frame(frame) is False:
            self.done.set()
        return not self.done.is_set() and not stop.is_set()

    def close(self) -> None:
        self.closed.set()


def run_reader(
    cfg: StreamConfig,
    tap,
    on_frame: Callable[[Frame], bool | None],
    *,
    demux: str = "auto",
    until: float = 120.0,
) -> StreamReader:
    """Read a stream through the real stream thread (demux, CPU decode) with ``tap`` as its packet tap,
    until it ends (files) or ``until`` seconds pass; ``on_frame`` sees each decoded frame."""
    stop = threading.Event()
    q = ListQueue(on_frame)
    reader = StreamReader(cfg, q, stop, demux=demux)
    reader.packet_tap = tap
    reader.start()
    deadline = time.monotonic() + until
    while not (q.closed.is_set() or q.done.is_set()) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    reader.join(timeout=30)
    deadline = time.monotonic() + 10
    while not q.closed.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    return reader
