"""Helpers shared by the GPU tests (the GPU must be known usable before calling them)."""

from __future__ import annotations

import numpy as np

POISON = 0xFF  # every byte 0xFF: NaN in float32 and float16, -1 in int32


def to_device(array: np.ndarray, stream: object) -> object:
    """A DeviceBuffer holding a copy of ``array`` (the copy has completed when this returns)."""
    from streamd.gpu.cuda import DeviceBuffer

    buf = DeviceBuffer(array.nbytes)
    buf.upload(np.ascontiguousarray(array), stream)  # type: ignore[arg-type]
    stream.synchronize()  # type: ignore[attr-defined]
    return buf


def from_device(
    buf: object, shape: tuple[int, ...], dtype: object, stream: object, offset: int = 0
) -> np.ndarray:
    out = np.empty(shape, dtype)  # type: ignore[call-overload]
    buf.download(out, stream, offset=offset)  # type: ignore[attr-defined]
    stream.synchronize()  # type: ignore[attr-defined]
    return out
