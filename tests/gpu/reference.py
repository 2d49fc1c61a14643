"""Numpy references for the GPU tests, written independently of the kernels.

NV12 -> RGB uses the textbook BT.601 / BT.709 equations with their published constants, in float64 with no
rounding to 8 bits, clamped to [0, 255]; chroma is repeated over its 2 x 2 luma block. The resize and
normalisation that follow are the CPU twin's (``CpuPreprocessor`` accepts a float32 image).
"""

from __future__ import annotations

import cv2
import numpy as np

# R = Y + r_cr Cr; G = Y - g_cb Cb - g_cr Cr; B = Y + b_cb Cb (Y, Cb, Cr scaled to full range first).
_EQUATIONS = {
    "bt601": {"r_cr": 1.402, "g_cb": 0.344136, "g_cr": 0.714136, "b_cb": 1.772},
    "bt709": {"r_cr": 1.5748, "g_cb": 0.187324, "g_cr": 0.468124, "b_cb": 1.8556},
}


def nv12_to_bgr_float(
    y: np.ndarray, uv: np.ndarray, matrix: str = "bt601", full_range: bool = False
) -> np.ndarray:
    """(h, w) Y plane + (ceil(h/2), 2 ceil(w/2)) interleaved UV plane, uint8 -> (h, w, 3) float32 BGR."""
    h, w = y.shape
    eq = _EQUATIONS[matrix]
    u = np.repeat(np.repeat(uv[:, 0::2].astype(np.float64), 2, axis=0), 2, axis=1)[:h, :w]
    v = np.repeat(np.repeat(uv[:, 1::2].astype(np.float64), 2, axis=0), 2, axis=1)[:h, :w]
    luma = y.astype(np.float64)
    if full_range:
        cb, cr = u - 128.0, v - 128.0
    else:
        luma = (luma - 16.0) * (255.0 / 219.0)
        cb, cr = (u - 128.0) * (255.0 / 224.0), (v - 128.0) * (255.0 / 224.0)
    r = luma + eq["r_cr"] * cr
    g = luma - eq["g_cb"] * cb - eq["g_cr"] * cr
    b = luma + eq["b_cb"] * cb
    return np.clip(np.stack([b, g, r], axis=-1), 0.0, 255.0).astype(np.float32)


def bgr_to_nv12(bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A BGR uint8 image with even sides -> (Y (h, w), UV (h/2, w)) uint8 planes (OpenCV's BT.601 I420)."""
    h, w = bgr.shape[:2]
    if h % 2 or w % 2:
        raise ValueError(f"bgr_to_nv12: expected even sides, got {w}x{h}")
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420).reshape(-1)
    y = i420[: h * w].reshape(h, w)
    u = i420[h * w : h * w + h * w // 4].reshape(h // 2, w // 2)
    v = i420[h * w + h * w // 4 :].reshape(h // 2, w // 2)
    uv = np.empty((h // 2, w), np.uint8)
    uv[:, 0::2], uv[:, 1::2] = u, v
    return np.ascontiguousarray(y), uv


def random_nv12(
    rng: np.random.Generator, width: int, height: int, smooth: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Random NV12 planes of any size. ``smooth`` adds gradients to the noise (like real pictures, so
    interpolation errors are not hidden by pure noise); values use the whole 0..255 range."""
    cw, ch = (width + 1) // 2, (height + 1) // 2
    y = rng.integers(0, 256, (height, width), dtype=np.int32)
    uv = rng.integers(0, 256, (ch, 2 * cw), dtype=np.int32)
    if smooth:
        gy = np.linspace(0, 255, height)[:, None] + np.linspace(0, 255, width)[None, :]
        y = (y // 4 + gy * 0.6).astype(np.int32)
    return np.clip(y, 0, 255).astype(np.uint8), np.clip(uv, 0, 255).astype(np.uint8)


def synthetic_output(
    rng: np.random.Generator,
    layout: str,
    batch: int,
    n: int,
    num_classes: int,
    *,
    positive: float = 0.05,
    clustered: bool = True,
    size: tuple[int, int] = (640, 640),
) -> np.ndarray:
    """Detector-like raw output in ``layout`` (float32): boxes in a ``size`` = (w, h) input, a ``positive``
    fraction of candidates with high class scores, the rest low; ``clustered`` puts boxes around a few
    centres so NMS has overlaps to suppress. Scores are multiples of 1/64, so exact ties are common."""
    w_in, h_in = size
    if clustered:
        centres = rng.uniform(0, 1, (batch, 24, 2)) * (w_in, h_in)
        pick = rng.integers(0, 24, (batch, n))
        cx = np.take_along_axis(centres[..., 0], pick, 1) + rng.normal(0, 6, (batch, n))
        cy = np.take_along_axis(centres[..., 1], pick, 1) + rng.normal(0, 6, (batch, n))
    else:
        cx, cy = rng.uniform(0, w_in, (batch, n)), rng.uniform(0, h_in, (batch, n))
    bw, bh = rng.uniform(8, w_in / 5, (batch, n)), rng.uniform(8, h_in / 5, (batch, n))
    hot = rng.uniform(0, 1, (batch, n, 1)) < positive
    scores = rng.uniform(0, 0.2, (batch, n, num_classes)) + hot * rng.uniform(0, 0.8, (batch, n, num_classes))
    scores = np.round(scores * 64) / 64
    if layout == "yolov8":
        return np.concatenate([np.stack([cx, cy, bw, bh], 1), scores.transpose(0, 2, 1)], 1).astype(
            np.float32
        )
    if layout == "yolov5":
        obj = np.round(rng.uniform(0.5, 1, (batch, n, 1)) * 16) / 16
        return np.concatenate([np.stack([cx, cy, bw, bh], 2), obj, scores], 2).astype(np.float32)
    if layout == "end2end":
        x1, y1 = cx - bw / 2, cy - bh / 2
        best = scores.max(2)
        return np.stack([x1, y1, x1 + bw, y1 + bh, best, scores.argmax(2)], 2).astype(np.float32)
    raise ValueError(f"unknown layout {layout!r}")
