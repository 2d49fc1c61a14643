"""The three-stage slot contract (the CPU implementation is ``pipeline/cpu_stages.py``).

A ``Slot`` owns everything one batch needs on its way through the pipeline, so K slots let K batches be in
flight at once. The scheduler calls, for each batch and in this order, each from its own thread:
``preprocess`` (S1), ``infer`` (S2), ``postprocess`` (S3), then ``collect`` on the host. A GPU implementation
only *enqueues* work on three CUDA streams chained by events and ``collect`` waits for the last event; the CPU
implementation does the work synchronously in each call, so the threads give the same overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from streamd.engines.base import Engine
from streamd.types import Detections, Frame, Transform


@dataclass(slots=True)
class Slot:
    """Buffers and metadata of one in-flight batch. ``buffers`` is owned by the stage implementation."""

    index: int
    buffers: object = None
    frames: list[Frame] = field(default_factory=list)
    transforms: list[Transform] = field(default_factory=list)
    stage_ms: dict[str, float] = field(default_factory=dict)  # per-batch stage durations
    t_start: float = 0.0  # perf_counter when the batch entered S1


class Stages(Protocol):
    engine: Engine

    def new_slot(self, index: int) -> Slot: ...
    def preprocess(self, slot: Slot) -> None: ...
    def infer(self, slot: Slot) -> None: ...
    def postprocess(self, slot: Slot) -> None: ...
    def collect(self, slot: Slot) -> list[Detections]:
        """Wait until the slot's results are on the host; detections in source pixels (``slot.transforms``
        undone, clipped to each frame), one per frame."""
        ...

    def set_classes(self, stream_id: str, thresholds: Sequence[float] | None) -> None:
        """A stream's per-class score thresholds from now on (``ModelConfig.thresholds`` of its ``classes``;
        +inf filters a class out); None: the model's. Frames postprocessed after the call use them."""
        ...

    def warmed(self) -> None:
        """Every slot exists and every batch size has run once: start-up is over (GPU stages give back the
        memory only start-up needed)."""
        ...

    def close(self) -> None: ...
