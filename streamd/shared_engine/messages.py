"""What a decode worker and the engine process say over the worker's socket (pickled dataclasses).

engine -> worker: ``EngineFacts`` once, on connect; then ``Results`` per ``Submit`` (a batch that fails
ends the engine process, and its workers restart).
worker -> engine: ``Attach`` once per ring slot (where its rows are), then ``Submit`` per batch; ``Classes``
whenever one of its streams starts or changes (its per-class thresholds: the engine process runs the NMS).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EngineFacts:
    name: str  # the engine's own name (torch, tensorrt, onnxruntime)
    on_device: bool  # rows are CUDA memory (IPC) when True, shared host memory otherwise
    max_rows: int  # rows one Submit may carry (the engine's batch)
    input_shape: tuple[int, int, int]  # C, H, W
    input_dtype: str  # numpy dtype name of the engine's input
    output_shape: tuple[int, ...] = ()  # the engine's own output for batch 1 (its NMS runs there)
    output_dtype: str = "float32"


@dataclass(frozen=True)
class Attach:
    slot: int
    nbytes: int
    memory: bytes | str  # a CUDA IPC memory handle, or a shared-memory block's name
    event: bytes | None  # a CUDA IPC event recorded after the rows are written (GPU only)


@dataclass(frozen=True)
class Submit:
    slot: int
    stream_ids: tuple[str, ...]  # one per row, in row order (per-stream score thresholds)


@dataclass(frozen=True)
class Classes:
    """A stream's per-class score thresholds from now on (``Stages.set_classes``); None: the model's."""

    stream_id: str
    thresholds: tuple[float, ...] | None


@dataclass(frozen=True)
class Results:
    """One Submit's detections in model-input pixels: ``counts`` [rows] int32, ``det`` [rows, max count, 6]
    float32 rows x1, y1, x2, y2, score, class (``types.to_source_padded``'s input)."""

    slot: int
    counts: np.ndarray
    det: np.ndarray
    engine_ms: float  # from the batch's dispatch to its results on the host, in the engine process
    batch_rows: int  # rows of the engine batch this Submit went in (several workers' rows together)
