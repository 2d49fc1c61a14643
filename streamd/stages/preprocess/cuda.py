"""GPU preprocess (kernels/preprocess.cu): a batch of device frames -> normalised NCHW engine input.

Input per frame: an :class:`Nv12Surface` (two planes with pitches, any even or odd size, BT.601/BT.709,
limited or full range) or a :class:`PackedSurface` (8-bit BGR/RGB rows with a pitch). Output: ``[B, 3, H, W]``
float32 or float16 written at a device address (the engine's input tensor). Same resize convention as the CPU
twin (``streamd.stages.preprocess.cpu``), whose :func:`compute_transform` gives each frame's transform.
NV12 -> RGB follows ``streamd.stages.preprocess.colour`` (its coefficients, chroma siting and interpolation:
chroma of the 2 x 2 block, no rounding before the resize), the CPU decoder's conversion too.

One launch per batch; the per-frame parameters travel in a small device array, uploaded from a pinned staging
ring on the caller's stream (each ring entry is reused only after the work that read it has finished).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamd.gpu.cuda import Context, DeviceBuffer, Event, PinnedBuffer, Stream, copy_htod, device_pointer
from streamd.gpu.kernels import KernelLoader, PackedArgs
from streamd.stages.preprocess.colour import yuv_coefficients
from streamd.stages.preprocess.spec import PreprocessSpec, compute_transform
from streamd.types import Nv12Surface, PackedSurface, Surface, Transform

# Mirrors struct FrameParams in kernels/preprocess.cu (8-byte fields first; 96 bytes).
FRAME_DTYPE = np.dtype(
    [
        ("src0", "<u8"), ("src1", "<u8"), ("sx", "<f8"), ("sy", "<f8"),
        ("pitch0", "<i4"), ("pitch1", "<i4"), ("src_w", "<i4"), ("src_h", "<i4"),
        ("format", "<i4"), ("uv16", "<i4"), ("x0", "<i4"), ("y0", "<i4"), ("rw", "<i4"), ("rh", "<i4"),
        ("y_mul", "<f4"), ("y_add", "<f4"), ("r_v", "<f4"), ("g_u", "<f4"), ("g_v", "<f4"), ("b_u", "<f4"),
    ],
    align=True,
)  # fmt: skip
assert FRAME_DTYPE.itemsize == 96, FRAME_DTYPE.itemsize

FORMAT_NV12, FORMAT_BGR, FORMAT_RGB = 0, 1, 2
DTYPES = {"float32": np.float32, "float16": np.float16}


class Normalise(ctypes.Structure):
    """Mirrors struct Normalise in kernels/preprocess.cu (passed by value)."""

    _fields_ = [
        ("scale", ctypes.c_float * 3),
        ("scale255", ctypes.c_float * 3),
        ("shift", ctypes.c_float * 3),
        ("pad", ctypes.c_float * 3),
    ]


def frame_params(
    surfaces: Sequence[Surface], spec: PreprocessSpec, out: np.ndarray | None = None
) -> tuple[np.ndarray, list[Transform]]:
    """Per-frame kernel parameters (FRAME_DTYPE records) and the letterbox transforms, one per surface.

    Everything but the plane addresses depends only on a frame's geometry (size, pitches, colour matrix and
    range, channel order, the parity of the UV address), so each geometry's record is built once
    (``_record``) and a batch is a broadcast plus two address columns: filling the structured array from
    per-frame tuples was the S1 thread's largest cost at batch 32."""
    params = np.zeros(len(surfaces), FRAME_DTYPE) if out is None else out[: len(surfaces)]
    records, transforms, src0, src1 = [], [], [], []
    known = _RECORDS.setdefault(spec, {})  # hashing the spec once per batch, not per frame
    for i, s in enumerate(surfaces):
        if isinstance(s, Nv12Surface):
            key: tuple = (s.width, s.height, s.y_pitch, s.uv_pitch, s.matrix, s.full_range, s.uv_ptr & 1)
            src0.append(s.y_ptr)
            src1.append(s.uv_ptr)
        elif isinstance(s, PackedSurface):
            key = (s.width, s.height, s.pitch, s.order)
            src0.append(s.ptr)
            src1.append(0)
        else:
            raise TypeError(f"frame {i}: expected Nv12Surface or PackedSurface, got {type(s).__name__}")
        entry = known.get(key)
        if entry is None:
            if len(known) > 256:  # a source changing size all the time must not grow this without bound
                known.clear()
            entry = known[key] = _record(key, spec)
        record, t = entry
        records.append(record)
        transforms.append(t)
    if records:
        first = records[0]
        params[:] = first if all(r is first for r in records) else np.concatenate(records)
        params["src0"] = src0
        params["src1"] = src1
    return params, transforms


_RECORDS: dict[PreprocessSpec, dict[tuple, tuple[np.ndarray, Transform]]] = {}


def _record(key: tuple, spec: PreprocessSpec) -> tuple[np.ndarray, Transform]:
    """One geometry's FRAME_DTYPE record (plane addresses 0) and transform. ``key``: (width, height, y pitch,
    uv pitch, matrix, full range, uv address odd) for NV12, (width, height, pitch, order) for packed."""
    width, height = key[0], key[1]
    t, nw, nh = compute_transform(width, height, spec)
    if len(key) == 7:
        pitches, fmt = (key[2], key[3]), FORMAT_NV12
        uv16 = int(key[6] == 0 and key[3] % 2 == 0)
        coefficients = _kernel_yuv(key[4], key[5])
    else:
        pitches, fmt = (key[2], 0), (FORMAT_BGR if key[3] == "bgr" else FORMAT_RGB)
        uv16, coefficients = 0, _NO_YUV
    record = np.zeros(1, FRAME_DTYPE)
    # Field order of FRAME_DTYPE; the scales are derived as OpenCV derives them (1 / (dst / src)).
    record[0] = (
        0,
        0,
        1.0 / (nw / width),
        1.0 / (nh / height),
        *pitches,
        width,
        height,
        fmt,
        uv16,
        int(t.pad_x),
        int(t.pad_y),
        nw,
        nh,
        *coefficients,
    )
    record.flags.writeable = False  # shared by every batch with this geometry
    return record, t


_NO_YUV = (0.0,) * 6


def _kernel_yuv(matrix: str, full_range: bool) -> tuple[float, ...]:
    """Kernel coefficients in units of 255, luma as one multiply-add: y_mul, y_add, r_v, g_u, g_v, b_u."""
    y_off, y_gain, *chroma = yuv_coefficients(matrix, full_range)
    return (y_gain / 255.0, -y_off * y_gain / 255.0, *(c / 255.0 for c in chroma))


def normalise_params(spec: PreprocessSpec) -> Normalise:
    """Scale, shift and pad value per output channel, in float32 exactly as the CPU twin computes them."""
    scale = np.float32(1.0) / np.asarray(spec.std, np.float32)
    shift = np.asarray(spec.mean, np.float32) / np.asarray(spec.std, np.float32)
    pad = np.float32(spec.pad_value) * scale - shift
    norm = Normalise()
    norm.scale[:], norm.shift[:], norm.pad[:] = scale.tolist(), shift.tolist(), pad.tolist()
    norm.scale255[:] = (np.float32(255.0) * scale).tolist()
    return norm


def launch_grid(spec: PreprocessSpec, batch: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of one launch: 32 x 8 threads per block, two horizontal output pixels per thread (a
    64 x 8 tile), z = frame."""
    return ((spec.width + 63) // 64, (spec.height + 7) // 8, batch), (32, 8, 1)


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """Parameters of one batch, uploaded to ring entry ``entry`` at ``params_ptr``."""

    entry: int
    params_ptr: int
    batch: int
    transforms: list[Transform]


class GpuPreprocessor:
    """Letterbox/stretch + colour conversion + normalisation of a batch of device frames, one launch.

    ``pre(surfaces, out, stream)`` enqueues the work on ``stream`` and returns each frame's
    :class:`Transform` (model-input pixels -> source pixels) immediately; ``out`` is the device address of a
    ``[len(surfaces), 3, spec.height, spec.width]`` tensor of ``dtype`` (int, DeviceBuffer or torch tensor).
    The source frames must stay valid until the stream has passed this point (record an event).
    """

    def __init__(
        self,
        spec: PreprocessSpec,
        ctx: Context,
        *,
        max_batch: int,
        dtype: str = "float16",
        loader: KernelLoader | None = None,
        ring: int = 8,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"GpuPreprocessor: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if spec.resize not in ("letterbox", "stretch") or spec.channel_order not in ("rgb", "bgr"):
            raise ValueError(f"GpuPreprocessor: unsupported spec {spec}")
        if max_batch < 1 or max_batch > 65535:
            raise ValueError(f"GpuPreprocessor: max_batch must be in 1..65535, got {max_batch}")
        self.spec, self.ctx, self.max_batch, self.dtype = spec, ctx, max_batch, dtype
        self._owns_loader = loader is None
        self.loader = loader or KernelLoader(ctx)
        self.kernel = self.loader.kernel(
            "preprocess", "preprocess_f16" if dtype == "float16" else "preprocess_f32"
        )
        self._norm = normalise_params(spec)
        self._rgb = ctypes.c_int(1 if spec.channel_order == "rgb" else 0)
        stride = max_batch * FRAME_DTYPE.itemsize
        self._stride = stride
        self._host = PinnedBuffer(ring * stride)
        self._dev = DeviceBuffer(ring * stride)
        self._staging = [self._host.array(FRAME_DTYPE, max_batch, offset=k * stride) for k in range(ring)]
        self._events: list[Event | None] = [None] * ring
        self._packed: dict[tuple[int, int], PackedArgs] = {}  # launch arguments per (params, output)
        self._next = 0

    def output_shape(self, batch: int) -> tuple[int, int, int, int]:
        return (batch, 3, self.spec.height, self.spec.width)

    def output_nbytes(self, batch: int) -> int:
        return batch * 3 * self.spec.height * self.spec.width * np.dtype(DTYPES[self.dtype]).itemsize

    def __call__(self, surfaces: Sequence[Surface], out: object, stream: Stream) -> list[Transform]:
        """Upload the batch's parameters and launch the kernel on ``stream``; returns the transforms."""
        if not surfaces:
            return []
        prepared = self.prepare(surfaces, stream)
        self.launch(prepared, out, stream)
        return prepared.transforms

    def prepare(self, surfaces: Sequence[Surface], stream: Stream) -> PreparedBatch:
        """Pack and upload (asynchronously on ``stream``) the per-frame parameters into the next ring entry.

        The entry stays valid for launches until ``ring`` more batches have been prepared.
        """
        batch = len(surfaces)
        if not 1 <= batch <= self.max_batch:
            raise ValueError(
                f"GpuPreprocessor: batch of {batch} frames outside 1..max_batch ({self.max_batch})"
            )
        k = self._next
        self._next = (k + 1) % len(self._staging)
        pending = self._events[k]
        if pending is not None:
            pending.synchronize()  # the copy and kernels that last used this ring entry are done
        _, transforms = frame_params(surfaces, self.spec, out=self._staging[k])
        offset = k * self._stride
        copy_htod(self._dev.ptr + offset, self._host.ptr + offset, batch * FRAME_DTYPE.itemsize, stream)
        return PreparedBatch(k, self._dev.ptr + offset, batch, transforms)

    def launch(self, prepared: PreparedBatch, out: object, stream: Stream) -> None:
        """Enqueue the kernel for a prepared batch, writing ``[batch, 3, H, W]`` at ``out``."""
        grid, block = launch_grid(self.spec, prepared.batch)
        key = (prepared.params_ptr, device_pointer(out))
        args = self._packed.get(key)
        if args is None:  # ring entries x output buffers: a few dozen in a pipeline
            if len(self._packed) > 256:
                self._packed.clear()
            args = self._packed[key] = PackedArgs(
                (
                    ctypes.c_uint64(key[0]),
                    ctypes.c_uint64(key[1]),
                    ctypes.c_int(self.spec.width),
                    ctypes.c_int(self.spec.height),
                    self._rgb,
                    self._norm,
                )
            )
        self.kernel.launch(stream, grid, block, args)
        event = self._events[prepared.entry] or Event()
        event.record(stream)
        self._events[prepared.entry] = event

    def close(self) -> None:
        for ev in self._events:
            if ev is not None:
                ev.synchronize()
                ev.close()
        self._events = [None] * len(self._events)
        self._dev.close()
        self._host.close()
        if self._owns_loader:
            self.loader.close()
