"""CPU postprocess: the three layouts agree, and NMS equals OpenCV's independent NMSBoxesBatched."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec, nms
from streamd.stages.postprocess.resolve import resolve_layout

C = 80


def random_yolov8(rng: np.random.Generator, n: int = 600) -> np.ndarray:
    """[4 + C, n]: clustered boxes (so NMS has work), random class scores in (0, 0.9)."""
    centres = rng.uniform(40, 376, (12, 2))
    pick = centres[rng.integers(0, 12, n)] + rng.normal(0, 6, (n, 2))
    wh = rng.uniform(20, 120, (n, 2))
    scores = rng.uniform(0, 0.9, (C, n)) ** 3  # mostly low, some high
    return np.concatenate([pick.T, wh.T, scores]).astype(np.float32)


def test_layouts_are_detected_from_shape() -> None:
    assert resolve_layout("auto", (1, 84, 3549), C) == "yolov8"
    assert resolve_layout("auto", (1, 25200, 85), C) == "yolov5"
    assert resolve_layout("auto", (1, 100, 6), C) == "end2end"
    with pytest.raises(ValueError, match="fits no known layout"):
        resolve_layout("auto", (1, 10, 10), C)
    with pytest.raises(ValueError, match="does not match"):
        resolve_layout("yolov5", (1, 84, 3549), C)


@pytest.mark.parametrize("seed", range(5))
def test_nms_equals_opencv(seed: int) -> None:
    rng = np.random.default_rng(seed)
    out = random_yolov8(rng)
    spec = PostprocessSpec(
        "yolov8", C, score_threshold=0.3, iou_threshold=0.5, max_detections=1000, top_k=100000
    )
    (det,) = CpuPostprocessor(spec)(out[None])
    cls = out[4:].argmax(0)
    score = out[4:].max(0)
    keep = score > 0.3
    rects = np.stack([out[0] - out[2] / 2, out[1] - out[3] / 2, out[2], out[3]], 1)[keep]
    ref = cv2.dnn.NMSBoxesBatched(rects.tolist(), score[keep].tolist(), cls[keep].tolist(), 0.3, 0.5)
    ref = np.asarray(ref, int).reshape(-1)
    assert len(ref) > 10 and len(det) == len(ref)
    ref_boxes = np.concatenate([rects[ref, :2], rects[ref, :2] + rects[ref, 2:]], 1)
    order = np.argsort(-score[keep][ref], kind="stable")
    np.testing.assert_allclose(det.xyxy, ref_boxes[order], atol=1e-3)
    np.testing.assert_array_equal(det.class_id, cls[keep][ref][order])


def test_three_layouts_agree() -> None:
    rng = np.random.default_rng(7)
    v8 = random_yolov8(rng)
    spec = dict(score_threshold=0.3, iou_threshold=0.5, max_detections=50)
    (a,) = CpuPostprocessor(PostprocessSpec("yolov8", C, **spec))(v8[None])
    # yolov5: same boxes, objectness 1, same class scores, [N, 5 + C]
    v5 = np.concatenate([v8[:4], np.ones((1, v8.shape[1]), np.float32), v8[4:]]).T
    (b,) = CpuPostprocessor(PostprocessSpec("yolov5", C, **spec))(v5[None])
    # end2end: the yolov8 result written as [K, 6] with padding rows of score 0
    e2e = np.zeros((100, 6), np.float32)
    e2e[: len(a), :4], e2e[: len(a), 4], e2e[: len(a), 5] = a.xyxy, a.score, a.class_id
    (c,) = CpuPostprocessor(PostprocessSpec("end2end", C, **spec))(e2e[None])
    assert len(a) > 5
    for other in (b, c):
        np.testing.assert_allclose(other.xyxy, a.xyxy, atol=1e-4)
        np.testing.assert_array_equal(other.class_id, a.class_id)
        np.testing.assert_allclose(other.score, a.score, atol=1e-6)


def test_zero_detections_and_max_det_overflow() -> None:
    rng = np.random.default_rng(3)
    v8 = random_yolov8(rng)
    (none,) = CpuPostprocessor(PostprocessSpec("yolov8", C, score_threshold=0.99))(v8[None])
    assert len(none) == 0 and none.xyxy.shape == (0, 4)
    (few,) = CpuPostprocessor(PostprocessSpec("yolov8", C, score_threshold=0.01, max_detections=7))(v8[None])
    assert len(few) == 7 and np.all(np.diff(few.score) <= 0)


def test_nms_is_class_aware() -> None:
    box = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [1, 1, 10, 10]], np.float32)
    kept = nms(box, np.array([0.9, 0.8, 0.7], np.float32), np.array([0, 1, 0], np.int32), 0.5, 100)
    assert kept.tolist() == [0, 1]
