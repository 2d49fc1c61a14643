"""Progress of a TensorRT engine build (minutes), fed by TensorRT's ``IProgressMonitor`` callbacks.

TensorRT reports nested phases ("Building engine" > "Tactic timing" > ...), each with a step count.
``BuildProgress`` shows them (one status line on a terminal for ``streamd build-engine``, log lines in the
daemon), cancels the build when its ``cancel`` event is set (``step`` returns False), and keeps systemd from
timing the service out while callbacks keep coming: ``EXTEND_TIMEOUT_USEC``, ``STATUS`` and, where systemd
asked for one, ``WATCHDOG=1`` at most every few seconds. A build that stops calling back stops extending, so a
hung build still trips the timeout.

A step that reports no progress (``torch.compile`` of a large model: minutes, no callbacks) runs inside
``keep_alive``: a timer thread extends the timeout every few seconds, up to a bound, so a compile longer than
the unit's ``TimeoutStartSec`` is not killed while one that hangs still is, once the bound is spent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from streamd import systemd

log = logging.getLogger(__name__)


class BuildProgress:
    def __init__(
        self,
        console: TextIO | None = None,
        cancel: threading.Event | None = None,
        *,
        extend_s: float = 120.0,
        notify_every_s: float = 5.0,
    ) -> None:
        """``console``: where the build-engine display goes (None: log lines instead)."""
        self.console = console
        self.tty = console is not None and console.isatty()
        self.cancel = cancel
        self._open: dict[str, list[float]] = {}  # phase -> [steps, done, started at], in start order
        self._t0 = self._shown = time.monotonic()
        usec = systemd.watchdog_usec()
        self._watchdog = usec is not None
        self._extend_s = max(extend_s, 3 * usec / 1e6) if usec else extend_s
        self._every_s = notify_every_s
        self._notified = -1e9
        self._top = ""

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        self._open[phase] = [float(max(steps, 0)), 0.0, time.monotonic()]
        if parent is None:
            self._top = phase
        if self.console is None:
            log.log(
                logging.INFO if parent is None else logging.DEBUG, "TensorRT: %s (%d steps)", phase, steps
            )
        self._show(force=parent is None)

    def step(self, phase: str, step: int) -> bool:
        """Step ``step`` (0-based) of ``phase`` is done; False asks TensorRT to cancel the build."""
        if phase in self._open:
            self._open[phase][1] = float(step + 1)
        self._show()
        return not (self.cancel is not None and self.cancel.is_set())

    def phase_finish(self, phase: str) -> None:
        entry = self._open.pop(phase, None)
        took = time.monotonic() - entry[2] if entry else 0.0
        if self.console is None:
            log.debug("TensorRT: %s done in %.1f s", phase, took)
        elif not self._open:
            self.console.write(("\r\x1b[K" if self.tty else "") + f"{phase}: done in {took:.0f} s\n")
            self.console.flush()
        self._show()

    def _show(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._notified >= self._every_s:
            self._notified = now
            lines = [
                f"EXTEND_TIMEOUT_USEC={int(self._extend_s * 1e6)}",
                f"STATUS=building TensorRT engine: {self._top}",
            ]
            systemd.notify(*lines, *(["WATCHDOG=1"] if self._watchdog else []))
        if (
            self.console is None
            or not self._open
            or (not force and now - self._shown < (0.1 if self.tty else 10.0))
        ):
            return
        self._shown = now
        parts = [
            f"{name} {int(done)}/{int(steps)}" if steps else name
            for name, (steps, done, _) in self._open.items()
        ]
        line = f"[{now - self._t0:6.0f} s] " + " > ".join(parts)
        self.console.write("\r\x1b[K" + line[:160] if self.tty else line + "\n")
        self.console.flush()


@contextlib.contextmanager
def keep_alive(
    status: str, *, every_s: float = 20.0, extend_s: float = 120.0, limit_s: float = 1800.0
) -> Iterator[None]:
    """While the block runs, every ``every_s``: ``EXTEND_TIMEOUT_USEC`` (``extend_s``) and ``STATUS``
    (plus ``WATCHDOG=1`` where systemd asked for one), for at most ``limit_s``: past that the block gets no
    more time, so a hung step still trips systemd's timeout. Outside systemd nothing is sent."""
    stop = threading.Event()
    watchdog = systemd.watchdog_usec() is not None

    def tick() -> None:
        ends = time.monotonic() + limit_s
        while time.monotonic() < ends:
            systemd.notify(
                f"EXTEND_TIMEOUT_USEC={int(extend_s * 1e6)}",
                f"STATUS={status}",
                *(["WATCHDOG=1"] if watchdog else []),
            )
            if stop.wait(every_s):
                return
        log.warning(
            "%s: still running after %.0f s; systemd's timeout is not extended further",
            status,
            limit_s,
        )

    thread = threading.Thread(target=tick, name="keep-alive", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)
