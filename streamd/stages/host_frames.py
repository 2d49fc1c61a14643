"""Host frames get their pixels when they are batched: ``Frame.pending`` -> ``Frame.image``.

The CPU decoder hands the stream threads unconverted pictures (``CpuDecoder(lazy=True)``); converting to BGR
(the GPU kernel's exact arithmetic, ``stages.preprocess.colour``) costs several times a small picture's
decode, so it happens here, for the frames that reach a batch only: a frame its queue dropped while the
pipeline was behind, or one ``detect_fps`` skipped, is never converted. Both stage implementations call
:func:`convert_pending` first thing in ``preprocess`` (the S1 thread).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from streamd.types import Frame

log = logging.getLogger(__name__)

# A batch converts in a few threads (OpenCV and numpy release the GIL for most of it) once it holds about
# three VGA pictures; fewer are not worth waking threads for.
THREADS = max(1, min(4, len(os.sched_getaffinity(0)) // 2))
PARALLEL_PIXELS = 1_000_000


class HostFrames:
    """Converts the pending pictures of a batch; owns the threads for large batches (``close``)."""

    def __init__(self, threads: int = THREADS) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def convert_pending(self, frames: Sequence[Frame]) -> None:
        todo = [f for f in frames if f.pending is not None]
        if not todo:
            return
        if self._threads > 1 and len(todo) > 1 and sum(f.width * f.height for f in todo) >= PARALLEL_PIXELS:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="convert")
            images = list(self._pool.map(_convert, todo))
        else:
            images = [_convert(f) for f in todo]
        for f, image in zip(todo, images, strict=True):
            f.image, f.pending = image, None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _convert(frame: Frame) -> np.ndarray:
    """The frame's pixels; a picture that cannot be converted (FFmpeg refuses its format) must not stop the
    worker's other streams: the frame is detected on a black picture, with a warning."""
    try:
        return frame.pending.bgr()
    except Exception as exc:
        log.warning(
            "stream %s: frame %d could not be converted to BGR (%s: %s); detected on a black picture",
            frame.stream_id, frame.index, type(exc).__name__, exc,
        )  # fmt: skip
        return np.zeros((frame.height, frame.width, 3), np.uint8)
