"""StreamAnalytics: the narrow per-stream API (should_detect / skip / annotate / flush), line order
with fill_skipped, zones_only, the JSON Schema of both line types, and the ingest hook (skips counted, GPU
surfaces released at once)."""

from __future__ import annotations

import json
import threading

import jsonschema
import numpy as np
import pytest

from streamd.analytics.stream import StreamAnalytics, build_analytics
from streamd.config import parse_config
from streamd.config.coco import COCO_NAMES
from streamd.types import Detections, Frame, FrameResult
from streamd.worker.output import encode_all
from tests.conftest import SCHEMA

pytest.importorskip("lap")
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))


def text(outputs: list) -> list[str]:
    """Analytics outputs as the JSON lines the worker writes."""
    return encode_all(outputs, COCO_NAMES)


def config(tmp_path, **stream):
    (tmp_path / "v.mp4").write_bytes(b"\0")
    data = {"streams": [{"id": "cam", "url": "v.mp4", **stream}], "tracking": {"enabled": True}}
    return parse_config(data, tmp_path)


def frame(i: int) -> Frame:
    return Frame("cam", i, i / 10, 768, 576, wall_time=1000 + i / 10)


def result(i: int, boxes: list[list[float]], scores: list[float] | None = None) -> FrameResult:
    n = len(boxes)
    det = Detections(
        np.asarray(boxes, np.float32).reshape(n, 4),
        np.asarray(scores or [0.9] * n, np.float32),
        np.zeros(n, np.int32),
    )
    return FrameResult(frame(i), det, {"decode": 1.0, "queue": 0.5, "total": 3.0})


def person(t: int, speed: float = 5) -> list[float]:
    x = 100 + speed * t
    return [x, 200, x + 40, 300]


def parse(lines: list[str]) -> list[dict]:
    records = [json.loads(line) for line in lines]
    for r in records:
        VALIDATOR.validate(r)
    return records


def test_fill_skipped_lines_in_frame_order_whatever_the_timing(tmp_path):
    cfg = config(tmp_path, detect_fps=5, tracking={"fill_skipped": True})
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    out: list[str] = []
    # Ingest runs ahead: frames 0..5 decoded before any result arrives.
    for i in range(6):
        if a.should_detect(frame(i)):
            assert i % 2 == 0
        else:
            out += text(a.skip(frame(i)))
    assert out == [] and a.skipped == 3 and a.detected == 3
    for i in (0, 2, 4):
        out += text(a.annotate(result(i, [person(i)])))
    out += text(a.flush())
    records = parse(out)
    assert [r["frame"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert [r.get("predicted", False) for r in records] == [False, True, False, True, False, True]
    ids = {d["track_id"] for r in records for d in r["detections"]}
    assert ids == {1}
    assert [r["detections"][0]["track_age"] for r in records] == [0, 1, 2, 3, 4, 5]
    # Nothing in flight: a skipped frame's line comes at once.
    assert a.should_detect(frame(6))
    out = text(a.annotate(result(6, [person(6)])))
    assert not a.should_detect(frame(7))
    (line,) = text(a.skip(frame(7)))
    assert json.loads(line)["frame"] == 7 and json.loads(line)["predicted"] is True


def test_a_held_skipped_frame_keeps_no_picture(tmp_path):
    """A skipped frame waiting for an earlier detection holds its stamps only: no host image, no picture
    pending conversion (the CPU decoder's), no decoder surface."""
    import dataclasses

    cfg = config(tmp_path, detect_fps=5, tracking={"fill_skipped": True})
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    assert a.should_detect(frame(0))  # in flight: the next skipped frame is held
    picture = np.zeros((576, 768, 3), np.uint8)
    skipped = dataclasses.replace(frame(1), image=picture, surface=object(), pending=object())
    assert not a.should_detect(skipped) and a.skip(skipped) == []
    (held,) = a._held
    assert (held.image, held.surface, held.pending) == (None, None, None)
    assert (held.index, held.pts, held.wall_time) == (1, skipped.pts, skipped.wall_time)


def test_dropped_frame_does_not_hold_lines_forever(tmp_path):
    cfg = config(tmp_path, detect_fps=5, tracking={"fill_skipped": True})
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    for i in range(5):
        if not a.should_detect(frame(i)):
            assert text(a.skip(frame(i))) == []
    # frame 2 was dropped by a live queue: the result of 4 settles 1 and 3
    frames = [
        r["frame"]
        for r in parse(text(a.annotate(result(0, [person(0)]))) + text(a.annotate(result(4, [person(4)]))))
    ]
    assert frames == [0, 1, 3, 4]


def test_zones_events_and_zones_only(tmp_path):
    zone = {"name": "left", "polygon": [[0, 0], [384, 0], [384, 576], [0, 576]]}
    cfg = config(tmp_path, zones=[zone], zones_only=True)
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    lines: list[str] = []
    for t in range(20):  # walks from x=100 to x=480: leaves the left half at t ~ 14
        lines += text(a.annotate(result(t, [person(t, 20), [600, 100, 640, 200]])))
    records = parse(lines)
    frames = [r for r in records if "type" not in r]
    events = [r for r in records if r.get("type") == "event"]
    assert [(e["event"], e["zone"], e["track_id"], e["label"]) for e in events] == [
        ("enter", "left", 1, "person"),
        ("leave", "left", 1, "person"),
    ]
    # anchor x = 120 + 20 t: first outside at t = 14 (x 400); the leave is confirmed 0.5 s (5 frames) later
    assert events[0]["frame"] == 0 and events[1]["frame"] == 19
    assert all(d["zones"] == ["left"] for r in frames for d in r["detections"])  # zones_only
    assert len(frames[0]["detections"]) == 1 and frames[-1]["detections"] == []


def test_leave_when_a_track_ends_inside(tmp_path):
    zone = {"name": "all", "polygon": [[0, 0], [768, 0], [768, 576], [0, 576]]}
    cfg = config(tmp_path, zones=[zone])
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    lines = text(a.annotate(result(0, [person(0)])))
    for t in range(1, 15):
        lines += text(a.annotate(result(t, [])))
    events = [r for r in parse(lines) if r.get("type") == "event"]
    assert [(e["event"], e["frame"]) for e in events] == [("enter", 0), ("leave", 11)]


def test_detections_that_no_track_takes_are_not_written(tmp_path):
    cfg = config(tmp_path, tracking={"new_track_score": 0.5, "high_score": 0.5})
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    (first,) = parse(text(a.annotate(result(0, [person(0), [600, 100, 640, 200]], [0.9, 0.3]))))
    assert [d["track_id"] for d in first["detections"]] == [1]
    (second,) = parse(text(a.annotate(result(1, [person(1)], [0.3]))))  # low score, continues track 1
    assert [(d["track_id"], d["score"]) for d in second["detections"]] == [(1, 0.3)]


def test_inactive_stream_gets_no_hook(tmp_path):
    (tmp_path / "v.mp4").write_bytes(b"\0")
    cfg = parse_config(
        {"streams": [{"id": "a", "url": "v.mp4"}, {"id": "b", "url": "v.mp4", "detect_fps": 2}]}, tmp_path
    )
    hooks = build_analytics(cfg)
    assert list(hooks) == ["b"]


class FakeSurface:
    def __init__(self) -> None:
        self.released: list[object] = []

    def release(self, stream: object = None) -> None:
        self.released.append(stream)


class FakeQueue:
    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def put(self, frame: Frame, stop: threading.Event) -> bool:
        self.frames.append(frame)
        return True


def test_ingest_hook_skips_counts_and_releases_surfaces(tmp_path):
    from streamd.ingest.decode import DecodedPicture
    from streamd.ingest.reader import StreamReader

    cfg = config(tmp_path, detect_fps=5, tracking={"fill_skipped": True})
    hook = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    q, lines = FakeQueue(), []
    worker = StreamReader(cfg.streams[0], q, threading.Event(), analytics=hook, on_lines=lines.extend)  # type: ignore[arg-type]
    surfaces = [FakeSurface() for _ in range(6)]
    pictures = [DecodedPicture(i / 10, 768, 576, surface=s) for i, s in enumerate(surfaces)]
    assert worker._emit(pictures, 1.0, None)
    assert [f.index for f in q.frames] == [0, 2, 4]
    assert worker.stats.skipped == 3 and worker.stats.decoded == 6
    assert [len(s.released) for s in surfaces] == [0, 1, 0, 1, 0, 1]  # skipped: back to the pool at once
    assert lines == []  # held until the results of frames 0, 2, 4 are written


def test_zone_outside_the_frame_is_reported_once(tmp_path, caplog):
    zone = {"name": "far", "polygon": [[0, 0], [1000, 0], [1000, 500], [0, 500]]}
    cfg = config(tmp_path, zones=[zone])
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    with caplog.at_level("ERROR", logger="streamd.analytics"):
        for t in range(3):
            parse(text(a.annotate(result(t, [person(t)]))))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "far" in errors[0] and "768x576" in errors[0], errors
