"""Comparing an engine's outputs with ONNX Runtime CPU's: tolerances by precision, per-output error, and
detection-level agreement after the configured decode + NMS (the measures of ``streamd.checks.verify``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamd.engines.base import OutputPart


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
    # bfloat16 keeps 8 mantissa bits to FP16's 11: about 8x the rounding error per op, hence looser figures
    "bf16": Tolerance(mean_rel=2e-2, max_rel=2e-1, iou=0.85, match=0.90),
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
    iou = np.divide(inter, union, out=np.zeros_like(inter, dtype=np.float64), where=union > 0)
    # Empty boxes (x2 <= x1: random-weight exports write them) have no IoU; the same empty box in both
    # outputs is still the same detection: 1 within a 1e-4 of the boxes' scale per coordinate.
    empty = union <= 0
    if empty.any():
        scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)), 1.0)
        same = (np.abs(a[:, None, :] - b[None, :, :]) <= 1e-4 * scale).all(axis=2)
        iou = np.where(empty & same, 1.0, iou)
    return iou


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


NMS_EDGE = 0.02  # IoU this close to the NMS threshold: keeping or suppressing is a rounding decision


def agree(
    ref: Any, got: Any, threshold: float, iou_min: float, nms_iou: float | None = None
) -> tuple[int, int, int, int, list[float]]:
    """Both ways: (reference detections above ``threshold``, how many ``got`` matches, the same for ``got``,
    the IoUs of the reference's matches).

    ``nms_iou`` (the NMS threshold both ran): a detection one side lacks is not a disagreement when NMS
    decided it on rounding — the other side kept a box of its class, scoring at least as high, that overlaps
    it by an IoU within ``NMS_EDGE`` of the threshold — or when the box that suppressed it is itself such a
    decision (a cascade, rooted at the edge; never two unexplained boxes excusing each other)."""
    a, b = (np.asarray(d.score) > threshold for d in (ref, got))
    if nms_iou is None or not (a.any() or b.any()):
        n_ref, hit_ref, ious = match_detections(ref, got, threshold, iou_min)
        n_got, hit_got, _ = match_detections(got, ref, threshold, iou_min)
        return n_ref, hit_ref, n_got, hit_got, ious
    same = ref.class_id[:, None] == got.class_id[None]
    iou = np.where(same, _iou(ref.xyxy.astype(np.float64), got.xyxy.astype(np.float64)), 0.0)
    ok_ref = iou.max(axis=1, initial=0.0) >= iou_min  # every box of each side, for the cascade
    ok_got = iou.max(axis=0, initial=0.0) >= iou_min
    # x[i, j]: j (other side) scores at least as high as i and could have suppressed it
    sup_ref = (got.score[None] >= ref.score[:, None] - 1e-3) & same & (iou > nms_iou - NMS_EDGE)
    sup_got = (ref.score[:, None] >= got.score[None] - 1e-3) & same & (iou > nms_iou - NMS_EDGE)
    edge = np.abs(iou - nms_iou) <= NMS_EDGE
    # the box that suppressed it is kept by both sides (it has its own twin): never an unexplained box
    fine_ref = ok_ref | (sup_ref & edge & ok_got[None]).any(axis=1)
    fine_got = ok_got | (sup_got & edge & ok_ref[:, None]).any(axis=0)
    for _ in range(len(ref.score) + len(got.score)):  # cascades: suppressed by an excused flip
        more_ref = fine_ref | (sup_ref & (~ok_got & fine_got)[None]).any(axis=1)
        more_got = fine_got | (sup_got & (~ok_ref & fine_ref)[:, None]).any(axis=0)
        if (more_ref == fine_ref).all() and (more_got == fine_got).all():
            break
        fine_ref, fine_got = more_ref, more_got
    ious = [float(v) for v in iou.max(axis=1, initial=0.0)[a & ok_ref]]
    return int(a.sum()), int((a & fine_ref).sum()), int(b.sum()), int((b & fine_got).sum()), ious


def _row_order(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """For each of ``ref``'s rows, best first, the index of the unused row of ``got`` closest to it (L1)."""
    dist = np.abs(ref[:, None, :] - got[None, :, :]).sum(axis=2)
    dist = np.nan_to_num(dist, nan=np.inf)
    free = np.ones(len(got), bool)
    order = np.empty(len(ref), np.int64)
    for i in range(len(ref)):
        j = int(np.argmin(np.where(free, dist[i], np.inf)))
        order[i], free[j] = j, False
    return order


def _align_rows(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """``got``'s rows (K, 6) reordered so each of ``ref``'s rows gets its closest twin (``_row_order``), for
    end2end outputs whose row order depends on near-tied scores."""
    return got[_row_order(ref, got)]


def _align_parts(head: Any, parts: Sequence[OutputPart], ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Packed rows [B, R] of a several-output model that picks its own rows (a classes output: TF's top-100
    after NMS): ``got`` with each per-candidate output reordered like its decoded rows (box, score, class)
    closest to the reference's, so near-tied rows that swapped places compare with their twins."""
    from streamd.stages.postprocess.read import decode_rows

    out = got.copy()
    (rb, rs, rc, _), (gb, gs, gc, _) = (decode_rows(head, x.astype(np.float32)) for x in (ref, got))
    for b in range(len(ref)):
        order = _row_order(np.c_[rb[b], rs[b], rc[b]], np.c_[gb[b], gs[b], gc[b]])
        for p in parts:
            if p.shape and p.shape[0] == head.candidates:
                block = got[b, p.offset : p.offset + p.size].reshape(p.shape[0], -1)
                out[b, p.offset : p.offset + p.size] = block[order].ravel()
    return out


def _errors(
    ref: np.ndarray, got: np.ndarray, tol: Tolerance, rows: np.ndarray | None
) -> tuple[float, float, float]:
    """(max abs, mean abs, scale) of one output; ``rows``: where the max is taken (end2end: rows above the
    threshold), None = everywhere."""
    diff = np.abs(ref - got)
    diff = np.where(np.isnan(diff) & ~(np.isnan(ref) & np.isnan(got)), np.inf, np.nan_to_num(diff, nan=0.0))
    scale = max(float(np.nanmax(np.abs(np.nan_to_num(ref, posinf=0, neginf=0)), initial=0.0)), 1e-6)
    max_abs = float(diff.max(initial=0.0)) if rows is None else float(diff[rows].max(initial=0.0))
    return max_abs, float(diff.mean()) if diff.size else 0.0, scale


def compare(
    reference: np.ndarray,
    output: np.ndarray,
    *,
    precision: str,
    output_name: str = "output",
    postprocess: Any = None,
    parts: Sequence[OutputPart] = (),
    tolerance: Tolerance | None = None,
) -> tuple[list[OutputError], dict[str, Any]]:
    """Compare an engine's output batch with the reference's; returns (per-output errors, detection
    agreement dict with ``ref``, ``got``, ``matched``, ``worst_iou``) and sets ``passed`` on each.

    ``parts``: a packed several-output model's outputs (each compared on its own, by name);
    ``postprocess``: a ``PostprocessSpec`` (its ``head``, or its layout resolved from the output's shape);
    ``tolerance`` replaces the precision's (``TOLERANCES``)."""
    from streamd.stages.postprocess.cpu import CpuPostprocessor, head_for
    from streamd.stages.postprocess.read import decode_rows

    tol = tolerance or TOLERANCES.get(precision, TOLERANCES["fp32"])
    ref = reference.astype(np.float64)
    got = output.astype(np.float64)
    if ref.shape != got.shape:
        err = OutputError(output_name, float("inf"), float("inf"), 0.0, False)
        return [err], {"ref": 0, "got": 0, "matched": 0.0, "worst_iou": 0.0, "layout": None}
    spec, head = postprocess, None
    if spec is not None:
        try:
            head = head_for(spec, tuple(output.shape))
        except ValueError:
            spec = None
    # Rows of (box, score, class) picked by a top-K in the model (end2end; Ultralytics RT-DETR's [B, 300, 6])
    # may swap on near-tied scores: compare each row with its closest twin.
    end2end = (
        head is not None
        and head.classes is not None
        and head.box[1:] == (6, 1)
        and len(parts) <= 1
        and ref.ndim == 3
        and ref.shape[-1] == 6
    )
    if end2end:
        got = np.stack([_align_rows(r, g) for r, g in zip(ref, got, strict=True)])
    errors = []
    # A set of rows the model picked itself (DETR's queries, TF's top-100): twins may swap places, and a row
    # at the selection's edge may be in one output only. Rows are paired by their decoded (box, score,
    # class), and the max error is taken over the rows whose reference score passes the threshold.
    picked = head is not None and spec is not None and not end2end and (head.layout == "detr" or head.classes)
    if len(parts) > 1 or picked:
        pieces = parts if len(parts) > 1 else (OutputPart(output_name, tuple(ref.shape[1:])),)
        flat_ref, flat_got = ref.reshape(len(ref), -1), got.reshape(len(got), -1)
        mask = None
        if picked and head is not None and spec is not None:
            flat_got = _align_parts(head, pieces, flat_ref, flat_got)
            _, score, _, valid = decode_rows(head, flat_ref.astype(np.float32))
            mask = valid & (score > spec.score_threshold)
        for p in pieces:
            span = slice(p.offset, p.offset + p.size)
            r, g = flat_ref[:, span], flat_got[:, span]
            rows = None
            if mask is not None and head is not None and p.shape and p.shape[0] == head.candidates:
                r, g = r.reshape(len(r), p.shape[0], -1), g.reshape(len(g), p.shape[0], -1)
                rows = mask
            max_abs, mean_abs, scale = _errors(r, g, tol, rows)
            ok = mean_abs <= tol.mean_rel * scale and max_abs <= tol.max_rel * scale
            errors.append(OutputError(p.name, max_abs, mean_abs, scale, ok))
    else:
        rows = ref[..., 4] > spec.score_threshold if end2end and spec is not None else None
        max_abs, mean_abs, scale = _errors(ref, got, tol, rows)
        ok = mean_abs <= tol.mean_rel * scale and max_abs <= tol.max_rel * scale
        errors.append(OutputError(output_name, max_abs, mean_abs, scale, ok))
    layout = head.layout if head is not None else None
    agreement: dict[str, Any] = {"ref": 0, "got": 0, "matched": 1.0, "worst_iou": 1.0, "layout": layout}
    if spec is not None and head is not None:
        post = CpuPostprocessor(dataclasses.replace(spec, layout=head.layout, head=head, thresholds=None))
        cut = spec.score_threshold + tol.margin
        n_ref = n_got = hit_ref = hit_got = 0
        ious: list[float] = []
        nms_iou = spec.iou_threshold if head.nms else None
        for rd, gd in zip(post(reference.astype(np.float32)), post(output.astype(np.float32)), strict=True):
            a, b, c, d, i = agree(rd, gd, cut, tol.iou, nms_iou)
            n_ref, hit_ref, n_got, hit_got = n_ref + a, hit_ref + b, n_got + c, hit_got + d
            ious += i
        rate = min(hit_ref / n_ref if n_ref else 1.0, hit_got / n_got if n_got else 1.0)
        agreement.update(ref=n_ref, got=n_got, matched=rate, worst_iou=min(ious, default=1.0))
    return errors, agreement
