"""The sink contract: finished JSON lines in, each sink behind its own bounded queue and thread.

The supervisor calls, in this order:

- ``start()`` once: opens the target. A failure that can be seen now (a read-only file, a full disk, a
  missing password) raises ``StartupError`` (exit code ``EX_CANTCREAT`` or ``EX_CONFIG``).
- ``submit(line, stream_id)`` per result line; thread-safe (the supervisor has one reader thread per worker).
  Never blocks: when the queue is full the line is dropped and counted. Lines of one stream keep their order
  as long as one thread submits them.
- ``wait_usable(timeout)`` after a reload started it: why it cannot deliver yet (MQTT: broker unreachable).
- ``stream_health(per_stream)`` once a second: each stream's health (MQTT's retained status follows it).
- ``configured(config)`` at start and whenever the running streams change: the config now running.
- ``reopen()`` on SIGHUP (after logrotate moved a file); a no-op for sinks without files.
- ``close(timeout)`` once at the end: writes what is queued within ``timeout``; what is left is dropped.

A sink whose target breaks for good (closed pipe, full disk) logs once and counts every later line as
dropped; the other sinks go on. ``stats()`` gives the counters; ``lost`` is what the exit status should count
(``drops_ok`` sinks count 0); ``gone`` is True when the reader went away (stdout closed), which the supervisor
treats like a Unix tool treats SIGPIPE once every sink is gone (``on_gone`` is called once when it happens).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamd.config import Config

log = logging.getLogger(__name__)

_CLOSE = ("", "")  # sentinel item: (stream_id, line) with an empty line
EMPTY_MARK = '"detections":[]'  # how a frame without detections reads in a compact JSON line


class LineSink:
    """Bounded queue + one writer thread. Subclasses implement ``_open`` and ``_serve``."""

    kind = "sink"
    close_grace_s = 1.0  # how long past the close deadline one last write/request may take

    def __init__(
        self, name: str, queue_size: int, *, skip_empty: bool = False, drops_ok: bool = False
    ) -> None:
        self.name = name
        self.skip_empty = skip_empty
        self.drops_ok = drops_ok
        self.written = 0  # lines delivered (written / published / acknowledged)
        self.skipped = 0  # lines left out by skip_empty
        self.broken: str | None = None  # why the target failed for good
        self.gone = False  # the reader went away (stdout closed): stop like a Unix tool
        self.on_gone: Callable[[], None] | None = None
        self.config: object = None  # the sinks: item it was built from (reload compares them)
        self._dropped_full = 0  # counted by submit (queue full / broken) ...
        self._dropped_out = 0  # ... and by the writer thread (failed writes, left at close)
        self._logged: set[str] = set()
        self._count_lock = threading.Lock()
        self._q: queue.Queue[tuple[str, str]] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()  # close() was called
        self._go = threading.Event()  # cleared while held (start(hold=True))
        self._go.set()
        self._thread = threading.Thread(target=self._run, name=f"sink-{name}", daemon=True)

    # -- the contract --------------------------------------------------------------------------------

    def start(self, hold: bool = False) -> None:
        """Open the target and start the writer; ``hold``: lines queue up but are written only after
        ``release()`` (a reload lets the sink it replaces finish first)."""
        if hold:
            self._go.clear()
        self._open()
        self._thread.start()

    def release(self) -> None:
        self._go.set()

    def submit(self, line: str, stream_id: str) -> None:
        if self.skip_empty and EMPTY_MARK in line:
            with self._count_lock:
                self.skipped += 1
            return
        if self.broken is None and not self.gone:
            try:
                self._q.put_nowait((stream_id, line))
                return
            except queue.Full:
                pass
        with self._count_lock:  # several submitting threads: no lost increments
            self._dropped_full += 1

    def reopen(self) -> None:
        """SIGHUP: reopen the output (files only)."""

    def stream_removed(self, stream_id: str) -> None:
        """A reload removed the stream (MQTT marks it offline); a no-op for most sinks."""

    def stream_health(self, per_stream: Mapping[str, Mapping[str, Any]]) -> None:
        """Each stream's state once a second (MQTT's retained status follows it); a no-op for most sinks."""

    def configured(self, config: Config) -> None:
        """At start and after each change of the running streams (reload, control API): the config now
        running (MQTT's Home Assistant discovery announces its streams); a no-op for most sinks."""

    def wait_usable(self, timeout: float) -> str | None:
        """After ``start``: None when the target can take lines, else why not (a network sink may wait up to
        ``timeout`` for its first connection). A reload names such a sink; it stays and keeps trying."""
        return self.broken

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, flush and close; gives up after ``timeout`` seconds (counted as dropped)."""
        self._stop.set()
        self._go.set()
        if not self._thread.is_alive():
            self._dropped_out += self._drain_uncounted()
            return
        deadline = time.monotonic() + timeout
        try:
            self._q.put(_CLOSE, timeout=timeout)
        except queue.Full:
            self.log_once("drain", logging.ERROR, "could not drain within %.0f s", timeout)
        # The writer gives up what is left at the deadline; its last attempt may take close_grace_s longer.
        self._thread.join(max(0.0, deadline - time.monotonic()) + self.close_grace_s)
        if self._thread.is_alive():
            self.log_once(
                "stuck", logging.ERROR, "writer still busy %.0f s after the deadline", self.close_grace_s
            )
        self._dropped_out += self._drain_uncounted()

    @property
    def dropped(self) -> int:
        return self._dropped_full + self._dropped_out

    @property
    def lost(self) -> int:
        """Lines that count against the exit status (0 for ``drops_ok`` sinks and for a reader that left)."""
        return 0 if self.drops_ok or self.gone else self.dropped

    @property
    def queued(self) -> int:
        return self._q.qsize()

    def stats(self) -> dict:
        """Plain counters for the snapshot, metrics and the summary."""
        return {
            "type": self.kind,
            "written": self.written,
            "dropped": self.dropped,
            "skipped": self.skipped,
            "queued": self.queued,
            "broken": self.broken,
            "gone": self.gone,
        }

    # -- for subclasses ------------------------------------------------------------------------------

    def _open(self) -> None:
        """Open the target (called by start, on the caller's thread); raise StartupError when it cannot."""

    def _serve(self) -> None:
        """The writer thread's loop: take items with ``_get`` until it returns the close sentinel."""
        raise NotImplementedError

    def _get(self, timeout: float | None = None) -> tuple[str, str] | None:
        """The next (stream_id, line); ``_CLOSE`` at the end; None after ``timeout`` seconds of nothing."""
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def _drain_uncounted(self) -> int:
        n = 0
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return n
            if item is not _CLOSE:
                n += 1

    def _fail(self, reason: str) -> None:
        """The target broke for good: log once; from now on every line is dropped and counted."""
        if self.broken is None:
            self.broken = reason
            log.error("sink %s: output failed (%s); its lines are dropped from now on", self.name, reason)

    def _went_away(self) -> None:
        if not self.gone:
            self.gone = True
            log.info("sink %s: the reader closed the output; nothing more is written there", self.name)
            if self.on_gone is not None:
                self.on_gone()

    def log_once(self, key: str, level: int, msg: str, *args: object) -> None:
        """Log ``msg`` the first time ``key`` comes up for this sink (later repeats are only counted)."""
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, "sink %s: " + msg, self.name, *args)

    def _run(self) -> None:
        self._go.wait()
        try:
            self._serve()
        except Exception as exc:  # a bug in a sink must not take the daemon down with it
            log.exception("sink %s: writer thread failed", self.name)
            self._fail(f"{type(exc).__name__}: {exc}")
            while self._get() is not _CLOSE:
                self._dropped_out += 1
