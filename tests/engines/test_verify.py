"""The start-up equivalence check (streamd.checks.verify) with the torch engine on the CPU.

The broken-conversion fixture is the tiny detector with a ``linear``/``asymmetric`` Resize (what tf2onnx
writes for TensorFlow's ResizeBilinear) converted by onnx2torch alone, i.e. with streamd's rewrite switched
off: the translation that made the TF-exported CenterNet detect different boxes on the GPU (issue 13).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from streamd.checks.verify import (
    TOLERANCES,
    VerificationError,
    VerifyPlan,
    compare,
    create_engine,
    frames,
    make_inputs,
)
from streamd.engines.options import EngineOptions, Machine
from streamd.stages.postprocess.cpu import PostprocessSpec
from streamd.stages.preprocess.cpu import PreprocessSpec
from tests.engines.tiny_models import make_detector

PLAN = VerifyPlan(
    True,
    PreprocessSpec(32, 32, "bgr", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395)),
    PostprocessSpec("yolov8", 80, 0.25),
    "tiny",
)


@pytest.fixture(scope="module")
def tf_style(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_detector(
        tmp_path_factory.mktemp("tf") / "tiny-tf-resize.onnx", resize_coordinates="asymmetric"
    )


@pytest.fixture
def broken_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx2torch's own Resize translation (streamd's rewrite off): the wrong conversion of issue 13."""
    from streamd.engines import torch_ops

    monkeypatch.setattr(torch_ops, "rewrite_for_torch", lambda model: (model, []))


def test_inputs_look_like_frames():
    images = frames()
    assert len(images) == 4 and all(im.shape == (576, 768, 3) and im.dtype == np.uint8 for im in images)
    assert all(8 < im.std() < 120 for im in images)  # neither flat nor noise-like extremes
    batch = make_inputs((3, 64, 96), None)
    assert batch.shape == (4, 3, 64, 96) and batch.min() >= 0 and batch.max() <= 1


def test_torch_cpu_engine_passes_and_the_verdict_is_cached(torch_ready, tf_style, tmp_path, caplog):
    caplog.set_level(logging.INFO, "streamd.checks.verify")
    engine = create_engine("torch", tf_style, max_batch=2, device="cpu", verify=PLAN, cache_dir=tmp_path)
    v = engine.verification
    assert v["passed"] and not v["cached"] and v["inputs"] == 4 and v["cost_ms"] > 0
    assert v["outputs"][0]["mean_abs"] < 1e-4 and v["matched"] == 1.0
    assert "pass," in caplog.text and " ms" in caplog.text
    engine.close()
    cached = list((tmp_path / "verify").glob("tiny-tf-resize.torch-cpu-fp32.*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["verdict"]["passed"]
    caplog.clear()
    again = create_engine("torch", tf_style, max_batch=2, device="cpu", verify=PLAN, cache_dir=tmp_path)
    assert again.verification["cached"] and again.verification["cost_ms"] == v["cost_ms"]
    assert "check skipped" in caplog.text
    again.close()


def test_a_wrong_conversion_is_refused_with_what_to_do(torch_ready, tf_style, tmp_path, broken_conversion):
    with pytest.raises(VerificationError) as info:
        create_engine("torch", tf_style, max_batch=2, device="cpu", verify=PLAN, cache_dir=tmp_path)
    message = str(info.value)
    for part in ("tiny-tf-resize.onnx", "torch-cpu-fp32", "output 'output0'", "max abs error", "mean",
                 "engine.type: onnxruntime", "engine.verify: false"):  # fmt: skip
        assert part in message, (part, message)


def test_a_cached_failure_is_refused_without_running_again(
    torch_ready, tf_style, tmp_path, broken_conversion
):
    for _ in range(2):
        with pytest.raises(VerificationError):
            create_engine("torch", tf_style, max_batch=2, device="cpu", verify=PLAN, cache_dir=tmp_path)
    (path,) = (tmp_path / "verify").glob("*.json")
    assert not json.loads(path.read_text())["verdict"]["passed"]


def test_auto_falls_back_to_onnxruntime(torch_ready, tf_style, tmp_path, broken_conversion, caplog):
    torch_box = Machine(tensorrt=False, torch_cuda=True)  # auto: torch, then ONNX Runtime
    options = EngineOptions(max_batch=2, device="cpu", cache_dir=tmp_path)
    engine = create_engine("auto", tf_style, options, verify=PLAN, machine=torch_box)
    assert engine.name == "onnxruntime-cpu"
    assert "torch refused at start-up" in caplog.text and "falls back to onnxruntime" in caplog.text
    engine.close()


def test_verify_false_skips_the_check(torch_ready, tf_style, tmp_path, broken_conversion, caplog):
    plan = VerifyPlan(False, PLAN.preprocess, PLAN.postprocess)
    engine = create_engine("torch", tf_style, max_batch=2, device="cpu", verify=plan, cache_dir=tmp_path)
    assert engine.verification is None and "engine.verify: false" in caplog.text
    assert not (tmp_path / "verify").exists()
    engine.close()


def test_onnxruntime_cpu_is_the_reference_and_is_not_checked(models, tmp_path):
    engine = create_engine("onnxruntime", models["dynamic"], max_batch=2, verify=PLAN, cache_dir=tmp_path)
    assert getattr(engine, "verification", None) is None
    engine.close()


def end2end(rows: list[list[float]]) -> np.ndarray:
    out = np.zeros((1, 10, 6), np.float32)
    out[0, : len(rows)] = rows
    return out


def test_end2end_rows_that_swap_on_a_score_tie_still_agree():
    spec = PostprocessSpec("end2end", 80, 0.25)
    a = [[10, 10, 50, 90, 0.600, 0], [200, 40, 260, 160, 0.601, 0], [300, 5, 400, 60, 0.5, 2]]
    ref = end2end(a)
    got = end2end([a[1], a[0], a[2]])  # first two swapped
    errors, agreement = compare(ref, got, precision="fp16", postprocess=spec)
    assert errors[0].max_abs == 0 and errors[0].passed and agreement["matched"] == 1.0  # rows paired first


def test_a_shifted_box_or_an_extra_detection_fails_the_detection_check():
    spec = PostprocessSpec("end2end", 80, 0.25)
    a = [[10, 10, 50, 90, 0.6, 0], [200, 40, 260, 160, 0.6, 0]]
    shifted = end2end([[15, 17, 53, 96, 0.57, 0], a[1]])  # the 5–7 px shift
    _, agreement = compare(end2end(a), shifted, precision="fp32", postprocess=spec)
    assert agreement["matched"] < TOLERANCES["fp32"].match
    extra = end2end([*a, [300, 5, 400, 60, 0.53, 7]])  # a truck only the engine sees
    _, agreement = compare(end2end(a), extra, precision="fp16", postprocess=spec)
    assert agreement["ref"] == 2 and agreement["got"] == 3 and agreement["matched"] < 1.0


def test_shape_mismatch_fails():
    errors, _ = compare(np.zeros((1, 4, 6)), np.zeros((1, 5, 6)), precision="fp32")
    assert not errors[0].passed


def test_the_verdict_key_holds_the_engines_numerics(tf_style) -> None:
    """auto's strict-FP32 rung (no TF32, no cuDNN autotuning) builds an engine of the same name as the FP32
    rung before it: its own check must run, not the cached verdict of the TF32 engine."""
    from types import SimpleNamespace

    from streamd.checks.verify import identity

    def engine(numerics: str) -> SimpleNamespace:
        return SimpleNamespace(name="torch-cuda-fp32", steps=(), numerics=numerics)

    tf32 = identity(engine("tf32=True,cudnn_benchmark=True"), tf_style, "fp32", PLAN)
    strict = identity(engine("tf32=False,cudnn_benchmark=False"), tf_style, "fp32", PLAN)
    assert tf32 != strict and tf32 == identity(
        engine("tf32=True,cudnn_benchmark=True"), tf_style, "fp32", PLAN
    )


def test_auto_checks_every_precision_at_fp32s_detection_bar() -> None:
    """engine.type auto promises the CPU path's detections: an fp16 engine it tries must match them as an
    fp32 one must (IoU ≥ 0.95, 99 %), or auto goes on to fp32; a named engine.type with precision fp16 keeps
    fp16's looser bar (what the user chose). The plan is part of the verdict's cache key."""
    from dataclasses import replace

    from streamd.config import load_config

    demo = load_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml")

    def plan(engine_type: str) -> VerifyPlan:
        return VerifyPlan.from_config(replace(demo, engine=replace(demo.engine, type=engine_type)))

    auto, named = plan("auto"), plan("torch")
    assert (auto.tolerance("fp16").iou, auto.tolerance("fp16").match) == (0.95, 0.99)
    assert auto.tolerance("fp16").max_rel == TOLERANCES["fp16"].max_rel  # outputs: still fp16's bounds
    assert named.tolerance("fp16") == TOLERANCES["fp16"]
    assert auto.tolerance("fp32") == named.tolerance("fp32") == TOLERANCES["fp32"]
    assert auto.key() != named.key()
