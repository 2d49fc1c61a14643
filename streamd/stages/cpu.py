"""The CPU twin of the slot contract (``streamd.stages.contract.Stages``): OpenCV/numpy preprocess, a host
engine, numpy NMS, each call doing its work in the calling stage thread."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from streamd.engines.base import Engine
from streamd.stages.contract import Slot
from streamd.stages.host_frames import HostFrames
from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec, set_stream_classes
from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec
from streamd.types import Detections


@dataclass(slots=True)
class _CpuBuffers:
    input: np.ndarray  # [max_batch, 3, H, W] float32
    output: np.ndarray | None = None
    detections: list[Detections] = field(default_factory=list)


class CpuStages:
    """OpenCV/numpy preprocess, a host engine, numpy NMS."""

    def __init__(self, engine: Engine, pre: PreprocessSpec, post: PostprocessSpec) -> None:
        if engine.on_device:
            raise ValueError(f"CpuStages needs a host engine, got {engine.name}")
        self.engine = engine
        self._pre = CpuPreprocessor(pre)
        self._post = CpuPostprocessor(post)
        self._input_shape = (engine.max_batch, 3, pre.height, pre.width)
        self._host = HostFrames()

    def new_slot(self, index: int) -> Slot:
        return Slot(index, buffers=_CpuBuffers(np.empty(self._input_shape, np.float32)))

    def preprocess(self, slot: Slot) -> None:
        t = time.perf_counter()
        buf: _CpuBuffers = slot.buffers  # type: ignore[assignment]
        self._host.convert_pending(slot.frames)
        slot.transforms = [self._pre(f.image, buf.input[i]) for i, f in enumerate(slot.frames)]  # type: ignore[arg-type]
        slot.stage_ms["preprocess"] = (time.perf_counter() - t) * 1e3

    def infer(self, slot: Slot) -> None:
        t = time.perf_counter()
        buf: _CpuBuffers = slot.buffers  # type: ignore[assignment]
        buf.output = self.engine.infer(buf.input[: len(slot.frames)])
        slot.stage_ms["infer"] = (time.perf_counter() - t) * 1e3

    def postprocess(self, slot: Slot) -> None:
        t = time.perf_counter()
        buf: _CpuBuffers = slot.buffers  # type: ignore[assignment]
        buf.detections = self._post(buf.output, [f.stream_id for f in slot.frames])  # type: ignore[arg-type]
        buf.output = None
        slot.stage_ms["postprocess"] = (time.perf_counter() - t) * 1e3

    def collect(self, slot: Slot) -> list[Detections]:
        buf: _CpuBuffers = slot.buffers  # type: ignore[assignment]
        return [
            Detections(t.to_source(d.xyxy, f.width, f.height), d.score, d.class_id)
            for f, t, d in zip(slot.frames, slot.transforms, buf.detections, strict=True)
        ]

    def set_classes(self, stream_id: str, thresholds: Sequence[float] | None) -> None:
        set_stream_classes(self._post.spec, stream_id, thresholds)

    def warmed(self) -> None:
        """Nothing to give back on the CPU."""

    def close(self) -> None:
        self._host.close()
        self.engine.close()
