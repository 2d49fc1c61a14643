"""The supervisor's engine processes (``engine.shared: true``): one per GPU the workers use, started before
the workers (which connect when it listens), restarted when one dies, stopped after the workers.

A start-up failure (the model does not load) is the run's failure, as a worker's would be: ``fatal`` holds it
and the pool hands it to every worker slot of that GPU. An engine process that dies after it was ready is
restarted with backoff; its workers' batches fail meanwhile, so they exit and the pool restarts them too
(their streams resume after their newest line), connecting once the engine listens again.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from streamd.config import Config
from streamd.exitcodes import EX_SOFTWARE
from streamd.protocol import EngineBeat, Ready, StartFailed, Stop
from streamd.shared_engine.process import EngineSpec, engine_address, engine_main

log = logging.getLogger("streamd.supervisor")


@dataclass
class EngineHost:
    device: int
    address: str
    process: Any = None
    conn: Connection | None = None
    ready: bool = False
    error: StartFailed | None = None
    restarts: int = 0
    restart_at: float | None = None
    ever_ready: bool = False  # once: a later death is restarted; a death before it ends the run
    ready_at: float = 0.0
    crashes_in_a_row: int = 0  # for the backoff; reset by a process that ran HEALTHY_S
    reader: threading.Thread | None = None
    fatal: StartFailed | None = None
    progress_at: float = 0.0  # monotonic: its last batch, or a beat with nothing waiting
    batches: int = 0  # this process's, from its beats
    rows: int = 0
    waiting: int = 0
    past_batches: int = 0  # those of the processes before a restart: the totals never go back
    past_rows: int = 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


class EngineHosts:
    RESTART_MIN_S = 0.5
    RESTART_MAX_S = 30.0
    HEALTHY_S = 60.0
    # A ready engine process that runs no batch for this long while Submits wait, or sends no beat at all, is
    # wedged (a GPU hang, a deadlock, SIGSTOP): killed, and restarted as if it had died. A batch takes
    # milliseconds to a second; every batch size is compiled and captured before Ready.
    STALL_S = 15.0

    def __init__(self, config: Config, ctx: Any, devices: list[int]) -> None:
        self.config, self._ctx = config, ctx
        self.authkey = secrets.token_bytes(32)
        self.hosts = {d: EngineHost(d, engine_address(d)) for d in sorted(set(devices))}
        self._stopping = False

    @classmethod
    def for_config(cls, config: Config, ctx: Any) -> EngineHosts:
        """One host per GPU the workers use with ``engine.shared``; none (every call a no-op) without it."""
        devices = list(config.pipeline.devices or (config.engine.device,)) if config.engine.shared else []
        return cls(config, ctx, devices)

    def endpoint(self, device: int) -> tuple[str, bytes] | None:
        host = self.hosts.get(device)
        return None if host is None else (host.address, self.authkey)

    def start(self) -> None:
        for host in self.hosts.values():
            self._spawn(host)

    def _spawn(self, host: EngineHost) -> None:
        spec = EngineSpec(self.config, host.device, host.address, self.authkey)
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=engine_main, args=(spec, child), name=f"streamd-engine{host.device}")
        proc.daemon = True
        proc.start()
        child.close()
        host.process, host.conn, host.ready, host.restart_at, host.error = proc, parent, False, None, None
        host.reader = threading.Thread(
            target=self._read, args=(host, parent), name=f"read-e{host.device}", daemon=True
        )
        host.reader.start()

    def _read(self, host: EngineHost, conn: Connection) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if isinstance(message, EngineBeat):
                if message.batches != host.batches or message.waiting == 0:
                    host.progress_at = time.monotonic()
                host.batches, host.rows, host.waiting = message.batches, message.rows, message.waiting
            elif isinstance(message, Ready):
                host.ready = host.ever_ready = True
                host.ready_at = host.progress_at = time.monotonic()
                host.past_batches += host.batches  # a restarted process counts from 0 again
                host.past_rows += host.rows
                host.batches = host.rows = 0
                state = "back" if host.restarts else "ready"
                log.info(
                    "engine process %s on device %d (pid %d): %s",
                    state,
                    host.device,
                    message.pid,
                    message.engine,
                )
            elif isinstance(message, StartFailed):
                host.error = message
                if host.ever_ready:  # a restart that cannot build: logged, and tried again with backoff
                    log.error(
                        "engine process on device %d could not start again: %s", host.device, message.message
                    )

    def stats(self) -> dict[int, dict[str, int]]:
        """Per GPU: engine batches run and their rows since start (every process of it), and Submits waiting
        now; rows / batches over a window is how full the merged batches ran (``/metrics``)."""
        return {
            d: {"batches": h.past_batches + h.batches, "rows": h.past_rows + h.rows, "waiting": h.waiting}
            for d, h in self.hosts.items()
        }

    def fatal(self) -> StartFailed | None:
        """A start-up failure of an engine process that was never ready in this run (the model does not load,
        it runs out of memory warming up, it crashed): the run cannot go on."""
        return next((h.fatal for h in self.hosts.values() if h.fatal is not None), None)

    def check(self, workers: list[Any]) -> None:
        """Restart engine processes that died (with backoff). A start-up failure becomes every worker slot's
        (``WorkerSlot.error``): the run stops with it, as when a worker cannot load the model."""
        now = time.monotonic()
        for host in self.hosts.values():
            if not self._stopping and host.alive and host.ready and now - host.progress_at > self.STALL_S:
                what = "engine process on device %d (pid %d): no batch in %.0f s, %d waiting (wedged); killed"
                host.process.kill()
                log.error(what, host.device, host.process.pid, now - host.progress_at, host.waiting)
                host.process.join(timeout=5)
            if self._stopping or host.alive or host.process is None or host.fatal is not None:
                continue
            if host.restart_at is not None:
                if now >= host.restart_at:
                    self._spawn(host)
                continue
            if host.reader is not None:
                host.reader.join(timeout=2)  # its StartFailed, if it sent one, is in
            code = host.process.exitcode
            why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            if not host.ever_ready:
                host.fatal = host.error or StartFailed(
                    EX_SOFTWARE,
                    f"the engine process on device {host.device} died before it was ready ({why})",
                )
                continue
            healthy = host.ready and now - host.ready_at >= self.HEALTHY_S
            host.crashes_in_a_row = 1 if healthy else host.crashes_in_a_row + 1
            host.restarts += 1
            delay = min(self.RESTART_MAX_S, self.RESTART_MIN_S * 2 ** min(host.crashes_in_a_row - 1, 8))
            host.restart_at, host.ready = now + delay, False
            what = "engine process on device %d died (%s); restarting in %.1f s (restart %d)"
            log.error(what, host.device, why, delay, host.restarts)
        fatal = self.fatal()
        for w in workers if fatal is not None else ():
            w.error = w.error or fatal

    def stop(self, timeout: float = 10.0) -> None:
        """After the workers: ask each engine process to stop, then end what is left."""
        self._stopping = True
        for host in self.hosts.values():
            if host.conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    host.conn.send(Stop())
        deadline = time.monotonic() + timeout
        for host in self.hosts.values():
            if host.process is None:
                continue
            host.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if host.process.is_alive():
                host.process.kill()
                host.process.join(timeout=5)
