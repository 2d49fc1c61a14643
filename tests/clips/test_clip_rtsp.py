"""Clips of a live RTSP stream (GStreamer's RTSP server on loopback, paced like a camera): FFmpeg's RTSP
client hands out Annex-B packets (the first of a session without a pts); H.264 and HEVC, both backends."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from streamd.clips import ClipRecorder, ClipWriter
from streamd.config.clips import ClipsConfig
from streamd.config.streams import StreamConfig
from streamd.ingest.reader import StreamReader
from streamd.types import Frame
from tests.clips.conftest import ListQueue, assert_valid_clip

PRE, POST = 3.0, 2.0


@pytest.mark.slow
@pytest.mark.parametrize("demux", ["pyav", "opencv"])
@pytest.mark.parametrize(("codec", "server_codec"), [("h264", "h264"), ("hevc", "h265")])
def test_clip_of_an_rtsp_stream_is_valid(sources, rtsp_server, tmp_path, codec, server_codec, demux):
    server = rtsp_server(sources[codec], server_codec)
    cfg = ClipsConfig(enabled=True, dir=str(tmp_path), pre_roll_s=PRE, post_roll_s=POST)
    writer = ClipWriter()
    writer.start()
    rec = ClipRecorder("cam", cfg, writer)
    first: list[float] = []
    paths: list[str | None] = []

    def on_frame(frame: Frame) -> None:
        if frame.pts is None:
            return
        if not first:
            first.append(frame.pts)
        if not paths and frame.pts >= first[0] + 5.0:  # 5 s in: 3 s of pre-roll are in the ring
            paths.append(rec.trigger(frame.pts, "cross"))
        rec.seen(frame.pts)

    stop = threading.Event()
    reader = StreamReader(StreamConfig(id="cam", url=server.url), ListQueue(on_frame), stop, demux=demux)
    reader.packet_tap = rec
    reader.start()
    deadline = time.monotonic() + 40
    while writer.written + writer.failed == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    reader.join(timeout=30)
    writer.close()
    assert reader.stats.backend == demux
    assert paths and paths[0] is not None, f"no clip asked for (frames seen from {first[:1]})"
    assert writer.written == 1 and writer.failed == 0
    facts = assert_valid_clip(Path(paths[0]), PRE + POST, sources[codec])
    assert facts.codec == codec
