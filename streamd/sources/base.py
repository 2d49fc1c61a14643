"""What a source hands the decoder: an opened demuxer of one video stream.

A source yields compressed packets in decode order and never decodes; the decoder owns decoding. Every
blocking call has a timeout (PyAV ``timeout=(open, read)``), so a silent input raises instead of hanging.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import av


class SourceError(RuntimeError):
    """The input could not be opened or read; the message never contains URL credentials."""


@dataclass(frozen=True, slots=True)
class VideoInfo:
    codec: str  # FFmpeg codec name: h264, hevc, mpeg4 …
    width: int
    height: int
    fps: float | None  # average frame rate when the container knows it
    time_base: float  # seconds per pts tick


class Demuxer(Protocol):
    info: VideoInfo
    stream: av.video.stream.VideoStream  # codec parameters for the decoder

    def packets(self) -> Iterator[av.Packet]: ...
    def close(self) -> None: ...
