"""How a model wants its input (``PreprocessSpec``) and where a frame lands in it (``compute_transform``).

Plain values, shared by the CPU twin (``stages/preprocess/cpu.py``, OpenCV) and the CUDA kernel
(``stages/preprocess/cuda.py``): this module imports neither OpenCV nor CUDA. The resize convention is
described in ``cpu.py``, the colour conversion in ``colour.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamd.types import Transform


@dataclass(frozen=True, slots=True)
class PreprocessSpec:
    """How one model wants its input. ``mean``/``std`` are in the model's channel order."""

    width: int
    height: int
    channel_order: str = "rgb"  # "rgb" | "bgr"
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (255.0, 255.0, 255.0)
    resize: str = "letterbox"  # "letterbox" | "stretch"
    pad_value: int = 114


def compute_transform(src_w: int, src_h: int, spec: PreprocessSpec) -> tuple[Transform, int, int]:
    """Transform plus the resized (unpadded) size ``(nw, nh)`` for a ``src_w`` x ``src_h`` frame."""
    if spec.resize == "stretch":
        return Transform(spec.width / src_w, spec.height / src_h, 0.0, 0.0), spec.width, spec.height
    scale = min(spec.width / src_w, spec.height / src_h)
    nw = min(spec.width, max(1, round(src_w * scale)))
    nh = min(spec.height, max(1, round(src_h * scale)))
    pad_x, pad_y = (spec.width - nw) // 2, (spec.height - nh) // 2
    # The effective per-axis scale is what was really applied after rounding the resized size.
    return Transform(nw / src_w, nh / src_h, float(pad_x), float(pad_y)), nw, nh
