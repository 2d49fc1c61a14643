"""Sinks write finished JSON lines, each behind its own bounded queue and thread.

``submit`` never blocks the pipeline: when a sink's queue is full (a slow disk, a stalled reader) the line
is dropped and counted. A sink whose target breaks (closed pipe, full disk) logs once, counts every later
line as dropped and leaves the other sinks alone.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import IO

log = logging.getLogger(__name__)
_CLOSE = None


class LineSink:
    def __init__(self, name: str, queue_size: int, flush_every: int = 1) -> None:
        self.name = name
        self.written = 0
        self.dropped = 0
        self.broken: str | None = None
        self._flush_every = flush_every
        self._q: queue.Queue[str | None] = queue.Queue(maxsize=queue_size)
        self._target: IO[str] | None = None
        self._thread = threading.Thread(target=self._run, name=f"sink-{name}", daemon=True)

    def _open(self) -> IO[str]:
        raise NotImplementedError

    def _close_target(self, target: IO[str]) -> None:
        target.close()

    def start(self) -> None:
        self._target = self._open()
        self._thread.start()

    def submit(self, line: str) -> None:
        if self.broken is not None:
            self.dropped += 1
            return
        try:
            self._q.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, flush and close; gives up after ``timeout`` seconds (counted as dropped)."""
        if not self._thread.is_alive():
            return
        try:
            self._q.put(_CLOSE, timeout=timeout)
        except queue.Full:
            log.error("sink %s: could not drain within %.0f s", self.name, timeout)
        self._thread.join(timeout)
        self.dropped += self._q.qsize()

    def _run(self) -> None:
        target = self._target
        assert target is not None
        pending = 0
        while (line := self._q.get()) is not _CLOSE:
            if self.broken is not None:
                self.dropped += 1
                continue
            try:
                target.write(line)
                self.written += 1
                pending += 1
                if pending >= self._flush_every or self._q.empty():
                    target.flush()
                    pending = 0
            except (OSError, ValueError) as exc:  # ValueError: write to a closed file
                self.broken = f"{type(exc).__name__}: {exc}"
                self.dropped += 1
                log.error("sink %s: output failed (%s); its lines are dropped from now on", self.name, exc)
        try:
            target.flush()
            self._close_target(target)
        except (OSError, ValueError):
            pass
