"""Postprocess: raw engine output -> per-frame detections (CPU twin of kernels/postprocess.cu).

Layouts (B = batch, C = classes):
- ``yolov8``  [B, 4 + C, N]: rows cx, cy, w, h (input pixels) then C class scores;
- ``yolov5``  [B, N, 5 + C]: cx, cy, w, h, objectness, C class scores (score = obj * cls);
- ``end2end`` [B, K, 6]: x1, y1, x2, y2, score, class id, NMS already done (rows with score <= 0 are empty).
For each frame: best class per candidate, score threshold, keep the ``top_k`` best, class-aware greedy NMS
by IoU, keep ``max_detections``. With ``PostprocessSpec.thresholds`` (model.classes, streams[].classes,
model.class_thresholds) the threshold is looked up per frame (by its stream) and per best class, +inf for a
filtered class, *before* top-K and NMS: filtered classes never use up ``top_k`` or ``max_detections``, and a
candidate whose best class is filtered is dropped, never relabelled with its second-best class.
Ties in score keep the lower candidate index first (stable sort), which the CUDA kernel matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamd.types import Detections

LAYOUTS = ("yolov8", "yolov5", "end2end")


class ClassThresholds:
    """Score threshold per stream and class: rows of C float32, ``+inf`` where a class is filtered out.

    ``rows(stream_ids)`` gives the [B, C] array of one batch (one row per frame, by the frame's stream);
    a stream without its own row uses ``default``.
    """

    def __init__(
        self, default: Sequence[float], per_stream: Mapping[str, Sequence[float]] | None = None
    ) -> None:
        self.default = np.asarray(default, np.float32)
        if self.default.ndim != 1 or len(self.default) == 0:
            raise ValueError(
                f"ClassThresholds: expected a row of C thresholds, got shape {self.default.shape}"
            )
        self.per_stream = {k: np.asarray(v, np.float32) for k, v in (per_stream or {}).items()}
        for sid, row in self.per_stream.items():
            if row.shape != self.default.shape:
                raise ValueError(
                    f"ClassThresholds: stream {sid!r} row {row.shape}, expected {self.default.shape}"
                )

    @property
    def num_classes(self) -> int:
        return len(self.default)

    @classmethod
    def from_config(cls, config: Any) -> ClassThresholds | None:
        """From a ``streamd.config.Config``; None when no class filter or per-class threshold is configured
        (then the plain ``score_threshold`` applies, with no per-frame table)."""
        model = config.model
        if (
            model.classes is None
            and not model.class_thresholds
            and all(s.classes is None for s in config.streams)
        ):
            return None
        per_stream = {s.id: model.thresholds(s.classes) for s in config.streams if s.classes is not None}
        return cls(model.thresholds(), per_stream)

    def rows(self, stream_ids: Sequence[str], out: np.ndarray | None = None) -> np.ndarray:
        """[len(stream_ids), C] float32 (written into ``out`` when given)."""
        table = np.empty((len(stream_ids), self.num_classes), np.float32) if out is None else out
        for i, sid in enumerate(stream_ids):
            table[i] = self.per_stream.get(sid, self.default)
        return table


@dataclass(frozen=True, slots=True)
class PostprocessSpec:
    layout: str  # resolved: one of LAYOUTS
    num_classes: int
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100
    top_k: int = 1000
    thresholds: ClassThresholds | None = None  # per-stream, per-class thresholds (class filter); None = off


SUPPORTED = "supported layouts: yolov8 [B, 4+C, N], yolov5 [B, N, 5+C], end2end [B, K, 6], each one output"
Dims = Sequence[int | str]


def _text(dims: Dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _fitting(a: int, b: int, num_classes: int) -> list[str]:
    """The layouts an output [B, a, b] fits with ``num_classes`` classes, in LAYOUTS order."""
    fits = {"yolov8": a == 4 + num_classes, "yolov5": b == 5 + num_classes, "end2end": b == 6}
    return [name for name in LAYOUTS if fits[name]]


def _implied(layout: str, a: int, b: int) -> str:
    """What ``layout`` would read from an output [B, a, b], whatever the class names say."""
    if layout == "yolov8":
        return f"yolov8 ({a - 4} classes, {b} candidates)"
    if layout == "yolov5":
        return f"yolov5 ({b - 5} classes, {a} candidates)"
    return f"end2end (up to {a} boxes, NMS in the model)"


def unsupported_model(outputs: Sequence[tuple[str, Dims]], num_classes: int) -> str | None:
    """A ``model.path: ...`` message when the outputs show a model this version cannot run (segmentation,
    pose, oriented boxes, several outputs): what was found and what streamd supports; None otherwise."""
    listed = ", ".join(f"{name} {_text(dims)}" for name, dims in outputs)
    if len(outputs) > 1:
        protos = [(n, d) for n, d in outputs if len(d) == 4 and d[1] == 32]
        if protos and any(len(d) == 3 for _, d in outputs):
            return (
                f"model.path: a segmentation model (Ultralytics -seg: outputs {listed}; {protos[0][0]} holds "
                "32 prototype masks [B, 32, H/4, W/4]) is not supported: streamd runs detection models only; "
                f"export the detection model (e.g. yolov8s.pt, not yolov8s-seg.pt); {SUPPORTED}"
            )
        return f"model.path: multi-output models are not supported yet: outputs {listed}; {SUPPORTED}"
    if not outputs or len(outputs[0][1]) != 3 or not isinstance(outputs[0][1][1], int):
        return None
    a, c = int(outputs[0][1][1]), num_classes
    if a == 4 + c + 32:
        kind = (
            f"a segmentation model ({a} = 4 box + {c} class scores + 32 mask coefficients, Ultralytics -seg)"
        )
    elif a > 5 and (a - 5) % 3 == 0 and (c == 1 or a == 56):
        k = (a - 5) // 3
        kind = f"a pose model ({a} = 4 box + 1 class score + {k} keypoints × 3, Ultralytics -pose)"
    elif a == 5 + c:
        kind = f"an oriented-box model ({a} = 4 box + {c} class scores + 1 angle, Ultralytics -obb)"
    else:
        return None
    return (
        f"model.path: output {listed} looks like {kind}, which this version cannot run; "
        f"export the detection model (e.g. yolov8s.pt); {SUPPORTED}"
    )


def resolve_layout(layout: str, shape: tuple[int, ...], num_classes: int, name: str = "output") -> str:
    """Pick the output layout from the output shape when the config says ``auto``; check it otherwise.

    ``auto`` refuses (ValueError naming ``model.layout``) a shape that fits more than one layout, or a square
    one ([B, n, n]: which axis holds the candidates cannot be told); a shape that fits none, or not the layout
    set, is checked against the models this version cannot run (``unsupported_model``, ``model.path: ...``).
    """
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(
            f"model.layout: unknown layout {layout!r}; expected auto or one of {', '.join(LAYOUTS)}"
        )
    if len(shape) != 3:
        raise ValueError(
            f"model output: expected a 3-D tensor [B, ., .], got shape {list(shape)}; {SUPPORTED}"
        )
    _, a, b = shape
    fits = _fitting(a, b, num_classes)
    if layout == "auto" and (len(fits) > 1 or (fits and a == b)):
        shaped = {"yolov8": a > 4, "yolov5": b > 5, "end2end": b == 6}  # whatever the class names say
        options = fits if len(fits) > 1 else [x for x in LAYOUTS if shaped[x]]
        raise ValueError(
            f"model.layout: auto cannot tell the layout of output {name} {list(shape)} with {num_classes} "
            f"class names: it fits {' and '.join(_implied(x, a, b) for x in options)}; set model.layout to "
            f"{' or '.join(options)} (and model.class_names to the model's classes)"
        )
    if (layout == "auto" and fits) or layout in fits:
        return fits[0] if layout == "auto" else layout
    refused = unsupported_model([(name, shape)], num_classes)
    if refused:
        raise ValueError(refused)
    if layout == "auto":
        raise ValueError(
            f"model output shape {list(shape)} fits no known layout for {num_classes} classes: expected "
            f"[B, {4 + num_classes}, N] (yolov8), [B, N, {5 + num_classes}] (yolov5) or [B, K, 6] "
            "(end2end); set model.layout or model.class_names to match the model"
        )
    raise ValueError(
        f"model.layout is {layout!r} but the model output shape {list(shape)} does not match it "
        f"with {num_classes} class names (model.class_names)"
    )


def layout_note(
    layout: str, resolved: str, shape: Dims, num_classes: int, name: str = "output", source: str = ""
) -> str:
    """One line naming the layout in use and its evidence: the output and the classes it implies vs the
    class names (``layout``: as configured, ``auto`` or a layout; ``source``: where a set layout came from,
    e.g. "the model's metadata")."""
    _, a, b = shape
    if layout == "auto":
        head = f"model.layout auto chose {resolved}"
    else:
        head = f"model.layout {resolved}" + (f" (from {source})" if source else "")
    if resolved == "yolov8":
        why = f"{a} = 4 box + {num_classes} class scores over {b} candidates"
    elif resolved == "yolov5":
        why = f"{b} = 4 box + 1 objectness + {num_classes} class scores over {a} candidates"
    else:
        why = f"up to {a} boxes of (x1, y1, x2, y2, score, class id), NMS done in the model"
    output = "output" if name == "output" else f"output {name}"  # an engine knows no output name
    return f"{head}: {output} {_text(shape)}, {why}; {num_classes} class names (model.class_names)"


def candidates(
    out: np.ndarray, spec: PostprocessSpec, thresholds: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One frame's raw output -> (xyxy (n, 4), score (n,), class_id (n,)) above threshold, best first.

    ``thresholds``: this frame's row of C per-class thresholds (None: ``spec.score_threshold`` for all); a
    class id outside 0..C-1 (end2end models) gets ``spec.score_threshold``."""
    if spec.layout == "end2end":
        xyxy, score, cls = out[:, :4], out[:, 4], out[:, 5]
    else:
        if spec.layout == "yolov8":
            box, cls_scores = out[:4].T, out[4:]  # (N, 4), (C, N)
            cls = cls_scores.argmax(0)
            score = np.take_along_axis(cls_scores, cls[None], 0)[0]
        else:  # yolov5
            box = out[:, :4]
            cls = out[:, 5:].argmax(1)
            score = out[:, 4] * np.take_along_axis(out[:, 5:], cls[:, None], 1)[:, 0]
        xyxy = np.concatenate([box[:, :2] - box[:, 2:] / 2, box[:, :2] + box[:, 2:] / 2], axis=1)
    if thresholds is None:
        keep = np.flatnonzero(score > spec.score_threshold)
    else:
        ci = cls.astype(np.int64)
        valid = (ci >= 0) & (ci < len(thresholds))
        limit = np.where(valid, thresholds[np.where(valid, ci, 0)], np.float32(spec.score_threshold))
        keep = np.flatnonzero(score.astype(np.float32) > limit)
    order = keep[np.argsort(-score[keep], kind="stable")][: spec.top_k]
    return (
        xyxy[order].astype(np.float32),
        score[order].astype(np.float32),
        cls[order].astype(np.int32),
    )


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

    def __call__(self, output: np.ndarray, stream_ids: Sequence[str] | None = None) -> list[Detections]:
        """``stream_ids``: the stream of each frame, for per-stream class thresholds (``spec.thresholds``)."""
        spec = self.spec
        table = None
        if spec.thresholds is not None:
            if stream_ids is None or len(stream_ids) != len(output):
                raise ValueError("CpuPostprocessor: class thresholds need the stream id of every frame")
            table = spec.thresholds.rows(stream_ids)
        results = []
        for i, out in enumerate(output):
            xyxy, score, cls = candidates(out, spec, None if table is None else table[i])
            if spec.layout == "end2end":
                keep = np.arange(min(len(score), spec.max_detections))
            else:
                keep = nms(xyxy, score, cls, spec.iou_threshold, spec.max_detections)
            results.append(Detections(xyxy[keep], score[keep], cls[keep]))
        return results
