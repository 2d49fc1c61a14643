"""Inputs: video files and RTSP cameras, demuxed to compressed packets (never decoded here).

Two demux backends give the same :class:`~.base.Packet` values: ``pyav`` (PyAV; default when
installed) and ``opencv`` (OpenCV's FFmpeg raw-packet mode; used where PyAV is missing, e.g. the GPU box).
Pick one with ``DemuxOptions(backend="pyav" | "opencv" | "auto")``. Backends are imported lazily.
"""

from __future__ import annotations

from typing import Any

from streamd.ingest.sources.backends import (
    BACKENDS,
    available_backends,
    default_backend,
    demuxer_class,
    open_demuxer,
)
from streamd.ingest.sources.base import (
    Demuxer,
    DemuxOptions,
    Packet,
    SourceEnded,
    SourceError,
    SourceTimeout,
    VideoInfo,
)

__all__ = [
    "BACKENDS",
    "DemuxOptions",
    "Demuxer",
    "Packet",
    "SourceEnded",
    "SourceError",
    "SourceTimeout",
    "VideoInfo",
    "available_backends",
    "default_backend",
    "demuxer_class",
    "open_demuxer",
    "open_stream",
]


def open_stream(cfg: Any, options: DemuxOptions | None = None) -> Demuxer:
    """Open a configured stream (:class:`~streamd.config.StreamConfig`): a file or an RTSP session, with
    ``options`` (default: :meth:`DemuxOptions.for_stream`, the stream's timeouts on the default backend)."""
    from streamd.ingest.sources.file import open_file
    from streamd.ingest.sources.rtsp import open_rtsp

    options = options or DemuxOptions.for_stream(cfg)
    if cfg.is_live:
        return open_rtsp(cfg.url, options)
    return open_file(cfg.path, options)
