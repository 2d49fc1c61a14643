"""The engine contract: the ``Engine`` protocol, ``EngineError`` and buffer sizes.

Two ways to run a loaded model, chosen by ``Engine.on_device``:

- host engines (``on_device`` False, e.g. ONNX Runtime on the CPU): ``infer(batch)`` takes a host array
  [b, C, H, W] in ``input_dtype`` and returns the host output [b, ...] in ``output_dtype``;
- device engines (``on_device`` True: TensorRT, torch, ONNX Runtime's CUDA EP): ``enqueue(in_ptr, out_ptr, b,
  stream)`` *enqueues* the model on the caller's CUDA stream (a ``streamd.gpu.cuda.Stream``; wrap a stream
  made elsewhere with ``Stream.borrow(handle)``), reading [b, C, H, W] at ``in_ptr`` and writing
  [b, *output_shape[1:]] at ``out_ptr``. Both buffers are device memory the caller owns (slot buffers); the
  call returns without waiting for the GPU. The caller orders its own work around the call with events on
  ``stream`` (record after its preprocess, wait on the next stage's stream after ``enqueue``); the engine
  never synchronises the host. An engine's private scratch (TensorRT's context memory, torch's graph pool) is
  shared by every call, so each engine orders its calls with its own event: calls made on different streams
  still run one after the other on the GPU, and the buffers of a call may be reused as soon as the caller's
  own events say the GPU has passed it.

A model whose ONNX fixes the batch at N runs N rows per model call whatever the batch
(``registry.FixedBatch``): a batch is padded up to a multiple of N, so the caller's buffers hold ``max_batch``
rows (a multiple of N) and rows past ``batch`` are read and written, their results ignored. A backend's own
engine reports such a model's batch in ``batch_fixed`` (None: dynamic) and takes exactly N rows.

Backends are chosen, loaded and checked by ``streamd.engines.registry.create_engine``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from streamd.exitcodes import EX_UNAVAILABLE, StartupError

if TYPE_CHECKING:
    from streamd.gpu.cuda import Stream

PRECISIONS = ("fp32", "fp16", "bf16", "int8")  # bf16: the torch engine only


@dataclass(frozen=True)
class OutputPart:
    """One model output: its name, per-image shape (no batch axis) and where it starts in an image's row.

    A model with several outputs runs as one whose single output [B, R] packs them per image: each output
    flattened, cast to float32, at ``offset`` (graph order; ``onnx_tools.pack_outputs``); the engine lists
    them in ``output_parts``."""

    name: str
    shape: tuple[int, ...]
    offset: int = 0
    dims: tuple[int | str, ...] | None = field(default=None, compare=False)  # as the file writes them

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def label(self) -> str:
        """``output NAME [dims]`` for notes (the file's own dims where known: ``[batch, 84, 3549]``)."""
        dims = self.dims or ("B", *self.shape)
        text = "[" + ", ".join(str(d) for d in dims) + "]"
        return f"output {text}" if self.name == "output" else f"output {self.name} {text}"


def parts_of(engine: Engine) -> tuple[OutputPart, ...]:
    """The engine's outputs: ``output_parts`` of a packed several-output model, else its one output."""
    parts = getattr(engine, "output_parts", ())
    return tuple(parts) or (OutputPart("output", tuple(int(d) for d in engine.output_shape[1:])),)


class EngineError(StartupError, RuntimeError):
    """The model could not be loaded, built or run; the message says which model and why. At start-up it
    ends the program with ``code``: ``EX_UNAVAILABLE`` (the backend or the GPU cannot be brought up, the
    default) or ``EX_CONFIG`` (the config does not fit the model or the backend)."""

    def __init__(self, message: str, code: int = EX_UNAVAILABLE) -> None:
        super().__init__(message, code)


class VerificationError(EngineError):
    """The engine's output differs from ONNX Runtime CPU's beyond the tolerance for its precision (raised by
    the start-up check, ``streamd.checks.verify``)."""


@runtime_checkable
class Engine(Protocol):
    """One loaded model. ``input_shape`` is (C, H, W); ``output_shape`` is the output for batch 1, e.g.
    (1, 84, 3549). ``input_dtype``/``output_dtype`` are the numpy dtypes of the buffers the caller
    provides."""

    name: str
    on_device: bool  # True: enqueue() with device pointers; False: infer() with host arrays
    max_batch: int
    input_shape: tuple[int, int, int]
    output_shape: tuple[int, ...]
    input_dtype: np.dtype
    output_dtype: np.dtype

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Host engines: run a host batch [b, C, H, W] (b ≤ max_batch); return the host output [b, ...].

        Device engines implement it too (a slow host round trip for tests and tools, never the pipeline)."""
        ...

    def enqueue(self, input_ptr: int, output_ptr: int, batch: int, stream: Stream) -> None:
        """Device engines: enqueue one batch on ``stream`` (never the legacy default stream 0 for TensorRT);
        returns at once. Host engines raise ``EngineError``."""
        ...

    def close(self) -> None:
        """Release the model; safe to call twice."""
        ...


def output_nbytes(engine: Engine, batch: int) -> int:
    """Bytes of the output buffer ``enqueue`` writes for ``batch`` images."""
    per_image = int(np.prod(engine.output_shape[1:], dtype=np.int64))
    return batch * per_image * engine.output_dtype.itemsize


def input_nbytes(engine: Engine, batch: int) -> int:
    """Bytes of the input buffer ``enqueue`` reads for ``batch`` images."""
    return batch * int(np.prod(engine.input_shape, dtype=np.int64)) * engine.input_dtype.itemsize


def run_padded(run: Callable[[np.ndarray], np.ndarray], batch: np.ndarray, n: int) -> np.ndarray:
    """``run`` takes exactly ``n`` rows (a fixed-batch model): ``batch`` goes through it in chunks of ``n``,
    the last one padded with zeros; the outputs of the padding rows are dropped."""
    outs = []
    for start in range(0, len(batch), n):
        chunk = np.asarray(batch[start : start + n])
        rows = len(chunk)
        if rows < n:
            chunk = np.concatenate([chunk, np.zeros((n - rows, *chunk.shape[1:]), chunk.dtype)])
        outs.append(np.asarray(run(chunk))[:rows])
    return np.concatenate(outs)
