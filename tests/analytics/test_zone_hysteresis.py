"""Zones at their edges: a track whose anchor jitters across a zone's edge enters once and does not leave
until it has been out for ``leave_after_s`` (0.5 s by default); a box cut off by the frame (clipped to the
border) stays in a zone drawn to that border; a walk through counts one enter and one leave.

Synthetic tracks at 10 fps on a 768x576 frame; the expected events are worked out by hand from each track's
anchor points (comments), not from the implementation.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from streamd.analytics.events import ZoneEvents
from streamd.analytics.stream import StreamAnalytics
from streamd.analytics.zones import ZoneSet, reach_border
from streamd.config.coco import COCO_NAMES
from streamd.worker.output import encode_all
from tests.analytics.test_stream_analytics import config, parse, result

pytest.importorskip("lap")

LEFT = {"name": "left", "polygon": [[0, 0], [384, 0], [384, 576], [0, 576]]}  # to the frame's border


def text(outputs: list) -> list[str]:
    """Analytics outputs as the JSON lines the worker writes."""
    return encode_all(outputs, COCO_NAMES)


def run(
    tmp_path, track: list[list[float]], zones: list[dict] | None = None
) -> tuple[list[dict], list[tuple]]:
    """One box per frame through StreamAnalytics: (frame lines, [(event, zone, frame)])."""
    cfg = config(tmp_path, zones=zones or [LEFT])
    a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
    lines: list[str] = []
    for i, box in enumerate(track):
        lines += text(a.annotate(result(i, [box])))
    records = parse(lines)
    frames = [r for r in records if "type" not in r]
    events = [(r["event"], r["zone"], r["frame"]) for r in records if r.get("type") == "event"]
    assert {d["track_id"] for r in frames for d in r["detections"]} == {1}  # one track throughout
    return frames, events


def at(cx: float, y2: float = 300.0) -> list[float]:
    """A 40 x 100 box whose bottom-center anchor is (cx, y2)."""
    return [cx - 20, y2 - 100, cx + 20, y2]


def test_a_walk_through_enters_and_leaves_once(tmp_path) -> None:
    # anchor x = 120 + 20 t: inside up to t = 13 (380), outside from t = 14 (400); leave 0.5 s later, t = 19
    _, events = run(tmp_path, [at(120 + 20 * t) for t in range(30)])
    assert events == [("enter", "left", 0), ("leave", "left", 19)]
    # from the right: x = 620 - 20 t, inside from t = 12 (380)
    _, events = run(tmp_path, [at(620 - 20 * t) for t in range(30)])
    assert events == [("enter", "left", 12)]


def test_jitter_on_a_zone_edge_counts_once(tmp_path) -> None:
    # 48 frames on the edge x = 384, the anchor 3 px in (i) or out (o), out for at most 4 frames (0.4 s) in a
    # row, then a walk out to the right from frame 48 on: one enter at 0, one leave at 48 + 5.
    pattern = "i" + "oi" + "ooi" + "oooi" + "ooooi" + "oi" * 4 + "ooi" * 3 + "oooi" * 2 + "ooooi" + "iii"
    assert len(pattern) == 48 and "ooooo" not in pattern and pattern[-1] == "i"
    track = [at(384 - 3 if c == "i" else 384 + 3) for c in pattern] + [at(400 + 10 * t) for t in range(10)]
    frames, events = run(tmp_path, track)
    assert events == [("enter", "left", 0), ("leave", "left", 53)]
    # the frame lines still say where the anchor is, frame by frame
    assert [bool(r["detections"][0]["zones"]) for r in frames[:48]] == [c == "i" for c in pattern]


def test_out_for_leave_after_s_is_a_leave(tmp_path) -> None:
    # out for 5 frames (0.4 s from the first to the last): still in; out for 6 (0.5 s): leave at the 6th
    _, events = run(tmp_path, [at(380)] * 5 + [at(390)] * 5 + [at(380)] * 5)
    assert events == [("enter", "left", 0)]
    _, events = run(tmp_path, [at(380)] * 5 + [at(390)] * 6 + [at(380)] * 5)
    assert events == [("enter", "left", 0), ("leave", "left", 10), ("enter", "left", 11)]


def test_a_box_cut_off_by_the_frame_stays_in_a_zone_drawn_to_the_border(tmp_path) -> None:
    # 48 frames of a person at the bottom edge: the detector's box reaches past the frame (clipped: y2 = 576)
    # or stops just short (575.6). Zones drawn to the border, or to the last pixel row/column (575, 767).
    bottom = {"name": "bottom_px", "polygon": [[0, 300], [767, 300], [767, 575], [0, 575]]}
    right = {
        "name": "right",
        "polygon": [[384, 0], [768, 0], [768, 576], [384, 576]],
        "anchor": "bottom_right",
    }
    y2 = [576.0 if t % 2 == 0 else 575.6 for t in range(48)]
    frames, events = run(tmp_path, [at(230, y) for y in y2], [LEFT, bottom])
    assert events == [("enter", "left", 0), ("enter", "bottom_px", 0)]
    assert all(r["detections"][0]["zones"] == ["left", "bottom_px"] for r in frames)
    # at the right border: x2 clipped to 768 or just short of it
    x2 = [768.0 if t % 3 == 0 else 767.5 for t in range(48)]
    frames, events = run(tmp_path, [[x - 40, 400, x, 500] for x in x2], [right])
    assert events == [("enter", "right", 0)]
    assert all(r["detections"][0]["zones"] == ["right"] for r in frames)


def test_border_points_move_past_the_frame_only() -> None:
    poly = np.array([[0, 0], [767, 0], [500, 300], [767, 575.5], [10, 576]], np.float64)
    assert reach_border(poly, 768, 576).tolist() == [[-1, -1], [769, -1], [500, 300], [769, 577], [10, 577]]
    zone = SimpleNamespace(name="z", polygon=LEFT["polygon"], anchor="bottom_center", classes=None)
    zones = ZoneSet([zone])
    clipped = np.array([[200, 476, 260, 576], [200, 476, 260, 575.6], [364, 476, 404, 576]], np.float32)
    cls = np.zeros(3, np.int64)
    assert zones.membership(clipped, cls).ravel().tolist() == [False, True, False]  # as drawn: half-open
    assert zones.membership(clipped, cls, (768, 576)).ravel().tolist() == [True, True, False]
    assert zones.leave_after_s == [0.5]  # the default when the zone does not say


def test_each_zone_has_its_own_leave_delay() -> None:
    events = ZoneEvents(["a", "b"], [0.0, 0.3])
    ids, cls = np.array([1]), np.array([0])
    got = []
    for i, inside in enumerate([[1, 1], [0, 0], [0, 0], [0, 0], [0, 0]]):
        got += [(e.event, e.zone, i) for e in events.update(ids, cls, np.array([inside], bool), i / 10)]
    assert got == [("enter", "a", 0), ("enter", "b", 0), ("leave", "a", 1), ("leave", "b", 4)]
