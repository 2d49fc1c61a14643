"""Postprocess: raw engine output -> per-frame detections (CPU twin of kernels/postprocess.cu).

Where the model's outputs hold boxes, scores and classes is a ``Head`` (``head.py``; resolved from the outputs
by ``resolve.py``): yolov8 [B, 4 + C, N], yolov5 [B, N, 5 + C], end2end [B, K, 6] (NMS done in the model),
detr [B, N, 4 + C] or boxes + logits, yolox raw [B, N, 5 + C] on a grid, or a mapping of several outputs
(boxes, scores, classes, count). ``read.decode_rows`` gives every candidate's box, best score and
class; for each frame then: score threshold, keep the ``top_k`` best, class-aware greedy NMS
by IoU, keep ``max_detections``. With ``PostprocessSpec.thresholds`` (model.classes, streams[].classes,
model.class_thresholds) the threshold is looked up per frame (by its stream) and per best class, +inf for a
filtered class, *before* top-K and NMS: filtered classes never use up ``top_k`` or ``max_detections``, and a
candidate whose best class is filtered is dropped, never relabelled with its second-best class.
Ties in score keep the lower candidate index first (stable sort), which the CUDA kernel matches.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamd.stages.postprocess.head import LAYOUTS, Head, HeadSettings, OutputPart
from streamd.stages.postprocess.read import decode_rows
from streamd.stages.postprocess.resolve import resolve_head
from streamd.types import Detections

__all__ = [
    "LAYOUTS",
    "ClassThresholds",
    "CpuPostprocessor",
    "PostprocessSpec",
    "head_for",
    "nms",
    "select",
    "set_stream_classes",
]


class ClassThresholds:
    """Score threshold per stream and class: rows of C float32, ``+inf`` where a class is filtered out.

    ``rows(stream_ids)`` gives the [B, C] array of one batch (one row per frame, by the frame's stream);
    a stream without its own row uses ``default``. ``set_stream`` changes one stream's row while batches run
    (a reload, the control API or a cluster changed its ``classes``): the frames postprocessed after it use
    the new row. ``plain``: the model's single score threshold; while every row equals it the table is not
    ``active`` and the postprocessors take their scalar path.
    """

    def __init__(
        self,
        default: Sequence[float],
        per_stream: Mapping[str, Sequence[float]] | None = None,
        plain: float | None = None,
    ) -> None:
        self.default = np.asarray(default, np.float32)
        if self.default.ndim != 1 or len(self.default) == 0:
            raise ValueError(
                f"ClassThresholds: expected a row of C thresholds, got shape {self.default.shape}"
            )
        self._plain_default = plain is not None and bool(np.all(self.default == np.float32(plain)))
        self._edit = threading.Lock()  # writers: the shared engine process runs one serve thread per worker
        self.per_stream: dict[str, np.ndarray] = {}
        for sid, row in (per_stream or {}).items():
            self.per_stream[sid] = self._row(sid, row)

    def _row(self, sid: str, row: Sequence[float]) -> np.ndarray:
        out = np.asarray(row, np.float32)
        if out.shape != self.default.shape:
            raise ValueError(
                f"ClassThresholds: stream {sid!r} row {out.shape}, expected {self.default.shape}"
            )
        return out

    @property
    def num_classes(self) -> int:
        return len(self.default)

    @property
    def active(self) -> bool:
        """Whether a frame's row may differ from the plain score threshold (else no per-frame table)."""
        return bool(self.per_stream) or not self._plain_default

    def set_stream(self, stream_id: str, row: Sequence[float] | None) -> None:
        """Stream ``stream_id``'s row from now on; None: the default row. Replaces the mapping whole, so a
        batch being looked up meanwhile sees the old rows or the new ones, never a mix in one mapping; writers
        take turns (two copies made at once would each lose the other's row)."""
        new = None if row is None else self._row(stream_id, row)
        with self._edit:
            table = dict(self.per_stream)
            if new is None:
                table.pop(stream_id, None)
            else:
                table[stream_id] = new
            self.per_stream = table

    @classmethod
    def from_config(cls, config: Any) -> ClassThresholds:
        """From a ``streamd.config.Config`` (model.classes, model.class_thresholds, streams[].classes); not
        ``active`` when none is configured (the plain ``score_threshold`` applies, no per-frame table)."""
        model = config.model
        per_stream = {s.id: model.thresholds(s.classes) for s in config.streams if s.classes is not None}
        return cls(model.thresholds(), per_stream, plain=model.score_threshold)

    def rows(self, stream_ids: Sequence[str], out: np.ndarray | None = None) -> np.ndarray:
        """[len(stream_ids), C] float32 (written into ``out`` when given)."""
        table = np.empty((len(stream_ids), self.num_classes), np.float32) if out is None else out
        per_stream = self.per_stream  # one mapping for the whole batch
        for i, sid in enumerate(stream_ids):
            table[i] = per_stream.get(sid, self.default)
        return table


def set_stream_classes(spec: PostprocessSpec, stream_id: str, row: Sequence[float] | None) -> None:
    """``Stages.set_classes`` of the stages that run this spec's postprocess."""
    if spec.thresholds is not None:
        spec.thresholds.set_stream(stream_id, row)
    elif row is not None:
        raise ValueError("postprocess built without a class table: per-stream classes cannot be set")


@dataclass(frozen=True, slots=True)
class PostprocessSpec:
    layout: str  # one of LAYOUTS (or auto, with ``head`` None: resolved from the output's shape)
    num_classes: int
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100
    top_k: int = 1000
    thresholds: ClassThresholds | None = None  # per-stream, per-class thresholds (class filter); None = off
    head: Head | None = None  # where the model's outputs hold what; None: a one-output model in ``layout``


def head_for(spec: PostprocessSpec, shape: tuple[int, ...]) -> Head:
    """``spec.head``, or the head of a one-output model in ``spec.layout`` with output ``shape`` [B, ...]."""
    if spec.head is not None:
        return spec.head
    settings = HeadSettings(spec.layout, spec.num_classes)
    return resolve_head(settings, [OutputPart("output", tuple(int(d) for d in shape[1:]))])


def select(
    xyxy: np.ndarray,
    score: np.ndarray,
    cls: np.ndarray,
    valid: np.ndarray,
    spec: PostprocessSpec,
    thresholds: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One frame's decoded candidates -> (xyxy (n, 4), score (n,), class_id (n,)) above threshold, best first.

    ``thresholds``: this frame's row of C per-class thresholds (None: ``spec.score_threshold`` for all); a
    class id outside 0..C-1 (models that give the class) gets ``spec.score_threshold``."""
    if thresholds is None:
        keep = np.flatnonzero(valid & (score > np.float32(spec.score_threshold)))
    else:
        ok = (cls >= 0) & (cls < len(thresholds))
        limit = np.where(ok, thresholds[np.where(ok, cls, 0)], np.float32(spec.score_threshold))
        keep = np.flatnonzero(valid & (score > limit))
    order = keep[np.argsort(-score[keep], kind="stable")][: spec.top_k]
    return xyxy[order].astype(np.float32), score[order].astype(np.float32), cls[order].astype(np.int32)


def nms(
    xyxy: np.ndarray, score: np.ndarray, class_id: np.ndarray, iou_threshold: float, limit: int
) -> np.ndarray:
    """Class-aware greedy NMS over boxes sorted by descending score; returns kept indices (≤ limit).

    The IoU matrix is computed once in numpy; the greedy pass is a loop over kept boxes only.
    """
    n = len(score)
    if n == 0:
        return np.zeros(0, np.int64)
    x1, y1, x2, y2 = xyxy.T
    area = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    iw = np.maximum(np.minimum(x2[:, None], x2[None]) - np.maximum(x1[:, None], x1[None]), 0)
    ih = np.maximum(np.minimum(y2[:, None], y2[None]) - np.maximum(y1[:, None], y1[None]), 0)
    inter = iw * ih
    union = area[:, None] + area[None] - inter
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    suppress = (iou > iou_threshold) & (class_id[:, None] == class_id[None])
    alive = np.ones(n, bool)
    kept: list[int] = []
    for i in range(n):
        if not alive[i]:
            continue
        kept.append(i)
        if len(kept) == limit:
            break
        alive &= ~suppress[i]
    return np.asarray(kept, np.int64)


class CpuPostprocessor:
    """Batched engine output -> list of per-frame ``Detections`` in model-input pixels."""

    def __init__(self, spec: PostprocessSpec) -> None:
        self.spec = spec
        self._heads: dict[tuple[int, ...], Head] = {}  # by output shape, when the spec names only a layout

    def __call__(self, output: np.ndarray, stream_ids: Sequence[str] | None = None) -> list[Detections]:
        """``stream_ids``: the stream of each frame, for per-stream class thresholds (``spec.thresholds``)."""
        spec = self.spec
        table = None
        if spec.thresholds is not None and spec.thresholds.active:
            if stream_ids is None or len(stream_ids) != len(output):
                raise ValueError("CpuPostprocessor: class thresholds need the stream id of every frame")
            table = spec.thresholds.rows(stream_ids)
        head = self._heads.get(output.shape[1:])
        if head is None:
            head = self._heads[output.shape[1:]] = head_for(spec, output.shape)
        boxes, scores, classes, valid = decode_rows(head, output)
        results = []
        for i in range(len(output)):
            row = None if table is None else table[i]
            xyxy, score, cls = select(boxes[i], scores[i], classes[i], valid[i], spec, row)
            if head.nms:
                keep = nms(xyxy, score, cls, spec.iou_threshold, spec.max_detections)
            else:
                keep = np.arange(min(len(score), spec.max_detections))
            results.append(Detections(xyxy[keep], score[keep], cls[keep]))
        return results
