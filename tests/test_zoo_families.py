"""Every family of the model zoo (tests/data/zoo: Ultralytics YOLOv8s/YOLO11s/YOLOv10s/YOLO26s/RT-DETR-l,
YOLOX-s, torchvision SSDlite, a TF-OD-API-style export; tiny random-weight versions at 160², built by
tools/model_zoo.py with each family's own exporter) runs end to end through ``streamd run`` on ONNX Runtime
and on torch (CPU), with ``layout`` left to auto (the metadata or the names) except where auto must refuse
(YOLOX's raw [B, 525, 85] is also a decoded yolov5 shape): schema-valid lines, detections, class ids in
range; torch passes the start-up check against ONNX Runtime."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import CLIP, ROOT, SCHEMA

ZOO = ROOT / "tests" / "data" / "zoo"
FRAMES = 20
TORCHVISION_90 = "[" + ", ".join(f"c{i}" for i in range(90)) + "]"
RGB01 = "  channel_order: rgb\n  mean: [0, 0, 0]\n  std: [255, 255, 255]\n"
# file -> (extra model lines, score threshold that leaves detections in the manifest's probe, expected layout)
MODELS = {
    "yolov8s-tiny-160-dyn.onnx": (RGB01, 0.1, "yolov8"),
    "yolov8s-tiny-160-b1.onnx": (RGB01, 0.1, "yolov8"),
    "yolo11s-tiny-160-dyn.onnx": (RGB01, 0.1, "yolov8"),
    "yolov10s-tiny-160-dyn.onnx": (RGB01, 0.1, "end2end"),
    "yolo26s-tiny-160-dyn.onnx": (RGB01, 0.1, "end2end"),
    "rtdetr-l-tiny-160-dyn.onnx": (RGB01, 0.25, "detr"),
    "rtdetr-l-raw-tiny-160-dyn.onnx": (RGB01, 0.25, "detr"),
    "yolox-s-tiny-160-dyn.onnx": (
        "  channel_order: bgr\n  mean: [0, 0, 0]\n  std: [1, 1, 1]\n  layout: yolox\n",
        0.1,
        "yolox",
    ),
    "ssdlite-tiny-160-batched.onnx": (RGB01 + f"  class_names: {TORCHVISION_90}\n", 0.1, "outputs"),
    "tfod-ssdlite-tiny-160.onnx": (RGB01 + f"  class_names: {TORCHVISION_90}\n", 0.1, "outputs"),
}
TORCH = {  # one model per family on torch (each start converts, and checks against ONNX Runtime)
    "yolov8s-tiny-160-dyn.onnx", "yolo26s-tiny-160-dyn.onnx", "rtdetr-l-tiny-160-dyn.onnx",
    "yolox-s-tiny-160-dyn.onnx", "ssdlite-tiny-160-batched.onnx", "tfod-ssdlite-tiny-160.onnx",
}  # fmt: skip
CASES = [(m, "onnxruntime") for m in MODELS] + [(m, "torch") for m in sorted(TORCH)]


@pytest.fixture(scope="module")
def short_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first FRAMES frames of the bundled clip, remuxed (no re-encode)."""
    import av

    path = tmp_path_factory.mktemp("clip") / "short.mp4"
    with av.open(str(CLIP)) as src, av.open(str(path), "w", format="mp4") as dst:
        stream = dst.add_stream_from_template(src.streams.video[0])
        for n, packet in enumerate(src.demux(src.streams.video[0])):
            if packet.dts is None or n >= FRAMES:
                continue
            packet.stream = stream
            dst.mux(packet)
    return path


def torch_on_cpu(tmp_path: Path) -> dict[str, str]:
    """A ``sitecustomize`` seam: ``EngineOptions.from_config`` passes ``device="cpu"`` (the config has no key
    for a CPU torch engine)."""
    seam = tmp_path / "seam"
    seam.mkdir()
    (seam / "sitecustomize.py").write_text(
        "import streamd.engines.options as o\n"
        "_from_config = o.EngineOptions.from_config.__func__\n"
        "def from_config(cls, engine, **kw):\n"
        "    return _from_config(cls, engine, **{**kw, 'device': 'cpu'})\n"
        "o.EngineOptions.from_config = classmethod(from_config)\n"
    )
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(seam), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize(("model", "engine"), CASES, ids=[f"{m.split('-tiny')[0]}-{e}" for m, e in CASES])
def test_family_runs_end_to_end(tmp_path: Path, short_clip: Path, model: str, engine: str) -> None:
    if engine == "torch" and importlib.util.find_spec("onnx2torch") is None:
        pytest.skip("onnx2torch is not installed (pip install 'streamd[torch]')")
    extra, threshold, layout = MODELS[model]
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"streams:\n  - id: cam\n    url: {short_clip}\nmodel:\n  path: {ZOO / model}\n"
        "  input_size: [160, 160]\n"
        f"{extra}  score_threshold: {threshold}\nengine:\n  type: {engine}\n  precision: fp32\n"
        f"  cache_dir: {tmp_path / 'cache'}\nsinks:\n  - type: jsonl\n    path: {out}\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(torch_on_cpu(tmp_path) if engine == "torch" else {})}
    proc = subprocess.run(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model.layout {layout}" in proc.stderr or f"auto chose {layout}" in proc.stderr, proc.stderr[
        -3000:
    ]
    if engine == "torch":
        assert "torch-cpu-fp32 fp32 vs onnxruntime-cpu" in proc.stderr and "— pass" in proc.stderr, (
            proc.stderr
        )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len([r for r in records if "type" not in r]) == FRAMES
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    for r in records:
        validator.validate(r)
    names = 90 if "ssdlite" in model else 80
    found = [d for r in records for d in r.get("detections", [])]
    assert found, "the tiny model's probe leaves detections at this threshold"
    assert all(0 <= d["class_id"] < names for d in found)
