"""Op coverage of the torch engine on CUDA: the cases of tests/engines/op_cases.py through the engine's
conversion, placed on the GPU as the engine places them (shape constants kept on the host), against ONNX
Runtime CPU. Skipped without CUDA, torch or onnx2torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("onnx2torch")

from streamd.engines.base import EngineError  # noqa: E402
from tests.engines.op_cases import all_cases, assert_same, nms_case, run_torch  # noqa: E402

pytestmark = pytest.mark.gpu
CASES = [*all_cases(), nms_case()]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_onnxruntime_on_cuda(case):
    from streamd.engines.torch import convert_onnx, place
    from streamd.engines.torch_ops import torchvision_usable

    refused = case.refused
    if case.id == "NonMaxSuppression" and not torchvision_usable():
        refused = "NonMaxSuppression"
    if refused:
        with pytest.raises(EngineError, match=refused):
            convert_onnx(case.model, case.id)
        return
    module, _ = convert_onnx(case.model, case.id)
    module = place(module, torch.device("cuda", 0), None, channels_last=False)
    torch.backends.cudnn.allow_tf32 = False  # compare FP32 with FP32
    assert_same(case, run_torch(module, case, device="cuda"), case.reference())
