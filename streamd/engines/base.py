"""The engine contract and the backend registry.

A CPU engine takes a host float32 batch [B, 3, H, W] and returns the host output [B, ...] (``infer``).
A GPU engine reads the input tensor and writes the output tensor at device addresses the caller owns,
enqueued on the caller's CUDA stream (``enqueue``). ``create_engine`` picks the backend: ``auto`` means
TensorRT if it imports and a GPU exists, else torch if CUDA works, else ONNX Runtime on the CPU.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """The model could not be loaded or run; the message says which model and why."""


@runtime_checkable
class Engine(Protocol):
    """One loaded model. ``input_shape`` is (C, H, W); ``output_shape`` is the output for batch 1."""

    name: str
    on_device: bool  # True: use enqueue() with device pointers; False: use infer() with host arrays
    max_batch: int
    input_shape: tuple[int, int, int]
    output_shape: tuple[int, ...]

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Run a host batch [b, C, H, W] float32 (b ≤ max_batch); return the host output [b, ...] float32."""
        ...

    def close(self) -> None:
        """Release the model; safe to call twice."""
        ...


# name -> "module:factory"; modules are imported only when chosen, so the CPU path never imports CUDA.
BACKENDS: dict[str, str] = {
    "onnxruntime": "streamd.engines.onnxruntime:OnnxRuntimeEngine",
}


def _gpu_available() -> bool:
    """True when torch sees CUDA (the cheapest reliable probe on machines that have torch)."""
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken torch install must not stop the CPU path
        return False


def choose_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    if "tensorrt" in BACKENDS and importlib.util.find_spec("tensorrt") is not None and _gpu_available():
        return "tensorrt"
    if "torch" in BACKENDS and _gpu_available():
        return "torch"
    return "onnxruntime"


def create_engine(
    requested: str, model_path: Path, *, max_batch: int, precision: str = "fp32", threads: int = 0, **options
) -> Engine:
    """Load ``model_path`` with the requested backend (``auto`` picks one, see module docstring)."""
    name = choose_backend(requested)
    if name not in BACKENDS:
        raise EngineError(f"engine.type: backend {name!r} is not available; installed: {', '.join(BACKENDS)}")
    module_name, factory = BACKENDS[name].split(":")
    module = importlib.import_module(module_name)
    engine: Engine = getattr(module, factory)(
        model_path, max_batch=max_batch, precision=precision, threads=threads, **options
    )
    log.info("engine: %s (%s, max batch %d)", engine.name, model_path.name, max_batch)
    return engine
