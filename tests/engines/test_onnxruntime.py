"""ONNX Runtime engine (CPU for real; the CUDA EP path through a recording stand-in session), the engine
registry, and the ONNX preparation shared by the engines (dynamic batch, FP16 conversion)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

from streamd.engines import Engine, create_engine, onnx_tools
from streamd.engines.base import EngineError, input_nbytes, output_nbytes
from streamd.engines.onnxruntime import OnnxRuntimeEngine
from streamd.engines.options import EngineOptions, Machine
from streamd.engines.registry import choose_backend
from streamd.gpu.cuda import Stream
from tests.engines.tiny_models import random_images

_RealSession = ort.InferenceSession


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    return _RealSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]


def test_cpu_engine_contract(models):
    e = create_engine("onnxruntime", models["dynamic"], max_batch=4, precision="fp16", threads=1)
    assert isinstance(e, Engine)
    assert (e.name, e.on_device, e.max_batch) == ("onnxruntime-cpu", False, 4)
    assert (e.input_shape, e.output_shape) == ((3, 32, 32), (1, 84, 320))
    assert e.input_dtype == np.float32 and e.output_dtype == np.float32
    assert input_nbytes(e, 2) == 2 * 3 * 32 * 32 * 4 and output_nbytes(e, 2) == 2 * 84 * 320 * 4
    x = random_images(3)
    np.testing.assert_allclose(
        e.infer(x), reference(models["dynamic"], x), rtol=1e-5, atol=1e-5
    )  # fp16: runs FP32
    with pytest.raises(EngineError, match="host engine"):
        e.enqueue(0, 0, 1, Stream.borrow(1))
    with pytest.raises(EngineError, match="max_batch"):
        e.infer(random_images(5))
    e.close()
    e.close()


def test_fixed_batch_one_model_runs_batches(models):
    e = OnnxRuntimeEngine(models["b1"], EngineOptions(max_batch=4))
    x = random_images(4)
    ref = np.concatenate([reference(models["b1"], x[i : i + 1]) for i in range(4)])
    np.testing.assert_allclose(e.infer(x), ref, atol=1e-5)
    assert e.batch_fixed is None  # made dynamic, proven equal


def test_bad_model_and_options(tmp_path, models):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(EngineError, match="cannot read ONNX model"):
        create_engine("onnxruntime", bad, max_batch=1)
    with pytest.raises(EngineError, match="unknown backend"):
        create_engine("openvino", models["dynamic"], max_batch=1)
    with pytest.raises(EngineError, match="precision"):
        create_engine("onnxruntime", models["dynamic"], max_batch=1, precision="fp8")
    with pytest.raises(EngineError, match="int8"):
        create_engine("onnxruntime", models["dynamic"], max_batch=1, precision="int8")


def test_auto_falls_back_to_onnxruntime_without_gpu():
    assert choose_backend("auto", Machine(tensorrt=False, torch_cuda=False)) == "onnxruntime"
    assert choose_backend("auto", Machine(tensorrt=False, torch_cuda=True)) == "torch"


class _FakeBinding:
    def __init__(self) -> None:
        self.inputs: list[tuple] = []
        self.outputs: list[tuple] = []

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        self.inputs.append((name, device_type, device_id, np.dtype(element_type), tuple(shape), buffer_ptr))

    def bind_output(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        self.outputs.append((name, device_type, device_id, np.dtype(element_type), tuple(shape), buffer_ptr))


class _FakeCudaSession:
    """onnxruntime-gpu's session as far as the engine uses it; "device" pointers are host addresses."""

    made: ClassVar[list[dict]] = []

    def __init__(self, model: bytes, opts, providers) -> None:
        self._cpu = _RealSession(model, opts, providers=["CPUExecutionProvider"])
        self.model = onnx.load_from_string(model)
        self.cuda = [p[1] for p in providers if isinstance(p, tuple) and p[0] == "CUDAExecutionProvider"]
        _FakeCudaSession.made.append({"cuda": self.cuda})

    def get_providers(self):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"] if self.cuda else ["CPUExecutionProvider"]

    def get_outputs(self):
        return self._cpu.get_outputs()

    def run(self, *args, **kw):
        return self._cpu.run(*args, **kw)

    def io_binding(self):
        return _FakeBinding()

    def run_with_iobinding(self, binding, run_options):
        assert run_options.get_run_config_entry("disable_synchronize_execution_providers") == "1"
        (name, dev, _, dtype, shape, ptr) = binding.inputs[0]
        assert dev == "cuda" and dtype == np.float32
        n = int(np.prod(shape))
        x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr)).reshape(shape).copy()
        y = self._cpu.run(None, {name: x})[0].astype(np.float32)
        (_, _, _, out_dtype, out_shape, out_ptr) = binding.outputs[0]
        assert out_shape == y.shape and out_dtype == np.float32
        ctypes.memmove(out_ptr, y.ctypes.data, y.nbytes)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_ep_binds_our_pointers_on_our_stream(models, monkeypatch, precision):
    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    monkeypatch.setattr(ort, "InferenceSession", _FakeCudaSession)
    _FakeCudaSession.made.clear()
    e = OnnxRuntimeEngine(models["dynamic"], EngineOptions(max_batch=4, precision=precision, device=0))
    assert e.on_device and e.name == "onnxruntime-cuda"
    x = random_images(3)
    out = np.zeros((3, *e.output_shape[1:]), np.float32)
    for stream in (11, 11, 12):
        e.enqueue(x.ctypes.data, out.ctypes.data, 3, Stream.borrow(stream))
    np.testing.assert_allclose(
        out, reference(models["dynamic"], x), atol=0.1 if precision == "fp16" else 1e-5
    )
    streams = [m["cuda"][0].get("user_compute_stream") for m in _FakeCudaSession.made if m["cuda"]]
    assert streams == [None, "11", "12"]  # probe session, then one session per caller stream
    assert e.input_dtype == np.float32  # FP16 models keep FP32 I/O


def test_fp16_conversion_keeps_io_and_resize_scales_fp32(models):
    model = onnx_tools.load(models["dynamic"])
    half = onnx_tools.convert_to_fp16(model)
    assert model.graph.initializer[0].data_type == TensorProto.FLOAT  # the argument is untouched
    types = {t.name: t.data_type for t in half.graph.initializer}
    assert types["conv1.w"] == TensorProto.FLOAT16 and types["pad.value"] == TensorProto.FLOAT16
    assert types["resize.scales"] == TensorProto.FLOAT and types["reshape1.shape"] == TensorProto.INT64
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert half.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert half.graph.node[0].op_type == "Cast" and half.graph.node[-1].op_type == "Cast"
    x = random_images(2)
    got = ReferenceEvaluator(half).run(None, {"images": x})[0]
    ref = reference(models["dynamic"], x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=0.1)
    assert np.abs(got - ref).max() > 0  # it really computed in FP16


def test_fp16_conversion_clamps_out_of_range_weights(models, caplog):
    model = onnx_tools.load(models["dynamic"])
    from onnx import numpy_helper

    for t in model.graph.initializer:
        if t.name == "head1.b":
            big = numpy_helper.to_array(t).copy()
            big[0] = 1e6
            t.CopyFrom(numpy_helper.from_array(big, t.name))
    half = onnx_tools.convert_to_fp16(model)
    value = next(numpy_helper.to_array(t) for t in half.graph.initializer if t.name == "head1.b")
    assert value[0] == np.float16(65504) and "clamped" in caplog.text


def test_make_batch_dynamic(models):
    fixed = onnx_tools.load(models["b1"])
    dynamic = onnx_tools.make_batch_dynamic(fixed)
    assert dynamic is not None and onnx_tools.model_io(dynamic).batch is None
    assert onnx_tools.verify_batch_dynamic(fixed, dynamic)
    assert onnx_tools.make_batch_dynamic(onnx_tools.load(models["dynamic"])) is None  # already dynamic


def test_has_qdq(models):
    assert onnx_tools.has_qdq(onnx_tools.load(models["qdq"]))
    assert not onnx_tools.has_qdq(onnx_tools.load(models["dynamic"]))
