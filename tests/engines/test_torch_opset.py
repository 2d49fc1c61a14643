"""``fold_static_topk`` on a model whose input is float16: ONNX Runtime is probed with float16 (review
finding: a float32 probe raised), and a probe that cannot run leaves the TopK as it is instead of raising."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from streamd.engines.torch_opset import fold_static_topk


def _topk_model(elem: int) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Min", ["n", "cap"], ["k1"]),
        helper.make_node("Reshape", ["k1", "shape1"], ["k"]),
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(30, np.int64), "cap"),
        numpy_helper.from_array(np.array([1], np.int64), "shape1"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", elem, ["batch", 50])],
        [helper.make_tensor_value_info("v", elem, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_fp16_input_is_probed_in_fp16() -> None:
    model = _topk_model(TensorProto.FLOAT16)
    assert fold_static_topk(model) == 1
    k = next(n for n in model.graph.node if n.op_type == "TopK").input[1]
    assert numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == k)).tolist() == [30]


def test_a_probe_that_cannot_run_leaves_the_model_as_it_is() -> None:
    model = _topk_model(TensorProto.FLOAT)
    model.graph.node.append(helper.make_node("Frobnicate", ["v"], ["w"], domain="com.example"))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    assert fold_static_topk(model) == 0
