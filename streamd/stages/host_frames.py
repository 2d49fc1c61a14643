"""Host frames get their pixels when they are batched: ``Frame.pending`` -> ``Frame.image``.

The CPU decoder hands the stream threads unconverted pictures (``CpuDecoder(lazy=True)``); converting to BGR
(the GPU kernel's exact arithmetic, ``stages.preprocess.colour``) costs several times a small picture's
decode, so it happens here, for the frames that reach a batch only: a frame its queue dropped while the
pipeline was behind, or one ``detect_fps`` skipped, is never converted. Both stage implementations call
:func:`convert_pending` first thing in ``preprocess`` (the S1 thread).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from streamd.types import Frame

# A batch of large pictures converts in a few threads (OpenCV and numpy release the GIL for most of it);
# small ones are not worth waking threads for.
THREADS = max(1, min(4, len(os.sched_getaffinity(0)) // 2))
PARALLEL_PIXELS = 4 * 1920 * 1080


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
            images = list(self._pool.map(lambda f: f.pending.bgr(), todo))
        else:
            images = [f.pending.bgr() for f in todo]
        for f, image in zip(todo, images, strict=True):
            f.image, f.pending = image, None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
