"""GPU NMS with a class filter and per-class thresholds (per-frame [B, C] table) vs the CPU twin, on a GPU.

Same detections, bit-identical (the kernel reproduces numpy's float32 arithmetic), for every layout, float16
outputs, per-stream rows that differ frame by frame, max_detections spent on wanted classes only, and real
NanoDet outputs on vtest frames filtered to person. Skips cleanly without a GPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamd.stages.postprocess.cpu import ClassThresholds, CpuPostprocessor, PostprocessSpec
from streamd.types import Detections
from tests.conftest import CLIP, MODEL
from tests.gpu.reference import synthetic_output

pytestmark = pytest.mark.gpu

POISON = 0xFF


def to_device(array: np.ndarray, stream: object) -> object:
    from streamd.gpu.cuda import DeviceBuffer

    buf = DeviceBuffer(array.nbytes)
    buf.upload(np.ascontiguousarray(array), stream)  # type: ignore[arg-type]
    stream.synchronize()  # type: ignore[attr-defined]
    return buf


def assert_same(got: list[Detections], want: list[Detections], what: str) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert len(g) == len(w), f"{what} frame {i}: {len(g)} detections, CPU twin has {len(w)}"
        assert np.array_equal(g.class_id, w.class_id), f"{what} frame {i}: classes differ"
        assert np.array_equal(g.xyxy, w.xyxy) and np.array_equal(g.score, w.score), (
            f"{what} frame {i}: not bit-identical"
        )


def run_gpu(ctx, loader, stream, spec, raw, n, dtype, stream_ids) -> list[Detections]:
    from streamd.stages.postprocess.cuda import GpuPostprocessor

    batch = raw.shape[0]
    post = GpuPostprocessor(spec, ctx, max_batch=batch, num_anchors=n, dtype=dtype, loader=loader)
    dev = to_device(raw.astype(np.float16 if dtype == "float16" else np.float32), stream)
    results, host = post.new_results(), post.new_host_results()
    results.buffer.fill_u8(POISON, stream)
    post(dev, batch, stream, results, stream_ids)
    results.download(host, stream, batch)
    stream.synchronize()
    out = host.detections(batch)
    for obj in (post, results, host, dev):
        obj.close()
    return out


def table_for(num_classes: int) -> ClassThresholds:
    """Default: classes 0 and 2 only, class 2 at 0.5; stream 'b': every class at 0.3; stream 'c': class 1."""
    default = [math.inf] * num_classes
    default[0], default[2 % num_classes] = 0.25, 0.5
    only_one = [math.inf] * num_classes
    only_one[1 % num_classes] = 0.2
    return ClassThresholds(default, {"b": [0.3] * num_classes, "c": only_one})


CASES = {  # layout, batch, n, classes, score_thr, max_det, top_k, positive, dtype
    "yolov8": ("yolov8", 6, 8400, 80, 0.25, 100, 1000, 0.05, "float32"),
    "yolov8-max-det": ("yolov8", 3, 3549, 80, 0.1, 5, 1000, 0.5, "float32"),
    "yolov8-fp16": ("yolov8", 3, 8400, 80, 0.25, 100, 1000, 0.05, "float16"),
    "yolov5": ("yolov5", 3, 25200, 80, 0.25, 100, 1000, 0.02, "float32"),
    "end2end": ("end2end", 3, 300, 80, 0.3, 100, 1000, 0.5, "float32"),
    "few-classes": ("yolov8", 4, 997, 3, 0.2, 50, 300, 0.3, "float32"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_class_filter_matches_cpu_twin(ctx, loader, stream, case: str) -> None:
    layout, batch, n, classes, thr, max_det, top_k, positive, dtype = CASES[case]
    rng = np.random.default_rng(len(case) * 31 + batch)
    raw = synthetic_output(rng, layout, batch, n, classes, positive=positive)
    spec = PostprocessSpec(layout, classes, thr, 0.45, max_det, top_k, thresholds=table_for(classes))
    ids = [("a", "b", "c")[i % 3] for i in range(batch)]
    got = run_gpu(ctx, loader, stream, spec, raw, n, dtype, ids)
    host_raw = raw.astype(np.float16).astype(np.float32) if dtype == "float16" else raw
    want = CpuPostprocessor(spec)(host_raw, ids)
    assert sum(len(d) for d in want) > 0
    assert_same(got, want, case)
    allowed = {"a": {0, 2 % classes}, "b": set(range(classes)), "c": {1 % classes}}
    for sid, det in zip(ids, got, strict=True):
        assert set(det.class_id.tolist()) <= allowed[sid], (case, sid, det.class_id)


def test_real_frames_person_only(ctx, loader, stream) -> None:
    """NanoDet on vtest frames: GPU NMS with classes [person] equals the CPU twin, and equals the unfiltered
    run's person boxes."""
    ort = pytest.importorskip("onnxruntime")
    import cv2

    from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec

    cap = cv2.VideoCapture(str(CLIP))
    pre = CpuPreprocessor(PreprocessSpec(416, 416, "bgr", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395)))
    blob = np.empty((8, 3, 416, 416), np.float32)
    for k in range(8):
        for _ in range(50):
            ok, frame = cap.read()
            assert ok
        pre(frame, blob[k])
    cap.release()
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    raw = session.run(None, {session.get_inputs()[0].name: blob})[0].astype(np.float32)
    row = [0.35] + [math.inf] * 79
    spec = PostprocessSpec("yolov8", 80, 0.35, 0.5, 100, 1000, thresholds=ClassThresholds(row))
    ids = ["demo"] * 8
    got = run_gpu(ctx, loader, stream, spec, raw, raw.shape[2], "float32", ids)
    want = CpuPostprocessor(spec)(raw, ids)
    assert_same(got, want, "nanodet person")
    plain = CpuPostprocessor(PostprocessSpec("yolov8", 80, 0.35, 0.5, 100, 1000))(raw)
    for g, p in zip(got, plain, strict=True):
        mask = p.class_id == 0
        assert np.array_equal(g.xyxy, p.xyxy[mask]), "person boxes differ from the unfiltered run"
    print(f"person boxes on 8 frames: {sum(len(g) for g in got)} (GPU == CPU, == unfiltered persons)")


def test_a_stream_row_set_while_running_switches_the_kernel_to_the_table_and_back(
    ctx, loader, stream
) -> None:
    """A reload changes a stream's classes (``ClassThresholds.set_stream``) while the same postprocessor and
    results buffers run on: the scalar threshold (table not active), then the table, then the scalar again,
    each call equal to the CPU twin then (the packed-argument cache is keyed on the table's pointer)."""
    from streamd.stages.postprocess.cuda import GpuPostprocessor

    layout, batch, n, classes, thr = "yolov8", 4, 3549, 80, 0.25
    raw = synthetic_output(np.random.default_rng(7), layout, batch, n, classes, positive=0.05)
    table = ClassThresholds([thr] * classes, plain=thr)
    spec = PostprocessSpec(layout, classes, thr, 0.45, 100, 1000, thresholds=table)
    post = GpuPostprocessor(spec, ctx, max_batch=batch, num_anchors=n, dtype="float32", loader=loader)
    dev = to_device(raw.astype(np.float32), stream)
    results, host = post.new_results(), post.new_host_results()
    ids = ["a", "b", "a", "b"]
    person_only = [thr] + [math.inf] * (classes - 1)
    try:
        for step, row in enumerate((None, person_only, None)):
            table.set_stream("a", row)
            assert table.active == (row is not None)
            results.buffer.fill_u8(POISON, stream)
            post(dev, batch, stream, results, ids)
            results.download(host, stream, batch)
            stream.synchronize()
            got = host.detections(batch)
            want = CpuPostprocessor(spec)(raw, ids)
            assert_same(got, want, f"step {step}")
            if row is not None:
                assert set(got[0].class_id.tolist()) <= {0} and len(set(got[1].class_id.tolist())) > 1
    finally:
        for obj in (post, results, host, dev):
            obj.close()
