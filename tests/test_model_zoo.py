"""The committed tiny model zoo (tests/data/zoo, built by tools/model_zoo.py).

Each file is the one its manifest describes (sha256, graph inputs/outputs read back with onnx) and
runs on ONNX Runtime at batch 2 on a real frame, leaving detections above the threshold the manifest
records. Two contracts the README recipe relies on are checked against an independent reference: the
batched SSDlite wrapper reproduces torchvision's own export, and the TF-OD-style file obeys its
four-output contract. streamd's layouts are tested elsewhere."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import ROOT

ZOO = ROOT / "tests" / "data" / "zoo"
MANIFEST = json.loads((ZOO / "MANIFEST.json").read_text())["files"]
CLIP = ROOT / "streamd" / "bundled" / "samples" / "vtest.mp4"
ONNX_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64"}


def frame(index: int) -> np.ndarray:
    cap = cv2.VideoCapture(str(CLIP))
    cap.set(cv2.CAP_PROP_POS_FRAMES, index)
    ok, img = cap.read()
    cap.release()
    assert ok, f"could not decode frame {index} of {CLIP}"
    return img


def tensor(img: np.ndarray, size: int, bgr255: bool) -> np.ndarray:
    img = cv2.resize(img, (size, size), interpolation=cv2.INTER_LINEAR)
    if bgr255:
        return np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32)
    return np.ascontiguousarray(img[:, :, ::-1].transpose(2, 0, 1), dtype=np.float32) / np.float32(255)


def session(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(ZOO / name), providers=["CPUExecutionProvider"])


def run(name: str, feed: np.ndarray) -> dict[str, np.ndarray]:
    sess = session(name)
    results = sess.run(None, {sess.get_inputs()[0].name: feed})
    return {o.name: r for o, r in zip(sess.get_outputs(), results, strict=True)}


def confidence(entry: dict[str, Any], out: dict[str, np.ndarray], image: int) -> np.ndarray:
    """Per-candidate score of one image, read from the layout the manifest's output notes describe."""
    family = entry["family"]
    if family in ("yolov8s", "yolo11s"):
        return out["output0"][image, 4:, :].max(axis=0)
    if family == "rtdetr-l-raw":
        return out["output0"][image, :, 4:].max(axis=1)
    if family in ("yolo26s", "yolov10s", "rtdetr-l"):
        return out["output0"][image, :, 4]
    if family == "yolox-s":
        rows = out["output"][image]
        return rows[:, 4] * rows[:, 5:].max(axis=1)
    if family == "ssdlite":
        return out["scores"][image].max(axis=1)
    return out["detection_scores"][image]


BATCHED = sorted(name for name, e in MANIFEST.items() if e["variant"] != "standard")


def test_manifest_covers_every_committed_file() -> None:
    on_disk = {p.name for p in ZOO.glob("*.onnx")}
    assert on_disk == set(MANIFEST), "MANIFEST.json and tests/data/zoo disagree"
    families = {e["family"] for e in MANIFEST.values()}
    assert families == {
        "yolov8s",
        "yolo11s",
        "yolo26s",
        "yolov10s",
        "rtdetr-l",
        "rtdetr-l-raw",
        "yolox-s",
        "ssdlite",
        "tfod-ssdlite",
    }


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_file_matches_manifest(name: str) -> None:
    entry, path = MANIFEST[name], ZOO / name
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert len(data) == entry["bytes"] and len(data) < 3_000_000, "tiny zoo files stay small"
    graph = onnx.load(str(path)).graph

    def described(values: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": v.name,
                "shape": [
                    d.dim_value if d.HasField("dim_value") else d.dim_param
                    for d in v.type.tensor_type.shape.dim
                ],
                "dtype": ONNX_DTYPES[v.type.tensor_type.elem_type],
            }
            for v in values
        ]

    assert described(graph.input) == entry["inputs"]
    assert described(graph.output) == entry["outputs"]


@pytest.mark.parametrize("name", BATCHED)
def test_runs_at_batch_2_with_detections(name: str) -> None:
    entry = MANIFEST[name]
    size = entry["input_size"][0]
    bgr = entry["family"] == "yolox-s"
    batch = entry["inputs"][0]["shape"][0]
    pictures = [tensor(frame(30), size, bgr), tensor(frame(200), size, bgr)]
    if isinstance(batch, int):  # the static-batch file: run what it was built for, then only check shapes
        pictures = pictures[:batch]
    out = run(name, np.stack(pictures))
    for spec in entry["outputs"]:
        got = out[spec["name"]].shape
        assert got[0] == len(pictures)
        fixed = [(i, d) for i, d in enumerate(spec["shape"]) if isinstance(d, int)]
        assert all(got[i] == d for i, d in fixed), (spec, got)
    threshold = entry["probe"]["highest_threshold_with_detections"]
    assert threshold is not None and threshold >= 0.05
    assert (confidence(entry, out, 0) > threshold).sum() >= 1
    if len(pictures) == 2:  # batch rows are independent: image 1 alone gives the same answer
        alone = run(name, pictures[1][None])
        for key, value in out.items():
            np.testing.assert_allclose(value[1], alone[key][0], rtol=1e-4, atol=1e-4)


def test_batched_ssdlite_equals_torchvision_own_export() -> None:
    """Every detection of torchvision's own (per-image, NMS'd) export is an anchor of the batched wrapper with
    the same box and the same class score: the wrapper is the model minus threshold and NMS."""
    standard = next(n for n, e in MANIFEST.items() if e["family"] == "ssdlite" and e["variant"] == "standard")
    batched = next(n for n, e in MANIFEST.items() if e["family"] == "ssdlite" and e["variant"] == "batched")
    size = MANIFEST[batched]["input_size"][0]
    picture = tensor(frame(30), size, bgr255=False)  # already at the model's size: its resize is a no-op
    ref = run(standard, picture)
    got = run(batched, picture[None])
    boxes, scores = got["boxes"][0], got["scores"][0]
    assert len(ref["boxes"]) > 0
    for box, score, label in zip(ref["boxes"], ref["scores"], ref["labels"], strict=True):
        anchor = np.abs(boxes - box).max(axis=1).argmin()
        assert np.abs(boxes[anchor] - box).max() < 1e-3 * size
        assert scores[anchor, label - 1] == pytest.approx(score, abs=1e-4)


def test_tfod_file_keeps_the_tf_od_contract() -> None:
    tfod = next(n for n, e in MANIFEST.items() if e["family"] == "tfod-ssdlite")
    floor = MANIFEST[tfod]["score_floor"]
    size = MANIFEST[tfod]["input_size"][0]
    out = run(tfod, np.stack([tensor(frame(30), size, False), tensor(frame(200), size, False)]))
    for i in range(2):
        scores, boxes = out["detection_scores"][i], out["detection_boxes"][i]
        classes, count = out["detection_classes"][i], int(out["num_detections"][i])
        assert count == int((scores > floor).sum()) and 0 < count <= 100
        assert np.all(np.diff(scores[:count]) <= 0), "scores sorted, highest first"
        assert np.all(scores[count:] == 0) and np.all(boxes[count:] == 0) and np.all(classes[count:] == 0)
        valid = boxes[:count]
        assert np.all((valid >= 0) & (valid <= 1))
        assert np.all(valid[:, 0] <= valid[:, 2]) and np.all(valid[:, 1] <= valid[:, 3]), (
            "ymin<=ymax, xmin<=xmax"
        )
        assert np.all(
            (classes[:count] >= 1) & (classes[:count] <= 90) & (classes[:count] == np.round(classes[:count]))
        )


def test_rtdetr_topk_export_is_the_raw_queries_top_pairs() -> None:
    """Same seed, same model: Ultralytics' [B,300,6] export holds the best (query, class) pairs of the raw
    [B,300,4+80] queries, with the query's box, in descending score order."""
    raw = next(n for n, e in MANIFEST.items() if e["family"] == "rtdetr-l-raw")
    topk = next(n for n, e in MANIFEST.items() if e["family"] == "rtdetr-l" and e["variant"] == "dynamic")
    size = MANIFEST[raw]["input_size"][0]
    picture = tensor(frame(30), size, bgr255=False)[None]
    queries, pairs = run(raw, picture)["output0"][0], run(topk, picture)["output0"][0]
    flat = queries[:, 4:].ravel()
    order = np.argsort(-flat, kind="stable")[:20]
    np.testing.assert_allclose(pairs[:20, 4], flat[order], atol=1e-5)
    np.testing.assert_array_equal(pairs[:20, 5], order % 80)
    np.testing.assert_allclose(pairs[:20, :4], queries[order // 80, :4], atol=1e-5)
    assert np.all((queries[:, :2] >= 0) & (queries[:, :2] <= 1)), "centres normalised"
