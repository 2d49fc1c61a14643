"""`streamd check` and `streamd run` with a model whose input H/W are dynamic (as Ultralytics'
``export(format="onnx", dynamic=True)`` writes it: ``[batch, 3, height, width]``): it runs at
``model.input_size`` and ``check`` says so; without a stated size it is a config error (exit 78)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import onnx
import pytest

from tests.conftest import CLIP, ROOT, SCHEMA, run_streamd
from tests.engines.tiny_models import make_detector

FRAMES = 30


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


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny YOLOv8-layout detector exported by ``torch.onnx.export`` with ``dynamic_axes`` on batch,
    height and width, the way Ultralytics exports ``dynamic=True``: its anchor grid is computed from the
    input's shape at run time (Shape, Range, ...), so output N follows H and W."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.c1 = torch.nn.Conv2d(3, 8, 3, 2, 1)
            self.c2 = torch.nn.Conv2d(8, 16, 3, 2, 1)
            self.head = torch.nn.Conv2d(16, 4 + 3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.head(torch.relu(self.c2(torch.relu(self.c1(x)))))
            b, _, h, w = y.shape
            y = y.flatten(2)
            gy, gx = torch.meshgrid(
                torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij"
            )
            cx, cy = (gx.flatten() + 0.5) * 4, (gy.flatten() + 0.5) * 4
            wh = torch.full_like(cx, 16.0)
            box = torch.stack([cx, cy, wh, wh])[None].expand(b, 4, h * w) + y[:, :4]
            return torch.cat([box, torch.sigmoid(y[:, 4:])], 1)

    path = tmp_path_factory.mktemp("exported") / "yolo-dyn.onnx"
    torch.onnx.export(
        Net().eval(),
        (torch.zeros(1, 3, 64, 64),),
        str(path),
        input_names=["images"],
        output_names=["output0"],
        dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}},
        opset_version=17,
        dynamo=False,
    )
    dims = [
        d.dim_param or d.dim_value for d in onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    ]
    assert dims == ["batch", 3, "height", "width"]
    return path


def write(
    tmp_path: Path, model: Path, model_lines: str, clip: Path = CLIP, engine: str = "onnxruntime"
) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"streams:\n  - id: cam\n    url: {clip}\nmodel:\n  path: {model}\n{model_lines}"
        f"engine:\n  type: {engine}\n  precision: fp32\n  cache_dir: {tmp_path / 'cache'}\n"
        f"sinks:\n  - type: jsonl\n    path: {tmp_path / 'out.jsonl'}\n"
    )
    return cfg


def test_check_notes_the_size_a_dynamic_model_runs_at(tmp_path: Path) -> None:
    model = make_detector(tmp_path / "tiny-dyn.onnx", dynamic_hw=True)
    proc = run_streamd("check", str(write(tmp_path, model, "  input_size: [640, 640]\n  layout: yolov8\n")))
    assert proc.returncode == 0, proc.stderr
    assert (
        "note: model input H, W are dynamic (input [batch, 3, height, width]); it runs at model.input_size "
        "[640, 640] on every engine" in proc.stderr
    )
    assert (
        "OK (1 stream(s); model tiny-dyn.onnx: input [batch, 3, height, width], output [batch, 84, 128000])"
        in (proc.stderr)
    )


def test_dynamic_model_without_a_stated_size_is_a_config_error(tmp_path: Path) -> None:
    model = make_detector(tmp_path / "tiny-dyn.onnx", dynamic_hw=True)
    cfg = write(tmp_path, model, "  layout: yolov8\n")
    for command in ("check", "run"):
        proc = run_streamd(command, str(cfg))
        assert proc.returncode == 78, proc.stderr
        assert (
            "model.input_size: tiny-dyn.onnx's input H, W are dynamic (input [batch, 3, height, width])"
            in (proc.stderr)
        )
        assert "would run at the default [416, 416]; set model.input_size: [width, height]" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_size_from_the_models_metadata_is_stated(tmp_path: Path) -> None:
    """Ultralytics writes ``imgsz: [h, w]`` into the ONNX metadata: that states the size too."""
    model = make_detector(tmp_path / "tiny-dyn.onnx", dynamic_hw=True)
    m = onnx.load(str(model))
    onnx.helper.set_model_props(m, {"imgsz": "[320, 640]"})
    onnx.save(m, str(model))
    proc = run_streamd("check", str(write(tmp_path, model, "  layout: yolov8\n")))
    assert proc.returncode == 0, proc.stderr
    assert "it runs at model.input_size (from the model's metadata) [640, 320]" in proc.stderr


def test_a_fixed_dimension_must_still_match(tmp_path: Path) -> None:
    """H fixed at 32, W dynamic: the config's height must be 32, as for a fully fixed model."""
    model = make_detector(tmp_path / "tiny-w.onnx", dynamic_hw=True)
    m = onnx.load(str(model))
    h = m.graph.input[0].type.tensor_type.shape.dim[2]
    h.Clear()
    h.dim_value = 32
    onnx.save(m, str(model))
    proc = run_streamd("check", str(write(tmp_path, model, "  input_size: [64, 64]\n  layout: yolov8\n")))
    assert proc.returncode == 78, proc.stderr
    assert "model.input_size is [64, 64] (width, height) but tiny-w.onnx takes 64×32" in proc.stderr
    assert "set model.input_size: [64, 32]" in proc.stderr


@pytest.mark.parametrize("engine", ["onnxruntime", "torch"])
def test_run_writes_valid_lines(tmp_path: Path, exported: Path, short_clip: Path, engine: str) -> None:
    """``streamd run`` end to end at input_size [96, 64] (not the export's 64×64). torch runs on the CPU
    through a test seam: a ``sitecustomize`` that makes ``EngineOptions.from_config`` pass ``device="cpu"``
    in every process (the config has no key for a CPU torch engine)."""
    if engine == "torch" and importlib.util.find_spec("onnx2torch") is None:
        pytest.skip("onnx2torch is not installed (pip install 'streamd[torch]')")
    lines = "  input_size: [96, 64]\n  layout: yolov8\n  class_names: [a, b, c]\n  score_threshold: 0.3\n"
    cfg = write(tmp_path, exported, lines, clip=short_clip, engine=engine)
    check = run_streamd("check", str(cfg))
    assert check.returncode == 0, check.stderr
    assert "it runs at model.input_size [96, 64]" in check.stderr
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if engine == "torch":
        seam = tmp_path / "seam"
        seam.mkdir()
        (seam / "sitecustomize.py").write_text(
            "import streamd.engines.options as o\n"
            "_from_config = o.EngineOptions.from_config.__func__\n"
            "def from_config(cls, engine, **kw):\n"
            "    return _from_config(cls, engine, **{**kw, 'device': 'cpu'})\n"
            "o.EngineOptions.from_config = classmethod(from_config)\n"
        )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(seam), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = "torch-cpu-fp32" if engine == "torch" else "onnxruntime-cpu"
    assert f"ready: engine {name}" in proc.stderr
    if engine == "torch":
        assert "torch-cpu-fp32 fp32 vs onnxruntime-cpu on 4 frames" in proc.stderr and "— pass" in proc.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(records) == FRAMES
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    for r in records:
        validator.validate(r)
    assert sum(len(r["detections"]) for r in records) > 0
