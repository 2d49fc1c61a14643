"""The whole GPU pipeline (three CUDA streams, preprocess kernel, torch engine, NMS kernel) against its CPU
twin (OpenCV/numpy preprocess, ONNX Runtime CPU, numpy NMS) on the same decoded frames of the bundled clips.
Skipped without CUDA + torch (+ onnx2torch)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from tests.conftest import CLIP, CLIP_HEVC, run_streamd
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


def run(tmp_path, name: str, engine: str, precision: str) -> dict[tuple[str, int], list[dict]]:
    out = tmp_path / f"{name}.jsonl"
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(
        f"streams:\n  - id: h264\n    url: {CLIP}\n  - id: hevc\n    url: {CLIP_HEVC}\n{NANODET_MODEL}"
        f"engine:\n  type: {engine}\n  precision: {precision}\n  max_batch: 16\n"
        f"pipeline:\n  batch_size: 16\n  ring_slots: 4\nsinks:\n  - type: jsonl\n    path: {out}\n"
    )
    proc = run_streamd("run", str(cfg), "--no-status", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return {(r["stream"], r["frame"]): r for r in records}


def iou(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_pipeline_matches_cpu_twin(tmp_path, precision: str) -> None:
    cpu = run(tmp_path, "cpu", "onnxruntime", "fp32")
    gpu = run(tmp_path, f"gpu-{precision}", "torch", precision)
    assert set(gpu) == set(cpu) and len(cpu) == 795 + 100
    matched = total = 0
    margin = 0.03 if precision == "fp32" else 0.06  # near-threshold detections may flip either way
    for key, ref in cpu.items():
        got = gpu[key]["detections"]
        for d in ref["detections"]:
            if d["score"] < 0.35 + margin:
                continue
            total += 1
            best = max((iou(d["box"], g["box"]) for g in got if g["class_id"] == d["class_id"]), default=0.0)
            matched += best >= 0.95
        assert gpu[key]["latency_ms"]["infer"] >= 0
    rate = matched / total
    print(f"{precision}: {matched}/{total} strong CPU detections matched by the GPU pipeline (IoU >= 0.95)")
    assert total > 3000 and rate >= (0.99 if precision == "fp32" else 0.97)
    per_frame = np.array([len(gpu[k]["detections"]) - len(cpu[k]["detections"]) for k in cpu])
    assert np.abs(per_frame).mean() < 0.3
