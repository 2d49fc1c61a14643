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


TORCH_GPU = Machine(tensorrt=False, torch_cuda=True)
ORT = "streamd.engines.onnxruntime:OnnxRuntimeEngine"


def _torch_stand_in(built: list[tuple[str, bool]]):
    """A "torch" factory that records each precision it is asked for and serves the model with ONNX Runtime
    (a real engine, so the rest of create_engine runs as on a GPU box)."""
    from streamd.engines.onnxruntime import OnnxRuntimeEngine

    def factory(path: Path, options: EngineOptions) -> object:
        built.append((options.precision, options.tf32))
        return OnnxRuntimeEngine(path, options)

    return factory


def _refuse_unless(passes: set[tuple[str, bool]]):
    from streamd.engines.base import VerificationError

    def check(engine: object, path: Path, options: EngineOptions) -> None:
        if (options.precision, options.tf32) not in passes:
            engine.close()  # type: ignore[attr-defined]
            raise VerificationError(f"matched 0.42 of detections at {options.precision}")

    return check


@pytest.mark.parametrize(
    ("passes", "expected_tries", "final"),
    [
        ({("fp16", True)}, [("fp16", True)], "torch at fp16"),
        ({("fp32", True)}, [("fp16", True), ("fp32", True)], "torch at fp32"),
        (
            {("fp32", False)},
            [("fp16", True), ("fp32", True), ("fp32", False)],
            "torch at strict fp32 (no TF32, no cuDNN autotuning)",
        ),
    ],
)
def test_auto_tries_fp32_on_the_same_gpu_before_leaving_it(
    tiny, caplog, passes, expected_tries, final
) -> None:
    """An fp16 engine refused by the start-up check (a model fp16 cannot carry) is rebuilt at FP32, then at
    strict FP32 (no TF32, no cuDNN autotuning), on the same backend — the GPU stays in use — and the log
    names each step."""
    built: list[tuple[str, bool]] = []
    engine = create(
        "auto",
        tiny,
        EngineOptions(max_batch=2, precision="fp16", check=_refuse_unless(passes)),
        machine=TORCH_GPU,
        backends={
            "torch": _torch_stand_in(built),
            "onnxruntime": ORT,
        },
    )
    engine.close()
    assert built == expected_tries
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == len(expected_tries) - 1
    if warnings:
        assert warnings[0].startswith("engine: torch at fp16 refused at start-up (matched 0.42")
        assert warnings[-1].endswith(f"engine.type auto tries {final}")


def test_every_precision_refused_falls_back_to_onnxruntime(tiny, caplog) -> None:
    from streamd.engines.base import VerificationError
    from streamd.engines.onnxruntime import OnnxRuntimeEngine

    built: list[tuple[str, bool]] = []

    def only_the_cpu(engine: object, path: Path, options: EngineOptions) -> None:
        if len(built) < 4:  # the three torch rungs refused
            engine.close()  # type: ignore[attr-defined]
            raise VerificationError("max error 0.3")

    def onnxruntime(path: Path, options: EngineOptions) -> object:
        built.append(("onnxruntime", options.precision))  # type: ignore[arg-type]
        return OnnxRuntimeEngine(path, options)

    engine = create(
        "auto",
        tiny,
        EngineOptions(max_batch=2, precision="fp16", check=only_the_cpu),
        machine=TORCH_GPU,
        backends={"torch": _torch_stand_in(built), "onnxruntime": onnxruntime},
    )
    engine.close()
    assert built == [("fp16", True), ("fp32", True), ("fp32", False), ("onnxruntime", "fp16")]
    warnings = [r.getMessage().split("; ")[1] for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "engine.type auto tries torch at fp32",
        "engine.type auto tries torch at strict fp32 (no TF32, no cuDNN autotuning)",
        "engine.type auto falls back to onnxruntime",
    ]


def test_named_engine_and_non_check_failures_do_not_ladder(tiny, caplog) -> None:
    """``engine.type: torch`` gets what it asked for (refused → exit 69 with the reason); under auto, a
    backend that cannot be brought up at all is left at once, its other precisions not tried."""
    built: list[tuple[str, bool]] = []
    with pytest.raises(EngineError, match=r"matched 0\.42"):
        create(
            "torch",
            tiny,
            EngineOptions(max_batch=2, precision="fp16", check=_refuse_unless(set())),
            machine=TORCH_GPU,
            backends={"torch": _torch_stand_in(built)},
        )
    assert built == [("fp16", True)]

    def cannot_load(path: Path, options: EngineOptions) -> None:
        built.append((options.precision, options.tf32))
        raise RuntimeError("CUDA driver too old")

    built.clear()
    engine = create(
        "auto",
        tiny,
        EngineOptions(max_batch=2, precision="fp16"),
        machine=TORCH_GPU,
        backends={"torch": cannot_load, "onnxruntime": ORT},
    )
    engine.close()
    assert built == [("fp16", True)]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "engine: torch at fp16 could not be brought up (engine torch: RuntimeError: CUDA driver too old); "
        "engine.type auto falls back to onnxruntime"
    ]


def test_auto_on_a_box_without_a_gpu_does_not_import_torch() -> None:
    """Where the CUDA driver sees no device, ``auto`` learns that torch has no CUDA without importing torch
    (1-2 s of CPU in every worker's start on a CPU box that has torch installed)."""
    import subprocess

    from streamd.gpu.cuda import gpu_available

    pytest.importorskip("torch")
    pytest.importorskip("cuda.bindings")
    if gpu_available()[0]:
        pytest.skip("a GPU is present: torch is imported to ask it")
    probe = (
        "import sys; from streamd.engines.options import Machine; "
        "print(Machine().has_torch_cuda(), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
