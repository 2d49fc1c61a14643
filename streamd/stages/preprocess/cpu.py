"""Preprocess: source frames -> normalised NCHW model input (CPU twin of kernels/preprocess.cu).

Resize convention shared with the CUDA kernel, so both give the same tensor:
- letterbox: ``scale = min(W / w, H / h)``, resized size ``(round(w * scale), round(h * scale))``,
  padding split with the smaller half left/top: ``pad_x = (W - nw) // 2``, ``pad_y = (H - nh) // 2``;
- stretch: independent scales ``W / w`` and ``H / h``, no padding;
- bilinear sampling with half-pixel centres (OpenCV's INTER_LINEAR), pad pixels = ``pad_value`` before
  normalisation; then ``(pixel - mean) / std`` per channel in the model's channel order.

Colour: the CPU decoder's BGR images come from ``colour.yuv420_to_bgr`` (the kernel's YUV -> RGB, rounded to
8 bits); :meth:`CpuPreprocessor.nv12` takes the NV12 planes the kernel reads and converts them as the kernel
does (``colour.nv12_to_bgr_float``, no rounding), so the two give the same tensor up to float rounding.
"""

from __future__ import annotations

import cv2
import numpy as np

from streamd.stages.preprocess.colour import nv12_to_bgr_float
from streamd.stages.preprocess.spec import PreprocessSpec, compute_transform
from streamd.types import Transform


class CpuPreprocessor:
    """Letterbox/stretch + normalise BGR uint8 frames into a preallocated float32 NCHW batch."""

    def __init__(self, spec: PreprocessSpec) -> None:
        self.spec = spec
        # OpenCV's own thread pool would compete with the engine's threads for the same cores; the pipeline
        # already overlaps stages with its own threads (measured with bench/bench_cpu.py).
        cv2.setNumThreads(1)
        order = [2, 1, 0] if spec.channel_order == "rgb" else [0, 1, 2]  # from BGR source
        self._order = np.array(order)
        self._scale = (1.0 / np.asarray(spec.std, np.float32)).reshape(3, 1, 1)
        self._shift = (np.asarray(spec.mean, np.float32) / np.asarray(spec.std, np.float32)).reshape(3, 1, 1)

    def __call__(self, image: np.ndarray, out: np.ndarray) -> Transform:
        """Write one BGR (H, W, 3) uint8 (or float32, 0..255) image into ``out`` (3, height, width) float32;
        return its transform.

        Resizing happens in float32 (no rounding back to uint8), the same arithmetic as the CUDA kernel.
        """
        spec = self.spec
        h, w = image.shape[:2]
        transform, nw, nh = compute_transform(w, h, spec)
        canvas = np.full((spec.height, spec.width, 3), spec.pad_value, np.float32)
        px, py = int(transform.pad_x), int(transform.pad_y)
        src = image.astype(np.float32)
        if (nw, nh) == (w, h):
            canvas[py : py + nh, px : px + nw] = src
        else:
            cv2.resize(src, (nw, nh), dst=canvas[py : py + nh, px : px + nw], interpolation=cv2.INTER_LINEAR)
        chw = canvas.transpose(2, 0, 1)[self._order]  # (3, H, W) in model channel order
        np.multiply(chw, self._scale, out=out)
        out -= self._shift
        return transform

    def nv12(
        self, y: np.ndarray, uv: np.ndarray, matrix: str, full_range: bool, out: np.ndarray
    ) -> Transform:
        """The kernel's NV12 input (Y (h, w), interleaved UV (ceil(h/2), 2 ceil(w/2)) uint8) into ``out``,
        converted with the kernel's arithmetic (``colour``); returns the transform."""
        return self(nv12_to_bgr_float(y, uv, matrix, full_range), out)
