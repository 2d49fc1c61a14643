"""Regression for issue 13: a ``linear`` Resize with ``coordinate_transformation_mode: asymmetric`` (tf2onnx's
translation of TensorFlow's ResizeBilinear) must give ONNX Runtime's result through the torch engine.
onnx2torch alone maps it onto ``F.interpolate(align_corners=False)`` (half-pixel centres), half a pixel off;
streamd moves Resize to its own converter (``streamd.engines.torch_ops``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, load, numpy_helper
from onnx.reference import ReferenceEvaluator

from streamd.engines.torch_resize import axis_table


def resize_model(path, scales=(1, 1, 2, 2), mode="linear", coord="asymmetric", shape=(1, 8, 13, 17)):
    graph = helper.make_graph(
        [
            helper.make_node(
                "Resize", ["x", "roi", "scales"], ["y"], mode=mode, coordinate_transformation_mode=coord
            )
        ],
        "tf_resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
            numpy_helper.from_array(np.array(scales, np.float32), "scales"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def run_torch(path, x):
    import torch

    from streamd.engines.torch import convert_model

    module, _, steps = convert_model(path, max_batch=1)
    with torch.inference_mode():
        return module(torch.from_numpy(x)).numpy(), steps


@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 0.5, 0.5), (1, 1, 3, 1.5)])
def test_asymmetric_linear_resize_matches_onnxruntime(torch_ready, tmp_path, scales):
    path = resize_model(tmp_path / "r.onnx", scales)
    x = np.random.default_rng(0).standard_normal((1, 8, 13, 17)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, steps = run_torch(path, x)
    assert any(s.startswith("torch-rewrite") for s in steps)
    assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-5


def test_onnx2torch_alone_gets_it_wrong(torch_ready, tmp_path, monkeypatch):
    """The bug this guards against still exists upstream (if this starts failing, onnx2torch was fixed)."""
    from streamd.engines import torch_ops

    monkeypatch.setattr(torch_ops, "rewrite_for_torch", lambda model: (model, []))
    path = resize_model(tmp_path / "r.onnx")
    x = np.random.default_rng(0).standard_normal((1, 8, 13, 17)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, _ = run_torch(path, x)
    assert np.abs(got - ref).max() > 0.1


def test_axis_table_asymmetric_upsample():
    idx, w, outside = axis_table(3, 6, 2.0, mode="linear", coord="asymmetric")
    # x = i / 2: 0, .5, 1, 1.5, 2, 2.5 -> the last ones clamp to the edge
    assert idx.tolist() == [[0, 1], [0, 1], [1, 2], [1, 2], [2, 2], [2, 2]]
    assert np.allclose(w[:, 1], [0, 0.5, 0, 0.5, 0, 0.5]) and not outside.any()


@pytest.mark.parametrize(
    ("mode", "coord", "scales", "fast"),
    [
        ("linear", "half_pixel", (1, 1, 2, 2), True),  # NanoDet's upsampling
        ("linear", "half_pixel", (1, 1, 0.5, 0.5), True),  # ... and downsampling
        ("linear", "half_pixel", (1, 1, 3, 1.5), True),
        ("linear", "half_pixel", (1, 1, 0.6, 1.7), True),
        ("linear", "align_corners", (1, 1, 2, 3), True),
        ("nearest", "asymmetric", (1, 1, 2, 4), True),  # YOLO's Upsample (nearest_mode floor, below)
        ("nearest", "asymmetric", (1, 1, 3, 3), False),  # 1/3 is not exact in float: the gathers
        ("linear", "asymmetric", (1, 1, 2, 2), False),
        ("nearest", "asymmetric", (1, 2, 2, 2), False),  # a channel axis resized
        ("linear", "half_pixel", (1, 1, 1.05, 1.05), False),  # same sizes, yet ONNX interpolates
        ("linear", "half_pixel", (1, 1, 0.99, 1.02), False),  # ... on one axis
    ],
)
def test_resizes_f_interpolate_computes_itself_match_the_spec(
    torch_ready, tmp_path, mode, coord, scales, fast
):
    """The F.interpolate shortcut is taken exactly where it computes the ONNX formula (onnx.reference), and
    every case matches ONNX Runtime where that follows the spec. CPU kernels only; the GPU suites run the
    bundled model's Resizes through CUDA against ONNX Runtime (tests/engines/gpu)."""
    import torch

    from streamd.engines.torch import convert_model

    path = resize_model(tmp_path / "r.onnx", scales, mode=mode, coord=coord)
    if mode == "nearest":  # resize_model leaves nearest_mode at its default (round_prefer_floor)
        model = load(str(path))
        model.graph.node[0].attribute.append(helper.make_attribute("nearest_mode", "floor"))
        path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(1).standard_normal((1, 8, 13, 17)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    spec = ReferenceEvaluator(load(str(path))).run(None, {"x": x})[0]  # ONNX's own formula
    module, _, _ = convert_model(path, max_batch=1)
    resize = next(m for m in module.modules() if type(m).__name__ == "ExactResize")
    taken = resize._interpolate(torch.from_numpy(x), [float(s) for s in scales], None) is not None
    assert taken == fast
    with torch.inference_mode():
        got = module(torch.from_numpy(x)).numpy()
    assert got.shape == spec.shape and np.abs(got - spec).max() < 1e-5
    if max(scales[2:]) < 1.1 and min(scales[2:]) > 0.9:  # ONNX Runtime copies a same-size axis: not the spec
        return
    assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-5


def _aten_ops_under_inductor_decompositions(module, *args) -> tuple[set[str], Any]:
    """The ATen-level ops of ``module`` traced by Dynamo and AOTAutograd with Inductor's decomposition table
    (what Inductor's code generation receives), no code generated."""
    import torch
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    seen: set[str] = set()

    def capture(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    compiled = torch.compile(
        module, backend=aot_autograd(fw_compiler=capture, decompositions=select_decomp_table())
    )
    with torch.inference_mode():
        out = compiled(*args)
    torch._dynamo.reset()
    return seen, out


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_reaches_inductor_as_one_op_and_computes_the_same(torch_ready, mode):
    """Compiled, the GridSample module hands Inductor one opaque op (ATen's kernel at run time), not the
    element-wise gathers of Inductor's decomposition, which took 4.7 of RT-DETR-l's 20.3 ms per batch-32
    call on the H200 (tools/kernel_profile.py); plain F.grid_sample, traced the same way, is decomposed."""
    import torch

    from streamd.engines.torch_resize import grid_sample_class

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, 10, 12, generator=gen)
    grid = torch.rand(6, 7, 5, 2, generator=gen) * 2.2 - 1.1  # some points outside: zeros padding
    module = grid_sample_class()(mode, "zeros", False)
    ops, got = _aten_ops_under_inductor_decompositions(module, x, grid)
    assert ops == {"streamd.grid_sample.default"}, ops
    with torch.inference_mode():
        want = torch.nn.functional.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False)
    torch.testing.assert_close(got, want, rtol=0, atol=0)

    class Plain(torch.nn.Module):
        def forward(self, x, grid):
            return torch.nn.functional.grid_sample(
                x, grid, mode=mode, padding_mode="zeros", align_corners=False
            )

    ops, _ = _aten_ops_under_inductor_decompositions(Plain(), x, grid)
    assert "aten.grid_sampler_2d.default" not in ops and "streamd.grid_sample.default" not in ops
    assert len(ops) > 5, ops  # the decomposition: index arithmetic and gathers


def test_the_opaque_grid_samples_shape_function_matches_the_kernel(torch_ready):
    """What Inductor plans with is the op's fake (shape-only) implementation: its shape, dtype and strides
    must be the kernel's for every mode, padding and corner convention, also for a channels-last input
    (the engine's layout) — torch.library.opcheck compares them."""
    import torch

    from streamd.engines.torch_resize import opaque_grid_sample

    op = opaque_grid_sample()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 9, 11, generator=gen)
    grid = torch.rand(2, 5, 3, 2, generator=gen) * 2.2 - 1.1
    for mode in ("bilinear", "nearest", "bicubic"):
        for padding in ("zeros", "border", "reflection"):
            for corners in (False, True):
                for inp in (x, x.contiguous(memory_format=torch.channels_last), x.double()):
                    torch.library.opcheck(
                        op,
                        (inp, grid.to(inp.dtype), mode, padding, corners),
                        test_utils=("test_schema", "test_faketensor"),
                    )
