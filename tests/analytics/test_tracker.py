"""ByteTracker: ids survive crossings and short occlusions, second association with low scores, timeouts,
prediction on skipped frames; the detection-rate slots; zones and events."""

from __future__ import annotations

import numpy as np
import pytest

from streamd.analytics.events import ZoneEvents
from streamd.analytics.rate import DetectRate
from streamd.analytics.tracker import ByteTracker, iou_matrix
from streamd.analytics.zones import ZoneSet, points_in_polygon
from streamd.config.streams import ZoneConfig
from streamd.config.tracking import TrackingConfig
from streamd.geometry import polygon_problem

pytest.importorskip("lap")

ON = TrackingConfig(enabled=True)


def box(cx: float, cy: float, w: float = 40, h: float = 80) -> list[float]:
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def step(tracker: ByteTracker, boxes: list[list[float]], scores: list[float], index: int, cls=None):
    xyxy = np.asarray(boxes, np.float32).reshape(-1, 4)
    score = np.asarray(scores, np.float32)
    class_id = np.zeros(len(score), np.int32) if cls is None else np.asarray(cls, np.int32)
    return tracker.update(xyxy, score, class_id, index, index / 10)


def test_iou_matrix():
    a = np.array([[0, 0, 10, 10], [20, 20, 30, 30]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [100, 100, 101, 101]], np.float32)
    iou = iou_matrix(a, b)
    assert iou.shape == (2, 3)
    assert iou[0, 0] == 1 and iou[0, 1] == pytest.approx(50 / 150) and iou[1].max() == 0
    assert iou_matrix(a[:0], b).shape == (0, 3)


def test_crossing_boxes_keep_their_ids():
    """Two people walk towards each other on one line, overlap fully for a few frames and walk on: the
    constant-velocity prediction carries each id through the crossing."""
    tracker = ByteTracker(ON)
    ids_a, ids_b = [], []
    for t in range(60):
        a, b = box(100 + 8 * t, 300), box(572 - 8 * t, 300)
        up = step(tracker, [a, b], [0.9, 0.8], t)
        ids_a.append(int(up.track_id[0]))
        ids_b.append(int(up.track_id[1]))
    assert set(ids_a) == {ids_a[0]} and set(ids_b) == {ids_b[0]} and ids_a[0] != ids_b[0], (ids_a, ids_b)


def test_crossing_with_merged_detection_and_occlusion():
    """While they overlap only one box is detected (the other is hidden) and at a low score for a few
    frames; both ids come back once they separate."""
    tracker = ByteTracker(ON)
    first = step(tracker, [box(100, 300), box(400, 300)], [0.9, 0.9], 0).track_id.tolist()
    for t in range(1, 40):
        a, b = box(100 + 6 * t, 300), box(400 - 6 * t, 300)
        if 22 <= t <= 28:  # overlapping: a hides b; a's score drops (occlusion) on some frames
            up = step(tracker, [a], [0.3 if t % 2 else 0.9], t)
            assert up.track_id[0] == first[0]
            continue
        up = step(tracker, [a, b], [0.9, 0.9], t)
        assert up.track_id.tolist() == first, (t, up.track_id)


def test_low_score_detections_continue_but_do_not_start_tracks():
    tracker = ByteTracker(TrackingConfig(enabled=True, high_score=0.5, new_track_score=0.5))
    (tid,) = step(tracker, [box(100, 100)], [0.9], 0).track_id.tolist()
    up = step(tracker, [box(104, 100), box(400, 400)], [0.2, 0.3], 1)  # both below high_score
    assert up.track_id.tolist() == [tid, -1] and up.track_age.tolist() == [1, 0]
    assert len(tracker) == 1


def test_lost_track_recovers_within_timeout_then_ends():
    tracker = ByteTracker(TrackingConfig(enabled=True, lost_timeout_s=0.5))
    (tid,) = step(tracker, [box(100, 100)], [0.9], 0).track_id.tolist()
    for t in range(1, 4):  # 0.3 s unseen
        assert step(tracker, [], [], t).ended == []
    assert step(tracker, [box(100, 100)], [0.9], 4).track_id.tolist() == [tid]
    for t in range(5, 15):  # last seen at 0.4 s: alive up to 0.9 s, ended at 1.0 s
        up = step(tracker, [], [], t)
        if up.ended:
            assert up.ended == [tid] and t == 10
            break
    else:
        raise AssertionError("the track never ended")
    assert step(tracker, [box(100, 100)], [0.9], 20).track_id.tolist() == [tid + 1]


def test_class_aware_matching():
    tracker = ByteTracker(ON)
    (tid,) = step(tracker, [box(100, 100)], [0.9], 0, cls=[0]).track_id.tolist()
    up = step(tracker, [box(100, 100)], [0.9], 1, cls=[2])
    assert up.track_id.tolist() == [tid + 1]


def test_predict_on_skipped_frames_does_not_change_state():
    tracker = ByteTracker(ON)
    for t in range(0, 10, 2):  # detected every other frame, moving 10 px per frame
        up = step(tracker, [box(100 + 10 * t, 200)], [0.9], t)
    p = tracker.predict(9)
    assert p.track_id.tolist() == up.track_id.tolist() and p.track_age.tolist() == [9]
    cx = (p.xyxy[0, 0] + p.xyxy[0, 2]) / 2
    assert cx == pytest.approx(190, abs=3)
    again = tracker.predict(9)
    assert np.array_equal(again.xyxy, p.xyxy)


def test_same_detections_same_tracks():
    """Determinism: the GPU path's detections equal the CPU twin's, so equal inputs must give equal ids."""
    runs = []
    for _ in range(2):
        tracker, ids = ByteTracker(ON), []
        r = np.random.default_rng(1)
        for t in range(30):
            centres = np.array([[100 + 5 * t, 100], [300, 100 + 4 * t], [500 - 3 * t, 400]])
            boxes = [box(*(c + r.normal(0, 2, 2))) for c in centres]
            ids.append(step(tracker, boxes, r.uniform(0.3, 1, 3).tolist(), t).track_id.tolist())
        runs.append(ids)
    assert runs[0] == runs[1]


def test_detect_rate_slots():
    rate = DetectRate(5)
    picked = [k for k in range(795) if rate.should_detect(k / 10)]
    assert len(picked) == 398 and picked[:3] == [0, 2, 4]
    rate = DetectRate(5)
    rng = np.random.default_rng(0)
    times = np.arange(3000) / 30 + rng.normal(0, 0.004, 3000)  # jittery 30 fps camera, 100 s
    n = sum(rate.should_detect(float(t)) for t in np.sort(times))
    assert 499 <= n <= 501
    assert sum(DetectRate(50).should_detect(k / 10) for k in range(100)) == 100  # faster than the stream
    with pytest.raises(ValueError):
        DetectRate(0)


def test_zones_membership_and_polygon_checks():
    square = [(0.0, 0.0), (100.0, 0.0), (100.0, 100.0), (0.0, 100.0)]
    pts = np.array([[50, 50], [150, 50], [99.9, 0.1], [-1, 50]], np.float64)
    assert points_in_polygon(pts, np.array(square)).tolist() == [True, False, True, False]
    zones = ZoneSet(
        [ZoneConfig("a", tuple(square)), ZoneConfig("b", tuple(square), classes=(1,), anchor="top_center")]
    )
    xyxy = np.array([[40, 20, 60, 90], [40, 50, 60, 150]], np.float32)
    m = zones.membership(xyxy, np.array([1, 0], np.int32))
    assert m.tolist() == [[True, True], [False, False]]
    assert zones.outside(768, 576) == [] and zones.outside(80, 80) == ["a", "b"]
    assert polygon_problem([(0, 0), (1, 1)]) and polygon_problem([(0, 0), (2, 2), (2, 0), (0, 2)])
    assert polygon_problem(square) is None


def test_zone_events_balance():
    events = ZoneEvents(["door"])
    inside = np.array([[True]])
    out = events.update(np.array([7]), np.array([0]), inside)
    assert [(e.event, e.track_id) for e in out] == [("enter", 7)]
    assert events.update(np.array([7]), np.array([0]), inside) == []
    assert [e.event for e in events.update(np.array([7]), np.array([0]), ~inside)] == ["leave"]
    events.update(np.array([7, -1]), np.array([0, 0]), np.array([[True], [True]]))
    assert [e.event for e in events.end([7, 8])] == ["leave"]
    assert events.counts == {"enter": 2, "dwell": 0, "leave": 2}


def test_predict_is_the_kalman_mean_of_the_tracks_seen_last():
    """``predict`` (cached between updates, mean only) against the filter written out here: every seen track's
    state through ``kalman_predict``, its box through ``xyah_to_xyxy``, over walkers with misses and skips."""
    from streamd.analytics.tracker import kalman_predict, xyah_to_xyxy

    rng = np.random.default_rng(7)
    tracker = ByteTracker(TrackingConfig(enabled=True))
    pos = rng.uniform(100, 900, (12, 2))
    vel = rng.normal(0, 5, (12, 2))
    checked = 0
    for index in range(0, 300, 3):  # detected every third frame; 1 and 2 after each are predicted
        pos += 3 * vel
        shown = rng.uniform(0, 1, 12) > 0.2
        half = np.array([20.0, 40.0])
        boxes = np.concatenate([pos - half, pos + half], 1)[shown].astype(np.float32)
        tracker.update(
            boxes, np.full(len(boxes), 0.9, np.float32), np.zeros(len(boxes), np.int32), index, index / 30
        )
        rows = np.nonzero(tracker.seen_now)[0]
        for skip in (1, 2, 1):  # the same frame twice: the cache must not drift
            p = tracker.predict(index + skip)
            mean, _ = kalman_predict(tracker.mean[rows], tracker.var[rows], float(skip))
            np.testing.assert_array_equal(p.xyxy, xyah_to_xyxy(mean).astype(np.float32))
            np.testing.assert_array_equal(p.track_id, tracker.ids[rows])
            np.testing.assert_array_equal(p.track_age, index + skip - tracker.first[rows])
            np.testing.assert_array_equal(p.score, tracker.score[rows])
            np.testing.assert_array_equal(p.class_id, tracker.cls[rows])
            p.xyxy[:] = -1  # a caller clipping in place changes nothing the next call sees
            p.score[:] = -1
            checked += len(rows)
    assert checked > 1000
