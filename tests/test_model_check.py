"""`streamd check` opens the model and finds what `run` would refuse; fixed-batch models run image by
image."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamd.checks.model import check_model
from streamd.config import load_config
from streamd.engines import create_engine
from tests.conftest import CLIP, MODEL, run_streamd

NANODET = "  path: {model}\n  input_size: [{w}, {h}]\n  layout: {layout}\n"


def fixed_batch_end2end(path: Path, batch: int = 1, size: int = 64, k: int = 4) -> Path:
    """An end-to-end detector [batch, 3, S, S] -> [batch, K, 6] whose batch is fixed: a Reshape to a fixed
    element count (as in tf2onnx CenterNet exports) fails for any other batch, so it cannot be made
    batch-dynamic. It reports one 'person' box (input pixels) in every frame."""
    rows = np.zeros((batch, k, 6), np.float32)
    rows[:, 0] = [8, 8, 40, 56, 0.9, 0]
    nodes = [
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("ReduceMax", ["flat"], ["m"], keepdims=1),
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Squeeze", ["mean", "sq_axes"], ["mean3"]),
        helper.make_node("Add", ["mean3", "m"], ["s"]),
        helper.make_node("Mul", ["s", "zero"], ["z"]),
        helper.make_node("Add", ["z", "rows"], ["dets"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fixed_batch_end2end",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("dets", TensorProto.FLOAT, [batch, k, 6])],
        [
            numpy_helper.from_array(np.array([batch * 3 * size * size // 4, 4], np.int64), "flat_shape"),
            numpy_helper.from_array(np.array([3], np.int64), "sq_axes"),
            numpy_helper.from_array(np.zeros((), np.float32), "zero"),
            numpy_helper.from_array(rows, "rows"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def write(tmp_path: Path, model_lines: str, extra: str = "", out: Path | None = None) -> Path:
    sink = f"  - type: jsonl\n    path: {out}\n" if out else "  - type: stdout\n"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"streams:\n  - id: cam\n    url: {CLIP}\nmodel:\n{model_lines}{extra}sinks:\n{sink}")
    return cfg


def test_bundled_demo_checks_with_its_model() -> None:
    report = check_model(load_config(None))
    assert report.problems == []
    assert report.notes == [
        "model.layout yolov8: output output0 [batch, 84, 3549], 84 = 4 box + 80 class scores over 3549 "
        "candidates; 80 class names (model.class_names)"
    ]
    assert "input [batch, 3, 416, 416]" in report.summary and "output [batch, 84, 3549]" in report.summary


def test_input_size_mismatch_is_a_config_error(tmp_path: Path) -> None:
    cfg = write(tmp_path, NANODET.format(model=MODEL, w=640, h=640, layout="yolov8"))
    proc = run_streamd("check", str(cfg))
    assert proc.returncode == 78, proc.stderr
    assert "cfg.yaml:6: model.input_size: model.input_size is [640, 640]" in proc.stderr
    assert "set model.input_size: [416, 416]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_video_as_model_path_is_a_config_error(tmp_path: Path) -> None:
    cfg = write(tmp_path, f"  path: {CLIP}\n")
    proc = run_streamd("check", str(cfg))
    assert proc.returncode == 78, proc.stderr
    assert "cfg.yaml:5: model.path: 'vtest.mp4' is a video file, not a model" in proc.stderr
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_bytes(CLIP.read_bytes()[:4096])
    report = check_model(load_config(write(tmp_path, f"  path: {not_onnx}\n")))
    assert len(report.problems) == 1 and "model.path:" in report.problems[0], report.problems


def test_no_model_opts_out(tmp_path: Path) -> None:
    cfg = write(tmp_path, f"  path: {CLIP}\n")
    proc = run_streamd("check", "--no-model", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("OK (1 stream(s))")


def test_layout_mismatch_is_a_config_error(tmp_path: Path) -> None:
    report = check_model(
        load_config(write(tmp_path, NANODET.format(model=MODEL, w=416, h=416, layout="end2end")))
    )
    assert len(report.problems) == 1 and ":7: model.layout: model.layout is 'end2end'" in report.problems[0]


def test_fixed_batch_above_one_is_a_note(tmp_path: Path) -> None:
    model = fixed_batch_end2end(tmp_path / "b2.onnx", batch=2)
    report = check_model(load_config(write(tmp_path, f"  path: {model}\n  input_size: [64, 64]\n")))
    assert report.problems == []
    assert report.notes == [
        "b2.onnx fixes its batch at 2: the engine runs 2 rows per call, a smaller batch padded (batches of "
        "up to 8; a dynamic-batch export wastes nothing)",
        "model.layout auto chose end2end: output dets [2, 4, 6], up to 4 boxes of (x1, y1, x2, y2, score, "
        "class id), NMS done in the model; 80 class names (model.class_names)",
    ]


def test_fixed_batch_one_engine_runs_image_by_image(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = fixed_batch_end2end(tmp_path / "b1.onnx")
    with caplog.at_level("INFO"):
        engine = create_engine("onnxruntime", model, max_batch=8)
    assert engine.max_batch == 8 and engine.output_shape == (1, 4, 6)
    out = engine.infer(np.random.default_rng(0).random((5, 3, 64, 64), np.float32))
    assert out.shape == (5, 4, 6) and np.allclose(out[:, 0, 4], 0.9)
    said = [r.getMessage() for r in caplog.records if "image by image" in r.getMessage()]
    assert len(said) == 1, caplog.text
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3])
def test_fixed_batch_end2end_model_runs_the_clip(tmp_path: Path, batch: int) -> None:
    """The issue's case: batch fixed at 1, end2end output, default engine.max_batch 8, batch_size 4; and a
    batch fixed at 3 (engine pinned at 3 rows per call, max batch rounded up to 9)."""
    model = fixed_batch_end2end(tmp_path / f"b{batch}.onnx", batch=batch)
    out = tmp_path / "out.jsonl"
    cfg = write(tmp_path, f"  path: {model}\n  input_size: [64, 64]\n", "pipeline:\n  batch_size: 4\n", out)
    check = run_streamd("check", str(cfg))
    assert check.returncode == 0, check.stderr
    assert f"note: b{batch}.onnx fixes its batch at {batch}" in check.stderr
    proc = run_streamd("run", str(cfg), "--no-status", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = "run image by image" if batch == 1 else "runs 3 rows per call"
    assert proc.stderr.count(said) == 1, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 795
    assert all([d["label"] for d in r["detections"]] == ["person"] for r in records)
