"""Several-output models on every CPU engine: ``torch.onnx.export`` of small nets with the output contracts of
the TF Object Detection API (4 outputs, int64 classes, a per-image count) and of DETR (boxes + logits).

Each engine runs them as one packed output [B, R] (``onnx_outputs``): ``output_parts`` names each output and
its offset, and the packed row equals ONNX Runtime's own outputs flattened in graph order (computed here from
a plain ONNX Runtime session); the start-up check against ONNX Runtime passes and compares every output."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from streamd.checks.verify import VerifyPlan, create_engine
from streamd.engines.options import EngineOptions
from streamd.stages.postprocess.cpu import PostprocessSpec
from streamd.stages.postprocess.head import HeadSettings
from streamd.stages.postprocess.resolve import resolve_head
from streamd.stages.preprocess.cpu import PreprocessSpec

torch = pytest.importorskip("torch")

ENGINES = ["onnxruntime", "torch"]


class TfStyle(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=8, padding=1)  # 64x64 -> 8x8 = 64 boxes

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = self.conv(x).flatten(2).transpose(1, 2)  # [B, 64, 8]
        y1x1 = torch.sigmoid(f[..., :2]) * 0.6
        boxes = torch.cat([y1x1, y1x1 + 0.05 + torch.sigmoid(f[..., 2:4]) * 0.3], -1)
        scores = torch.sigmoid(f[..., 4] * 4)
        classes = (f[..., 5].abs() * 10).long() % 3 + 1  # int64, 1-based like TF label maps
        count = (scores > 0.2).sum(1).float()
        return boxes, scores, classes, count


class DetrStyle(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv = torch.nn.Conv2d(3, 7, 3, stride=8, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.conv(x).flatten(2).transpose(1, 2)  # [B, 64, 7]
        boxes = torch.cat([torch.sigmoid(f[..., :2]), 0.05 + torch.sigmoid(f[..., 2:4]) * 0.2], -1)
        return boxes, f[..., 4:] * 3  # logits of 3 classes


MODELS = {
    "tf": (TfStyle, ["detection_boxes", "detection_scores", "detection_classes", "num_detections"]),
    "detr": (DetrStyle, ["pred_boxes", "pred_logits"]),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, (cls, outputs) in MODELS.items():
        path = tmp_path_factory.mktemp("multi") / f"{name}.onnx"
        torch.onnx.export(
            cls().eval(),
            (torch.zeros(1, 3, 64, 64),),
            str(path),
            input_names=["images"],
            output_names=outputs,
            dynamic_axes={"images": {0: "batch"}, **{o: {0: "batch"} for o in outputs}},
            opset_version=17,
            dynamo=False,
        )
        out[name] = path
    return out


def frames() -> np.ndarray:
    rng = np.random.default_rng(3)
    return rng.uniform(0, 1, (3, 3, 64, 64)).astype(np.float32)


def packed_reference(path: Path, x: np.ndarray) -> tuple[np.ndarray, list[str]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    outs = session.run(names, {"images": x})
    return np.concatenate([np.asarray(o, np.float32).reshape(len(x), -1) for o in outs], axis=1), names


def plan(num_classes: int) -> VerifyPlan:
    pre = PreprocessSpec(64, 64, "rgb", (0.0, 0.0, 0.0), (255.0, 255.0, 255.0), "stretch", 114)
    post = PostprocessSpec("auto", num_classes, 0.25, 0.45, 100, 1000)
    return VerifyPlan(True, pre, post, "m", HeadSettings(num_classes=num_classes, input_size=(64, 64)))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_engine_packs_every_output(
    tmp_path: Path, exported: dict[str, Path], model: str, engine: str
) -> None:
    if engine == "torch" and importlib.util.find_spec("onnx2torch") is None:
        pytest.skip("onnx2torch is not installed (pip install 'streamd[torch]')")
    options = EngineOptions(
        max_batch=4, precision="fp32", device="cpu", cache_dir=tmp_path, input_size=(64, 64)
    )
    e = create_engine(engine, exported[model], options, verify=plan(3))
    try:
        x = frames()
        want, names = packed_reference(exported[model], x)
        assert [p.name for p in e.output_parts] == names
        offsets = np.cumsum([0, *(p.size for p in e.output_parts)])
        assert [p.offset for p in e.output_parts] == offsets[:-1].tolist() and offsets[-1] == want.shape[1]
        got = np.asarray(e.infer(x), np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        head = resolve_head(HeadSettings(num_classes=3, input_size=(64, 64)), e.output_parts)
        assert head.layout == ("outputs" if model == "tf" else "detr")
        verdict = getattr(e, "verification", None)
        if engine == "torch":
            assert verdict is not None and verdict["passed"], verdict
            assert [o["name"] for o in verdict["outputs"]] == names  # every output compared on its own
    finally:
        e.close()


def test_check_and_run_a_tf_style_model(tmp_path: Path, exported: dict[str, Path]) -> None:
    """``streamd check`` notes what auto chose from the names; ``streamd run`` writes schema-valid lines whose
    classes are the model's 1-based labels minus 1 (class_offset auto for TF names)."""
    import json
    import os
    import subprocess
    import sys

    import jsonschema

    from tests.conftest import CLIP, ROOT, SCHEMA, run_streamd

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"streams:\n  - id: cam\n    url: {CLIP}\nmodel:\n  path: {exported['tf']}\n  input_size: [64, 64]\n"
        "  class_names: [a, b, c]\n  resize: stretch\n  score_threshold: 0.2\n"
        f"engine:\n  type: onnxruntime\nsinks:\n  - type: jsonl\n    path: {tmp_path / 'out.jsonl'}\n"
    )
    check = run_streamd("check", str(cfg))
    assert check.returncode == 0, check.stderr
    assert "model.layout auto chose outputs (TF Object Detection API names): boxes detection_boxes (yxyx" in (
        check.stderr
    )
    assert "classes detection_classes (minus 1), count num_detections, no NMS" in check.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    for r in records:
        validator.validate(r)
    classes = {d["class_id"] for r in records for d in r["detections"]}
    assert classes and classes <= {0, 1, 2}, classes
