"""``streamd.engines.torch_place`` on small hand-made graphs (converted without onnxslim, which would fold
them): shape arithmetic on the host, activation-sized makers on the device, device copies only where a device
op reads a host value, and the placed module computing what the converted one computes."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

torch = pytest.importorskip("torch")


def _convert(nodes: list[Any], initializers: list[Any], out_shape: list[Any]) -> Any:
    from streamd.engines import torch_ops

    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("images", T.FLOAT, ["N", 3, 8, 8])],
        [h.make_tensor_value_info("output0", T.FLOAT, out_shape)],
        initializers,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    return torch_ops.import_onnx2torch().convert(model).eval()


def _shape_read_on_host_and_device() -> Any:
    """Shape(x) builds Reshape's target (host arithmetic) and is multiplied by a device scalar."""
    nodes = [
        h.make_node("Shape", ["images"], ["s"]),
        h.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        h.make_node("Concat", ["n1", "m1"], ["shp"], axis=0),
        h.make_node("Reshape", ["images", "shp"], ["flat"]),
        h.make_node("ReduceMax", ["images"], ["mx"], keepdims=0),
        h.make_node("Cast", ["mx"], ["k"], to=T.INT64),
        h.make_node("Mul", ["s", "k"], ["sk"]),
        h.make_node("ReduceSum", ["sk"], ["t"], keepdims=0),
        h.make_node("Cast", ["t"], ["tf"], to=T.FLOAT),
        h.make_node("Add", ["flat", "tf"], ["output0"]),
    ]
    inits = [
        h.make_tensor("zero", T.INT64, [], [0]),
        h.make_tensor("ax", T.INT64, [1], [0]),
        h.make_tensor("m1", T.INT64, [1], [-1]),
    ]
    return _convert(nodes, inits, ["N", 192])


def _makers_from_a_shape() -> Any:
    """Expand(a constant, Shape(x)) and ConstantOfShape(Shape(x)): activation-sized outputs from a shape."""
    nodes = [
        h.make_node("Shape", ["images"], ["s"]),
        h.make_node("Expand", ["half", "s"], ["e"]),
        h.make_node("ConstantOfShape", ["s"], ["c"], value=h.make_tensor("v", T.FLOAT, [1], [2.0])),
        h.make_node("Add", ["images", "e"], ["a"]),
        h.make_node("Mul", ["a", "c"], ["output0"]),
    ]
    return _convert(nodes, [h.make_tensor("half", T.FLOAT, [1], [0.5])], ["N", 3, 8, 8])


def _names(module: Any, nodes: set[Any]) -> set[str]:
    return {type(module.get_submodule(n.target)).__name__ for n in nodes if n.op == "call_module"}


def test_placed_module_computes_what_the_converted_one_does(torch_ready) -> None:
    from streamd.engines.torch_place import keep_constants_on_host

    for make in (_shape_read_on_host_and_device, _makers_from_a_shape):
        module = make()
        reference = copy.deepcopy(module)
        keep_constants_on_host(module, torch.device("cpu"))
        for batch in (1, 3, 2):
            x = torch.rand(batch, 3, 8, 8)
            np.testing.assert_allclose(module(x).numpy(), reference(x).numpy(), rtol=0, atol=0)


def test_makers_run_on_the_device_and_constant_of_shape_is_replaced(torch_ready) -> None:
    """Expand and ConstantOfShape of a shape are as large as an activation: never computed on the host (each
    call would build and copy them), and ConstantOfShape makes its output where the model lives, its fill
    value a Python number (onnx2torch's reads a tensor with .item(): a sync on the device)."""
    from streamd.engines.torch_place import host_valued, keep_constants_on_host

    module = _makers_from_a_shape()
    on_host = host_valued(module)
    assert _names(module, on_host) == {"OnnxShape"}
    moved = keep_constants_on_host(module, torch.device("cpu"))
    kinds = {type(m).__name__ for m in module.modules()}
    assert "ConstantOfShape" in kinds and "OnnxConstantOfShape" not in kinds, moved


def test_a_value_read_on_the_host_and_on_the_device_is_copied_for_the_device_read_only(torch_ready) -> None:
    """Shape(x) feeds host arithmetic (Gather/Unsqueeze/Concat → Reshape's target) and a device Mul: only the
    Mul gets the kept device copy, and the audit finds nothing (its host readers stay host readers)."""
    from streamd.engines.torch_place import host_valued, keep_constants_on_host
    from tools.torch_graph_audit import audit

    module = _shape_read_on_host_and_device()
    assert {"OnnxShape", "OnnxGather", "OnnxConcat"} <= _names(module, host_valued(module))
    keep_constants_on_host(module, torch.device("cpu"))
    copies = [n for n in module.graph.nodes if n.op == "call_module" and "device_copy" in str(n.target)]
    assert len(copies) == 1
    (reader,) = copies[0].users
    assert type(module.get_submodule(reader.target)).__name__ == "OnnxBinaryMathOperation"  # the Mul
    assert audit(None, None, converted=(_shape_read_on_host_and_device(), (3, 8, 8))) == []


def test_a_host_read_position_keeps_the_host_value_when_the_same_op_also_reads_it_on_the_device() -> None:
    """One user reading a host value at a HOST_ARGS position and at a device position: only the device
    position gets the copy (a device copy at the host position would be read back: a sync)."""
    from torch import fx

    from streamd.engines.torch_place import _replace_device_reads

    class OnnxReshape(torch.nn.Module):  # the class name is what HOST_ARGS keys on: arg 1 is read on the host
        def forward(self, x: Any, shape: Any) -> Any:
            return x.reshape(shape.tolist())

    root = torch.nn.Module()
    root.add_module("reshape", OnnxReshape())
    graph = fx.Graph()
    value = graph.placeholder("value")
    copied = graph.placeholder("copied")
    user = graph.call_module("reshape", (value, value))
    graph.output(user)
    module = fx.GraphModule(root, graph)
    _replace_device_reads(module, value, user, copied)
    assert user.args == (copied, value)


def test_the_graph_output_gets_the_device_copy_even_inside_a_tuple() -> None:
    """A host value the model returns (nested in the output tuple) is replaced there too."""
    from torch import fx

    from streamd.engines.torch_place import _replace_device_reads

    graph = fx.Graph()
    value = graph.placeholder("value")
    copied = graph.placeholder("copied")
    out = graph.output((value, value))
    module = fx.GraphModule(torch.nn.Module(), graph)
    _replace_device_reads(module, value, out, copied)
    assert out.args == ((copied, copied),)


def test_device_copies_are_kept_per_value_and_bounded() -> None:
    from streamd.engines.torch_place import KEPT_COPIES_MAX, _DeviceCopy

    copy_module = _DeviceCopy.make(torch.device("meta"))
    first = copy_module(torch.arange(4))
    assert first.device.type == "meta" and copy_module(torch.arange(4)) is first
    for n in range(5, 5 + 2 * KEPT_COPIES_MAX):  # data-dependent values: copied, but not all kept
        copy_module(torch.arange(n))
    assert len(copy_module.copies) == KEPT_COPIES_MAX
    assert copy_module(torch.arange(4)) is first  # a kept copy is never dropped (a graph may read it)
    on_target = torch.empty(3, device="meta")
    assert copy_module(on_target) is on_target
