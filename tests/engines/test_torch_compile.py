"""``engine.compile`` on the CPU: the graph rewrites that let Dynamo trace converted models — constant
reshapes as plain ``torch.reshape`` calls, RT-DETR's shape arithmetic as Python ints, constant operands as
Python values — each computing exactly what the model did before. Dynamo itself runs in
tests/engines/test_torch_compile_dynamo.py; the compile with Inductor on the GPU
(tests/engines/gpu/test_torch_engine_gpu.py, fp16-compiled)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

MODEL = Path(__file__).resolve().parents[2] / "models" / "nanodet-coco.onnx"


def test_frozen_reshapes_compute_the_same(torch_ready):
    import torch

    from streamd.engines.torch import convert_model
    from streamd.engines.torch_compile import freeze_reshapes

    module, _, _ = convert_model(MODEL, max_batch=4)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, 3, 416, 416)).astype(np.float32))
    with torch.inference_mode():
        before = module(x)
    assert freeze_reshapes(module) == 8  # every Reshape of the bundled NanoDet has a constant shape
    kinds = {type(m).__name__ for m in module.modules()}
    assert "OnnxReshape" not in kinds
    assert any(n.target is torch.reshape for n in module.graph.nodes if n.op == "call_function")
    with torch.inference_mode():
        after = module(x)
    torch.testing.assert_close(after, before, rtol=0, atol=0)


ZOO = Path(__file__).resolve().parents[1] / "data" / "zoo"


def _placed(name: str, as_on_a_gpu: bool = False):
    """The converted model placed on the CPU; ``as_on_a_gpu``: with what the placement adds on a GPU only
    (host shapes, kept device copies of host values: ``keep_constants_on_host``), its target the CPU here,
    so the graph the rewrites see is the GPU's and the model still runs (the thirteenth session's H200 run:
    RT-DETR's kept copy stopped ``pythonize_shapes``, which the plain CPU placement never showed)."""
    import torch

    from streamd.engines.torch import convert_model
    from streamd.engines.torch_place import keep_constants_on_host, place

    module, io, _ = convert_model(ZOO / name, max_batch=4, input_size=(160, 160))
    module = place(module, torch.device("cpu"), None, False)
    if as_on_a_gpu:
        keep_constants_on_host(module, torch.device("cpu"))
    return module, io.chw


def _runner(chw, outputs: dict):
    import torch

    def run(module, batch: int) -> None:
        x = torch.from_numpy(np.random.default_rng(batch).standard_normal((batch, *chw)).astype(np.float32))
        with torch.inference_mode():
            outputs[batch] = module(x)

    return run


@pytest.mark.parametrize("as_on_a_gpu", [False, True], ids=["cpu-placement", "gpu-placement"])
def test_rtdetr_shape_arithmetic_becomes_python_ints_and_computes_the_same(torch_ready, as_on_a_gpu: bool):
    """pythonize_shapes: RT-DETR's run-time shape arithmetic (host int64 tensors, what Dynamo fails on) turns
    into Python ints feeding plain reshape/repeat/expand calls — none of onnx2torch's shape-reading modules
    is left — and the copy computes exactly what the model does at three batch sizes. (Dynamo traces the
    copy with the batch dynamic: 69 s on this CPU, too slow for CI; Inductor and CUDA graphs on it run in
    tests/engines/gpu/test_torch_engine_gpu.py.)"""
    import torch

    from streamd.engines.torch_compile import freeze_reshapes, pythonize_shapes

    module, chw = _placed("rtdetr-l-tiny-160-dyn.onnx", as_on_a_gpu)
    freeze_reshapes(module)
    rewritten = pythonize_shapes(module)
    assert rewritten is not None
    kinds = {type(m).__name__ for m in rewritten.modules()}
    shape_ops = {"OnnxShape", "HostShape", "OnnxReshape", "OnnxTile", "OnnxExpand", "OnnxRange", "DeviceCopy"}
    assert not kinds & shape_ops, kinds
    if as_on_a_gpu:  # the copy made where the GPU's placement puts one (else this test checks nothing new)
        assert "DeviceCopy" in {type(m).__name__ for m in module.modules()}
    for batch in (1, 2, 3):
        plain: dict = {}
        python: dict = {}
        _runner(chw, plain)(module, batch)
        _runner(chw, python)(rewritten, batch)
        torch.testing.assert_close(python[batch], plain[batch], rtol=0, atol=0)


def test_the_gpu_placements_shape_op_keeps_its_bounds_for_the_rewrite(torch_ready):
    """On a GPU the placement swaps onnx2torch's OnnxShape for HostShape; pythonize_shapes reads the same
    ``_start``/``_end`` from either (a Shape(start, end) of opset 15 read whole would build wrong targets)."""
    import torch

    from streamd.engines.torch_place import _HostShape
    from streamd.engines.torch_shapes import _shape

    op = _HostShape.make(1, 3)
    x = torch.zeros(2, 3, 4, 5)
    assert (op._start, op._end) == (1, 3)
    assert op(x).tolist() == _shape(x, op._start, op._end) == [3, 4]


CONSTANT_KINDS = {
    "OnnxSlice",
    "OnnxTopK",
    "OnnxSplit13",
    "OnnxPadDynamic",
    "OnnxSqueezeDynamicAxes",
    "OnnxExpand",
}


@pytest.mark.parametrize(
    ("name", "rewrites"),
    [
        ("yolov8s-tiny-160-dyn.onnx", 12),
        ("rtdetr-l-tiny-160-dyn.onnx", 19),
        ("yolox-s-tiny-160-dyn.onnx", 6),
        ("yolo26s-tiny-160-dyn.onnx", 20),  # its Expand to a constant shape: Dynamo failed on it before
    ],
)
def test_constant_operands_become_python_values_and_compute_the_same(torch_ready, name: str, rewrites: int):
    """freeze_constant_args: the Slice/TopK/Split/Pad/Squeeze whose parameter inputs are constants (what
    Dynamo broke the graph on: .item()/.tolist() at every call) become plain torch calls, and the exact
    Resize gets its scales as lists; the model computes exactly what it did, at three batch sizes. (How
    many: counted from the converted graphs, the test's only fixed figure; a new onnx2torch may change it.)"""
    import torch

    from streamd.engines.torch_compile import freeze_constant_args, freeze_reshapes, pythonize_shapes

    module, chw = _placed(name)
    freeze_reshapes(module)
    target = pythonize_shapes(module) or module
    before: dict = {}
    for batch in (1, 2, 3):
        _runner(chw, before)(target, batch)
    names = sorted(n for n, _ in module.named_modules())
    assert freeze_constant_args(target) == rewrites
    if target is not module:  # pythonize_shapes' copy shares submodules: the engine's module keeps all of its
        assert sorted(n for n, _ in module.named_modules()) == names
    left = {type(m).__name__ for m in target.modules()} & CONSTANT_KINDS
    assert not left, left
    for batch in (1, 2, 3):
        after: dict = {}
        _runner(chw, after)(target, batch)
        torch.testing.assert_close(after[batch], before[batch], rtol=0, atol=0)


def _one_op(op, x_shape, consts):
    """A graph of one onnx2torch module reading ``consts`` (tensors, or None for an absent input) as get_attr
    constants, the way a converted model holds them."""
    import torch
    from torch import fx

    root = torch.nn.Module()
    root.op = op
    graph = fx.Graph()
    args = [graph.placeholder("x")]
    for i, c in enumerate(consts):
        if c is None:
            args.append(None)
        else:
            root.register_buffer(f"c{i}", c)
            args.append(graph.get_attr(f"c{i}"))
    graph.output(graph.call_module("op", tuple(args)))
    x = torch.from_numpy(np.random.default_rng(7).standard_normal(x_shape).astype(np.float32))
    return fx.GraphModule(root, graph), x


def _op_cases():
    from streamd.engines.torch_ops import import_onnx2torch

    import_onnx2torch()
    import torch
    from onnx2torch.node_converters import expand, pad, reshape, slice, split, squeeze, tile, topk

    t = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    big = 2**63 - 1
    return [
        ("slice reversed", slice.OnnxSlice(), (2, 3, 8, 8), [t(-1), t(-big - 1), t(3), t(-1)]),
        ("slice two axes", slice.OnnxSlice(), (2, 3, 8, 8), [t(1, 0), t(3, big), t(-1, 1), t(1, 2)]),
        ("slice no axes", slice.OnnxSlice(), (4, 6), [t(1, 2), t(3, -1)]),
        ("topk smallest unsorted", topk.OnnxTopK(dim=1, largest=0, sorted_=0), (2, 9, 3), [t(4)]),
        ("split", split.OnnxSplit13(num_splits=2, axis=1), (2, 3, 4), [t(1, 2)]),
        ("pad value", pad.OnnxPadDynamic("constant"), (1, 2, 4, 4), [t(0, 0, 1, 2, 0, 0, 2, 1),
                                                                       torch.tensor(1.5)]),
        ("pad value None", pad.OnnxPadDynamic("constant"), (1, 2, 4, 4), [t(0, 0, 1, 0, 0, 0, 0, 3), None]),
        ("pad reflect", pad.OnnxPadDynamic("reflect"), (1, 2, 5, 5), [t(0, 0, 1, 2, 0, 0, 2, 1)]),
        ("squeeze", squeeze.OnnxSqueezeDynamicAxes(), (1, 3, 1, 4, 1), [t(-1, 0)]),
        ("expand", expand.OnnxExpand(), (3, 1), [t(2, 1, 4)]),
        ("tile", tile.OnnxTile(), (1, 2, 3), [t(2, 1, 2)]),
        ("reshape copy", reshape.OnnxReshape(), (2, 3, 4), [t(0, -1)]),
    ]  # fmt: skip


def test_each_constant_op_rewrite_computes_what_the_onnx2torch_module_does(torch_ready):
    """freeze_constant_args op by op, on the inputs the zoo's models do not have: reversed and multi-axis
    slices, the smallest unsorted TopK, Pad with a value, with an explicit None and in reflect mode, Squeeze
    of negative axes, Expand, Tile and a Reshape that copies a dimension — each rewritten, each exact."""
    import torch

    from streamd.engines.torch_compile import freeze_constant_args

    for what, op, x_shape, consts in _op_cases():
        module, x = _one_op(op, x_shape, consts)
        before = module(x)
        assert freeze_constant_args(module) == 1, what
        assert not any(type(m).__module__.startswith("onnx2torch") for m in module.modules()), what
        torch.testing.assert_close(module(x), before, rtol=0, atol=0, msg=what)
