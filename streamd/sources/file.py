"""Video files (any container FFmpeg reads), demuxed with PyAV."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import av

from streamd.sources.base import SourceError, VideoInfo


class FileDemuxer:
    """Demux the first video stream of a file. Packets come in decode order; non-video packets are skipped."""

    def __init__(self, path: Path, *, open_timeout_s: float = 10.0, read_timeout_s: float = 5.0) -> None:
        try:
            self._container = av.open(os.fspath(path), timeout=(open_timeout_s, read_timeout_s))
        except (av.FFmpegError, OSError) as exc:
            raise SourceError(f"cannot open {path}: {exc}") from exc
        if not self._container.streams.video:
            self._container.close()
            raise SourceError(f"{path}: no video stream")
        self.stream = self._container.streams.video[0]
        ctx = self.stream.codec_context
        rate = self.stream.average_rate or self.stream.guessed_rate
        self.info = VideoInfo(
            codec=ctx.name,
            width=ctx.width,
            height=ctx.height,
            fps=float(rate) if rate else None,
            time_base=float(self.stream.time_base or 0.0),
        )

    def packets(self) -> Iterator[av.Packet]:
        try:
            for packet in self._container.demux(self.stream):
                if packet.size:  # the final empty packet only signals end of stream
                    yield packet
        except av.FFmpegError as exc:
            # A truncated or damaged file: report it; what was read before still counts.
            raise SourceError(f"read error: {exc}") from exc

    def close(self) -> None:
        self._container.close()
