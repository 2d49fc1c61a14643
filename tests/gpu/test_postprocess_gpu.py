"""GPU postprocess (decode + top-K + NMS) vs its CPU twin, on the device.

Same detections: same count, same classes, boxes matched in order with IoU >= 0.99 (and, by construction of
the kernel's arithmetic, bit-identical values, checked too). Cases: YOLOv8 8400 x 80, every candidate above
threshold, no detection at all, max_det overflow, top_k selection with many exact score ties, odd sizes,
float16 outputs, YOLOv5 and end-to-end layouts, real NanoDet outputs on real frames. The result buffer is
poisoned before each run; rows past each count must come back zeroed.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec
from streamd.types import Detections
from tests.conftest import CLIP, MODEL
from tests.gpu._helpers import POISON, to_device
from tests.gpu.reference import synthetic_output

pytestmark = pytest.mark.gpu

# name: (layout, batch, n, classes, score_thr, iou_thr, max_det, top_k, positive fraction, input size, dtype)
CASES = {
    "yolov8-8400x80": ("yolov8", 4, 8400, 80, 0.25, 0.45, 100, 1000, 0.03, (640, 640), "float32"),
    "yolov8-8400x80-all-above": ("yolov8", 2, 8400, 80, 0.0, 0.45, 300, 1000, 1.0, (640, 640), "float32"),
    "yolov8-none-above": ("yolov8", 3, 8400, 80, 0.99, 0.45, 100, 1000, 0.0, (640, 640), "float32"),
    "yolov8-max-det-overflow": ("yolov8", 3, 3549, 80, 0.1, 0.5, 7, 1000, 0.5, (416, 416), "float32"),
    "yolov8-odd-642x362": ("yolov8", 5, 997, 3, 0.3, 0.5, 50, 300, 0.3, (642, 362), "float32"),
    "yolov8-topk4096-ties": ("yolov8", 2, 8400, 2, 0.0, 0.7, 4096, 4096, 1.0, (640, 640), "float32"),
    "yolov8-topk7": ("yolov8", 2, 1000, 5, 0.2, 0.5, 100, 7, 0.5, (640, 640), "float32"),
    "yolov8-fp16": ("yolov8", 3, 8400, 80, 0.25, 0.45, 100, 1000, 0.05, (640, 640), "float16"),
    "yolov5-25200x80": ("yolov5", 2, 25200, 80, 0.25, 0.45, 100, 1000, 0.02, (640, 640), "float32"),
    "yolov5-fp16-odd": ("yolov5", 3, 1001, 11, 0.2, 0.6, 30, 500, 0.3, (642, 362), "float16"),
    "end2end-300": ("end2end", 4, 300, 80, 0.3, 0.5, 100, 1000, 0.5, (640, 640), "float32"),
    "end2end-max-det": ("end2end", 2, 300, 80, 0.0, 0.5, 20, 50, 1.0, (640, 640), "float32"),
    "batch-64": ("yolov8", 64, 8400, 80, 0.25, 0.45, 100, 1000, 0.03, (640, 640), "float32"),
}


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise IoU of two (n, 4) xyxy arrays."""
    iw = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0, None)
    inter = iw * ih
    union = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), (a == b).all(1).astype(np.float32))


def assert_same(got: list[Detections], want: list[Detections], what: str) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert len(g) == len(w), f"{what} frame {i}: {len(g)} detections, CPU twin has {len(w)}"
        assert np.array_equal(g.class_id, w.class_id), f"{what} frame {i}: classes differ"
        if len(g):
            iou = box_iou(g.xyxy, w.xyxy)
            assert iou.min() >= 0.99, f"{what} frame {i}: box IoU {iou.min():.4f} < 0.99"
            np.testing.assert_allclose(g.score, w.score, rtol=1e-6, err_msg=f"{what} frame {i}: scores")
        # The kernel reproduces numpy's float32 arithmetic, so the results are bit-identical.
        assert np.array_equal(g.xyxy, w.xyxy) and np.array_equal(g.score, w.score), (
            f"{what} frame {i}: not bit-identical"
        )


def run_gpu(
    ctx: object, loader: object, stream: object, spec: PostprocessSpec, raw: np.ndarray, n: int, dtype: str
) -> list[Detections]:
    from streamd.stages.postprocess.cuda import GpuPostprocessor

    batch = raw.shape[0]
    post = GpuPostprocessor(spec, ctx, max_batch=batch, num_anchors=n, dtype=dtype, loader=loader)
    assert post.input_shape(batch) == raw.shape
    dev = to_device(raw.astype(np.float16 if dtype == "float16" else np.float32), stream)
    results, host = post.new_results(), post.new_host_results()
    results.buffer.fill_u8(POISON, stream)
    host.buffer.array()[:] = 0x5A
    post(dev, batch, stream, results)
    results.download(host, stream, batch)
    stream.synchronize()
    counts = host.counts[:batch].copy()
    assert ((counts >= 0) & (counts <= spec.max_detections)).all(), f"counts not written: {counts}"
    for i, c in enumerate(counts):
        assert not np.isnan(host.det[i, :c]).any(), f"frame {i}: unwritten detection rows"
        assert (host.det[i, c:] == 0).all(), f"frame {i}: rows past the count are not zeroed"
    out = host.detections(batch)
    for obj in (post, results, host, dev):
        obj.close()
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_matches_cpu_twin(ctx: object, loader: object, stream: object, case: str) -> None:
    layout, batch, n, classes, thr, iou, max_det, top_k, positive, size, dtype = CASES[case]
    rng = np.random.default_rng(len(case) * 7919 + batch)
    raw = synthetic_output(rng, layout, batch, n, classes, positive=positive, size=size)
    spec = PostprocessSpec(layout, classes, thr, iou, max_det, top_k)
    got = run_gpu(ctx, loader, stream, spec, raw, n, dtype)
    host_raw = raw.astype(np.float16).astype(np.float32) if dtype == "float16" else raw
    want = CpuPostprocessor(spec)(host_raw)
    assert_same(got, want, case)
    if case.endswith("none-above"):
        assert all(len(d) == 0 for d in got)
    if case.endswith("max-det-overflow"):
        assert all(len(d) == max_det for d in got)


def test_streams_share_scratch_safely(ctx: object, loader: object) -> None:
    """Back-to-back calls on two streams (scratch shared): each result equals the CPU twin."""
    from streamd.gpu.cuda import Stream
    from streamd.stages.postprocess.cuda import GpuPostprocessor

    spec = PostprocessSpec("yolov8", 80, 0.25, 0.45, 100, 1000)
    rng = np.random.default_rng(3)
    raws = [synthetic_output(rng, "yolov8", 8, 8400, 80, positive=0.05) for _ in range(4)]
    s1, s2 = Stream(ctx, priority=0), Stream(ctx, priority=-1)
    devs = [to_device(r, s1) for r in raws]
    post = GpuPostprocessor(spec, ctx, max_batch=8, num_anchors=8400, loader=loader)
    pairs = [(post.new_results(), post.new_host_results()) for _ in raws]
    for k, (dev, (res, host)) in enumerate(zip(devs, pairs, strict=True)):
        s = s1 if k % 2 == 0 else s2
        res.buffer.fill_u8(POISON, s)
        post(dev, 8, s, res)
        res.download(host, s, 8)
    s1.synchronize()
    s2.synchronize()
    cpu = CpuPostprocessor(spec)
    for k, (_, host) in enumerate(pairs):
        assert_same(host.detections(8), cpu(raws[k]), f"call {k}")
    post.close()


def test_real_detector_outputs(ctx: object, loader: object, stream: object) -> None:
    """NanoDet (ONNX Runtime, CPU) on real frames preprocessed on the GPU; GPU NMS equals the CPU twin."""
    ort = pytest.importorskip("onnxruntime")
    import cv2

    from streamd.gpu.cuda import DeviceBuffer
    from streamd.stages.preprocess.cpu import PreprocessSpec
    from streamd.stages.preprocess.cuda import GpuPreprocessor, PackedSurface

    cap = cv2.VideoCapture(str(CLIP))
    images = []
    for k in range(400):
        ok, frame = cap.read()
        if not ok:
            break
        if k % 100 == 0:
            images.append(frame)
    cap.release()
    assert len(images) == 4
    pre_spec = PreprocessSpec(416, 416, "bgr", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395))
    pre = GpuPreprocessor(pre_spec, ctx, max_batch=4, dtype="float32", loader=loader)
    devs = [to_device(img, stream) for img in images]
    surfaces = [
        PackedSurface(d.ptr, i.shape[1], i.shape[0], i.strides[0]) for d, i in zip(devs, images, strict=True)
    ]
    tensor = DeviceBuffer(pre.output_nbytes(4))
    pre(surfaces, tensor, stream)
    blob = np.empty(pre.output_shape(4), np.float32)
    tensor.download(blob, stream)
    stream.synchronize()
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    raw = session.run(None, {session.get_inputs()[0].name: blob})[0].astype(np.float32)  # [4, 84, 3549]
    spec = PostprocessSpec("yolov8", 80, 0.35, 0.5, 100, 1000)
    got = run_gpu(ctx, loader, stream, spec, raw, raw.shape[2], "float32")
    want = CpuPostprocessor(spec)(raw)
    assert sum(len(d) for d in want) > 0, "the real frames should give detections"
    assert_same(got, want, "nanodet")
    for obj in (pre, tensor, *devs):
        obj.close()
