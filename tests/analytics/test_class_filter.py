"""Class filter and per-class thresholds in the CPU postprocess (before top-K and NMS)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamd.stages.postprocess.cpu import ClassThresholds, CpuPostprocessor, PostprocessSpec
from tests.gpu.reference import synthetic_output


def yolov8(boxes: list[tuple[float, float, float, float]], scores: list[list[float]]) -> np.ndarray:
    """One frame [1, 4 + C, N] from (cx, cy, w, h) boxes and per-candidate class scores."""
    b = np.asarray(boxes, np.float32).T
    s = np.asarray(scores, np.float32).T
    return np.concatenate([b, s], 0)[None]


def test_filtered_classes_do_not_spend_max_detections():
    # 6 strong cars (class 1) far apart, 3 weaker persons (class 0); max_detections 4.
    boxes = [(50 + 60 * k, 50, 20, 20) for k in range(6)] + [(50 + 60 * k, 300, 20, 40) for k in range(3)]
    scores = [[0.0, 0.9]] * 6 + [[0.6, 0.0]] * 3
    raw = yolov8(boxes, scores)
    plain = CpuPostprocessor(PostprocessSpec("yolov8", 2, 0.3, 0.5, 4, 100))(raw)[0]
    assert plain.class_id.tolist() == [1, 1, 1, 1]  # the persons were cut by max_detections
    table = ClassThresholds([0.3, math.inf])  # person only
    spec = PostprocessSpec("yolov8", 2, 0.3, 0.5, 4, 100, thresholds=table)
    det = CpuPostprocessor(spec)(raw, ["cam"])[0]
    assert det.class_id.tolist() == [0, 0, 0] and np.allclose(det.score, 0.6)


def test_best_class_filtered_is_dropped_not_relabelled():
    raw = yolov8([(100, 100, 30, 30)], [[0.5, 0.8]])  # best class 1 (filtered), person 0.5 above threshold
    spec = PostprocessSpec("yolov8", 2, 0.3, 0.5, 10, 100, thresholds=ClassThresholds([0.3, math.inf]))
    assert len(CpuPostprocessor(spec)(raw, ["cam"])[0]) == 0


def test_per_stream_rows_and_per_class_thresholds():
    raw = np.concatenate([yolov8([(100, 100, 30, 30), (300, 100, 30, 30)], [[0.45, 0.0], [0.0, 0.45]])] * 3)
    table = ClassThresholds([0.5, 0.3], {"persons": [0.4, math.inf], "cars": [math.inf, 0.3]})
    spec = PostprocessSpec("yolov8", 2, 0.3, 0.5, 10, 100, thresholds=table)
    a, b, c = CpuPostprocessor(spec)(raw, ["other", "persons", "cars"])
    assert a.class_id.tolist() == [1]  # person 0.45 < its class threshold 0.5
    assert b.class_id.tolist() == [0]
    assert c.class_id.tolist() == [1]
    with pytest.raises(ValueError, match="stream id of every frame"):
        CpuPostprocessor(spec)(raw)


@pytest.mark.parametrize("layout", ["yolov8", "yolov5", "end2end"])
def test_filter_equals_unfiltered_restricted_to_the_class(layout: str):
    """With top_k and max_detections large enough to cut nothing, filtering to a class set gives exactly the
    unfiltered detections of those classes (class-aware NMS never lets other classes interact)."""
    rng = np.random.default_rng(7)
    raw = synthetic_output(rng, layout, 4, 2000, 6, positive=0.2)
    keep = [0, 3]
    row = [0.25 if c in keep else math.inf for c in range(6)]
    base = PostprocessSpec(layout, 6, 0.25, 0.5, 10000, 100000)
    plain = CpuPostprocessor(base)(raw)
    spec = PostprocessSpec(layout, 6, 0.25, 0.5, 10000, 100000, thresholds=ClassThresholds(row))
    got = CpuPostprocessor(spec)(raw, ["s"] * 4)
    for p, g in zip(plain, got, strict=True):
        mask = np.isin(p.class_id, keep)
        assert len(g) > 0 and set(g.class_id.tolist()) <= set(keep)
        assert np.array_equal(g.xyxy, p.xyxy[mask]) and np.array_equal(g.score, p.score[mask])


def test_thresholds_from_config(tmp_path):
    from streamd.config import parse_config

    (tmp_path / "v.mp4").write_bytes(b"\0")
    data = {
        "streams": [{"id": "a", "url": "v.mp4"}, {"id": "b", "url": "v.mp4", "classes": ["car"]}],
        "model": {"classes": ["person"], "class_thresholds": {"person": 0.6}},
    }
    table = ClassThresholds.from_config(parse_config(data, tmp_path))
    assert table is not None
    rows = table.rows(["a", "b", "zzz"])
    assert rows.shape == (3, 80) and rows.dtype == np.float32
    assert rows[0, 0] == np.float32(0.6) and np.isinf(rows[0, 1:]).all()
    assert rows[1, 2] == np.float32(0.25) and np.isinf(rows[1, 0])
    assert np.array_equal(rows[2], rows[0])
    plain = {"streams": [{"id": "a", "url": "v.mp4"}]}
    assert not ClassThresholds.from_config(parse_config(plain, tmp_path)).active


def test_a_streams_row_changes_while_batches_run():
    """``set_stream`` (a reload, the API or a cluster changed a stream's classes): later lookups use the new
    row, None goes back to the default, and a table whose rows all equal the plain threshold is not active."""
    table = ClassThresholds([0.3, 0.3], plain=0.3)
    assert not table.active
    table.set_stream("a", [0.3, math.inf])  # person only
    assert table.active
    assert table.rows(["a", "b"]).tolist() == [[np.float32(0.3), math.inf], [np.float32(0.3)] * 2]
    frame = yolov8([(50, 50, 20, 20), (300, 300, 20, 40)], [[0.0, 0.9], [0.6, 0.0]])  # a car, a person
    raw = np.concatenate([frame, frame])
    spec = PostprocessSpec("yolov8", 2, 0.3, 0.5, 10, 100, thresholds=table)
    got = CpuPostprocessor(spec)(raw, ["a", "b"])
    assert set(got[0].class_id.tolist()) == {0} and set(got[1].class_id.tolist()) == {0, 1}
    table.set_stream("a", None)
    assert not table.active and table.rows(["a"]).tolist() == [[np.float32(0.3)] * 2]
    with pytest.raises(ValueError, match="row"):
        table.set_stream("a", [0.3])


def test_rows_set_from_several_threads_are_all_kept():
    """The shared engine process sets rows from one serve thread per worker, all at start-up: none may undo
    another (each copies the mapping; without taking turns two copies lose one row)."""
    import sys
    import threading

    table = ClassThresholds([0.3, 0.3], plain=0.3)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [
            threading.Thread(
                target=lambda k=k: [table.set_stream(f"w{k}-s{i}", [0.3, math.inf]) for i in range(300)]
            )
            for k in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(table.per_stream) == 8 * 300
