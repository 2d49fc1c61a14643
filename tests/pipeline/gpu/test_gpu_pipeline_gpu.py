"""The whole GPU pipeline (three CUDA streams, preprocess kernel, torch engine, NMS kernel) against its CPU
twin (OpenCV/numpy preprocess, ONNX Runtime CPU, numpy NMS) on the bundled clips. The GPU side decodes with
NVDEC, the CPU side with FFmpeg (via OpenCV): their luma is bit-identical (tests/decode/gpu), chroma
conversion differs slightly, so the comparison is on detections (IoU >= 0.95 matched), not bits.
Skipped without CUDA + torch (+ onnx2torch)."""

from __future__ import annotations

import importlib.util
import json

import cv2
import numpy as np
import pytest

from streamd.config import load_config
from streamd.engines import create_engine
from streamd.stages.cpu import CpuStages
from streamd.stages.postprocess.cpu import PostprocessSpec
from streamd.stages.postprocess.resolve import resolve_layout
from streamd.stages.preprocess.cpu import PreprocessSpec
from streamd.types import Frame
from tests.conftest import CLIP, CLIP_HEVC, MODEL, run_streamd
from tests.test_reference_detections import NANODET_MODEL


def _cuda_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("cuda") is None:
        return "cuda-python (cuda.bindings) is not installed"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))]


def gpu_run(tmp_path, precision: str) -> dict[tuple[str, int], dict]:
    """The daemon with engine torch: NVDEC (when PyNvVideoCodec is there), kernels, three CUDA stages (two
    engine lanes: consecutive batches in inference at once)."""
    out = tmp_path / f"gpu-{precision}.jsonl"
    cfg = tmp_path / f"gpu-{precision}.yaml"
    cfg.write_text(
        f"streams:\n  - id: h264\n    url: {CLIP}\n  - id: hevc\n    url: {CLIP_HEVC}\n{NANODET_MODEL}"
        f"engine:\n  type: torch\n  precision: {precision}\n  max_batch: 16\n  lanes: 2\n  compile: false\n"
        f"pipeline:\n  batch_size: 16\n  ring_slots: 4\nsinks:\n  - type: jsonl\n    path: {out}\n"
    )
    proc = run_streamd("run", str(cfg), "--no-status", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return {(r["stream"], r["frame"]): r for r in records}


def cpu_twin(clip, stream_id: str) -> dict[tuple[str, int], list[dict]]:
    """The CPU stages (OpenCV/numpy preprocess, ONNX Runtime, numpy NMS) on frames OpenCV decodes (the GPU
    box has no PyAV), driven slot by slot in-process (``collect`` gives boxes in source pixels)."""
    config = load_config(None)
    m = config.model
    engine = create_engine("onnxruntime", MODEL, max_batch=16)
    pre = PreprocessSpec(*m.input_size, m.channel_order, tuple(m.mean), tuple(m.std), m.resize, m.pad_value)
    layout = resolve_layout(m.layout, engine.output_shape, len(m.class_names))
    post = PostprocessSpec(layout, len(m.class_names), m.score_threshold, m.iou_threshold, m.max_detections)
    stages = CpuStages(engine, pre, post)
    slot = stages.new_slot(0)
    cap = cv2.VideoCapture(str(clip))
    frames, out, index = [], {}, 0

    def flush() -> None:
        slot.frames = frames[:]
        stages.preprocess(slot)
        stages.infer(slot)
        stages.postprocess(slot)
        for f, det in zip(slot.frames, stages.collect(slot), strict=True):  # source pixels
            out[(stream_id, f.index)] = [
                {"class_id": int(c), "score": float(s), "box": b.tolist()}
                for c, s, b in zip(det.class_id, det.score, det.xyxy, strict=True)
            ]
        frames.clear()

    while True:
        ok, image = cap.read()
        if not ok:
            break
        frames.append(Frame(stream_id, index, None, image.shape[1], image.shape[0], image=image))
        index += 1
        if len(frames) == 16:
            flush()
    if frames:
        flush()
    stages.close()
    return out


def iou(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_pipeline_matches_cpu_twin(tmp_path, precision: str) -> None:
    cpu = {**cpu_twin(CLIP, "h264"), **cpu_twin(CLIP_HEVC, "hevc")}
    gpu = gpu_run(tmp_path, precision)
    assert set(gpu) == set(cpu) and len(cpu) == 795 + 100
    matched = total = 0
    margin = 0.03 if precision == "fp32" else 0.06  # near-threshold detections may flip either way
    for key, ref in cpu.items():
        got = gpu[key]["detections"]
        for d in ref:
            if d["score"] < 0.35 + margin:
                continue
            total += 1
            best = max((iou(d["box"], g["box"]) for g in got if g["class_id"] == d["class_id"]), default=0.0)
            matched += best >= 0.95
        assert gpu[key]["latency_ms"]["infer"] >= 0
    rate = matched / total
    print(f"{precision}: {matched}/{total} strong CPU detections matched by the GPU pipeline (IoU >= 0.95)")
    assert total > 3000 and rate >= (0.99 if precision == "fp32" else 0.97)
    per_frame = np.array([len(gpu[k]["detections"]) - len(cpu[k]) for k in cpu])
    assert np.abs(per_frame).mean() < 0.3
