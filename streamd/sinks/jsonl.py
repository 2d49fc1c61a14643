"""JSON Lines to a file (appended; rotated by size and/or age; reopened on SIGHUP) or to standard output."""

from __future__ import annotations

import errno
import io
import logging
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import IO

from streamd.exitcodes import EX_CANTCREAT, StartupError
from streamd.sinks.base import _CLOSE, LineSink

log = logging.getLogger(__name__)

_IDLE_S = 0.5  # the writer wakes this often when idle, to flush, reopen or rotate on time


class _StreamWriter(LineSink):
    """Writes lines to a text file object; flushes every ``flush_every`` lines and whenever idle."""

    def __init__(self, name: str, queue_size: int, flush_every: int = 1, **kw: bool) -> None:
        super().__init__(name, queue_size, **kw)
        self._flush_every = flush_every
        self._target: IO[str] | None = None
        self._pending = 0
        self._line_in = False

    def _before_write(self, line: str) -> None:
        """Hook: rotate before ``line`` is written (files)."""

    def _idle(self) -> None:
        """Hook: called when no line came for a while (time-based rotation, reopen)."""

    def _close_target(self) -> None:
        if self._target is not None:
            self._target.close()
        self._target = None

    def _flush(self) -> None:
        if self._target is not None and self._pending:
            self._target.flush()
            self.written += self._pending
            self._pending = 0

    def _serve(self) -> None:
        while True:
            item = self._get(timeout=_IDLE_S)
            if item is None:
                self._guard(self._idle)
                continue
            if item is _CLOSE:
                break
            if self.broken is not None or self.gone or self._target is None:
                self._dropped_out += 1
                continue
            self._line_in = False
            if not self._guard(lambda line=item[1]: self._write(line)) and not self._line_in:  # type: ignore[misc]
                self._dropped_out += 1
        self._guard(self._flush)
        self._guard(self._finish)

    def _write(self, line: str) -> None:
        self._before_write(line)
        assert self._target is not None
        self._pending += 1  # from here on the line is counted by _flush (written) or _guard (dropped)
        self._line_in = True
        self._target.write(line)
        if self._pending >= self._flush_every or self._q.empty():
            self._flush()

    def _finish(self) -> None:
        self._close_target()

    def _guard(self, fn: object) -> bool:
        """Run ``fn``; an OSError breaks the sink (EPIPE: the reader left) and the unflushed lines are
        counted as dropped. False when it failed."""
        try:
            fn()  # type: ignore[operator]
            return True
        except BrokenPipeError:
            self._went_away()
        except (OSError, ValueError) as exc:  # ValueError: write to a closed file
            self._fail(_describe(exc))
        self._dropped_out += self._pending
        self._pending = 0
        return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"


class JsonlFileSink(_StreamWriter):
    """Appends to ``path``. Rotation renames path -> path.1 -> path.2 ... (``keep`` files) and starts a new
    file; ``reopen()`` (SIGHUP) closes and reopens ``path`` after an outside tool (logrotate) moved it."""

    kind = "jsonl"

    def __init__(
        self,
        path: Path,
        queue_size: int = 4096,
        flush_every: int = 1,
        *,
        rotate_bytes: int = 0,
        rotate_interval_s: float = 0.0,
        keep: int = 5,
        fsync: str = "rotate",
        skip_empty: bool = False,
        drops_ok: bool = False,
    ) -> None:
        super().__init__(
            f"jsonl:{path.name}", queue_size, flush_every, skip_empty=skip_empty, drops_ok=drops_ok
        )
        self.path = Path(path)
        self.rotate_bytes = rotate_bytes
        self.rotate_interval_s = rotate_interval_s
        self.keep = keep
        self.fsync = fsync
        self.rotations = 0
        self.reopens = 0
        self._size = 0
        self._opened_at = 0.0
        self._reopen = threading.Event()
        self._regular = True

    def _open(self) -> None:
        """Open for append; what fails here is reported before anything runs (exit 73)."""
        try:
            self._open_file()
        except OSError as exc:
            raise StartupError(
                f"sink jsonl: cannot write {self.path}: {exc.strerror or exc}", EX_CANTCREAT
            ) from None
        if self._regular:
            assert self._target is not None
            st = os.fstatvfs(self._target.fileno())
            if st.f_bavail == 0 and st.f_blocks > 0:
                self._close_target()
                raise StartupError(
                    f"sink jsonl: cannot write {self.path}: no space left on device", EX_CANTCREAT
                )

    def _open_file(self) -> None:
        target = open(self.path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115 (kept open)
        try:
            st = os.fstat(target.fileno())
        except OSError:
            target.close()
            raise
        self._regular = stat.S_ISREG(st.st_mode)
        self._size = st.st_size if self._regular else 0
        self._opened_at = time.monotonic()
        self._target = target

    def reopen(self) -> None:
        self._reopen.set()

    def _before_write(self, line: str) -> None:
        if self._reopen.is_set():
            self._do_reopen()
        nbytes = len(line) if line.isascii() else len(line.encode())  # lines are UTF-8: count bytes
        if self._regular and self._due(nbytes):
            self._rotate()
        self._size += nbytes

    def _idle(self) -> None:
        self._flush()
        if self._reopen.is_set():
            self._do_reopen()
        elif self._regular and self.rotate_interval_s and self._size and self._due(0):
            self._rotate()

    def _due(self, incoming: int) -> bool:
        if self._size == 0:
            return False
        if self.rotate_bytes and self._size + incoming > self.rotate_bytes:
            return True
        return bool(self.rotate_interval_s) and time.monotonic() - self._opened_at >= self.rotate_interval_s

    def _sync(self, always: bool = False) -> None:
        if self._target is not None and self._regular and (always or self.fsync != "never"):
            os.fsync(self._target.fileno())

    def _flush(self) -> None:
        had = self._pending
        super()._flush()
        if had and self.fsync == "flush":
            self._sync()

    def _close_target(self) -> None:
        if self._target is not None:
            self._flush()
            self._target.flush()
            self._sync()
        super()._close_target()

    def _do_reopen(self) -> None:
        self._reopen.clear()
        self._flush()
        self._close_target()
        self._open_file()
        self.reopens += 1
        log.info("sink %s: reopened %s", self.name, self.path)

    def _rotate(self) -> None:
        self._flush()
        self._close_target()
        oldest = self.path.with_name(f"{self.path.name}.{self.keep}")
        if oldest.exists():
            oldest.unlink()
        for n in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.rename(self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.path.exists():
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        self._open_file()
        self.rotations += 1

    def stats(self) -> dict:
        return {**super().stats(), "rotations": self.rotations, "reopens": self.reopens}


class StdoutSink(_StreamWriter):
    """Standard output. When the reader goes away (``streamd run | head``) the sink is ``gone``."""

    kind = "stdout"

    def __init__(self, queue_size: int = 4096, *, skip_empty: bool = False, drops_ok: bool = False) -> None:
        super().__init__("stdout", queue_size, 1, skip_empty=skip_empty, drops_ok=drops_ok)
        self._borrowed = False

    def _open(self) -> None:
        # Our own file object on a duplicate of fd 1: a closed pipe breaks this sink, not the interpreter.
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):  # stdout replaced (e.g. by a test runner)
            self._borrowed = True
            self._target = sys.stdout
            return
        try:
            self._target = os.fdopen(os.dup(fd), "w", encoding="utf-8", buffering=1 << 16)
        except OSError as exc:
            if exc.errno == errno.EBADF:  # started with stdout closed
                raise StartupError("sink stdout: standard output is closed", EX_CANTCREAT) from None
            raise

    def _close_target(self) -> None:
        if self._borrowed:
            if self._target is not None:
                self._target.flush()
            self._target = None
            return
        super()._close_target()
