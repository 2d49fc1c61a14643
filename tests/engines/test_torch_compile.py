"""``engine.compile``'s graph rewrite, on the CPU: the bundled model's constant reshapes become plain
``torch.reshape`` calls (what lets Dynamo trace it) and the model computes exactly what it did before. The
compile itself runs on the GPU (tests/engines/gpu/test_torch_engine_gpu.py, fp16-compiled)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
