"""Tiny ONNX detectors with the bundled model's interface, made with onnx.helper (no download, < 100 kB).

``make_detector`` gives input ``images`` [B, 3, S, S] float32 and output ``output0`` [B, 4 + C, N] (YOLOv8
layout), built from the op kinds of the NanoDet graph that matter to the engines: Conv, LeakyRelu, a Pad
whose pads/value are initializers, MaxPool, Resize with a float ``scales`` initializer, Reshape with an
integer shape initializer, Split, Sigmoid, Mul, Concat.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_detector(
    path: Path,
    *,
    batch: int | None = None,
    size: int = 32,
    num_classes: int = 80,
    seed: int = 0,
    opset: int = 13,
    resize_coordinates: str = "half_pixel",
    dynamic_hw: bool = False,
) -> Path:
    """Write the model to ``path``; ``batch`` None = dynamic batch ("batch"), else that fixed batch.
    ``resize_coordinates``: the Resize's coordinate_transformation_mode (``asymmetric`` is what tf2onnx
    writes for TensorFlow's ResizeBilinear, and what onnx2torch alone translates wrongly). ``dynamic_hw``:
    input ``[batch, 3, height, width]`` as Ultralytics' ``dynamic=True`` export writes it, output
    ``[batch, 4 + C, anchors]`` whose N follows H and W (``size`` then only scales the boxes)."""
    rng = np.random.default_rng(seed)
    c = 4 + num_classes
    s1, s2 = size // 2, size // 4
    lead = 0 if batch is None else batch  # Reshape's leading dim: 0 copies the input's, a number fixes it

    def w(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    inits = [
        numpy_helper.from_array(w(8, 3, 3, 3), "conv1.w"),
        numpy_helper.from_array(w(8, scale=0.1), "conv1.b"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pad.pads"),
        numpy_helper.from_array(np.array(-np.inf, np.float32), "pad.value"),
        numpy_helper.from_array(np.zeros(0, np.float32), "resize.roi"),
        numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "resize.scales"),
        numpy_helper.from_array(w(c, 8, 1, 1), "head1.w"),
        numpy_helper.from_array(w(c, scale=0.1), "head1.b"),
        numpy_helper.from_array(w(c, 8, 1, 1), "head2.w"),
        numpy_helper.from_array(w(c, scale=0.1), "head2.b"),
        numpy_helper.from_array(
            np.array([lead, c, -1 if dynamic_hw else s1 * s1], np.int64), "reshape1.shape"
        ),
        numpy_helper.from_array(
            np.array([lead, c, -1 if dynamic_hw else s2 * s2], np.int64), "reshape2.shape"
        ),
        numpy_helper.from_array(np.array([4, num_classes], np.int64), "split.sizes"),
        numpy_helper.from_array(np.array(float(size), np.float32), "box.scale"),
    ]
    nodes = [
        helper.make_node("Conv", ["images", "conv1.w", "conv1.b"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c1"], ["a1"], alpha=0.1),
        helper.make_node("Pad", ["a1", "pad.pads", "pad.value"], ["p1"], mode="constant"),
        helper.make_node("MaxPool", ["p1"], ["m1"], kernel_shape=[3, 3], strides=[1, 1]),
        helper.make_node(
            "Resize",
            ["m1", "resize.roi", "resize.scales"],
            ["r1"],
            mode="linear",
            coordinate_transformation_mode=resize_coordinates,
        ),
        helper.make_node("Conv", ["m1", "head1.w", "head1.b"], ["h1"]),
        helper.make_node("Conv", ["r1", "head2.w", "head2.b"], ["h2"]),
        helper.make_node("Reshape", ["h1", "reshape1.shape"], ["f1"]),
        helper.make_node("Reshape", ["h2", "reshape2.shape"], ["f2"]),
        helper.make_node("Concat", ["f1", "f2"], ["cat"], axis=2),
        helper.make_node("Split", ["cat", "split.sizes"], ["box_raw", "cls_raw"], axis=1),
        helper.make_node("Sigmoid", ["box_raw"], ["box_sig"]),
        helper.make_node("Mul", ["box_sig", "box.scale"], ["box"]),
        helper.make_node("Sigmoid", ["cls_raw"], ["cls"]),
        helper.make_node("Concat", ["box", "cls"], ["output0"], axis=1),
    ]
    b: int | str = "batch" if batch is None else batch
    hw: list[int | str] = ["height", "width"] if dynamic_hw else [size, size]
    n: int | str = "anchors" if dynamic_hw else s1 * s1 + s2 * s2
    graph = helper.make_graph(
        nodes,
        "tiny_detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [b, 3, *hw])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [b, c, n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="streamd-tests"
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def make_qdq_detector(path: Path, *, size: int = 32) -> Path:
    """A tiny model with one QuantizeLinear/DequantizeLinear pair (what TensorRT INT8 needs), same IO."""
    model = onnx.load(str(make_detector(path, size=size)))
    g = model.graph
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array(0.02, np.float32), "q.scale"),
            numpy_helper.from_array(np.array(0, np.int8), "q.zero"),
        ]
    )
    for node in g.node:
        node.input[:] = ["images_dq" if x == "images" else x for x in node.input]
    g.node.insert(0, helper.make_node("DequantizeLinear", ["images_q", "q.scale", "q.zero"], ["images_dq"]))
    g.node.insert(0, helper.make_node("QuantizeLinear", ["images", "q.scale", "q.zero"], ["images_q"]))
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def random_images(batch: int, size: int = 32, seed: int = 1) -> np.ndarray:
    """Non-trivial float32 input [batch, 3, size, size] in the range a normalised image has."""
    return (np.random.default_rng(seed).random((batch, 3, size, size), dtype=np.float32) * 4 - 2).astype(
        np.float32
    )


def make_outputs_model(path: Path, outputs: dict[str, list[int]], *, size: int = 32) -> Path:
    """A model with input ``images`` [1, 3, S, S] and the given outputs (name -> fixed shape), each a
    constant plus 0 x the input's mean: what a segmentation, pose, oriented-box or multi-output export
    looks like to streamd's layout check, in a few hundred bytes."""
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], keepdims=0),
        helper.make_node("Mul", ["mean", "zero"], ["z"]),
    ]
    inits = [numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    for name, shape in outputs.items():
        inits.append(numpy_helper.from_array(np.full(shape, 0.01, np.float32), f"{name}.const"))
        nodes.append(helper.make_node("Add", ["z", f"{name}.const"], [name]))
    graph = helper.make_graph(
        nodes,
        "tiny_outputs",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="streamd-tests"
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
