"""The demux backends (``pyav``, ``opencv``): which are installed, the default one, a backend's class, and
opening an input through one."""

from __future__ import annotations

import importlib.util
from typing import Any

from streamd.ingest.sources.base import Demuxer, DemuxOptions, SourceError

BACKENDS = ("pyav", "opencv")


def available_backends() -> list[str]:
    modules = {"pyav": "av", "opencv": "cv2"}
    return [b for b in BACKENDS if importlib.util.find_spec(modules[b]) is not None]


def default_backend() -> str:
    """``pyav`` when PyAV is installed, else ``opencv``."""
    found = available_backends()
    if not found:
        raise SourceError("no demux backend: install PyAV (av) or opencv-python-headless")
    return found[0]


def demuxer_class(backend: str = "auto") -> Any:
    """The demuxer class of ``backend`` (``auto``: :func:`default_backend`)."""
    name = default_backend() if backend == "auto" else backend
    if name == "pyav":
        from streamd.ingest.sources.pyav import PyAVDemuxer

        return PyAVDemuxer
    if name == "opencv":
        from streamd.ingest.sources.opencv import OpenCVDemuxer

        return OpenCVDemuxer
    raise ValueError(f"demux backend: expected one of {', '.join(('auto', *BACKENDS))}, got {backend!r}")


def open_demuxer(url: str, options: DemuxOptions, ffmpeg_options: dict[str, str] | None = None) -> Demuxer:
    """Open ``url`` (a file path or an rtsp:// URL) with ``options.backend``; ``ffmpeg_options`` go to
    FFmpeg's demuxer (the RTSP transport and probe size). Raises SourceError, credentials redacted."""
    return demuxer_class(options.backend)(url, options, ffmpeg_options=ffmpeg_options)
