"""Video files (any container FFmpeg reads): open through a demux backend, and pace at the native rate."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from streamd.ingest.sources.base import Demuxer, DemuxOptions, SourceError


def open_file(path: Path, options: DemuxOptions) -> Demuxer:
    """Open a video file; raises SourceError when it is missing, unreadable or has no video stream."""
    from streamd.ingest.sources.backends import open_demuxer
    from streamd.ingest.sources.errors import file_problem

    problem = file_problem(str(path))
    if problem is None and not path.is_file():
        problem = "not a regular file"
    if problem:
        raise SourceError(f"cannot open: {problem}")
    return open_demuxer(str(path), options)


class Pacer:
    """Releases frames at the stream's own rate: the frame with pts ``p`` is due ``p - p0`` after the first.

    If the consumer falls more than ``max_lag_s`` behind, the schedule restarts from now instead of
    releasing a burst of late frames (latency must not build up). ``wait`` returns False when ``stop`` is set.
    """

    def __init__(self, stop: threading.Event, max_lag_s: float = 1.0) -> None:
        self._stop = stop
        self._max_lag_s = max_lag_s
        self._anchor: tuple[float, float] | None = None  # (monotonic time, pts) of the schedule's origin

    def reset(self) -> None:
        self._anchor = None

    def wait(self, pts: float | None) -> bool:
        if pts is None:
            return not self._stop.is_set()
        now = time.monotonic()
        if self._anchor is None:
            self._anchor = (now, pts)
            return not self._stop.is_set()
        t0, p0 = self._anchor
        delay = t0 + (pts - p0) - now
        if delay < -self._max_lag_s or pts < p0:
            self._anchor = (now, pts)
            return not self._stop.is_set()
        if delay > 0:
            return not self._stop.wait(delay)
        return not self._stop.is_set()
