"""Which outputs write a clip (``on``, ``classes``), and the event lines that name it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streamd.analytics.annotations import AnnotatedFrame, Annotations, FrameEvent
from streamd.analytics.events import ZoneEvent
from streamd.analytics.lines import LineEvent
from streamd.clips import ClipHooks, ClipRecorder, with_clip
from streamd.clips.writer import ClipJob, ClipWriter
from streamd.config.clips import ClipsConfig
from streamd.config.streams import StreamConfig
from streamd.ingest.sources.base import Packet, VideoInfo
from streamd.types import Detections, Frame, FrameResult
from streamd.worker.output import encode_all

INFO = VideoInfo(codec="h264", width=64, height=48, fps=10.0, time_base=0.1)
NAMES = ("person", "bicycle", "car")


class Jobs(ClipWriter):
    """Takes the finished clips without writing them (the packets here are not video)."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[ClipJob] = []

    def submit(self, job: ClipJob) -> bool:
        self.jobs.append(job)
        return True


def recorder(tmp_path, **kw) -> ClipRecorder:
    cfg = ClipsConfig(enabled=True, dir=str(tmp_path), pre_roll_s=2.0, post_roll_s=1.0, **kw)
    rec = ClipRecorder("cam", cfg, Jobs())
    rec.begin(INFO)
    rec.place(0.0)
    for i in range(100):  # 10 s at 10 fps, a key frame every second
        rec.packet(Packet(b"x" * 10, i, i % 10 == 0))
    return rec


def result(pts: float, classes: list[int] = ()) -> FrameResult:
    n = len(classes)
    det = Detections(np.zeros((n, 4), np.float32), np.ones(n, np.float32), np.asarray(classes, np.int32))
    return FrameResult(Frame("cam", round(pts * 10), pts, 64, 48), det)


def outputs(r: FrameResult, *events) -> list:
    return [AnnotatedFrame(r, Annotations()), *(FrameEvent(r.frame, e) for e in events)]


def test_events_in_on_name_their_clip(tmp_path):
    rec = recorder(tmp_path)
    r = result(5.0, [0])
    outs = outputs(
        r, ZoneEvent("enter", "door", 1, 0), ZoneEvent("leave", "door", 2, 0), LineEvent("gate", "in", 3, 0)
    )
    lines = rec.on_result(r, outs, encode_all(outs, NAMES))
    records = [json.loads(line) for line in lines]
    assert "clip" not in records[0]  # the frame line
    assert records[1]["event"] == "enter" and records[1]["clip"].startswith(str(tmp_path / "cam" / "cam-"))
    assert "clip" not in records[2]  # leave is not in the default on
    assert records[3]["event"] == "cross" and records[3]["clip"] == records[1]["clip"]  # one clip for both
    assert rec.clips == 1 and rec.extended == 1


def test_classes_filter_events_and_class_detections_trigger(tmp_path):
    rec = recorder(tmp_path, on=("enter", "class"), classes=(2,))
    r = result(5.0, [0, 0])
    outs = outputs(r, ZoneEvent("enter", "door", 1, 0))
    assert "clip" not in json.loads(rec.on_result(r, outs, encode_all(outs, NAMES))[1])  # a person: no
    assert rec.clips == 0
    rec.on_result(result(6.0, [0, 2]))  # a car appears
    assert rec.clips == 1


def test_a_clip_is_finished_once_the_detector_is_a_pre_roll_past_its_end(tmp_path):
    rec = recorder(tmp_path)
    path = rec.trigger(5.0, "enter")  # 3.0 .. 6.0
    writer = rec.writer
    assert isinstance(writer, Jobs)
    rec.seen(8.0)  # a later event's pre-roll could still reach 6.0
    assert writer.jobs == []
    rec.seen(8.1)
    (job,) = writer.jobs
    assert str(job.path) == path
    assert [round(p.t, 6) for p in job.packets] == [i / 10 for i in range(30, 61)]  # key frame at 3.0 .. 6.0


def test_api_trigger_and_with_clip(tmp_path):
    hooks = ClipHooks()
    assert hooks.recorder(StreamConfig(id="off", url="rtsp://h/x")) is None
    rec = hooks.recorder(
        StreamConfig(id="cam", url="rtsp://h/x", clips=ClipsConfig(enabled=True, dir=str(tmp_path)))
    )
    assert rec is not None and (tmp_path / "cam").is_dir()
    assert hooks.trigger("cam") is None  # nothing buffered yet
    rec.begin(INFO)
    rec.packet(Packet(b"k", 0, True))
    rec.place(0.0)
    assert hooks.trigger("cam", "api") is not None and hooks.trigger("off") is None
    hooks.close()
    assert with_clip('{"v":1,"type":"event"}\n', "/c/a.mp4") == '{"v":1,"type":"event","clip":"/c/a.mp4"}\n'


def test_an_unwritable_dir_is_exit_73(tmp_path):
    from streamd.exitcodes import EX_CANTCREAT, StartupError

    blocker = tmp_path / "file"
    blocker.write_text("")
    stream = StreamConfig(id="cam", url="rtsp://h/x", clips=ClipsConfig(enabled=True, dir=str(blocker)))
    with pytest.raises(StartupError) as err:
        ClipHooks().recorder(stream)
    assert err.value.code == EX_CANTCREAT and "clips.dir" in str(err.value)
