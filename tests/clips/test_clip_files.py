"""Clips of real file streams through the real stream thread (demux -> tap -> ring; decode), written by the
real writer, checked by ffprobe/ffmpeg: H.264 and HEVC, both demux backends (PyAV hands out length-prefixed
NAL units for MP4, OpenCV's raw mode Annex-B), overlapping events, the packets-only contract."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamd.clips import ClipRecorder, ClipWriter
from streamd.clips.writer import ClipJob
from streamd.config.clips import ClipsConfig
from streamd.config.streams import StreamConfig
from streamd.ingest.packet_ring import RingPacket
from streamd.ingest.sources.base import Packet, VideoInfo
from streamd.types import Frame
from tests.clips.conftest import assert_valid_clip, run_reader

PRE, POST = 3.0, 2.0


class Spy:
    """Wraps a recorder as the stream's packet tap and records the type of everything handed to it."""

    def __init__(self, rec: ClipRecorder) -> None:
        self.rec = rec
        self.kinds: set[type] = set()

    def begin(self, info: VideoInfo) -> None:
        self.kinds.add(type(info))
        self.rec.begin(info)

    def packet(self, packet: Packet) -> None:
        self.kinds.add(type(packet))
        self.rec.packet(packet)

    def place(self, offset: float) -> None:
        self.kinds.add(type(offset))
        self.rec.place(offset)

    def end(self) -> None:
        self.rec.end()


class SpyWriter(ClipWriter):
    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[ClipJob] = []

    def submit(self, job: ClipJob) -> bool:
        self.jobs.append(job)
        return super().submit(job)


def record(source: Path, tmp_path: Path, events: list[float], *, demux: str = "auto", **clips):
    """Read ``source`` with clips on; an event (``trigger``) at the first frame at or after each time in
    ``events``. Returns the paths the events got, the writer and the spy."""
    cfg = ClipsConfig(enabled=True, dir=str(tmp_path / "clips"), pre_roll_s=PRE, post_roll_s=POST, **clips)
    writer = SpyWriter()
    writer.start()
    rec = ClipRecorder("cam", cfg, writer)
    spy = Spy(rec)
    pending = sorted(events)
    paths: list[str | None] = []

    def on_frame(frame: Frame) -> None:  # the result thread's part, here in the stream thread
        while pending and frame.pts is not None and frame.pts >= pending[0] - 1e-6:
            pending.pop(0)
            paths.append(rec.trigger(frame.pts, "enter"))
        if frame.pts is not None:
            rec.seen(frame.pts)

    stream = StreamConfig(id="cam", url=str(source))
    run_reader(stream, spy, on_frame, demux=demux)
    writer.close()
    return paths, writer, spy


@pytest.mark.parametrize("codec", ["h264", "hevc"])
@pytest.mark.parametrize("demux", ["pyav", "opencv"])
def test_clip_of_a_file_is_valid(sources, tmp_path, codec, demux):
    paths, writer, _ = record(sources[codec], tmp_path, [8.0], demux=demux)
    assert len(paths) == 1 and paths[0] is not None
    assert writer.written == 1 and writer.failed == 0 and writer.dropped == 0
    facts = assert_valid_clip(Path(paths[0]), PRE + POST, sources[codec])
    assert facts.codec == codec
    # the key frame at or before 8 - 3 = 5.0 s: the source has one every second, at 5.0
    assert facts.frames == pytest.approx((8.0 + POST - 5.0) * 10, abs=3)


def test_overlapping_events_make_one_clip(sources, tmp_path):
    # 6.0 and 7.5: the second's pre-roll (4.5 s) starts before the first clip ends (8.0 s)
    paths, writer, _ = record(sources["h264"], tmp_path, [6.0, 7.5, 15.0])
    assert paths[0] == paths[1] != paths[2]
    assert writer.written == 2
    files = sorted((tmp_path / "clips" / "cam").glob("*.mp4"))
    assert [str(f) for f in files] == sorted({p for p in paths if p})
    assert_valid_clip(Path(paths[0]), 7.5 + POST - (6.0 - PRE), sources["h264"])  # 3.0 .. 9.5
    assert_valid_clip(Path(paths[2]), PRE + POST, sources["h264"])


def test_a_clip_is_capped_at_max_length(sources, tmp_path):
    # 5.0 opens [2, 7]; 6.0 extends it to 8 = its cap (2 + 6); 6.5 would need 8.5: the first clip ends at
    # its cap and a new one covers [3.5, 8.5]
    paths, writer, _ = record(sources["h264"], tmp_path, [5.0, 6.0, 6.5], max_length_s=6.0)
    assert paths[0] == paths[1] != paths[2]
    assert writer.written == 2
    assert_valid_clip(Path(paths[0]), 6.0, sources["h264"])
    assert_valid_clip(Path(paths[2]), PRE + POST, sources["h264"])


def test_the_writer_gets_packets_only(sources, tmp_path):
    """The clip path never touches decoded frames: the tap sees demuxed packets (and the session's stream
    parameters), the writer gets bytes of compressed packets."""
    _, writer, spy = record(sources["h264"], tmp_path, [8.0])
    assert spy.kinds == {Packet, VideoInfo, float}
    (job,) = writer.jobs
    assert job.packets and all(type(p) is RingPacket and type(p.data) is bytes for p in job.packets)
    assert not any(isinstance(v, np.ndarray) for p in job.packets for v in (p.data, p.t, p.src))


def test_a_clip_across_a_file_loop_keeps_time_going(sources, tmp_path):
    """A looping file starts a new session at 0 s of its source; the clip continues on the stream's
    timeline (20 s onwards) and still decodes cleanly."""
    cfg = ClipsConfig(enabled=True, dir=str(tmp_path), pre_roll_s=PRE, post_roll_s=POST)
    writer = ClipWriter()
    writer.start()
    rec = ClipRecorder("cam", cfg, writer)
    paths: list[str | None] = []

    def on_frame(frame: Frame) -> bool:
        if frame.pts is None:
            return True
        if not paths and frame.pts >= 19.0:
            paths.append(rec.trigger(frame.pts, "dwell"))
        rec.seen(frame.pts)
        return writer.written + writer.failed == 0  # False: the clip is out, the stream stops

    stream = StreamConfig(id="cam", url=str(sources["h264"]), loop=True)
    run_reader(stream, rec, on_frame, until=60)
    writer.close()
    assert writer.written == 1 and writer.failed == 0
    assert_valid_clip(Path(paths[0]), PRE + POST)  # 16 .. 21 s: the last 4 s of one pass, 1 s of the next


def test_a_full_queue_drops_the_clip_and_counts_it(tmp_path):
    writer = ClipWriter(queue_clips=1)  # not started: nothing is taken off the queue
    job = ClipJob(tmp_path / "a.mp4", [], 2**30, 3600.0)
    assert writer.submit(job) and not writer.submit(job)
    assert writer.dropped == 1
