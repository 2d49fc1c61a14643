"""The engine process (one per GPU with ``engine.shared: true``): build the engine and its stages, listen on
a Unix socket for decode workers, serve until the supervisor says stop or goes away.

It talks to the supervisor over a pipe in ``streamd.protocol``'s words: ``Ready`` once listening (or
``StartFailed``, and exit), ``Stop`` from the supervisor. Workers authenticate with the run's key
(``multiprocessing.connection``'s HMAC handshake); the socket's name is in the abstract namespace (nothing
on disk to clean up, and private to the service's network namespace).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener

import numpy as np

from streamd.config import Config
from streamd.exitcodes import EX_SOFTWARE, StartupError
from streamd.protocol import EngineBeat, Ready, StartFailed, Stop
from streamd.shared_engine.messages import EngineFacts
from streamd.shared_engine.server import EngineServer

log = logging.getLogger("streamd.engine")
RING = 2  # engine batches in flight: one in the engine, the next queued behind it (server.py)


@dataclass(frozen=True)
class EngineSpec:
    config: Config
    device: int
    address: str
    authkey: bytes


def engine_address(device: int) -> str:
    """The abstract socket of this supervisor's engine process on ``device``."""
    return f"\0streamd-engine-{os.getpid()}-{device}"


def engine_main(spec: EngineSpec, conn: Connection) -> None:
    # The supervisor decides when it stops (Stop, or its pipe closing), after the workers have drained their
    # last batches through it: a signal to the whole group (Ctrl-C, KillMode=control-group) must not end it
    # before them.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(
        level=spec.config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s engine{spec.device} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        server, listener = _build(spec)
    except StartupError as exc:
        conn.send(StartFailed(exc.code, str(exc)))
        return
    except Exception as exc:
        log.debug("start-up failure", exc_info=True)
        conn.send(StartFailed(EX_SOFTWARE, f"engine process: {type(exc).__name__}: {exc}"))
        return
    engine = server.stages.engine
    server.start()
    stop = threading.Event()
    threading.Thread(target=_accept, args=(listener, server, stop), name="accept", daemon=True).start()
    where = f"GPU {spec.device}" if engine.on_device else "the CPU"
    log.info("engine %s on %s: serving batches of up to %d rows", engine.name, where, engine.max_batch)
    conn.send(Ready(os.getpid(), engine.name, engine.on_device, "-"))
    threading.Thread(target=_commands, args=(conn, stop), name="commands", daemon=True).start()
    threading.Thread(target=_beat, args=(conn, server, stop), name="beat", daemon=True).start()
    stop.wait()
    listener.close()
    log.info("engine: stopping after %d batches (%d rows)", server.batches, server.rows)
    server.close()


def _build(spec: EngineSpec) -> tuple[EngineServer, Listener]:
    """The engine, its slots (warmed: CUDA graphs captured at every batch size up to engine.max_batch) and
    the socket; nothing left open when it raises."""
    from streamd.pipeline.build import build_stages

    cfg = spec.config
    stages = build_stages(cfg, spec.device, warm_batch=cfg.engine.max_batch)
    try:
        engine = stages.engine
        c, h, w = engine.input_shape
        facts = EngineFacts(
            engine.name,
            engine.on_device,
            engine.max_batch,
            (c, h, w),
            np.dtype(engine.input_dtype).name,
            tuple(engine.output_shape),
            np.dtype(engine.output_dtype).name,
        )
        server = EngineServer(stages, facts, RING)
        stages.warmed()  # the slots exist and every batch size ran: start-up's own memory goes back
        try:
            listener = Listener(spec.address, family="AF_UNIX", authkey=spec.authkey)
        except OSError as exc:
            raise StartupError(f"engine process: cannot listen ({exc})", EX_SOFTWARE) from exc
    except BaseException:
        stages.close()
        raise
    return server, listener


def _beat(conn: Connection, server: EngineServer, stop: threading.Event) -> None:
    """Progress for the supervisor's watchdog (``EngineHosts.STALL_S``), once a second."""
    while not stop.wait(1.0):
        try:
            conn.send(EngineBeat(server.batches, server.waiting(), server.rows))
        except (OSError, ValueError):
            return


def _commands(conn: Connection, stop: threading.Event) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the supervisor is gone
            break
        if isinstance(message, Stop):
            break
    stop.set()


def _accept(listener: Listener, server: EngineServer, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        try:
            conn = listener.accept()
        except Exception as exc:  # closed, or a client failed the handshake (AuthenticationError)
            if stop.is_set():
                return
            log.warning("engine: a connection was refused (%s)", exc)
            continue
        n += 1
        threading.Thread(target=server.serve, args=(conn, f"#{n}"), name=f"client{n}", daemon=True).start()
