"""Analytics on the GPU path, on a GPU.

1. Same detections, same tracks: NanoDet outputs (ONNX Runtime) of 120 consecutive vtest frames go through the
   GPU NMS kernel and through the CPU twin with a class filter; each result list then drives its own
   StreamAnalytics (tracking, a zone, events). Detections are bit-identical, so every line must be identical.
2. The whole daemon on the GPU (torch engine; NVDEC when PyNvVideoCodec is there) with detect_fps 5,
   classes [person], tracking + fill_skipped and a zone over the left half: 795 lines in frame order, 397 of
   them predicted, 397 skipped and 0 dropped in the summary, schema-valid, events balanced, ids kept.
Skips cleanly without a GPU.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import re

import numpy as np
import pytest

from streamd.analytics.stream import StreamAnalytics
from streamd.analytics.tracker import assign, iou_matrix
from streamd.config import parse_config
from streamd.config.coco import COCO_NAMES
from streamd.stages.postprocess.cpu import ClassThresholds, CpuPostprocessor, PostprocessSpec
from streamd.types import Detections, Frame, FrameResult
from streamd.worker.output import encode_all
from tests.analytics.gpu.test_class_filter_gpu import run_gpu
from tests.conftest import CLIP, MODEL, ROOT, SCHEMA, run_streamd

pytestmark = pytest.mark.gpu
ZONE = {"name": "left", "polygon": [[0, 0], [384, 0], [384, 576], [0, 576]]}


def strip_times(line: str) -> dict:
    r = json.loads(line)
    r.pop("time", None)
    r.pop("latency_ms", None)
    return r


def test_same_detections_same_tracks(ctx, loader, stream, tmp_path) -> None:
    pytest.importorskip("lap")
    ort = pytest.importorskip("onnxruntime")
    import cv2

    from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec

    n = 120
    cap = cv2.VideoCapture(str(CLIP))
    pre = CpuPreprocessor(PreprocessSpec(416, 416, "bgr", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395)))
    blob = np.empty((n, 3, 416, 416), np.float32)
    transforms = []
    for k in range(n):
        ok, image = cap.read()
        assert ok
        transforms.append(pre(image, blob[k]))
    cap.release()
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    raw = np.concatenate([session.run(None, {name: blob[i : i + 8]})[0] for i in range(0, n, 8)]).astype(
        np.float32
    )
    row = [0.35] + [math.inf] * 79
    spec = PostprocessSpec("yolov8", 80, 0.35, 0.5, 100, 1000, thresholds=ClassThresholds(row))
    ids = ["demo"] * 8
    gpu: list[Detections] = []
    for i in range(0, n, 8):
        gpu += run_gpu(ctx, loader, stream, spec, raw[i : i + 8], raw.shape[2], "float32", ids)
    cpu = CpuPostprocessor(spec)(raw, ["demo"] * n)
    (tmp_path / "v.mp4").write_bytes(b"\0")
    cfg = parse_config(
        {"streams": [{"id": "demo", "url": "v.mp4", "zones": [ZONE]}], "tracking": {"enabled": True}},
        tmp_path,
    )
    lines = []
    for dets in (gpu, cpu):
        a = StreamAnalytics(cfg.streams[0], COCO_NAMES)
        out = []
        for k, (det, t) in enumerate(zip(dets, transforms, strict=True)):
            f = Frame("demo", k, k / 10, 768, 576, wall_time=1.0)
            src = Detections(t.to_source(det.xyxy, 768, 576), det.score, det.class_id)
            out += [
                strip_times(x)
                for x in encode_all(
                    a.annotate(FrameResult(f, src, {"decode": 0, "queue": 0, "total": 0})), COCO_NAMES
                )
            ]
        lines.append(out)
    assert lines[0] == lines[1], "tracking output differs between the GPU and the CPU detections"
    n_ids = len({d["track_id"] for r in lines[0] if "detections" in r for d in r["detections"]})
    n_events = sum(r.get("type") == "event" for r in lines[0])
    print(f"{n} frames: GPU == CPU detections and tracks; {n_ids} track ids, {n_events} zone events")


def _cuda_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("lap") is None:
        return "lap is not installed (bring its wheel)"
    return None


@pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))
def test_daemon_on_gpu_with_analytics(tmp_path) -> None:
    out = tmp_path / "gpu.jsonl"
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(
        f"streams:\n  - id: demo\n    url: {CLIP}\n    detect_fps: 5\n    classes: [person]\n"
        "    zones:\n      - name: left\n        polygon: [[0, 0], [384, 0], [384, 576], [0, 576]]\n"
        f"model:\n  path: {ROOT}/models/nanodet-coco.onnx\n  score_threshold: 0.35\n  iou_threshold: 0.5\n"
        "engine:\n  type: torch\n  precision: fp16\n  max_batch: 16\n  compile: false\n"
        "pipeline:\n  batch_size: 16\n  ring_slots: 4\n"
        "tracking:\n  enabled: true\n  fill_skipped: true\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )
    proc = run_streamd("run", str(cfg), "--no-status", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = next(line for line in proc.stderr.splitlines() if "streamd: done:" in line)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    if importlib.util.find_spec("jsonschema") is not None:  # not in the GPU box's image
        import jsonschema

        validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
        for r in records:
            validator.validate(r)
    frames = [r for r in records if "type" not in r]
    events = [r for r in records if r.get("type") == "event"]
    assert [r["frame"] for r in frames] == list(range(795))
    assert sum(r.get("predicted", False) for r in frames) == 397
    assert re.search(r"\b397 skipped", summary) and re.search(r"\b0 dropped after decode", summary), summary
    assert {d["label"] for r in frames for d in r["detections"]} <= {"person"}
    inside: set[int] = set()
    for e in events:
        assert e["event"] == "enter" or e["track_id"] in inside, e
        (inside.add if e["event"] == "enter" else inside.discard)(e["track_id"])
    kept = switched = 0
    detected = [r for r in frames if not r.get("predicted")]
    for a, b in itertools.pairwise(detected):
        pa = np.array([d["box"] for d in a["detections"]]).reshape(-1, 4)
        pb = np.array([d["box"] for d in b["detections"]]).reshape(-1, 4)
        r, c = assign(iou_matrix(pa, pb), 0.5)
        for i, j in zip(r, c, strict=True):
            same = a["detections"][i]["track_id"] == b["detections"][j]["track_id"]
            kept += same
            switched += not same
    rate = kept / max(kept + switched, 1)
    print(f"GPU daemon: {summary.split('INFO ')[-1]}; {len(events)} events; ids kept {100 * rate:.2f} %")
    assert rate >= 0.95
