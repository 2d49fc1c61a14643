"""Value types shared by every stage of the data flow.

Each hop of the pipeline turns one of these into the next:
Source/Decoder -> ``Frame`` -> Batcher -> ``list[Frame]`` -> slot (``streamd.stages.contract.Slot``) ->
``FrameResult`` -> analytics -> JSON line (``streamd.worker.output``) -> sinks.
On the GPU path a frame's pixels are device memory described by ``Nv12Surface`` (what NVDEC writes; the one
NV12 type: the decoder's lease exposes it as ``planes``) or ``PackedSurface`` (a CPU-decoded frame uploaded).
Arrays are numpy; shapes are in the docstrings and checked on construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(slots=True)
class Frame:
    """One decoded picture of one stream.

    ``image`` is a host BGR uint8 array (H, W, 3) on the CPU path (None, with ``pending`` set, until the
    frame is batched); on the GPU path it is None and ``surface`` holds the decoder's device frame. ``index``
    counts decoded frames of the stream from 0 and never goes back (also across reconnects); ``pts`` is the
    presentation time in seconds (None when the container has none).
    """

    stream_id: str
    index: int
    pts: float | None
    width: int
    height: int
    image: np.ndarray | None = None
    surface: Any = None
    wall_time: float = 0.0  # time.time() when the frame left the decoder
    t_decoded: float = 0.0  # time.perf_counter() at the same moment, for latencies
    decode_ms: float = 0.0
    t_arrival: float = 0.0  # time.perf_counter() when the demuxer received this picture's packet (0: unknown)
    # A host picture not converted to ``image`` yet (``ingest.decode.base.HostPicture``): the stages convert
    # it when the frame is batched (``stages.host_frames``), so a frame dropped before never costs that.
    pending: Any = None

    def __post_init__(self) -> None:
        if self.image is not None and (
            self.image.dtype != np.uint8 or self.image.shape != (self.height, self.width, 3)
        ):
            raise ValueError(
                f"Frame.image: expected uint8 ({self.height}, {self.width}, 3), "
                f"got {self.image.dtype} {self.image.shape}"
            )


COLOR_MATRICES = ("bt601", "bt709")


@dataclass(frozen=True, slots=True)
class Nv12Surface:
    """An NV12 frame in device memory: Y plane (``height`` rows) and interleaved UV plane
    (``ceil(height / 2)`` rows of ``2 * ceil(width / 2)`` bytes), each with its own pitch in bytes."""

    y_ptr: int
    uv_ptr: int
    width: int
    height: int
    y_pitch: int
    uv_pitch: int
    matrix: str = "bt601"  # "bt601" | "bt709"
    full_range: bool = False

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ValueError(f"Nv12Surface: expected a positive size, got {self.width}x{self.height}")
        if self.y_pitch < self.width or self.uv_pitch < 2 * ((self.width + 1) // 2):
            raise ValueError(
                f"Nv12Surface: pitches ({self.y_pitch}, {self.uv_pitch}) too small for width {self.width}: "
                f"expected >= ({self.width}, {2 * ((self.width + 1) // 2)})"
            )
        if self.matrix not in COLOR_MATRICES:
            raise ValueError(
                f"Nv12Surface: unknown matrix {self.matrix!r}; expected one of {', '.join(COLOR_MATRICES)}"
            )

    @classmethod
    def contiguous(
        cls, ptr: int, width: int, height: int, pitch: int | None = None, **kw: object
    ) -> Nv12Surface:
        """The decoder layout: UV plane right after the Y plane (``ptr + pitch * height``), one pitch."""
        pitch = pitch or (width + (width & 1))
        return cls(ptr, ptr + pitch * height, width, height, pitch, pitch, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class PackedSurface:
    """A packed 8-bit 3-channel frame in device memory (rows of ``3 * width`` bytes, ``pitch`` apart)."""

    ptr: int
    width: int
    height: int
    pitch: int
    order: str = "bgr"  # "bgr" | "rgb"

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ValueError(f"PackedSurface: expected a positive size, got {self.width}x{self.height}")
        if self.pitch < 3 * self.width:
            raise ValueError(f"PackedSurface: pitch {self.pitch} < 3 * width ({3 * self.width})")
        if self.order not in ("bgr", "rgb"):
            raise ValueError(f"PackedSurface: order must be 'bgr' or 'rgb', got {self.order!r}")


Surface = Nv12Surface | PackedSurface


@runtime_checkable
class SurfaceLease(Protocol):
    """``Frame.surface`` on the GPU path: a decoder's picture, lent until ``release``. ``planes`` is where the
    pixels are; ``wait(stream)`` orders reads on ``stream`` after the decoder's writes; ``release(stream)``
    gives the buffer back once the work enqueued on ``stream`` so far is done (None: nothing reads it)."""

    @property
    def planes(self) -> Nv12Surface: ...

    def wait(self, stream: Any) -> None: ...

    def release(self, stream: Any = None) -> None: ...


@dataclass(frozen=True, slots=True)
class Transform:
    """Maps model-input pixels back to source pixels: ``src = (dst - pad) / scale`` per axis."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float

    def to_source(self, xyxy: np.ndarray, width: int, height: int) -> np.ndarray:
        """(n, 4) boxes in model-input pixels -> (n, 4) boxes in source pixels, clipped to the frame."""
        out = np.empty_like(xyxy, dtype=np.float32)
        out[:, 0::2] = (xyxy[:, 0::2] - self.pad_x) / self.scale_x
        out[:, 1::2] = (xyxy[:, 1::2] - self.pad_y) / self.scale_y
        np.clip(out[:, 0::2], 0, width, out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, height, out=out[:, 1::2])
        return out


def to_source_padded(
    det: np.ndarray, counts: np.ndarray, transforms: list[Transform], sizes: list[tuple[int, int]]
) -> list[Detections]:
    """A batch of NMS results in model-input pixels (``det`` [>= B, max_det, 6] rows x1, y1, x2, y2, score,
    class; ``counts`` [>= B] valid rows per frame) -> each frame's ``Detections`` in source pixels, the same
    float32 values ``Transform.to_source`` gives frame by frame, in a few array operations for the whole batch
    (frame by frame it was ~15 us of Python per frame in the collect thread, the thread that bounds a
    batch-32 ring), bit for bit, -0.0 included. The returned arrays are new (views of this batch's own arrays,
    about 50 KB at batch 32: a frame's detections kept keep those alive), never views of ``det``."""
    b = len(transforms)
    n = [int(c) for c in counts[:b]]
    rows = max(n, default=0)
    # per frame, float32 (what a weak Python float becomes in to_source): pads, scales, frame size per column
    params = np.array(
        [(t.pad_x, t.pad_y, t.scale_x, t.scale_y, w, h) for t, (w, h) in zip(transforms, sizes, strict=True)],
        np.float32,
    ).reshape(b, 1, 6)[:, :, [0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5]]
    block = det[:b, :rows]
    boxes = (block[:, :, :4] - params[:, :, 0:4]) / params[:, :, 4:8]
    # bounds first: np.clip(x, 0, w) keeps a -0.0, and maximum/minimum return their first argument on a tie
    np.maximum(np.float32(0), boxes, out=boxes)
    np.minimum(params[:, :, 8:12], boxes, out=boxes)
    scores = block[:, :, 4].copy()
    classes = block[:, :, 5].astype(np.int32)
    return [Detections(boxes[i, :c], scores[i, :c], classes[i, :c]) for i, c in enumerate(n)]


@dataclass(frozen=True, slots=True)
class Detections:
    """Detections of one frame: parallel arrays ``xyxy`` (n, 4) float32, ``score`` (n,) float32,
    ``class_id`` (n,) int32, sorted by descending score."""

    xyxy: np.ndarray
    score: np.ndarray
    class_id: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.score)
        if self.xyxy.shape != (n, 4) or self.class_id.shape != (n,):
            raise ValueError(
                f"Detections: expected xyxy (n, 4), score (n,), class_id (n,); got "
                f"{self.xyxy.shape}, {self.score.shape}, {self.class_id.shape}"
            )

    @classmethod
    def empty(cls) -> Detections:
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.score)


@dataclass(slots=True)
class FrameResult:
    """What the pipeline says about one frame; the worker's output edge (``streamd.worker.output``) turns it,
    with its analytics, into one JSON line."""

    frame: Frame
    detections: Detections  # boxes in source pixels
    latency_ms: dict[str, float] = field(default_factory=dict)
