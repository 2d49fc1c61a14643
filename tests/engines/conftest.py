"""Fixtures for the engine tests: tiny ONNX models, the fake TensorRT of each version, a torchvision
stand-in."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines.fake_tensorrt import FakeCuda, make_fakes
from tests.engines.tiny_models import make_detector, make_qdq_detector

TRT_VERSIONS = ("10.16.1.11", "11.4.0.106")


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny detectors: ``dynamic`` batch, fixed batch ``b1``, ``qdq`` (INT8-ready), ``other`` (other
    weights)."""
    root = tmp_path_factory.mktemp("models")
    return {
        "dynamic": make_detector(root / "tiny.onnx"),
        "b1": make_detector(root / "tiny-b1.onnx", batch=1),
        "qdq": make_qdq_detector(root / "tiny-qdq.onnx"),
        "other": make_detector(root / "tiny-other.onnx", seed=5),
    }


@pytest.fixture(params=TRT_VERSIONS, ids=["trt10", "trt11"])
def fake_trt(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[object, FakeCuda]]:
    """The fake ``tensorrt`` of one version installed as ``sys.modules['tensorrt']``, with its fake CUDA,
    which also stands in for ``DriverCuda`` (so code that builds its own CUDA helper gets the fake)."""
    module, cuda = make_fakes(request.param)
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    monkeypatch.setattr("streamd.gpu.driver_api.DriverApi", lambda device=0: cuda)
    yield module, cuda


def _install_torchvision_stub() -> None:
    """onnx2torch imports torchvision for its NMS/RoIAlign converters only. The CPU torch wheel used on
    developer machines has no matching torchvision; a stub lets the conversion logic be tested there."""
    tv = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")

    def unavailable(*_args: object, **_kwargs: object) -> None:
        raise NotImplementedError("torchvision is not installed (test stub)")

    ops.nms = ops.box_convert = ops.roi_align = unavailable  # type: ignore[attr-defined]
    tv.ops = ops  # type: ignore[attr-defined]
    sys.modules["torchvision"] = tv
    sys.modules["torchvision.ops"] = ops


@pytest.fixture(scope="session")
def torch_ready() -> object:
    """torch and onnx2torch importable (torchvision stubbed if the installed one is unusable); else skip."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("onnx2torch") is None:
        pytest.skip("torch and onnx2torch are not installed (pip install 'streamd[torch]')")
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        _install_torchvision_stub()
    import torch

    return torch
