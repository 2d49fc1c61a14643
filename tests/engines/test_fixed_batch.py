"""Models whose ONNX fixes the batch at N > 1 run with the engine's batch pinned at N
(``registry.FixedBatch``): a batch of fewer rows is padded, a larger one runs N rows at a time, the padding
rows' results are ignored, and one info line says so. Each engine's output must equal running every image
alone through the same weights with a dynamic batch (the reference)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import onnxruntime as ort
import pytest

from streamd.checks.verify import create_engine
from streamd.engines import onnx_tools
from streamd.engines.base import EngineError
from streamd.engines.onnxruntime import OnnxRuntimeEngine
from streamd.engines.options import EngineOptions
from streamd.engines.registry import FixedBatch
from streamd.gpu.cuda import Stream
from tests.engines.tiny_models import make_detector, random_images


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> dict[object, Path]:
    """The tiny detector with fixed batches 2 and 4 (a Reshape pins the batch: no other batch runs) and the
    same weights with a dynamic batch."""
    root = tmp_path_factory.mktemp("fixed")
    return {
        2: make_detector(root / "tiny-b2.onnx", batch=2, seed=3),
        4: make_detector(root / "tiny-b4.onnx", batch=4, seed=3),
        "dynamic": make_detector(root / "tiny-dyn.onnx", seed=3),
    }


def alone(model: Path, x: np.ndarray) -> np.ndarray:
    """Every image on its own (batch 1) through the dynamic-batch twin."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"images": x[i : i + 1]})[0] for i in range(len(x))])


def said(caplog: pytest.LogCaptureFixture, n: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"fixes its batch at {n}" in r.getMessage()]


def test_the_model_really_refuses_other_batches(fixed):
    session = ort.InferenceSession(str(fixed[2]), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match=r"(?i)dimension|shape"):
        session.run(None, {"images": random_images(1)})
    raw = OnnxRuntimeEngine(fixed[2], EngineOptions(max_batch=8))
    assert (raw.batch_fixed, raw.max_batch, raw.output_shape) == (2, 2, (1, 84, 320))
    with pytest.raises(EngineError, match="fixed at 2, got 1"):
        raw.infer(random_images(1))
    raw.close()


@pytest.mark.parametrize(
    ("n", "max_batch", "top"),
    [(2, 8, 8), (2, 5, 6), (4, 8, 8), (4, 6, 8), (4, 1, 4), (2, 2, 2)],
)
def test_onnxruntime_pins_the_batch(fixed, caplog, n, max_batch, top):
    with caplog.at_level("INFO"):
        engine = create_engine("onnxruntime", fixed[n], max_batch=max_batch)
    assert isinstance(engine, FixedBatch) and engine.pinned_batch == n
    assert engine.max_batch == top and top % n == 0  # rounded up to a multiple of N
    assert (engine.input_shape, engine.output_shape, engine.name) == (
        (3, 32, 32),
        (1, 84, 320),
        "onnxruntime-cpu",
    )
    (line,) = said(caplog, n)
    assert "padded" in line and f"batches of up to {top}" in line
    assert ("rounded up" in line) == (top != max_batch)
    x = random_images(top, seed=7)
    ref = alone(fixed["dynamic"], x)
    for b in sorted({1, n - 1, n, n + 1, top} - {0}):
        if b <= top:
            np.testing.assert_allclose(engine.infer(x[:b]), ref[:b], rtol=1e-5, atol=1e-5)
    with pytest.raises(EngineError, match=f"outside 1..{top}"):
        engine.infer(random_images(top + 1))
    engine.close()


def test_batch_one_still_runs_image_by_image(models, caplog):
    """A fixed batch 1 that cannot be made dynamic (here: refused on purpose) keeps running image by image."""
    with caplog.at_level("INFO"), mock.patch.object(onnx_tools, "verify_batch_dynamic", return_value=False):
        engine = create_engine("onnxruntime", models["b1"], max_batch=3)
    assert isinstance(engine, FixedBatch) and (engine.pinned_batch, engine.max_batch) == (1, 3)
    assert len([m for m in said(caplog, 1) if "run image by image" in m]) == 1
    x = random_images(3)
    np.testing.assert_allclose(engine.infer(x), alone(models["b1"], x), rtol=1e-5, atol=1e-5)
    engine.close()


def test_torch_cpu_pins_the_batch(torch_ready, fixed, caplog, tmp_path):
    """The torch engine (CPU) on a fixed batch 4, through the start-up check (which pads too)."""
    with caplog.at_level("INFO"):
        engine = create_engine("torch", fixed[4], max_batch=6, device="cpu", cache_dir=tmp_path)
    assert isinstance(engine, FixedBatch) and (engine.pinned_batch, engine.max_batch) == (4, 8)
    assert engine.name == "torch-cpu-fp32" and engine.engine.batch_fixed == 4
    assert engine.verification["passed"] and engine.verification["inputs"] == 4
    assert len(said(caplog, 4)) == 1
    x = random_images(8, seed=11)
    ref = alone(fixed["dynamic"], x)
    for b in (1, 3, 4, 5, 8):
        np.testing.assert_allclose(engine.infer(x[:b]), ref[:b], rtol=1e-4, atol=1e-4)
    engine.close()


def test_device_path_pads_in_the_callers_buffers(fake_trt, fixed, tmp_path):
    """``enqueue`` on a fixed-batch engine (TensorRT fake: host memory stands in for device memory): a batch
    of 3 on a fixed batch of 2 runs twice on slot buffers of ``max_batch`` rows; rows 0..2 are the results."""
    _, cuda = fake_trt
    engine = create_engine("tensorrt", fixed[2], max_batch=6, cuda_api=cuda, cache_dir=tmp_path, verify=False)
    assert isinstance(engine, FixedBatch) and engine.on_device and engine.max_batch == 6
    x = random_images(6, seed=5)
    out = np.zeros((6, 84, 320), np.float32)
    engine.enqueue(x.ctypes.data, out.ctypes.data, 3, Stream.borrow(9))
    np.testing.assert_allclose(out[:3], alone(fixed["dynamic"], x[:3]), rtol=1e-5, atol=1e-5)
    assert not out[4:].any()  # the third call was never made: 3 rows need two calls of 2
    np.testing.assert_allclose(engine.infer(x[:5]), alone(fixed["dynamic"], x[:5]), rtol=1e-5, atol=1e-5)
    engine.close()
