"""Synthetic outputs of each model family, packed the way the engines pack them, for the head tests.

Each family: the outputs (name, per-image shape), the ``HeadSettings`` a config would give, and a generator of
plausible raw values (boxes inside the input, a share of candidates scoring above a threshold). Shared by the
CPU tests (tests/pipeline/test_heads.py) and the GPU twin tests (tests/gpu/test_heads_gpu.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streamd.stages.postprocess.head import HeadSettings, OutputPart, cells, pack_parts

W, H = 640, 480


@dataclass(frozen=True)
class Family:
    outputs: tuple[tuple[str, tuple[int, ...]], ...]
    settings: HeadSettings
    fill: Callable[[np.random.Generator, int], dict[str, np.ndarray]]  # batch -> output name -> [B, ...]

    def parts(self) -> tuple[OutputPart, ...]:
        return pack_parts(self.outputs)

    def rows(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        """[B, R] float32: every output flattened in order, as ``onnx_outputs.pack_outputs`` makes them."""
        values = self.fill(rng, batch)
        return np.concatenate(
            [values[name].reshape(batch, -1).astype(np.float32) for name, _ in self.outputs], axis=1
        )


def _cxcywh(rng: np.random.Generator, shape: tuple[int, ...], w: float, h: float) -> np.ndarray:
    cx, cy = rng.uniform(0, w, shape), rng.uniform(0, h, shape)
    bw, bh = rng.uniform(w / 100, w / 3, shape), rng.uniform(h / 100, h / 3, shape)
    return np.stack([cx, cy, bw, bh], axis=-1)


def _probs(rng: np.random.Generator, shape: tuple[int, ...], positive: float) -> np.ndarray:
    p = rng.uniform(0, 0.2, shape)
    hot = rng.random(shape[:-1]) < positive
    p[hot, rng.integers(0, shape[-1], hot.sum())] = rng.uniform(0.3, 1.0, hot.sum())
    return p


def _detr1(rng: np.random.Generator, b: int) -> dict[str, np.ndarray]:
    box = _cxcywh(rng, (b, 300), 1.0, 1.0)
    return {"output0": np.concatenate([box, _probs(rng, (b, 300, 80), 0.1)], axis=-1)}


def _detr2(rng: np.random.Generator, b: int) -> dict[str, np.ndarray]:
    return {"pred_boxes": _cxcywh(rng, (b, 300), 1.0, 1.0), "pred_logits": rng.normal(-3, 2.5, (b, 300, 80))}


def _detr_softmax(rng: np.random.Generator, b: int) -> dict[str, np.ndarray]:
    logits = rng.normal(0, 2, (b, 100, 92))
    logits[..., -1] += 2  # "no object" usually wins
    return {"pred_logits": logits, "pred_boxes": _cxcywh(rng, (b, 100), 1.0, 1.0)}


YOLOX_N = cells((8, 16, 32), W, H)


def _yolox(rng: np.random.Generator, b: int) -> dict[str, np.ndarray]:
    xy = rng.uniform(-0.5, 1.5, (b, YOLOX_N, 2))
    wh = rng.uniform(-1.0, 2.5, (b, YOLOX_N, 2))
    obj = rng.uniform(0, 1, (b, YOLOX_N, 1)) ** 3
    return {"output": np.concatenate([xy, wh, obj, _probs(rng, (b, YOLOX_N, 80), 0.2)], axis=-1)}


def _tf(rng: np.random.Generator, b: int) -> dict[str, np.ndarray]:
    y1, x1 = rng.uniform(0, 0.7, (b, 100)), rng.uniform(0, 0.7, (b, 100))
    boxes = np.stack(
        [y1, x1, y1 + rng.uniform(0.01, 0.3, (b, 100)), x1 + rng.uniform(0.01, 0.3, (b, 100))], -1
    )
    scores = -np.sort(-rng.uniform(0, 1, (b, 100)), axis=1)
    return {
        "detection_boxes": boxes,
        "detection_scores": scores,
        "detection_classes": rng.integers(1, 81, (b, 100)).astype(np.float32),
        "num_detections": rng.integers(0, 101, (b,)).astype(np.float32),
    }


def _ssd(rng: np.random.Generator, b: int) -> dict[str, np.ndarray]:
    c = _cxcywh(rng, (b, 3234), W, H)
    xyxy = np.concatenate([c[..., :2] - c[..., 2:] / 2, c[..., :2] + c[..., 2:] / 2], axis=-1)
    return {"boxes": xyxy, "scores": _probs(rng, (b, 3234, 80), 0.05)}


def _mapped_xywh(rng: np.random.Generator, b: int) -> dict[str, np.ndarray]:
    c = _cxcywh(rng, (b, 500), W, H)
    xywh = np.concatenate([c[..., :2] - c[..., 2:] / 2, c[..., 2:]], axis=-1)
    return {"scores": _probs(rng, (b, 500, 3), 0.3), "bbox": xywh}


S = HeadSettings
FAMILIES: dict[str, Family] = {
    "detr-one-output": Family((("output0", (300, 84)),), S(input_size=(W, H)), _detr1),
    "detr-sigmoid": Family(
        (("pred_boxes", (300, 4)), ("pred_logits", (300, 80))), S(input_size=(W, H)), _detr2
    ),
    "detr-softmax": Family(
        (("pred_logits", (100, 92)), ("pred_boxes", (100, 4))),
        S(num_classes=91, input_size=(W, H)),
        _detr_softmax,
    ),
    "yolox": Family((("output", (YOLOX_N, 85)),), S(layout="yolox", input_size=(W, H)), _yolox),
    "tf-od-api": Family(
        (
            ("detection_boxes", (100, 4)),
            ("detection_scores", (100,)),
            ("detection_classes", (100,)),
            ("num_detections", ()),
        ),
        S(input_size=(W, H)),
        _tf,
    ),
    "torchvision-ssd": Family((("boxes", (3234, 4)), ("scores", (3234, 80))), S(input_size=(W, H)), _ssd),
    "mapped-xywh": Family(
        (("scores", (500, 3)), ("bbox", (500, 4))),
        S(
            num_classes=3,
            input_size=(W, H),
            outputs={"boxes": "bbox", "scores": "scores"},
            box_format="xywh",
            box_units="pixels",
        ),
        _mapped_xywh,
    ),
}
