"""A model whose input H/W are dynamic (Ultralytics' ``export(format="onnx", dynamic=True)``: input
``[batch, 3, height, width]``) runs at ``model.input_size`` on every engine: ONNX Runtime, torch (on the CPU
here) and TensorRT (through the fake, whose profile must then be at that size)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from streamd.checks.verify import VerifyPlan
from streamd.checks.verify import create_engine as create_checked
from streamd.engines import create_engine, onnx_tools
from streamd.engines.base import EngineError
from streamd.engines.options import EngineOptions
from streamd.exitcodes import EX_CONFIG
from streamd.stages.preprocess.spec import PreprocessSpec
from tests.engines.tiny_models import make_detector

W, H = 64, 32  # input_size (width, height): not square, so a swapped H/W shows


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_detector(tmp_path_factory.mktemp("dyn") / "tiny-dyn.onnx", dynamic_hw=True)


def images(batch: int, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).random((batch, 3, H, W), dtype=np.float32) * 4 - 2).astype(np.float32)


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"images": x})[0]


def with_input_dims(model: Path, dims: list[int | str], out: Path) -> Path:
    m = onnx.load(str(model))
    for d, value in zip(m.graph.input[0].type.tensor_type.shape.dim, dims, strict=True):
        d.Clear()
        if isinstance(value, int):
            d.dim_value = value
        else:
            d.dim_param = value
    onnx.save(m, str(out))
    return out


def test_model_io_resolves_a_dynamic_h_w_from_input_size(dynamic: Path, tmp_path: Path) -> None:
    model = onnx.load(str(dynamic))
    with pytest.raises(EngineError) as err:
        onnx_tools.model_io(model, "tiny-dyn.onnx")
    assert err.value.code == EX_CONFIG
    assert str(err.value).startswith("model.input_size: the model's input H, W are dynamic")
    assert "['batch', 3, 'height', 'width']" in str(err.value) and "set model.input_size" in str(err.value)
    io = onnx_tools.model_io(model, "tiny-dyn.onnx", (W, H))
    assert io.chw == (3, H, W) and io.dynamic_hw == ("H", "W") and io.batch is None
    pinned, fixed_io, steps = onnx_tools.fix_input_size(model, "tiny-dyn.onnx", (W, H))
    assert steps == (f"hw{W}x{H}-v1",) and fixed_io.chw == (3, H, W) and fixed_io.dynamic_hw == ("H", "W")
    assert onnx_tools.model_io(pinned).dynamic_hw == ()  # the copy's input is [batch, 3, 32, 64]
    assert onnx_tools.model_io(model, "m", (W, H)).dynamic_hw == ("H", "W")  # the argument is unchanged
    # -1 and 0 are dynamic too; a fixed dim is kept as the file says (the caller compares it with the config)
    only_w = onnx.load(str(with_input_dims(dynamic, ["b", 3, 32, -1], tmp_path / "w.onnx")))
    with pytest.raises(EngineError, match="input W is dynamic"):
        onnx_tools.model_io(only_w)
    half = onnx_tools.model_io(only_w, "w", (96, 64))
    assert half.chw == (3, 32, 96) and half.dynamic_hw == ("W",)
    zero = onnx.load(str(with_input_dims(dynamic, [1, 3, 0, 0], tmp_path / "z.onnx")))
    assert onnx_tools.model_io(zero, "z", (W, H)).chw == (3, H, W)
    with pytest.raises(EngineError, match="with a fixed C"):
        onnx_tools.model_io(onnx.load(str(with_input_dims(dynamic, [1, "c", 32, 32], tmp_path / "c.onnx"))))


def test_onnxruntime_runs_at_input_size(dynamic: Path) -> None:
    with pytest.raises(EngineError, match=r"^model.input_size: ") as err:
        create_engine("onnxruntime", dynamic, max_batch=4)
    assert err.value.code == EX_CONFIG
    engine = create_engine("onnxruntime", dynamic, max_batch=4, input_size=(W, H))
    assert engine.input_shape == (3, H, W) and engine.output_shape == (
        1,
        84,
        (H // 2) * (W // 2) + (H // 4) * (W // 4),
    )
    x = images(3)
    np.testing.assert_allclose(engine.infer(x), reference(dynamic, x), rtol=1e-5, atol=1e-5)
    engine.close()


def test_a_fixed_model_ignores_input_size(tmp_path: Path) -> None:
    fixed = make_detector(
        tmp_path / "fixed.onnx"
    )  # [batch, 3, 32, 32]: the file wins; the config check compares
    engine = create_engine("onnxruntime", fixed, max_batch=2, input_size=(640, 640))
    assert engine.input_shape == (3, 32, 32)
    engine.close()


def test_torch_cpu_converts_and_runs_at_input_size(torch_ready, dynamic: Path, tmp_path: Path) -> None:
    plan = VerifyPlan(
        preprocess=PreprocessSpec(W, H)
    )  # the config's model.input_size, as the worker passes it
    engine = create_checked("torch", dynamic, max_batch=4, device="cpu", verify=plan, cache_dir=tmp_path)
    assert engine.input_shape == (3, H, W) and engine.steps[0] == f"hw{W}x{H}-v1"
    assert engine.verification["passed"]
    x = images(2)
    np.testing.assert_allclose(engine.infer(x), reference(dynamic, x), rtol=1e-4, atol=1e-4)
    engine.close()


def test_tensorrt_profile_is_at_input_size(fake_trt, dynamic: Path, tmp_path: Path) -> None:
    from streamd.engines.tensorrt import TensorRTEngine

    trt, cuda = fake_trt
    options = EngineOptions(max_batch=4, precision="fp32", cache_dir=tmp_path / "cache", cuda_api=cuda)
    with pytest.raises(EngineError, match=r"^model.input_size: ") as err:
        TensorRTEngine(dynamic, options)
    assert err.value.code == EX_CONFIG
    from dataclasses import replace

    engine = TensorRTEngine(dynamic, replace(options, input_size=(W, H)))
    (build,) = trt._builds
    assert build["profile"] == ((1, 3, H, W), (4, 3, H, W), (4, 3, H, W))  # min = opt = max in H, W
    assert engine.input_shape == (3, H, W)
    key = engine.plan.key.fields
    assert key["prepare"] == [f"hw{W}x{H}-v1"]
    assert key["profile"] == {"images": [[1, 3, H, W], [4, 3, H, W], [4, 3, H, W]]}
    x = images(3)
    np.testing.assert_allclose(engine.infer(x), reference(dynamic, x), rtol=1e-5, atol=1e-5)
    engine.close()
    other = TensorRTEngine(dynamic, replace(options, input_size=(W, W)))  # another size: another plan
    assert len(trt._builds) == 2 and other.input_shape == (3, W, W)
    other.close()


def test_tensorrt_fixed_batch_with_dynamic_h_w_needs_no_profile(
    fake_trt, dynamic: Path, tmp_path: Path
) -> None:
    from streamd.engines.tensorrt import TensorRTEngine

    trt, cuda = fake_trt
    b2 = with_input_dims(dynamic, [2, 3, "height", "width"], tmp_path / "b2.onnx")
    options = EngineOptions(
        max_batch=2, precision="fp32", cache_dir=tmp_path / "c", cuda_api=cuda, input_size=(W, H)
    )
    engine = TensorRTEngine(b2, options)
    assert trt._builds[-1]["profile"] is None and engine.input_shape == (3, H, W) and engine.max_batch == 2
    engine.close()
