"""GPU preprocess vs its CPU twin, on the device.

The reference for NV12 input converts NV12 -> BGR in float (tests/gpu/reference.py, independent of the
kernel) and hands the float image to the CPU twin (``CpuPreprocessor``: cv2.resize INTER_LINEAR, pad,
normalise). Packed BGR/RGB input goes straight to the CPU twin. Max abs error <= 1e-3 (float32) and <= 1e-2
(float16); outputs are poisoned (NaN) before each run and a guard region after the tensor must stay poisoned.
"""

from __future__ import annotations

import zlib

import cv2
import numpy as np
import pytest

from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec, compute_transform
from tests.conftest import CLIP
from tests.gpu._helpers import POISON, from_device
from tests.gpu.reference import bgr_to_nv12, nv12_to_bgr_float, random_nv12

pytestmark = pytest.mark.gpu

IMAGENET = ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))
SPECS = {
    "letterbox640-rgb-imagenet": PreprocessSpec(640, 640, "rgb", *IMAGENET, "letterbox", 114),
    "letterbox416-bgr-nanodet": PreprocessSpec(
        416, 416, "bgr", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395), "letterbox", 114
    ),
    "stretch320x256-rgb-unit": PreprocessSpec(320, 256, "rgb", resize="stretch", pad_value=0),
    "letterbox333x211-rgb-pad0": PreprocessSpec(
        333, 211, "rgb", (10.0, 20.0, 30.0), (60.0, 70.0, 80.0), pad_value=0
    ),
}
SIZES = [(642, 362), (1920, 1080), (361, 643), (7, 5), (640, 640), (1, 1), (1279, 719), (3840, 2160)]
TOL = {"float32": 1e-3, "float16": 1e-2}
GUARD = 4096


class DeviceFrames:
    """Frames uploaded into one device buffer; ``surfaces`` describes them for the preprocessor."""

    def __init__(self, stream: object) -> None:
        self.stream = stream
        self.chunks: list[bytes] = []
        self.layout: list[tuple] = []
        self.size = 0
        self.buffer = None

    def _add(self, plane: np.ndarray, pitch: int) -> int:
        rows, width = plane.shape[0], plane.shape[1] * (plane.shape[2] if plane.ndim == 3 else 1)
        padded = np.full((rows, pitch), 0xA5, np.uint8)
        padded[:, :width] = plane.reshape(rows, width)
        offset = self.size
        self.chunks.append(padded.tobytes())
        self.size += padded.nbytes + (-padded.nbytes) % 256
        self.chunks.append(b"\0" * ((-padded.nbytes) % 256))
        return offset

    def nv12(self, y: np.ndarray, uv: np.ndarray, y_pad: int, uv_pad: int, **kw: object) -> None:
        h, w = y.shape
        yo = self._add(y, w + y_pad)
        uvo = self._add(uv, uv.shape[1] + uv_pad)
        self.layout.append(("nv12", yo, uvo, w, h, w + y_pad, uv.shape[1] + uv_pad, kw))

    def packed(self, image: np.ndarray, order: str, pad: int) -> None:
        h, w = image.shape[:2]
        off = self._add(image, 3 * w + pad)
        self.layout.append(("packed", off, w, h, 3 * w + pad, order))

    def surfaces(self) -> list[object]:
        from streamd.gpu.cuda import DeviceBuffer
        from streamd.stages.preprocess.cuda import Nv12Surface, PackedSurface

        if self.buffer is None:
            self.buffer = DeviceBuffer(self.size)
            data = np.frombuffer(b"".join(self.chunks), np.uint8)
            self.buffer.upload(data, self.stream)
            self.stream.synchronize()
        base = self.buffer.ptr
        out = []
        for item in self.layout:
            if item[0] == "nv12":
                _, yo, uvo, w, h, yp, uvp, kw = item
                out.append(Nv12Surface(base + yo, base + uvo, w, h, yp, uvp, **kw))
            else:
                _, off, w, h, pitch, order = item
                out.append(PackedSurface(base + off, w, h, pitch, order))
        return out


def run_gpu(pre: object, surfaces: list, stream: object, dtype: str) -> tuple[np.ndarray, list]:
    """Run the preprocessor into a poisoned buffer; check the guard after the tensor is untouched."""
    from streamd.gpu.cuda import DeviceBuffer

    np_dtype = np.float16 if dtype == "float16" else np.float32
    nbytes = pre.output_nbytes(len(surfaces))
    out = DeviceBuffer(nbytes + GUARD)
    out.fill_u8(POISON, stream)
    transforms = pre(surfaces, out, stream)
    result = from_device(out, pre.output_shape(len(surfaces)), np_dtype, stream)
    guard = from_device(out, (GUARD,), np.uint8, stream, offset=nbytes)
    assert (guard == POISON).all(), "kernel wrote past the end of the output tensor"
    out.close()
    return result.astype(np.float32), transforms


def check_close(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> float:
    assert not np.isnan(got).any(), f"{what}: {int(np.isnan(got).sum())} output elements left unwritten"
    err = float(np.abs(got - want).max())
    assert err <= TOL[dtype], f"{what}: max abs error {err:.3g} > {TOL[dtype]}"
    return err


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_random_frames(
    ctx: object, loader: object, stream: object, size: tuple[int, int], spec_name: str, dtype: str
) -> None:
    """One batch: NV12 (odd pitch), NV12 (even pitch, other matrix/range), packed BGR, packed RGB."""
    from streamd.stages.preprocess.cuda import GpuPreprocessor

    spec = SPECS[spec_name]
    w, h = size
    rng = np.random.default_rng(zlib.crc32(f"{size}{spec_name}".encode()))
    matrix_a, matrix_b = ("bt601", "bt709") if w % 2 else ("bt709", "bt601")
    y1, uv1 = random_nv12(rng, w, h)
    y2, uv2 = random_nv12(rng, w, h, smooth=False)
    bgr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    frames = DeviceFrames(stream)
    frames.nv12(y1, uv1, 3, 1, matrix=matrix_a, full_range=False)
    frames.nv12(y2, uv2, 64, 0, matrix=matrix_b, full_range=True)
    frames.packed(bgr, "bgr", 5)
    frames.packed(np.ascontiguousarray(bgr[:, :, ::-1]), "rgb", 0)

    pre = GpuPreprocessor(spec, ctx, max_batch=4, dtype=dtype, loader=loader)
    got, transforms = run_gpu(pre, frames.surfaces(), stream, dtype)
    pre.close()

    cpu = CpuPreprocessor(spec)
    want = np.empty((4, 3, spec.height, spec.width), np.float32)
    sources = [
        nv12_to_bgr_float(y1, uv1, matrix_a, full_range=False),
        nv12_to_bgr_float(y2, uv2, matrix_b, full_range=True),
        bgr,
        bgr,
    ]
    for i, src in enumerate(sources):
        t = cpu(src, want[i])
        assert transforms[i] == t == compute_transform(w, h, spec)[0]
    for i, name in enumerate(["nv12-limited", "nv12-full", "bgr", "rgb"]):
        check_close(got[i], want[i], dtype, f"{name} {w}x{h} {spec_name} {dtype}")


def real_frames(count: int) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(CLIP))
    frames = []
    for _ in range(count * 40):
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    if len(frames) < count:
        pytest.fail(f"{CLIP}: could not decode {count} frames")
    return frames[:: max(1, len(frames) // count)][:count]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_real_frames_mixed_batch(ctx: object, loader: object, stream: object, dtype: str) -> None:
    """Real video frames, NV12 and packed, at their own size and upscaled to 1080p, in one launch."""
    from streamd.stages.preprocess.cuda import GpuPreprocessor

    spec = SPECS["letterbox640-rgb-imagenet"]
    images = real_frames(3)
    images += [cv2.resize(images[0], (1920, 1080), interpolation=cv2.INTER_AREA)]
    frames = DeviceFrames(stream)
    sources = []
    for img in images:
        y, uv = bgr_to_nv12(img)
        frames.nv12(y, uv, 0, 0, matrix="bt601", full_range=False)
        sources.append(nv12_to_bgr_float(y, uv, "bt601", full_range=False))
        frames.packed(img, "bgr", 0)
        sources.append(img)
    pre = GpuPreprocessor(spec, ctx, max_batch=len(sources), dtype=dtype, loader=loader)
    got, _ = run_gpu(pre, frames.surfaces(), stream, dtype)
    pre.close()
    cpu = CpuPreprocessor(spec)
    for i, src in enumerate(sources):
        want = np.empty((3, spec.height, spec.width), np.float32)
        cpu(src, want)
        check_close(got[i], want, dtype, f"real frame {i}")


def test_batches_reuse_the_parameter_ring(ctx: object, loader: object, stream: object) -> None:
    """More calls than ring entries, each checked: no parameter set is overwritten too early."""
    from streamd.gpu.cuda import DeviceBuffer
    from streamd.stages.preprocess.cuda import GpuPreprocessor

    spec = PreprocessSpec(96, 64)
    rng = np.random.default_rng(7)
    pre = GpuPreprocessor(spec, ctx, max_batch=2, dtype="float32", loader=loader, ring=2)
    frames = DeviceFrames(stream)
    images = [rng.integers(0, 256, (50 + 7 * i, 80 + 5 * i, 3), dtype=np.uint8) for i in range(5)]
    for img in images:
        frames.packed(img, "bgr", 0)
    surfaces = frames.surfaces()
    outs = [DeviceBuffer(pre.output_nbytes(2)) for _ in range(7)]
    for k, out in enumerate(outs):  # enqueue all, then read all back
        out.fill_u8(POISON, stream)
        pre([surfaces[k % 5], surfaces[(k + 2) % 5]], out, stream)
    cpu = CpuPreprocessor(spec)
    for k, out in enumerate(outs):
        got = from_device(out, (2, 3, 64, 96), np.float32, stream)
        for j, idx in enumerate((k % 5, (k + 2) % 5)):
            want = np.empty((3, 64, 96), np.float32)
            cpu(images[idx], want)
            check_close(got[j], want, "float32", f"call {k} frame {j}")
    pre.close()


def test_writes_into_a_torch_tensor(ctx: object, loader: object) -> None:
    """The output can be an engine's torch input tensor, on torch's stream (same primary context)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from streamd.gpu.cuda import Stream
    from streamd.stages.preprocess.cuda import GpuPreprocessor

    spec = SPECS["letterbox416-bgr-nanodet"]
    img = real_frames(1)[0]
    ts = torch.cuda.Stream()
    stream = Stream.borrow(ts.cuda_stream, ctx)
    src = torch.from_numpy(img).to("cuda")
    torch.cuda.synchronize()
    from streamd.stages.preprocess.cuda import PackedSurface

    tensor = torch.full((1, 3, 416, 416), float("nan"), dtype=torch.float16, device="cuda")
    torch.cuda.synchronize()
    pre = GpuPreprocessor(spec, ctx, max_batch=1, dtype="float16", loader=loader)
    pre([PackedSurface(src.data_ptr(), img.shape[1], img.shape[0], img.strides[0], "bgr")], tensor, stream)
    ts.synchronize()
    want = np.empty((3, 416, 416), np.float32)
    CpuPreprocessor(spec)(img, want)
    check_close(tensor[0].float().cpu().numpy(), want, "float16", "torch tensor output")
    pre.close()
    stream.close()
