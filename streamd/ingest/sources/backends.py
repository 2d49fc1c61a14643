"""The demux backends (``pyav``, ``opencv``): which are installed, the default one, a backend's class."""

from __future__ import annotations

import importlib.util
from typing import Any

from streamd.ingest.sources.base import SourceError

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
