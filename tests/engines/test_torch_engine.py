"""torch engine on the CPU: ONNX conversion, which constants stay on the host, and host inference.

The CUDA path (ExternalStream, our device pointers, CUDA graphs) is in tests/engines/gpu/. Skipped without
torch and onnx2torch (CI installs neither; pip install 'streamd[torch]').
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from streamd.engines.base import EngineError
from streamd.engines.options import EngineOptions
from streamd.gpu.cuda import Stream
from tests.engines.tiny_models import random_images


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]


def consumers(module, target: str) -> set[str]:
    """Module classes that read the fx get_attr ``target``."""
    node = next(n for n in module.graph.nodes if n.op == "get_attr" and n.target == target)
    return {type(module.get_submodule(u.target)).__name__ for u in node.users}


def test_shape_constants_stay_on_the_host(torch_ready, models):
    from streamd.engines.torch import convert_model, keep_constants_on_host

    module, io, steps = convert_model(models["dynamic"], max_batch=4)
    assert io.batch is None and any(s.startswith("onnxslim") for s in steps)
    targets = {n.target for n in module.graph.nodes if n.op == "get_attr"}
    moved = set(keep_constants_on_host(module))
    readers = {t: consumers(module, t) for t in targets}
    for target, kinds in readers.items():
        on_host = kinds <= {"OnnxPadDynamic", "OnnxResize", "ExactResize", "OnnxReshape", "OnnxSplit13"}
        assert (target in moved) == on_host, (target, kinds)
    assert any("OnnxBinaryMathOperation" in k for k in readers.values())  # the Mul constant stays put
    assert len(moved) >= 5


def test_constant_shared_by_host_and_device_uses_gets_a_host_copy(torch_ready):
    import onnx2torch
    import torch

    from streamd.engines.torch import keep_constants_on_host

    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [8, 2])
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["images", "shape"], ["r"]),
            helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["r", "shape_f"], ["output0"]),
        ],
        "shared",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 4, 2, 2])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [8, 2])],
        [shape],
    )
    module = onnx2torch.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    # onnx2torch gives each use of an initializer its own buffer; make both uses read one buffer.
    first, *others = [n for n in module.graph.nodes if n.op == "get_attr"]
    for other in others:
        other.replace_all_uses_with(first)
        module.graph.erase_node(other)
    module.recompile()
    moved = keep_constants_on_host(module)
    assert moved == [f"{first.target} (host copy)"]
    reshape = next(n for n in module.graph.nodes if n.op == "call_module" and "Reshape" in n.target)
    assert module.get_buffer(reshape.args[1].target).device.type == "cpu"
    assert reshape.args[1] is not first and len(first.users) == 1
    x = torch.randn(1, 4, 2, 2)
    expected = x.reshape(8, 2) * torch.tensor([8.0, 2.0])
    assert torch.allclose(module(x), expected)


def test_shape_op_runs_on_the_host(torch_ready, tmp_path):
    import torch

    from streamd.engines.torch import keep_constants_on_host

    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["images"], ["a"]),
            helper.make_node("Shape", ["images"], ["s"]),
            helper.make_node("Reshape", ["a", "s"], ["output0"]),
        ],
        "shape",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 4, 4])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 3, 4, 4])],
    )
    import onnx2torch

    module = onnx2torch.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    keep_constants_on_host(module)
    assert any(type(m).__name__ == "HostShape" for m in module.modules())
    x = torch.randn(2, 3, 4, 4)
    assert torch.equal(module(x), torch.relu(x))


@pytest.mark.parametrize("model", ["dynamic", "b1"])
def test_cpu_engine_matches_onnxruntime(torch_ready, models, model):
    from streamd.engines.torch import TorchEngine

    e = TorchEngine(models[model], EngineOptions(max_batch=4, precision="fp16", device="cpu", threads=1))
    assert (e.name, e.on_device, e.max_batch) == ("torch-cpu-fp32", False, 4)  # CPU runs FP32
    assert (e.input_shape, e.output_shape) == ((3, 32, 32), (1, 84, 320))
    x = random_images(3)
    ref = np.concatenate([reference(models[model], x[i : i + 1]) for i in range(3)])
    np.testing.assert_allclose(e.infer(x), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(EngineError, match="host engine"):
        e.enqueue(0, 0, 1, Stream.borrow(1))
    e.close()
    e.close()


def test_gpu_engine_needs_cuda(torch_ready, models, monkeypatch):
    from streamd.engines.torch import TorchEngine

    monkeypatch.setattr(torch_ready.cuda, "is_available", lambda: False)
    with pytest.raises(EngineError, match="no CUDA device"):
        TorchEngine(models["dynamic"], EngineOptions(max_batch=2, device=0))
    with pytest.raises(EngineError, match="int8"):
        TorchEngine(models["dynamic"], EngineOptions(max_batch=2, precision="int8", device="cpu"))


def test_a_device_that_does_not_exist_is_a_config_error(torch_ready, models, monkeypatch):
    """pipeline.devices: [0, 1] on a one-GPU box: the worker on device 1 ends with one line and exit 78
    before it converts the model or touches CUDA."""
    from streamd.engines.torch import TorchEngine
    from streamd.exitcodes import EX_CONFIG

    monkeypatch.setattr(torch_ready.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch_ready.cuda, "device_count", lambda: 1)
    for device in (1, -1):
        with pytest.raises(EngineError, match=rf"CUDA device {device} does not exist: this process sees 1"):
            TorchEngine(models["dynamic"], EngineOptions(max_batch=2, device=device))
    with pytest.raises(EngineError, match=r"pipeline\.devices") as e:
        TorchEngine(models["dynamic"], EngineOptions(max_batch=2, device=2))
    assert e.value.code == EX_CONFIG


def test_a_model_that_needs_onnxslim_says_so_when_it_is_missing(torch_ready, monkeypatch):
    """RT-DETR converted unsimplified fails inside onnx2torch's Tile (a TypeError from torch.Size, what the
    twelfth session's GPU call hit with onnxslim missing from the box): the engine names the fix instead."""
    from streamd.engines import onnx_tools
    from streamd.engines.torch import TorchEngine

    model = Path(__file__).resolve().parents[1] / "data" / "zoo" / "rtdetr-l-tiny-160-dyn.onnx"
    monkeypatch.setattr(onnx_tools, "slim", lambda m: (m, None))  # as when onnxslim is not installed
    options = EngineOptions(max_batch=2, precision="fp32", device="cpu", input_size=(160, 160))
    with pytest.raises(EngineError, match=r"onnxslim did not run .*streamd\[torch\]"):
        TorchEngine(model, options)
