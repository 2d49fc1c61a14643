"""``pipeline:`` — batching and the queues between the stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streamd.config._fields import Problems, opt, read_section


@dataclass(frozen=True)
class PipelineConfig:
    """How frames from all streams are batched for the engine and how much is buffered between stages."""

    batch_size: int = opt(4, "frames per inference batch, taken across streams (<= engine.max_batch)", ge=1)
    batch_timeout_ms: float = opt(
        10.0, "longest wait for a batch to fill before a partial batch runs", ge=0, note="0 = never wait"
    )
    ring_slots: int = opt(3, "batches in flight at once (input/output buffer sets in the ring)", ge=2, le=16)
    frame_queue: int = opt(
        2, "decoded frames kept per stream; when full the oldest frame is dropped and counted", ge=1
    )
    decoder: Literal["auto", "cpu", "nvdec"] = opt(
        "auto",
        "video decoder: nvdec (GPU, PyNvVideoCodec; H.264/HEVC) or cpu (FFmpeg via PyAV/OpenCV)",
        note="auto = nvdec when the engine runs on a GPU and PyNvVideoCodec is installed, else cpu",
    )


def parse_pipeline(raw: object, problems: Problems) -> PipelineConfig:
    """Check the ``pipeline:`` section (absent or empty = all defaults)."""
    given = read_section(PipelineConfig, {} if raw is None else raw, "pipeline", problems)
    return PipelineConfig(**given) if given is not None else PipelineConfig()
