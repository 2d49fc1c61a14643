"""``EngineOptions``: how to build one engine, one value from ``create_engine`` down to each backend and its
start-up check; ``Machine``: what this box offers ``engine.type: auto`` (probed, or given by a caller or a
test)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading

    from streamd.config.engine import EngineConfig
    from streamd.engines.base import Engine
    from streamd.engines.progress import BuildProgress
    from streamd.gpu.driver_api import CudaApi

# A start-up check: raising refuses the engine (and closes it); ``streamd.checks.verify`` provides one.
Check = Callable[["Engine", Path, "EngineOptions"], None]


@dataclass(frozen=True)
class EngineOptions:
    """Options of one engine. The first group is every backend's (each ignores what does not apply to it);
    then one group per backend. ``check`` runs on each engine a backend builds, before it is taken."""

    max_batch: int
    precision: str = "fp32"
    threads: int = 0  # CPU engine threads; 0 = the library's default
    device: int | str = 0  # CUDA device index; torch also takes "cpu" (a host engine, for tests)
    cache_dir: Path | None = None  # built plans go to cache_dir/engines, converted models beside them
    cuda_graphs: bool = True
    lanes: int = 1  # batches a GPU engine runs at once, each on its own CUDA stream
    # (width, height) a model whose input H/W are dynamic runs at (model.input_size); None: it must fix them
    input_size: tuple[int, int] | None = None
    check: Check | None = field(default=None, compare=False)
    # ONNX Runtime: "auto" (the CUDA EP when onnxruntime-gpu sees a GPU, else the CPU), "cpu" or "cuda"
    provider: str = "auto"
    # torch
    compile: bool = False  # torch.compile (streamd.engines.torch_compile)
    channels_last: bool = True
    cudnn_benchmark: bool = True  # process-wide
    tf32: bool = True  # FP32 convolutions may use TF32, as TensorRT does
    # TensorRT
    opt_batch: int | None = None
    workspace_mb: int | None = None
    optimization_level: int = 3
    rebuild: bool = False  # ignore the cache
    progress: BuildProgress | None = field(default=None, compare=False)
    cancel: threading.Event | None = field(default=None, compare=False)  # cancels a build
    cuda_api: CudaApi | None = field(default=None, compare=False)  # tests pass a fake CUDA

    @classmethod
    def from_config(cls, engine: EngineConfig, **overrides: Any) -> EngineOptions:
        """The options an ``engine:`` section sets; ``overrides`` (e.g. ``device``) replace them."""
        given = cls(
            max_batch=engine.max_batch,
            precision=engine.precision,
            threads=engine.threads,
            device=engine.device,
            cache_dir=engine.cache_dir,
            cuda_graphs=engine.cuda_graphs,
            lanes=engine.lanes,
            compile=engine.compile,
        )
        return replace(given, **overrides)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ValueError, ImportError):  # in sys.modules without a spec (a stand-in), or a broken package
        return module in sys.modules


def _gpu_available() -> bool:
    """True when the CUDA driver reports a usable device (``streamd.gpu.cuda.gpu_available``)."""
    from streamd.gpu.cuda import gpu_available

    return gpu_available()[0]


def _torch_cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    if _importable("cuda.bindings") and not _gpu_available():
        return False  # the driver sees no device: skip importing torch (1-2 s of CPU in every worker)
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


@dataclass(frozen=True)
class Machine:
    """What ``auto`` may choose from: TensorRT (it imports and the driver sees a GPU) and torch with CUDA.
    None = probe this box when asked (a CPU box without TensorRT never loads the CUDA driver)."""

    tensorrt: bool | None = None
    torch_cuda: bool | None = None

    def has_tensorrt(self) -> bool:
        if self.tensorrt is not None:
            return self.tensorrt
        return _importable("tensorrt") and _gpu_available()

    def has_torch_cuda(self) -> bool:
        return self.torch_cuda if self.torch_cuda is not None else _torch_cuda_available()
