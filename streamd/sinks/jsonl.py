"""JSON Lines to a file (appended) or to standard output."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import IO

from streamd.sinks.base import LineSink


class JsonlFileSink(LineSink):
    def __init__(self, path: Path, queue_size: int = 4096, flush_every: int = 1) -> None:
        super().__init__(f"jsonl:{path.name}", queue_size, flush_every)
        self.path = path

    def _open(self) -> IO[str]:
        return open(self.path, "a", encoding="utf-8", buffering=1 << 16)


class StdoutSink(LineSink):
    def __init__(self, queue_size: int = 4096) -> None:
        super().__init__("stdout", queue_size, flush_every=1)

    def _open(self) -> IO[str]:
        # Our own file object on a duplicate of fd 1: a closed pipe breaks this sink, not the interpreter.
        try:
            fd = sys.stdout.fileno()
        except (
            AttributeError,
            OSError,
            io.UnsupportedOperation,
        ):  # stdout replaced (e.g. under a test runner)
            self._borrowed = True
            return sys.stdout
        self._borrowed = False
        return os.fdopen(os.dup(fd), "w", encoding="utf-8", buffering=1 << 16)

    def _close_target(self, target: IO[str]) -> None:
        if not self._borrowed:
            target.close()
