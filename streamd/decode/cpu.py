"""CPU decoder (PyAV / FFmpeg): packets -> BGR uint8 frames. Twin of ``decode/nvdec.py``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import av
import numpy as np


@dataclass(slots=True)
class DecodedPicture:
    image: np.ndarray  # (H, W, 3) uint8 BGR
    pts: float | None  # seconds


class CpuDecoder:
    """Decodes every packet it is given (never skips, so references stay intact).

    A packet FFmpeg cannot decode raises ``av.InvalidDataError``; the caller counts it and goes on.
    """

    name = "cpu"

    def __init__(self, stream: av.video.stream.VideoStream, threads: int = 0) -> None:
        self._ctx = av.CodecContext.create(stream.codec_context.name, "r")
        if stream.codec_context.extradata:
            self._ctx.extradata = stream.codec_context.extradata
        self._ctx.thread_type = "AUTO"
        if threads:
            self._ctx.thread_count = threads
        self._time_base = stream.time_base

    def _convert(self, frames: list[av.VideoFrame]) -> Iterator[DecodedPicture]:
        for f in frames:
            pts = float(f.pts * self._time_base) if f.pts is not None and self._time_base else None
            yield DecodedPicture(f.to_ndarray(format="bgr24"), pts)

    def decode(self, packet: av.Packet) -> Iterator[DecodedPicture]:
        return self._convert(self._ctx.decode(packet))

    def flush(self) -> Iterator[DecodedPicture]:
        return self._convert(self._ctx.decode(None))

    def close(self) -> None:
        self._ctx = None
