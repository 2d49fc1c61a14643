"""Run a built file on ONNX Runtime (CPU) with a real frame: batch-2 check, boxes left by each threshold.

Random weights give small scores; the manifest records, for each file, the detections left above a few
thresholds so a test or benchmark can pick a threshold that still exercises NMS and tracking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

THRESHOLDS = (0.05, 0.1, 0.2, 0.25, 0.3)
CALIBRATION_FRAMES = range(0, 400, 25)  # 16 frames spread over the clip (a moving crowd)
SAMPLE = Path(__file__).resolve().parents[2] / "streamd" / "bundled" / "samples" / "vtest.mp4"


def read_frame(video: Path, index: int = 30) -> np.ndarray:
    """One decoded BGR frame of a real clip (OpenCV decode, like streamd's CPU path)."""
    import cv2

    cap = cv2.VideoCapture(str(video))
    try:
        cap.set(cv2.CAP_PROP_POS_FRAMES, index)
        ok, frame = cap.read()
    finally:
        cap.release()
    if not ok:
        raise RuntimeError(f"could not decode frame {index} of {video}")
    return frame


def calibration_images(size: int, kind: str) -> Any:
    """[16,3,S,S] float32 torch tensor of bundled-clip frames, for BatchNorm calibration."""
    import torch

    frames = [read_frame(SAMPLE, i) for i in CALIBRATION_FRAMES]
    return torch.from_numpy(np.stack([preprocess(f, size, size, kind) for f in frames]))


def preprocess(frame_bgr: np.ndarray, height: int, width: int, kind: str) -> np.ndarray:
    """[3,H,W] float32 as the family's own predictor feeds it (plain resize; enough for a score census)."""
    import cv2

    img = cv2.resize(frame_bgr, (width, height), interpolation=cv2.INTER_LINEAR)
    if kind == "bgr255":  # YOLOX (legacy=False): BGR, 0..255, no normalisation
        return img.transpose(2, 0, 1).astype(np.float32)
    return (img[:, :, ::-1].transpose(2, 0, 1) / 255.0).astype(np.float32)  # RGB 0..1


def scores_of(family: str, variant: str, outputs: dict[str, np.ndarray]) -> np.ndarray:
    """Per-candidate confidence of image 0, read the way each family's own post-processing reads it."""
    if family in ("yolov8s", "yolo11s"):
        return outputs["output0"][0, 4:, :].max(axis=0)
    if family == "rtdetr-l-raw":
        return outputs["output0"][0, :, 4:].max(axis=1)
    if family in ("yolo26s", "yolov10s", "rtdetr-l"):
        return outputs["output0"][0, :, 4]
    if family == "yolox-s":
        out = outputs["output"][0]
        return out[:, 4] * out[:, 5:].max(axis=1)
    if family == "ssdlite" and variant == "standard":
        return outputs["scores"]
    if family == "ssdlite":
        return outputs["scores"][0].max(axis=1)
    if family == "tfod-ssdlite":
        return outputs["detection_scores"][0]
    raise KeyError(family)


def run(path: Path, family: str, variant: str, frame_bgr: np.ndarray, kind: str, size: int) -> dict[str, Any]:
    """Dynamic axes run at batch 2 and the export size; static ones at their own shape."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = inp.shape
    if variant == "standard":  # torchvision's own export: one [3,H,W] image, any size
        feed = preprocess(frame_bgr, frame_bgr.shape[0], frame_bgr.shape[1], kind)
        ran = "one [3,H,W] image per call (list-of-images export, no batch axis)"
    else:
        h, w = (shape[2], shape[3]) if isinstance(shape[2], int) else (size, size)
        batch = shape[0] if isinstance(shape[0], int) else 2
        feed = np.stack([preprocess(frame_bgr, h, w, kind)] * batch)
        ran = f"batch {batch} at {h}x{w}"
    results = sess.run(None, {inp.name: feed})
    outputs = {o.name: r for o, r in zip(sess.get_outputs(), results, strict=True)}
    scores = scores_of(family, variant, outputs)
    census = {f"{t:g}": int((scores > t).sum()) for t in THRESHOLDS}
    return {
        "ran": ran,
        "output_shapes": {k: list(v.shape) for k, v in outputs.items()},
        "max_score": round(float(scores.max()), 4) if scores.size else 0.0,
        "detections_above": census,  # candidates before NMS (after it, for the standard SSDlite export)
        "highest_threshold_with_detections": max((t for t in THRESHOLDS if census[f"{t:g}"]), default=None),
    }
