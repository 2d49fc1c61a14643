"""Comparing an engine's outputs with ONNX Runtime CPU's: tolerances by precision, per-output error, and
detection-level agreement after the configured decode + NMS (the measures of ``streamd.checks.verify``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    mean_rel: float  # mean |engine - reference| / max|reference|, per output
    max_rel: float  # max |engine - reference| / max|reference|, per output (not for end2end)
    iou: float  # a reference detection is matched by one of the same class at IoU >= this
    match: float  # fraction of detections (above threshold + margin) matched, both ways
    margin: float = 0.05  # detections within this of the score threshold are not counted


TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(mean_rel=1e-3, max_rel=2e-2, iou=0.95, match=0.99),
    "fp16": Tolerance(mean_rel=5e-3, max_rel=1e-1, iou=0.90, match=0.95),
    "int8": Tolerance(mean_rel=2e-2, max_rel=3e-1, iou=0.80, match=0.90),
}


@dataclass
class OutputError:
    name: str
    max_abs: float
    mean_abs: float
    scale: float
    passed: bool


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of boxes a (n, 4) and b (m, 4), xyxy."""
    iw = np.maximum(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0)
    ih = np.maximum(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0)
    inter = iw * ih
    area_a = np.maximum(a[:, 2] - a[:, 0], 0) * np.maximum(a[:, 3] - a[:, 1], 0)
    area_b = np.maximum(b[:, 2] - b[:, 0], 0) * np.maximum(b[:, 3] - b[:, 1], 0)
    union = area_a[:, None] + area_b[None] - inter
    return np.divide(inter, union, out=np.zeros_like(inter, dtype=np.float64), where=union > 0)


def match_detections(ref: Any, got: Any, threshold: float, iou_min: float) -> tuple[int, int, list[float]]:
    """Reference detections scoring above ``threshold``: (how many, how many matched in ``got`` by the same
    class at IoU ≥ ``iou_min``, the IoUs of the matches). ``ref``/``got`` are ``Detections``."""
    keep = ref.score > threshold
    boxes, classes = ref.xyxy[keep], ref.class_id[keep]
    if not len(boxes):
        return 0, 0, []
    if not len(got.score):
        return len(boxes), 0, []
    iou = _iou(boxes.astype(np.float64), got.xyxy.astype(np.float64))
    iou = np.where(classes[:, None] == got.class_id[None], iou, 0.0)
    best = iou.max(axis=1)
    ok = best >= iou_min
    return len(boxes), int(ok.sum()), [float(v) for v in best[ok]]


def _align_rows(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """``got``'s rows (K, 6) reordered so each of ``ref``'s rows, best first, gets the unused row closest to
    it (L1), for end2end outputs whose row order depends on near-tied scores."""
    dist = np.abs(ref[:, None, :] - got[None, :, :]).sum(axis=2)
    dist = np.nan_to_num(dist, nan=np.inf)
    free = np.ones(len(got), bool)
    order = np.empty(len(ref), np.int64)
    for i in range(len(ref)):
        j = int(np.argmin(np.where(free, dist[i], np.inf)))
        order[i], free[j] = j, False
    return got[order]


def compare(
    reference: np.ndarray,
    output: np.ndarray,
    *,
    precision: str,
    output_name: str = "output",
    postprocess: Any = None,
) -> tuple[list[OutputError], dict[str, Any]]:
    """Compare an engine's output batch with the reference's; returns (per-output errors, detection
    agreement dict with ``ref``, ``got``, ``matched``, ``worst_iou``) and sets ``passed`` on each."""
    from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec, resolve_layout

    tol = TOLERANCES.get(precision, TOLERANCES["fp32"])
    ref = reference.astype(np.float64)
    got = output.astype(np.float64)
    if ref.shape != got.shape:
        err = OutputError(output_name, float("inf"), float("inf"), 0.0, False)
        return [err], {"ref": 0, "got": 0, "matched": 0.0, "worst_iou": 0.0, "layout": None}
    layout = None
    spec = postprocess
    if spec is not None:
        try:
            layout = resolve_layout(spec.layout, tuple(output.shape), spec.num_classes)
        except ValueError:
            spec, layout = None, None
    if layout == "end2end":  # rows may swap on near-tied scores: compare each row with its closest twin
        got = np.stack([_align_rows(r, g) for r, g in zip(ref, got, strict=True)])
    diff = np.abs(ref - got)
    diff = np.where(np.isnan(diff) & ~(np.isnan(ref) & np.isnan(got)), np.inf, np.nan_to_num(diff, nan=0.0))
    scale = max(float(np.nanmax(np.abs(np.nan_to_num(ref, posinf=0, neginf=0)))), 1e-6)
    max_abs, mean_abs = float(diff.max()), float(diff.mean())
    if layout == "end2end" and spec is not None:  # max over the rows that can become detections
        rows = ref[..., 4] > spec.score_threshold
        max_abs = float(diff[rows].max()) if rows.any() else 0.0
    passed = mean_abs <= tol.mean_rel * scale and max_abs <= tol.max_rel * scale
    errors = [OutputError(output_name, max_abs, mean_abs, scale, passed)]
    agreement: dict[str, Any] = {"ref": 0, "got": 0, "matched": 1.0, "worst_iou": 1.0, "layout": layout}
    if spec is not None and layout is not None:
        spec = PostprocessSpec(
            layout,
            spec.num_classes,
            spec.score_threshold,
            spec.iou_threshold,
            spec.max_detections,
            spec.top_k,
        )
        post = CpuPostprocessor(spec)
        cut = spec.score_threshold + tol.margin
        n_ref = n_got = hit_ref = hit_got = 0
        ious: list[float] = []
        for r, g in zip(post(reference.astype(np.float32)), post(output.astype(np.float32)), strict=True):
            a, b, i = match_detections(r, g, cut, tol.iou)
            c, d, _ = match_detections(g, r, cut, tol.iou)
            n_ref, hit_ref, n_got, hit_got = n_ref + a, hit_ref + b, n_got + c, hit_got + d
            ious += i
        rate = min(hit_ref / n_ref if n_ref else 1.0, hit_got / n_got if n_got else 1.0)
        agreement.update(ref=n_ref, got=n_got, matched=rate, worst_iou=min(ious, default=1.0))
    return errors, agreement


# ------------------------------------------------------------------------------------------------------------
# The check
