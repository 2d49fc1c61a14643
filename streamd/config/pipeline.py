"""``pipeline:`` — batching and the queues between the stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streamd.config._fields import Invalid, Problems, describe, opt, read_section

MAX_WORKERS = 64


@dataclass(frozen=True)
class PipelineConfig:
    """How frames from all streams are batched for the engine and how much is buffered between stages."""

    batch_size: int = opt(4, "frames per inference batch, taken across streams (<= engine.max_batch)", ge=1)
    batch_timeout_ms: float = opt(
        10.0, "longest wait for a batch to fill before a partial batch runs", ge=0, note="0 = never wait"
    )
    ring_slots: int = opt(3, "batches in flight at once (input/output buffer sets in the ring)", ge=1, le=16)
    frame_queue: int = opt(
        2,
        "decoded frames a live stream always keeps; beyond them the oldest is dropped (counted) when 1 s old",
        ge=1,
        le=256,
    )
    decoder: Literal["auto", "cpu", "nvdec"] = opt(
        "auto",
        "video decoder: nvdec (GPU, PyNvVideoCodec; H.264/HEVC) or cpu (FFmpeg via PyAV/OpenCV)",
        note="auto = nvdec when the engine runs on a GPU and PyNvVideoCodec is installed, else cpu",
    )
    workers: int | str = opt(
        "auto",
        "worker processes the streams are spread over; each runs the whole pipeline for its share",
        note="auto = one per 16 streams on a GPU engine (at most cores/2), one on the CPU engine",
        doc_type="'auto' or an integer 1..64",
    )
    spare_worker: bool = opt(
        True,
        "keep one extra worker built and idle, so a worker that dies is replaced in about a second",
        note="only with 2 or more workers; one per GPU in use, each costs one engine's memory",
    )
    devices: tuple[int, ...] = opt(
        (),
        "CUDA devices the workers are spread over, round robin (empty = engine.device only)",
        doc_type="a list of device indices",
    )


def parse_pipeline(raw: object, problems: Problems) -> PipelineConfig:
    """Check the ``pipeline:`` section (absent or empty = all defaults)."""
    given = read_section(
        PipelineConfig,
        {} if raw is None else raw,
        "pipeline",
        problems,
        special={"workers": _check_workers, "devices": _check_devices},
    )
    return PipelineConfig(**given) if given is not None else PipelineConfig()


def _check_workers(value: object, path: str) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise Invalid(
            f"expected 'auto' or an integer between 1 and {MAX_WORKERS}, got {describe(value)}; "
            "auto picks one worker per 16 streams",
            path,
        )
    return value


def _check_devices(value: object, path: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise Invalid(f"expected a list of CUDA device indices (integers >= 0), got {describe(value)}", path)
    if len(set(value)) != len(value):
        raise Invalid(f"device listed twice in {value}; list each device once", path)
    return tuple(value)
