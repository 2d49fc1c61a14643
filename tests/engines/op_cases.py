"""Tiny one-op ONNX graphs (onnx.helper) for each op family the detectors of the supported layouts use, with
inputs; run through ONNX Runtime CPU and the torch engine's conversion by tests/engines/test_op_coverage.py
(CPU) and tests/engines/gpu/test_op_coverage_gpu.py (CUDA).

A case is (id, model, feeds). Data inputs are graph inputs, so onnxslim cannot fold the op away.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Case:
    id: str
    model: Any  # onnx.ModelProto
    feeds: dict[str, np.ndarray]
    refused: str | None = None  # the torch engine must refuse it at build time with a message matching this

    def reference(self) -> list[np.ndarray]:
        session = ort.InferenceSession(self.model.SerializeToString(), providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in session.run(None, self.feeds)]


def _model(
    nodes: list[Any],
    inputs: dict[str, np.ndarray],
    outputs: list[str],
    inits: dict[str, Any],
    opset: int = 13,
) -> Any:
    def elem(a: np.ndarray) -> int:
        return helper.np_dtype_to_tensor_dtype(a.dtype)

    graph = helper.make_graph(
        nodes,
        "op_case",
        [helper.make_tensor_value_info(k, elem(v), list(v.shape)) for k, v in inputs.items()],
        [helper.make_value_info(o, helper.TypeProto()) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    try:  # typed outputs (onnxslim wants them): from shape inference
        inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.output}
        for out in model.graph.output:
            if out.name in inferred and inferred[out.name].type.tensor_type.elem_type:
                out.CopyFrom(inferred[out.name])
    except Exception:  # a custom-domain op: leave it untyped
        pass
    return model


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def resize_cases() -> Iterator[Case]:
    x = _x((1, 3, 13, 17))
    empty = np.zeros(0, np.float32)
    sizes = {"up2": ((1, 1, 2, 2), None), "down": ((1, 1, 0.5, 0.5), None), "sizes": (None, (1, 3, 20, 9))}

    def case(mode: str, coord: str, how: str, **attrs: Any) -> Case:
        scales, size = sizes[how]
        inits: dict[str, Any] = {"roi": np.array(attrs.pop("roi"), np.float32) if "roi" in attrs else empty}
        ins = ["x", "roi"]
        if scales is not None:
            inits["scales"] = np.array(scales, np.float32)
            ins.append("scales")
        else:
            inits["scales"] = empty
            inits["sizes"] = np.array(size, np.int64)
            ins += ["scales", "sizes"]
        node = helper.make_node(
            "Resize", ins, ["y"], mode=mode, coordinate_transformation_mode=coord, **attrs
        )
        extra = "-".join(f"{k}={v}" for k, v in attrs.items())
        name = f"Resize-{mode}-{coord}-{how}{'-' + extra if extra else ''}"
        return Case(name, _model([node], {"x": x}, ["y"], inits), {"x": x})

    coords = ["asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners", "tf_half_pixel_for_nn"]
    for coord in coords:
        for how in sizes:
            for nearest in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
                yield case("nearest", coord, how, nearest_mode=nearest)
            if coord != "tf_half_pixel_for_nn":
                yield case("linear", coord, how)
    for coord in ("half_pixel", "asymmetric", "align_corners"):
        for excl in (0, 1):
            yield case("cubic", coord, "up2", exclude_outside=excl)
    yield case("cubic", "half_pixel", "down", cubic_coeff_a=-0.5)
    roi = [0, 0, 0.1, 0.2, 1, 1, 0.8, 1.1]
    yield case("linear", "tf_crop_and_resize", "sizes", roi=roi, extrapolation_value=-3.0)
    yield case("nearest", "tf_crop_and_resize", "sizes", roi=roi, extrapolation_value=5.0)


def pad_cases() -> Iterator[Case]:
    x = _x((1, 3, 7, 9))
    for mode in ("constant", "reflect", "edge"):
        for pads in ([0, 0, 1, 2, 0, 0, 3, 1], [0, 0, 0, 1, 0, 0, 1, 0]):
            inits: dict[str, Any] = {"pads": np.array(pads, np.int64)}
            ins = ["x", "pads"]
            if mode == "constant":
                inits["value"] = np.array(-1.5, np.float32)
                ins.append("value")
            node = helper.make_node("Pad", ins, ["y"], mode=mode)
            yield Case(
                f"Pad-{mode}-{'_'.join(map(str, pads))}", _model([node], {"x": x}, ["y"], inits), {"x": x}
            )
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")
    pads = {"pads": np.array([0, 0, 1, 2, 0, 0, 3, 1], np.int64)}
    yield Case("Pad-wrap", _model([node], {"x": x}, ["y"], pads, opset=19), {"x": x}, "Pad mode 'wrap'")
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")
    crop = {"pads": np.array([0, 0, -1, 0, 0, 0, 1, -2], np.int64)}
    yield Case("Pad-constant-negative", _model([node], {"x": x}, ["y"], crop), {"x": x})


def slice_cases() -> Iterator[Case]:
    x = _x((2, 3, 10, 12))
    specs = {
        "neg-step": ([9], [0], [2], [-1]),
        "neg-step2-clamped": ([INT64_MAX], [INT64_MIN], [3], [-2]),
        "neg-step-neg-start": ([-2], [-11], [2], [-3]),
        "clamped-end": ([2, 1], [INT64_MAX, 100], [2, 3], [1, 1]),
        "neg-axes": ([1, -5], [-1, INT64_MAX], [-1, -2], [2, 1]),
        "start-past-end": ([20], [25], [3], [1]),
        "channels-reversed": ([INT64_MAX], [INT64_MIN], [1], [-1]),
    }
    for name, (starts, ends, axes, steps) in specs.items():
        inits = {
            "starts": np.array(starts, np.int64),
            "ends": np.array(ends, np.int64),
            "axes": np.array(axes, np.int64),
            "steps": np.array(steps, np.int64),
        }
        node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
        yield Case(f"Slice-{name}", _model([node], {"x": x}, ["y"], inits), {"x": x})


def topk_gather_cases() -> Iterator[Case]:
    x = np.random.default_rng(3).permutation(2 * 200).astype(np.float32).reshape(2, 200) / 7
    for largest in (1, 0):
        node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1, largest=largest, sorted=1)
        model = _model([node], {"x": x}, ["values", "indices"], {"k": np.array([7], np.int64)})
        yield Case(f"TopK-largest={largest}", model, {"x": x})
    data = _x((2, 5, 4, 3))
    idx = np.array([[[1, 2], [4, 0]], [[0, 3], [3, 1]]], np.int64)
    for batch_dims in (0, 1):
        node = helper.make_node("GatherND", ["data", "idx"], ["y"], batch_dims=batch_dims)
        indices = idx if batch_dims else np.array([[1, 2], [0, 4], [1, 3], [0, -1]], np.int64)
        model = _model([node], {"data": data}, ["y"], {"idx": indices})
        refused = "GatherND with batch_dims" if batch_dims else None
        yield Case(f"GatherND-batch_dims={batch_dims}", model, {"data": data}, refused)
    for axis, indices in ((0, np.array([1, -1], np.int64)), (1, np.array([[0, -2], [4, 1]], np.int64))):
        node = helper.make_node("Gather", ["data", "idx"], ["y"], axis=axis)
        yield Case(
            f"Gather-axis={axis}", _model([node], {"data": data}, ["y"], {"idx": indices}), {"data": data}
        )
    # integer arithmetic of a CenterNet decode: Div on ints truncates, Mod follows the divisor's sign
    a = np.array([[-7, -3, 0, 5, 9, 128 * 128 - 1]], np.int64)
    b = np.array([3], np.int64)
    for op, attrs in (("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})):
        node = helper.make_node(op, ["a", "b"], ["y"], **attrs)
        name = f"{op}-int64{'-fmod' if attrs.get('fmod') else ''}"
        yield Case(name, _model([node], {"a": a}, ["y"], {"b": b}), {"a": a})


def conv_pool_cases() -> Iterator[Case]:
    x = _x((1, 4, 15, 16))
    w = _x((8, 4, 3, 3), seed=1) * 0.3
    dw = _x((4, 1, 5, 5), seed=2) * 0.3
    convs = {
        "pads-0011-s2": ({"w": w}, {"pads": [0, 0, 1, 1], "strides": [2, 2]}),
        "pads-1122-s2-depthwise-k5": ({"w": dw}, {"pads": [1, 1, 2, 2], "strides": [2, 2], "group": 4}),
        "same_upper-s2": ({"w": w}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        "same_lower-s2": ({"w": w}, {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
        "dilated": ({"w": w}, {"pads": [2, 1, 2, 3], "dilations": [2, 2]}),
    }
    for name, (inits, attrs) in convs.items():
        node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
        yield Case(f"Conv-{name}", _model([node], {"x": x}, ["y"], inits), {"x": x})
    pools = {
        "same_upper": {"auto_pad": "SAME_UPPER", "kernel_shape": [3, 3], "strides": [2, 2]},
        "pads-asym": {"pads": [0, 0, 1, 1], "kernel_shape": [3, 3], "strides": [2, 2]},
        "ceil": {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        "k3s1-same": {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3], "strides": [1, 1]},
    }
    for name, attrs in pools.items():
        node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
        yield Case(f"MaxPool-{name}", _model([node], {"x": x}, ["y"], {}), {"x": x})


def nms_case() -> Case:
    rng = np.random.default_rng(4)
    xy = rng.random((1, 40, 2)).astype(np.float32) * 100
    wh = rng.random((1, 40, 2)).astype(np.float32) * 30 + 5
    boxes = np.concatenate([xy, xy + wh], axis=2)
    scores = rng.random((1, 2, 40)).astype(np.float32)
    node = helper.make_node(
        "NonMaxSuppression",
        ["boxes", "scores", "max_out", "iou", "score_thr"],
        ["selected"],
        center_point_box=0,
    )
    inits = {
        "max_out": np.array([10], np.int64),
        "iou": np.array([0.5], np.float32),
        "score_thr": np.array([0.2], np.float32),
    }
    feeds = {"boxes": boxes, "scores": scores}
    return Case("NonMaxSuppression", _model([node], feeds, ["selected"], inits), feeds)


def transformer_cases() -> Iterator[Case]:
    """What DETR-family exports (RT-DETR at opset 18) bring: opset-18 Reduce/Split/Pad forms, GridSample,
    LayerNormalization behind a dynamic batch, Clip with an absent min, TopK of a computed K."""
    x = _x((2, 4, 6, 8))
    node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=1)
    yield Case(
        "ReduceMax-18-axes-input", _model([node], {"x": x}, ["y"], {"axes": np.array([1, 3])}, 18), {"x": x}
    )
    node = helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0)
    yield Case("ReduceMean-18-all-axes", _model([node], {"x": x}, ["y"], {}, 18), {"x": x})
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=3, num_outputs=2)
    yield Case("Split-18-num_outputs", _model([node], {"x": x}, ["a", "b"], {}, 18), {"x": x})
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")
    pads = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}
    yield Case("Pad-18", _model([node], {"x": x}, ["y"], pads, 18), {"x": x})
    grid = np.random.default_rng(4).uniform(-1.2, 1.2, (2, 5, 7, 2)).astype(np.float32)
    for mode in ("bilinear", "nearest", "bicubic"):
        for padding in ("zeros", "border", "reflection"):
            for align in (0, 1):
                node = helper.make_node(
                    "GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align
                )
                feeds = {"x": x, "g": grid}
                yield Case(
                    f"GridSample-{mode}-{padding}-align{align}", _model([node], feeds, ["y"], {}, 16), feeds
                )
    node = helper.make_node("LayerNormalization", ["x", "w", "b"], ["y"], axis=-1, epsilon=1e-5)
    model = _model([node], {"x": x}, ["y"], {"w": _x((8,), 5), "b": _x((8,), 6)}, 17)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].Clear()
    dims[0].dim_param = "batch"  # what made onnx2torch's own converter read a normalized shape of [0]
    dims[3].Clear()
    dims[3].dim_param = "channels"
    yield Case("LayerNormalization-symbolic", model, {"x": x})
    node = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    yield Case(
        "Clip-absent-min", _model([node], {"x": x}, ["y"], {"hi": np.array(0.5, np.float32)}), {"x": x}
    )
    flat = _x((2, 50), 7)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Min", ["n", "cap"], ["k1"]),
        helper.make_node("Reshape", ["k1", "shape1"], ["k"]),
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
    ]
    inits = {"one": np.array(1, np.int64), "cap": np.array(30, np.int64), "shape1": np.array([1], np.int64)}
    yield Case("TopK-computed-K", _model(nodes, {"x": flat}, ["v", "i"], inits), {"x": flat})


def all_cases() -> list[Case]:
    return [
        *resize_cases(), *pad_cases(), *slice_cases(), *topk_gather_cases(), *conv_pool_cases(),
        *transformer_cases(),
    ]  # fmt: skip


def run_torch(module: Any, case: Case, device: str = "cpu") -> list[np.ndarray]:
    import torch

    args = [torch.from_numpy(v).to(device) for v in case.feeds.values()]
    with torch.inference_mode():
        out = module(*args)
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.detach().cpu().numpy() for o in outs]


def assert_same(case: Case, got: list[np.ndarray], ref: list[np.ndarray], atol: float = 1e-4) -> None:
    assert len(got) == len(ref), (case.id, len(got), len(ref))
    for g, r in zip(got, ref, strict=True):
        assert g.shape == r.shape, (case.id, g.shape, r.shape)
        if np.issubdtype(r.dtype, np.integer):
            assert np.array_equal(g.astype(np.int64), r.astype(np.int64)), (case.id, g, r)
        else:
            if not r.size:
                continue
            err = float(np.abs(g.astype(np.float64) - r).max())
            assert err <= atol * max(1.0, float(np.abs(r).max())), (case.id, err)
