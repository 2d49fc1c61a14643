"""``engine.type: auto`` falls back to the next engine, with one warning, when one cannot be brought up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streamd.checks.verify import create_engine
from streamd.engines import EngineError
from streamd.engines import create_engine as create
from streamd.engines.options import EngineOptions, Machine
from streamd.engines.registry import backend_order
from streamd.exitcodes import EX_CONFIG, EX_UNAVAILABLE
from tests.engines.fake_tensorrt import make_fakes
from tests.engines.tiny_models import make_detector


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return make_detector(tmp_path / "tiny.onnx")


@pytest.fixture
def broken_tensorrt(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The fake TensorRT 10 on a machine with a GPU (and no CUDA for torch), whose builder fails (returns no
    plan, as a real TensorRT does when no tactic fits or the GPU is unsupported)."""
    module, cuda = make_fakes("10.16.1.11")

    def no_plan(self: object, network: object, config: object) -> None:
        self._logger.log(module.ILogger.Severity.ERROR, "no implementation obeys reformatting constraints")  # type: ignore[attr-defined]
        return None

    monkeypatch.setattr(module.Builder, "build_serialized_network", no_plan)
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    # cuda_api: the one seam between TensorRTEngine and CUDA; other backends ignore it
    return {"cuda_api": cuda, "machine": TRT_ONLY}


TRT_ONLY = Machine(tensorrt=True, torch_cuda=False)
TRT_AND_TORCH = Machine(tensorrt=True, torch_cuda=True)


def options(tmp_path: Path, fake: dict[str, object], **fields: object) -> dict[str, object]:
    """``create_engine``'s options and machine for the broken TensorRT box."""
    given = EngineOptions(max_batch=2, cache_dir=tmp_path, cuda_api=fake["cuda_api"], **fields)
    return {"options": given, "machine": fake["machine"]}


def test_auto_order_on_a_gpu_box_with_tensorrt() -> None:
    assert backend_order("auto", TRT_ONLY) == ["tensorrt", "onnxruntime"]
    assert backend_order("auto", TRT_AND_TORCH) == ["tensorrt", "torch", "onnxruntime"]
    assert backend_order("tensorrt", TRT_AND_TORCH) == ["tensorrt"]


def test_auto_falls_back_when_tensorrt_fails_to_build(broken_tensorrt, tiny, tmp_path, caplog) -> None:
    engine = create_engine("auto", tiny, **options(tmp_path, broken_tensorrt))
    try:
        assert engine.name == "onnxruntime-cpu"
    finally:
        engine.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("engine: tensorrt could not be brought up (TensorRT could not build")
    assert warnings[0].endswith("engine.type auto falls back to onnxruntime")


def test_named_tensorrt_fails_with_its_reason_and_69(broken_tensorrt, tiny, tmp_path) -> None:
    with pytest.raises(EngineError) as info:
        create_engine("tensorrt", tiny, **options(tmp_path, broken_tensorrt))
    assert info.value.code == EX_UNAVAILABLE and "TensorRT could not build" in str(info.value)


def test_each_failing_engine_gets_one_warning(broken_tensorrt, tiny, tmp_path, monkeypatch, caplog) -> None:
    """TensorRT fails to build, torch (asked for CUDA on a box without it) fails to load, ORT runs."""
    pytest.importorskip("torch")
    broken_tensorrt["machine"] = TRT_AND_TORCH
    engine = create_engine("auto", tiny, **options(tmp_path, broken_tensorrt))
    engine.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w.split(" (")[0] for w in warnings] == [
        "engine: tensorrt could not be brought up",
        "engine: torch could not be brought up",
    ]
    assert warnings[0].endswith("falls back to torch") and warnings[1].endswith("falls back to onnxruntime")


def test_auto_stops_at_a_config_error(broken_tensorrt, tiny, tmp_path, monkeypatch, caplog) -> None:
    """A GPU that does not exist (pipeline.devices on a smaller box) is the config's fault: auto does not
    hide it behind the CPU engine (a worker meant for a GPU running on the CPU), it fails with 78."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    broken_tensorrt["machine"] = TRT_AND_TORCH
    with pytest.raises(EngineError) as info:
        create_engine("auto", tiny, **options(tmp_path, broken_tensorrt, device=1))
    assert info.value.code == EX_CONFIG and "CUDA device 1 does not exist" in str(info.value)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w.split(" (")[0] for w in warnings] == ["engine: tensorrt could not be brought up"]


def test_a_library_exception_becomes_an_engine_error(tiny, tmp_path) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise MemoryError("out of device memory")

    with pytest.raises(EngineError) as info:
        create(
            "onnxruntime",
            tiny,
            EngineOptions(max_batch=2, cache_dir=tmp_path),
            backends={"onnxruntime": boom},
        )
    assert str(info.value) == "engine onnxruntime: MemoryError: out of device memory"
    assert info.value.code == EX_UNAVAILABLE


def test_config_errors_are_78(tiny) -> None:
    for kwargs in ({"precision": "fp8"}, {"max_batch": 0}):
        with pytest.raises(EngineError) as info:
            create_engine("onnxruntime", tiny, **{"max_batch": 2, **kwargs})
        assert info.value.code == EX_CONFIG
