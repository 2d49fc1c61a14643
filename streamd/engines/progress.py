"""Progress of long engine builds, fed by TensorRT's ``IProgressMonitor`` callbacks.

TensorRT reports nested phases ("Building engine" > "Tactic timing" > ...), each with a step count. A
``BuildProgress`` receives them; ``step`` returning False asks TensorRT to cancel the build. Implementations:
``ConsoleProgress`` (the ``streamd build-engine`` display), ``LogProgress`` (a daemon building at start-up)
and ``SystemdKeepalive`` (extends systemd's start-up timeout while a build makes progress). ``Fanout``
combines them.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Protocol, TextIO

from streamd import systemd

log = logging.getLogger(__name__)


class BuildProgress(Protocol):
    def phase_start(self, phase: str, parent: str | None, steps: int) -> None: ...

    def step(self, phase: str, step: int) -> bool:
        """Step ``step`` (0-based) of ``phase`` is done; False cancels the build."""
        ...

    def phase_finish(self, phase: str) -> None: ...


class _Phases:
    """Open phases in start order: name -> [steps, done, started_at]."""

    def __init__(self) -> None:
        self.open: dict[str, list[float]] = {}

    def start(self, phase: str, steps: int) -> None:
        self.open[phase] = [float(max(steps, 0)), 0.0, time.monotonic()]

    def step(self, phase: str, step: int) -> None:
        if phase in self.open:
            self.open[phase][1] = float(step + 1)

    def finish(self, phase: str) -> float:
        entry = self.open.pop(phase, None)
        return time.monotonic() - entry[2] if entry else 0.0


class ConsoleProgress:
    """One status line on a terminal (phases joined by ' > ' with step counts), plain lines otherwise."""

    def __init__(self, stream: TextIO | None = None, cancel: threading.Event | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.cancel = cancel
        self._phases = _Phases()
        self._last = 0.0
        self._t0 = time.monotonic()

    def _render(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.1 if self.tty else 10.0):
            return
        self._last = now
        parts = []
        for name, (steps, done, _) in self._phases.open.items():
            parts.append(f"{name} {int(done)}/{int(steps)}" if steps else name)
        line = f"[{now - self._t0:6.0f} s] " + " > ".join(parts)
        if self.tty:
            width = 160
            self.stream.write("\r\x1b[K" + line[:width])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        self._phases.start(phase, steps)
        self._render(force=parent is None)

    def step(self, phase: str, step: int) -> bool:
        self._phases.step(phase, step)
        self._render()
        return not (self.cancel is not None and self.cancel.is_set())

    def phase_finish(self, phase: str) -> None:
        took = self._phases.finish(phase)
        if not self._phases.open:
            if self.tty:
                self.stream.write("\r\x1b[K")
            self.stream.write(f"{phase}: done in {took:.0f} s\n")
            self.stream.flush()
        else:
            self._render()


class LogProgress:
    """Top-level phases as log lines (INFO), inner ones at DEBUG."""

    def __init__(self, cancel: threading.Event | None = None) -> None:
        self.cancel = cancel
        self._phases = _Phases()

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        self._phases.start(phase, steps)
        log.log(logging.INFO if parent is None else logging.DEBUG, "TensorRT: %s (%d steps)", phase, steps)

    def step(self, phase: str, step: int) -> bool:
        self._phases.step(phase, step)
        return not (self.cancel is not None and self.cancel.is_set())

    def phase_finish(self, phase: str) -> None:
        took = self._phases.finish(phase)
        log.debug("TensorRT: %s done in %.1f s", phase, took)


class SystemdKeepalive:
    """While a build makes progress, keep systemd from timing the service out.

    Every callback (at most every ``every`` seconds) sends ``EXTEND_TIMEOUT_USEC`` for ``extend`` seconds, a
    ``STATUS`` line and, when systemd asked for a watchdog, ``WATCHDOG=1``: progress callbacks are real
    progress, and a build that stops calling back stops extending, so a hung build still trips the timeout.
    """

    def __init__(self, extend: float = 120.0, every: float = 5.0) -> None:
        usec = systemd.watchdog_usec()
        self.watchdog = usec is not None
        self.extend = max(extend, 3 * usec / 1e6) if usec else extend
        self.every = every
        self._last = -1e9
        self._phase = ""

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        lines = [
            f"EXTEND_TIMEOUT_USEC={int(self.extend * 1e6)}",
            f"STATUS=building TensorRT engine: {self._phase}",
        ]
        if self.watchdog:
            lines.append("WATCHDOG=1")
        systemd.notify(*lines)

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        if parent is None:
            self._phase = phase
        self._tick()

    def step(self, phase: str, step: int) -> bool:
        self._tick()
        return True

    def phase_finish(self, phase: str) -> None:
        self._tick()


class Fanout:
    """Send every callback to several ``BuildProgress``; cancel if any asks to."""

    def __init__(self, *targets: BuildProgress) -> None:
        self.targets = targets

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        for t in self.targets:
            t.phase_start(phase, parent, steps)

    def step(self, phase: str, step: int) -> bool:
        go = True
        for t in self.targets:
            go = t.step(phase, step) and go
        return go

    def phase_finish(self, phase: str) -> None:
        for t in self.targets:
            t.phase_finish(phase)
