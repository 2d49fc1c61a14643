"""The detection head: where each candidate's box, scores and class are in a model's outputs, and how to read
them.

A ``Head`` is resolved once per model from its outputs (names and per-image shapes) and the ``model:``
settings; both postprocess twins read it (the CPU one through numpy views, the CUDA one as the kernel's
``HeadParams``), so they decode the same way by construction. Every layout becomes one addressing scheme over
one image's row of output values (several outputs are packed into one row per image by the engines, each
output flattened at ``OutputPart.offset``, graph order, float32):

- box: 4 values at ``box_off + a * box_sa + k * box_sk`` for candidate ``a``, coordinate ``k``, in
  ``box_format`` (``cxcywh``, ``xyxy``, ``xywh`` = top-left + size, ``yxyx`` = TF's ymin, xmin, ymax, xmax),
  multiplied by ``box_scale`` (input width/height for normalised boxes) *before* conversion to x1, y1, x2, y2;
- scores: ``score_cols`` columns at ``score_off + a * score_sa + c * score_sc``; the best of the first
  ``num_classes`` (first maximum) is the class, unless a ``classes`` output gives it (then one score column);
  ``activation`` (sigmoid, or softmax over all ``softmax_cols`` columns, a trailing "no object" column
  included) is applied to the best raw value only: both are monotonic, so the best class does not change;
- objectness (yolov5, yolox): score = objectness × best class score;
- yolox: ``grid`` levels (stride, grid width, grid height), candidates in level then row-major cell order:
  x = (raw_x + cell_x) × stride, w = exp(raw_w) × stride;
- count (TF OD API ``num_detections``): candidates at or past it are empty;
- ``nms``: class-aware NMS applies (False where the model did it or needs none: end2end, DETR, a ``classes``
  output).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from streamd.engines.base import OutputPart

__all__ = ["Head", "HeadSettings", "OutputPart", "cells", "pack_parts"]

LAYOUTS = ("yolov8", "yolov5", "end2end", "detr", "yolox", "outputs")
BOX_FORMATS = ("cxcywh", "xyxy", "xywh", "yxyx")
ACTIVATIONS = ("none", "sigmoid", "softmax")
DEFAULT_STRIDES = (8, 16, 32)
SUPPORTED = (
    "supported layouts: yolov8 [B, 4+C, N], yolov5 [B, N, 5+C], end2end [B, K, 6], detr [B, N, 4+C] or boxes "
    "+ logits, yolox [B, N, 5+C] raw, outputs (model.outputs: boxes, scores, classes, count)"
)
# Output names of known exports (lower-case), for ``auto``.
TF_NAMES = {"boxes": "detection_boxes", "scores": "detection_scores", "classes": "detection_classes"}
TORCHVISION_NAMES = ("boxes", "scores")
DETR_BOX_NAMES = ("pred_boxes", "boxes", "dets", "bboxes")
DETR_LOGIT_NAMES = ("pred_logits", "logits", "labels", "scores")


def pack_parts(outputs: Sequence[tuple[str, Sequence[int]]]) -> tuple[OutputPart, ...]:
    """(name, per-image shape) in graph order -> parts with their offsets in the packed row."""
    parts, offset = [], 0
    for name, shape in outputs:
        part = OutputPart(name, tuple(int(d) for d in shape), offset)
        parts.append(part)
        offset += part.size
    return tuple(parts)


@dataclass(frozen=True)
class HeadSettings:
    """What ``model:`` says about the head (``auto`` where it leaves the choice to the model's outputs)."""

    layout: str = "auto"
    num_classes: int = 80
    input_size: tuple[int, int] = (640, 640)  # (width, height)
    strides: tuple[int, ...] = DEFAULT_STRIDES
    score_activation: str = "auto"
    box_format: str = "auto"
    box_units: str = "auto"  # pixels | normalized
    outputs: dict[str, str] = field(default_factory=dict)  # boxes/scores/classes/count -> output name
    class_offset: int | None = None  # None: auto (1 for TF OD API names, else 0)

    @staticmethod
    def from_model(m: object) -> HeadSettings:
        """From a ``streamd.config.model.ModelConfig`` (or anything with its attributes)."""
        g = getattr
        return HeadSettings(
            g(m, "layout", "auto"),
            len(g(m, "class_names")),
            tuple(g(m, "input_size", (640, 640))),  # type: ignore[arg-type]
            tuple(g(m, "strides", DEFAULT_STRIDES)),
            g(m, "score_activation", "auto"),
            g(m, "box_format", "auto"),
            g(m, "box_units", "auto"),
            dict(g(m, "outputs", None) or {}),
            g(m, "class_offset", None),
        )


@dataclass(frozen=True)
class Head:
    """The resolved head (see the module docstring); ``note`` is the evidence, for logs and ``check``."""

    layout: str
    num_classes: int
    candidates: int
    row: int
    box: tuple[int, int, int]  # offset, stride per candidate, stride per coordinate
    box_format: str = "cxcywh"
    box_scale: tuple[float, float] = (1.0, 1.0)
    scores: tuple[int, int, int] = (0, 0, 0)  # offset, stride per candidate, stride per column
    score_cols: int = 1
    softmax_cols: int = 0
    activation: str = "none"
    objectness: tuple[int, int] | None = None  # offset, stride per candidate
    classes: tuple[int, int] | None = None
    class_offset: int = 0
    count: int | None = None
    grid: tuple[tuple[int, int, int], ...] = ()  # yolox: (stride, grid w, grid h) per level
    nms: bool = True
    note: str = field(default="", compare=False)
    legacy: bool = field(default=False, compare=False)  # one output in a layout the fixed kernels decode


def cells(strides: Sequence[int], width: int, height: int) -> int:
    """Grid cells over all levels: YOLOX's candidate count (one per cell)."""
    return sum(math.ceil(width / s) * math.ceil(height / s) for s in strides)


def shapes_text(parts: Sequence[OutputPart]) -> str:
    """``boxes [1, 10, 4], scores [1, 10]``: each output with its dims (as the file has them, or [B, ...])."""
    return ", ".join(p.label.removeprefix("output ") for p in parts)
