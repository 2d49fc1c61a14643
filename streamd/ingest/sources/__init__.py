"""Inputs: video files and RTSP cameras, demuxed to compressed packets (never decoded here).

Two demux backends give the same :class:`~.base.Packet` values: ``pyav`` (PyAV; default when
installed) and ``opencv`` (OpenCV's FFmpeg raw-packet mode; used where PyAV is missing, e.g. the GPU box).
Pick one with ``backend="pyav" | "opencv" | "auto"``. Backends are imported lazily.
"""

from __future__ import annotations

from typing import Any

from streamd.ingest.sources.backends import BACKENDS, available_backends, default_backend, demuxer_class
from streamd.ingest.sources.base import Demuxer, Packet, SourceEnded, SourceError, SourceTimeout, VideoInfo

__all__ = [
    "BACKENDS",
    "Demuxer",
    "Packet",
    "SourceEnded",
    "SourceError",
    "SourceTimeout",
    "VideoInfo",
    "available_backends",
    "default_backend",
    "demuxer_class",
    "open_stream",
]


def open_stream(cfg: Any, *, annexb: bool = False, backend: str = "auto") -> Demuxer:
    """Open a configured stream (:class:`~streamd.config.StreamConfig`): a file or an RTSP session."""
    from streamd.ingest.sources.file import open_file
    from streamd.ingest.sources.rtsp import open_rtsp

    stall_first = cfg.stall_timeout_s < cfg.read_timeout_s  # then a read gives up at the stall timeout
    timeouts = {
        "open_timeout_s": cfg.open_timeout_s,
        "read_timeout_s": min(cfg.read_timeout_s, cfg.stall_timeout_s),
        "read_timeout_key": "stall_timeout_s" if stall_first else "read_timeout_s",
    }
    if cfg.is_live:
        return open_rtsp(cfg.url, transport=cfg.transport, annexb=annexb, backend=backend, **timeouts)
    return open_file(cfg.path, annexb=annexb, backend=backend, **timeouts)
