"""Dwell: ``zones[].dwell_s`` gives one ``dwell`` event per visit once a track has been in the zone that long
(stream time, from the pts), and ``leave`` carries ``time_in_zone_s``.

Frames at 10 fps (pts = frame / 10) on a 768x576 picture; the zone ``left`` is x < 384, ``leave_after_s`` 0.5
(the default). One 40 x 100 box per frame; its bottom-center anchor x is given per frame. Expected times are
worked out by hand from the frame numbers (comments).
"""

from __future__ import annotations

import pytest

from streamd.analytics.stream import StreamAnalytics
from streamd.config.coco import COCO_NAMES
from tests.analytics.test_stream_analytics import config, frame, parse, result, text

pytest.importorskip("lap")

LEFT = {"name": "left", "polygon": [[0, 0], [384, 0], [384, 576], [0, 576]], "dwell_s": 1.0}


def at(cx: float) -> list[float]:
    return [cx - 20, 200, cx + 20, 300]


def run(tmp_path, xs: list[float], zone: dict | None = None, **stream) -> tuple[list[tuple], list[dict]]:
    """One box per frame at anchor x = xs[t] -> ([(event, frame, time_in_zone_s)], event records)."""
    cfg = config(tmp_path, zones=[zone or LEFT], **stream)
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    out: list[str] = []
    for t, x in enumerate(xs):
        if a.should_detect(frame(t)):
            out += text(a.annotate(result(t, [at(x)])))
    out += text(a.stream_ended())
    records = [r for r in parse(out) if r.get("type") == "event"]
    return [(r["event"], r["frame"], r.get("time_in_zone_s")) for r in records], records


def stay_then_walk_out(stay: int) -> list[float]:
    """x = 300 for frames 0 .. stay-1, then 20 px a frame to the right: last inside at x = 380, first outside
    at x = 400, 5 frames after the walk starts."""
    return [300.0] * stay + [300.0 + 20 * (k + 1) for k in range(15)]


def test_dwell_once_and_leave_with_the_time_in_the_zone(tmp_path) -> None:
    # enter at frame 0 (0.0 s); dwell at frame 10 (1.0 s in); walk from frame 20: x = 400 at frame 24 (2.4 s),
    # the first frame outside; leave confirmed 0.5 s later, at frame 29; time in the zone 2.4 s
    events, records = run(tmp_path, stay_then_walk_out(20))
    assert events == [("enter", 0, None), ("dwell", 10, 1.0), ("leave", 29, 2.4)]
    assert records[1]["zone"] == "left" and records[1]["label"] == "person"


def test_no_dwell_for_a_short_visit(tmp_path) -> None:
    # x = 300 for frames 0..4, first outside at frame 9 (0.9 s): leaves before 1.0 s, at frame 14
    events, _ = run(tmp_path, stay_then_walk_out(5))
    assert events == [("enter", 0, None), ("leave", 14, 0.9)]


def test_jitter_over_the_edge_keeps_the_visit(tmp_path) -> None:
    # in at 370 from frame 0, one frame out at 390 (frame 6), back in: one visit; dwell at frame 10 (1.0 s)
    # although the anchor was outside for a frame; at the end of the stream (last frame 14, 1.4 s) still in
    xs = [370.0] * 6 + [390.0] + [370.0] * 8
    events, _ = run(tmp_path, xs)
    assert events == [("enter", 0, None), ("dwell", 10, 1.0), ("leave", 14, 1.4)]


def test_every_visit_has_its_own_dwell(tmp_path) -> None:
    # visit 1: in frames 0..12 (x 370), out from 13 (x 390) to 20; leave at 18 (1.8 s), time 1.3 s
    # visit 2: back in at frame 21 (2.1 s) to the end (frame 35, 3.5 s); dwell at frame 31 (3.1 s)
    xs = [370.0] * 13 + [390.0] * 8 + [370.0] * 15
    events, _ = run(tmp_path, xs, {**LEFT, "leave_after_s": 0.5})
    assert events == [
        ("enter", 0, None),
        ("dwell", 10, 1.0),
        ("leave", 18, 1.3),
        ("enter", 21, None),
        ("dwell", 31, 1.0),
        ("leave", 35, 1.4),
    ]


def test_dwell_on_detected_frames_only(tmp_path) -> None:
    # detect_fps 4 on 10 fps: slots of 0.25 s, detected frames 0, 3, 5, 8, 10, 13, ... (the first frame of
    # each slot); the first detected frame 1.0 s or more after the enter is frame 10 (1.0 s); dwell_s 1.2:
    # frame 13 (1.3 s, the time so far)
    events, _ = run(tmp_path, [300.0] * 16, {**LEFT, "dwell_s": 1.2}, detect_fps=4)
    assert events == [("enter", 0, None), ("dwell", 13, 1.3), ("leave", 15, 1.5)]


def test_a_track_that_ends_inside_leaves_with_its_time(tmp_path) -> None:
    # seen inside frames 0..7 (last 0.7 s), then nothing: the track ends when unseen for lost_timeout_s (1 s),
    # i.e. at the first update 1 s after frame 7: frame 18 (another object elsewhere keeps frames coming)
    cfg = config(tmp_path, zones=[LEFT])
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    out: list[str] = []
    for t in range(20):
        boxes = ([at(300)] if t < 8 else []) + [[600, 400, 640, 500]]
        out += text(a.annotate(result(t, boxes)))
    events = [
        (r["event"], r["track_id"], r["frame"], r.get("time_in_zone_s")) for r in parse(out) if "type" in r
    ]
    assert events == [("enter", 1, 0, None), ("leave", 1, 18, 0.7)]
