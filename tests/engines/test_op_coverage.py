"""Op coverage of the torch engine on the CPU: each op family the detectors use, in each mode, through ONNX
Runtime CPU and through the torch engine's conversion (onnxslim, streamd's rewrites, onnx2torch); the results
must agree. An op or mode the torch engine cannot run as ONNX specifies must be refused at build time with a
clear error, never give a different result. The same cases run on CUDA in tests/engines/gpu/.
"""

from __future__ import annotations

import pytest
from onnx import helper

from streamd.engines.base import EngineError
from tests.engines.op_cases import all_cases, assert_same, nms_case, run_torch

CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_onnxruntime(torch_ready, case):
    from streamd.engines.torch import convert_onnx

    if case.refused:
        with pytest.raises(EngineError, match=case.refused):
            convert_onnx(case.model, case.id)
        return
    module, _ = convert_onnx(case.model, case.id)
    assert_same(case, run_torch(module, case), case.reference())


def test_non_max_suppression_matches_or_is_refused(torch_ready):
    from streamd.engines.torch import convert_onnx
    from streamd.engines.torch_ops import torchvision_usable

    case = nms_case()
    if not torchvision_usable():
        with pytest.raises(EngineError, match="NonMaxSuppression"):
            convert_onnx(case.model, case.id)
        return
    module, _ = convert_onnx(case.model, case.id)
    assert_same(case, run_torch(module, case), case.reference())


def test_an_op_without_a_converter_is_refused_at_build_time(torch_ready):
    from streamd.engines.torch import convert_onnx
    from tests.engines.op_cases import _model, _x

    x = _x((1, 3, 4, 4))
    model = _model([helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")], {"x": x}, ["y"], {})
    model.opset_import.add(domain="com.example", version=1)
    with pytest.raises(
        EngineError, match=r"no onnx2torch converter for Frobnicate.*engine.type: onnxruntime"
    ):
        convert_onnx(model, "custom")


@pytest.mark.parametrize(
    ("attrs", "opset", "message"),
    [({"antialias": 1}, 18, "antialias"), ({"keep_aspect_ratio_policy": "not_larger"}, 18, "keep_aspect")],
)
def test_an_unsupported_resize_mode_is_refused_at_build_time(torch_ready, attrs, opset, message):
    import numpy as np

    from streamd.engines.torch import convert_onnx
    from tests.engines.op_cases import _model, _x

    x = _x((1, 3, 8, 8))
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", **attrs)
    model = _model([node], {"x": x}, ["y"], {"sizes": np.array([1, 3, 4, 4], np.int64)}, opset=opset)
    with pytest.raises(EngineError, match=message):
        convert_onnx(model, "resize")
