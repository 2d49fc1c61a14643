"""``engine.compile`` through real Dynamo on the CPU (mostly a backend that runs the traced graphs as they
are; one test compiles with Inductor's C++ code generation), the slow part of
tests/engines/test_torch_compile.py kept in a file of its own so that the parallel test run spreads it: the
fallback when Dynamo cannot trace a model, the one-graph trace that ``pythonize_shapes`` and
``freeze_constant_args`` make possible, and which dimensions stay symbolic."""

from __future__ import annotations

import shutil

import pytest

from tests.engines.rows import assert_same_rows
from tests.engines.test_torch_compile import _placed, _runner


def test_a_model_dynamo_cannot_trace_runs_uncompiled_with_the_reason(torch_ready, monkeypatch):
    """RT-DETR builds its Reshape/Tile targets from the batch size at run time (on the host): as converted,
    Dynamo fails on them (the H200 run of bench_engines, twelfth session). With its shape arithmetic left
    as host tensors (pythonize_shapes off), compile_checked must hand back the uncompiled module, still
    computing what it did, and say why — not let the first pipeline call raise."""
    import torch

    from streamd.engines import torch_compile

    monkeypatch.setattr(torch_compile, "pythonize_shapes", lambda module: None)
    module, chw = _placed("rtdetr-l-tiny-160-dyn.onnx")
    before: dict = {}
    _runner(chw, before)(module, 2)
    got, why = torch_compile.compile_checked(module, _runner(chw, {}), [2], backend="eager")
    assert got is module
    assert why is not None and "torch.Size" in why, why
    after: dict = {}
    _runner(chw, after)(got, 2)
    torch.testing.assert_close(after[2], before[2], rtol=0, atol=0)


@pytest.mark.parametrize(
    "name", ["yolov8s-tiny-160-dyn.onnx", "rtdetr-l-tiny-160-dyn.onnx", "yolo26s-tiny-160-dyn.onnx"]
)
def test_dynamo_traces_the_model_in_one_graph_with_the_batch_dynamic(torch_ready, name: str):
    """With its shape arithmetic as Python ints and its constant operands as Python values, Dynamo traces
    YOLOv8s, RT-DETR and YOLO26 (NMS-free) whole: one dynamic graph for batch 2 that batch 3 reuses, no
    break (before this rewrite: 16 graphs for YOLOv8s's batch 2, 19 for RT-DETR's, whose trace
    took 43 s here instead of 5; YOLO26's constant Expand failed the trace); a batch of one runs through the
    same graph as two (BatchOfOneAsTwo: no second, specialised compile); and compile_checked's compiled
    module (Dynamo with a backend that runs the traced graphs as they are) computes what the uncompiled one
    does — exactly at batches 2 and 3, within float rounding at batch 1 (its row computed in a batch of 2;
    tied RT-DETR queries may swap places there)."""
    import torch

    from streamd.engines.torch_compile import compile_checked

    module, chw = _placed(name, as_on_a_gpu=True)  # the graph a GPU's placement makes (_placed)
    plain: dict = {}
    for batch in (1, 2, 3):
        _runner(chw, plain)(module, batch)
    graphs: list = []

    def backend(gm, _inputs):  # what Dynamo hands a backend: one call per graph it traced
        graphs.append(gm)
        return gm.forward

    compiled_out: dict = {}
    compiled, why = compile_checked(
        module, _runner(chw, compiled_out), [1, 2, 3], backend=backend, one_as_two=True
    )
    assert why is None and compiled is not module
    assert len(graphs) == 1, [g.graph for g in graphs]  # without one_as_two, batch 1 would make a second
    for batch in (2, 3):
        torch.testing.assert_close(compiled_out[batch], plain[batch], rtol=0, atol=0)
    assert compiled_out[1].shape == plain[1].shape
    # RT-DETR's tied queries may rank the other way round within a batch of two (torch 2.13 CPU, onnxslim
    # 0.1.98: two rows swapped): rows equal up to such a permutation
    assert_same_rows(compiled_out[1].numpy(), plain[1].numpy(), rtol=1e-3, atol=1e-3)


def test_one_graph_when_the_engine_hands_inference_tensors(torch_ready):
    """The engine converts its input inside inference mode (fp32 -> fp16, or to channels-last), so every
    pipeline call hands the compiled model an inference tensor; Dynamo guards on that. Probed the same way,
    batches 1, 2 and 3 still share one graph. (The case where the pair must *not* be an inference tensor is
    the one-graph test above: normal inputs, called in inference mode.)"""
    import numpy as np
    import torch

    from streamd.engines.torch_compile import compile_checked

    module, chw = _placed("yolov8s-tiny-160-dyn.onnx", as_on_a_gpu=True)
    graphs: list = []

    def backend(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    def run(compiled, batch: int) -> None:  # as TorchEngine._forward: converted inside inference mode
        x = torch.from_numpy(np.random.default_rng(batch).standard_normal((batch, *chw)).astype(np.float32))
        with torch.inference_mode():
            compiled(x.contiguous(memory_format=torch.channels_last))

    _, why = compile_checked(module, run, [1, 2, 3], backend=backend, one_as_two=True)
    assert why is None and len(graphs) == 1, len(graphs)


@pytest.mark.parametrize("dims, static_hw", [("batch", True), ("all", False)])
def test_only_the_batch_is_symbolic_in_the_compiled_graph(torch_ready, monkeypatch, dims: str, static_hw):
    """``DYNAMIC_DIMS = "batch"`` (the default): the graph Dynamo hands the backend has a symbolic batch and
    the input's channels, height and width as constants (Inductor then indexes with constants), and batches
    2, 3 and 5 share it, the caller marking nothing; "all" (the earlier default, the control) makes the
    height and width symbolic too."""
    import torch

    from streamd.engines import torch_compile

    assert torch_compile.DYNAMIC_DIMS == "batch"  # the default
    monkeypatch.setattr(torch_compile, "DYNAMIC_DIMS", dims)
    module, chw = _placed("yolov8s-tiny-160-dyn.onnx", as_on_a_gpu=True)
    graphs: list = []

    def backend(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    _, why = torch_compile.compile_checked(module, _runner(chw, {}), [2, 3, 5], backend=backend)
    assert why is None and len(graphs) == 1, (why, len(graphs))
    # the model's input: the tensor placeholder that is not a parameter or buffer (Dynamo's "l_self_...")
    (shape,) = [
        n.meta["example_value"].shape
        for n in graphs[0].graph.nodes
        if n.op == "placeholder"
        and not n.name.startswith("l_self_")
        and isinstance(n.meta.get("example_value"), torch.Tensor)
    ]
    assert isinstance(shape[0], torch.SymInt), shape
    assert all(isinstance(d, int) for d in shape[1:]) == static_hw, shape


NO_CXX = not (shutil.which("g++") or shutil.which("c++"))


@pytest.mark.skipif(NO_CXX, reason="Inductor's CPU code needs a C++ compiler")
def test_inductor_compiles_rtdetr_once_and_computes_the_same(torch_ready):
    """The whole compile on the CPU, Inductor's C++ code generation included (the GPU test compiles Triton):
    the tiny RT-DETR (deformable attention's grid_sample as the opaque op, shape arithmetic as Python ints,
    only the batch symbolic) compiles into one graph that batches 2 and 3 share, and computes what the
    uncompiled model does to float rounding (rows of near-tied scores may swap places: assert_same_rows).
    ~30 s here."""
    from torch._inductor.compile_fx import compile_fx

    from streamd.engines.torch_compile import compile_checked

    module, chw = _placed("rtdetr-l-tiny-160-dyn.onnx", as_on_a_gpu=True)
    plain: dict = {}
    for batch in (2, 3):
        _runner(chw, plain)(module, batch)
    graphs: list = []

    def backend(gm, inputs):  # Inductor, counting the graphs Dynamo hands it
        graphs.append(gm)
        return compile_fx(gm, inputs)

    got: dict = {}
    _, why = compile_checked(module, _runner(chw, got), [2, 3], backend=backend)
    assert why is None and len(graphs) == 1, (why, len(graphs))
    for batch in (2, 3):
        assert_same_rows(got[batch].numpy(), plain[batch].numpy(), rtol=1e-5, atol=1e-5)
