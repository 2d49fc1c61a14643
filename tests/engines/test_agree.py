"""Detection agreement of the start-up check: NMS decisions taken on rounding are not disagreements, a cascade
rooted in one is not either, and genuinely different boxes never excuse each other."""

from __future__ import annotations

import numpy as np

from streamd.checks.compare import agree
from streamd.types import Detections


def dets(boxes: list[list[float]], scores: list[float], classes: list[int] | None = None) -> Detections:
    n = len(scores)
    return Detections(
        np.asarray(boxes, np.float32).reshape(n, 4),
        np.asarray(scores, np.float32),
        np.asarray(classes or [0] * n, np.int32),
    )


A = [0, 0, 100, 100]
B = [0, 0, 100, 80]
C = [0, 30.27, 100, 110.27]  # IoU(B, C) ≈ 0.451: one side keeps C, the other suppresses it (NMS at 0.45)


def iou(a: list[float], b: list[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / area


def test_a_decision_on_the_nms_edge_is_not_a_disagreement() -> None:
    assert abs(iou(B, C) - 0.45) < 0.02
    ref = dets([B, C], [0.9, 0.8])  # kept C (IoU just under 0.45 here)
    got = dets([B], [0.9])  # suppressed it (just over)
    assert agree(ref, got, 0.3, 0.95)[:2] == (2, 1)  # without knowing the NMS threshold: a miss
    assert agree(ref, got, 0.3, 0.95, nms_iou=0.45)[:4] == (2, 2, 1, 1)


def test_a_cascade_rooted_at_the_edge_is_not_either() -> None:
    """ref: B suppresses C (edge), so D (IoU 0.82 with C, 0.36 with B) survives; got: C kept, D gone."""
    d = [0, 38, 100, 118]
    assert iou(C, d) > 0.5 and iou(B, d) < 0.45
    ref = dets([B, d], [0.9, 0.7])
    got = dets([B, C], [0.9, 0.8])
    n_ref, hit_ref, n_got, hit_got, _ = agree(ref, got, 0.3, 0.95, nms_iou=0.45)
    assert (n_ref, hit_ref, n_got, hit_got) == (2, 2, 2, 2)


def test_different_boxes_never_excuse_each_other() -> None:
    """Shifted boxes (a wrong conversion): each side's box overlaps the other's far from the NMS edge."""
    ref = dets([A], [0.9])
    got = dets([[20, 0, 120, 100]], [0.9])  # IoU 0.67
    assert agree(ref, got, 0.3, 0.95, nms_iou=0.45)[:4] == (1, 0, 1, 0)


def test_two_wrong_boxes_on_the_edge_do_not_excuse_each_other() -> None:
    """A box shifted so its IoU with the reference's lands on the NMS threshold (review finding): still a miss
    both ways — the excusing box must be one both sides kept."""
    ref = dets([[0, 0, 100, 100]], [0.8])
    got = dets([[38, 0, 138, 100]], [0.8])  # IoU 0.449
    assert agree(ref, got, 0.3, 0.95, nms_iou=0.45)[:4] == (1, 0, 1, 0)
