"""Lines: synthetic tracks through ``StreamAnalytics`` with exact expected crossings.

Frames at 10 fps on a 768x576 picture; one 40 x 100 box per object and frame, its bottom-center anchor given
per frame. The street line ``h`` runs from (100, 300) to (600, 300), left to right, so its left side ("in" by
default) is above it (y < 300); ``margin_px`` is 8. The expected events are worked out by hand from the
anchors (comments) and the rule in ``streamd.analytics.lines``, not from the implementation.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamd.analytics.lines import LineCrossings, LineSet, segments_intersect
from streamd.analytics.stream import StreamAnalytics
from streamd.config.coco import COCO_NAMES
from streamd.types import Detections, FrameResult
from tests.analytics.test_stream_analytics import config, frame, parse, text

pytest.importorskip("lap")

H = {"name": "h", "points": [[100, 300], [600, 300]]}
PERSON, CAR = 0, 2


def box(x: float, y2: float) -> list[float]:
    """A 40 x 100 box whose bottom-center anchor is (x, y2)."""
    return [x - 20, y2 - 100, x + 20, y2]


def result(i: int, anchors: list[tuple[float, float]], classes: list[int] | None = None) -> FrameResult:
    n = len(anchors)
    det = Detections(
        np.asarray([box(x, y) for x, y in anchors], np.float32).reshape(n, 4),
        np.full(n, 0.9, np.float32),
        np.asarray(classes or [PERSON] * n, np.int32),
    )
    return FrameResult(frame(i), det, {"decode": 1.0, "queue": 0.5, "total": 3.0})


def run(tmp_path, tracks: list[list[float]], xs: list[float], lines=None, classes=None, **stream):
    """Objects at x = xs[k] moving along y2 = tracks[k][t] (None: not in frame t) -> (analytics, [(line,
    direction, track_id, frame)])."""
    cfg = config(tmp_path, lines=lines or [H], **stream)
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    out: list[str] = []
    for t in range(max(len(tr) for tr in tracks)):
        here = [k for k, tr in enumerate(tracks) if t < len(tr) and tr[t] is not None]
        anchors = [(xs[k], tracks[k][t]) for k in here]
        out += text(a.annotate(result(t, anchors, [classes[k] for k in here] if classes else None)))
    events = [
        (r["line"], r["direction"], r["track_id"], r["frame"])
        for r in parse(out)
        if r.get("event") == "cross"
    ]
    return a, events


def test_straight_crossings_both_ways(tmp_path) -> None:
    down = [250 + 10 * t for t in range(11)]  # 250 .. 350: on the line at t=5 (300), 10 px below at t=6
    up = [350 - 10 * t for t in range(11)]  # 350 .. 250: 10 px above at t=6
    a, events = run(tmp_path, [down, up], [200, 500])
    assert events == [("h", "out", 1, 6), ("h", "in", 2, 6)]
    assert a.line_counts() == {("h", "person", "out"): 1, ("h", "person", "in"): 1}


def test_in_side_right_swaps_the_directions(tmp_path) -> None:
    down = [250 + 10 * t for t in range(11)]
    _, events = run(tmp_path, [down], [200], lines=[{**H, "in_side": "right"}])
    assert events == [("h", "in", 1, 6)]


def test_left_of_a_vertical_line_is_the_right_half(tmp_path) -> None:
    # [[400, 0], [400, 576]] points down the picture: standing on (400, 0) facing down, left is x > 400
    v = {"name": "v", "points": [[400, 0], [400, 576]]}
    cfg = config(tmp_path, lines=[v])
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    out: list[str] = []
    for t in range(11):  # x = 350 .. 450: 10 px right of the line at t = 6
        out += text(a.annotate(result(t, [(350 + 10 * t, 300)])))
    assert [(r["line"], r["direction"], r["frame"]) for r in parse(out) if r.get("type") == "event"] == [
        ("v", "in", 6)
    ]


def test_jitter_on_the_line_counts_once_or_never(tmp_path) -> None:
    # anchor 3-5 px either side of the line, crossing it 8 times, never 8 px past it, then 20 px below: one
    # crossing, settled at t = 10; a second object jitters the same way and goes back up: none
    jitter = [298, 303, 297, 304, 296, 302, 299, 305, 297]
    across = [280, 290, *jitter, 320, 330]
    back = [280, 290, *jitter, 285, 270]
    a, events = run(tmp_path, [across, back], [200, 500])
    assert events == [("h", "out", 1, 11)]
    assert a.line_counts() == {("h", "person", "out"): 1}


def test_a_u_turn_counts_nothing(tmp_path) -> None:
    short = [250, 270, 290, 298, 290, 270, 250]  # comes to 2 px of the line, turns back
    over = [250, 270, 290, 300, 306, 300, 290, 270, 250]  # 6 px past it (< margin_px), turns back
    a, events = run(tmp_path, [short, over], [200, 500])
    assert events == []
    assert a.line_counts() == {}


def test_a_crossing_outside_the_segment_counts_nothing(tmp_path) -> None:
    beyond = [250 + 10 * t for t in range(11)]  # x = 700: past the segment's end (x 100 .. 600)
    inside = [250 + 10 * t for t in range(11)]  # x = 590: within it
    _, events = run(tmp_path, [beyond, inside], [700, 590])
    assert events == [("h", "out", 2, 6)]


def test_a_crossing_between_two_detected_frames_counts_once(tmp_path) -> None:
    # detect_fps 2 on 10 fps: frames 0, 5, 10 detected; the anchor goes 280 -> 310 -> 340 (6 px a frame),
    # over the line between frames 0 and 5; the predicted boxes of the frames between do not count
    cfg = config(tmp_path, lines=[H], detect_fps=2, tracking={"fill_skipped": True})
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    out: list[str] = []
    for t in range(11):
        f = frame(t)
        if a.should_detect(f):
            out += text(a.annotate(result(t, [(300, 280 + 6 * t)])))
        else:
            out += text(a.skip(f))
    records = parse(out)
    assert [r["frame"] for r in records if "type" not in r] == list(range(11))  # predicted frames too
    assert [(r["direction"], r["frame"]) for r in records if r.get("type") == "event"] == [("out", 5)]
    assert a.line_counts() == {("h", "person", "out"): 1}


def test_class_filter(tmp_path) -> None:
    down = [250 + 10 * t for t in range(11)]
    cars = {**H, "classes": ["car"]}
    a, events = run(
        tmp_path, [down, down], [200, 500], lines=[cars, {**H, "name": "all"}], classes=[PERSON, CAR]
    )
    assert events == [("all", "out", 1, 6), ("h", "out", 2, 6), ("all", "out", 2, 6)]
    assert a.line_counts() == {("all", "person", "out"): 1, ("h", "car", "out"): 1, ("all", "car", "out"): 1}


def test_event_lines_keys_and_many_crossings(tmp_path) -> None:
    # back and forth 3 times, 40 px each way: out, in, out, in, out, in
    path = [280, 320] * 3 + [280]
    _, events = run(tmp_path, [path], [300])
    assert [(d, f) for _, d, _, f in events] == [
        ("out", 1),
        ("in", 2),
        ("out", 3),
        ("in", 4),
        ("out", 5),
        ("in", 6),
    ]
    cfg = config(tmp_path, lines=[H])
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    out = text(a.annotate(result(0, [(300, 280)]))) + text(a.annotate(result(1, [(300, 320)])))
    event = parse(out)[-1]
    assert " ".join(event) == "v type event stream frame pts time line direction track_id class_id label"
    assert (event["event"], event["line"], event["direction"], event["label"]) == (
        "cross",
        "h",
        "out",
        "person",
    )


def test_ended_tracks_are_forgotten() -> None:
    class Line:
        name, points, in_side, classes, anchor, margin_px = (
            "h",
            ((100, 300), (600, 300)),
            "left",
            None,
            "center",
            8,
        )

    c = LineCrossings(LineSet([Line()]))
    c.update(np.array([5]), np.array([0]), np.array([box(300, 290)], np.float64))
    assert 5 in c.prev
    c.end([5])
    assert c.prev == {} and c.side == {} and c.crossed == {}


def test_segment_intersection_cases() -> None:
    a, b = np.array([0.0, 0.0]), np.array([10.0, 0.0])
    moves = np.array(
        [
            [[5, -1], [5, 1]],  # through the middle
            [[11, -1], [11, 1]],  # past the end
            [[10, -1], [10, 1]],  # through the end point (touching counts)
            [[2, 0], [8, 0]],  # along the segment: no crossing
            [[5, 1], [5, 1]],  # no motion
            [[5, 2], [5, 0]],  # onto it
        ],
        np.float64,
    )
    assert segments_intersect(moves[:, 0], moves[:, 1], a, b).tolist() == [
        True,
        False,
        True,
        False,
        False,
        True,
    ]


def test_a_line_outside_the_frame_is_logged_once(tmp_path, caplog) -> None:
    far = {"name": "far", "points": [[100, 300], [900, 300]]}  # the frame is 768 wide
    cfg = config(tmp_path, lines=[H, far])
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    with caplog.at_level("ERROR", logger="streamd.analytics.stream"):
        for t in range(3):
            a.annotate(result(t, [(300, 250)]))
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and "line(s) far reach outside the 768x576 frame" in logged[0], logged
