"""A worker process: runs one ``Pipeline`` and talks to the supervisor over a pipe.

    worker -> supervisor   ("ready", info) · ("lines", [Record, ...]) per batch · ("stats", dict) at least
                           once a second, also while held (the supervisor's sign of life) · ("error",
                           exit_code, message) when it cannot start · ("streams", removed, refused) after a
                           ("streams", ...) request · ("snapshot", stream_id, jpeg) · ("done", failed)
    supervisor -> worker   ("go",) start the streams (first start: once every worker is built) · ("adopt",
                           stream_configs, resumes) a spare takes over a dead worker's streams, then starts ·
                           ("streams", remove_ids, stream_configs, resumes) a reload removes, changes or
                           adds streams in place (the others never pause) · ("stop",) drain and finish ·
                           ("abort",) finish now · ("snapshot", stream_id)

The worker never outlives its supervisor: a closed pipe means stop.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from streamd import logutil
from streamd.config import Config, StreamConfig
from streamd.exitcodes import EX_SOFTWARE, StartupError
from streamd.worker.pipeline import Pipeline, Record, Resume

log = logging.getLogger("streamd.worker")


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    config: Config
    stream_ids: tuple[str, ...]
    device: int
    resume: dict[str, Resume] = field(default_factory=dict)
    hold: bool = False  # after "ready", wait for ("go",): every worker's streams start together


class _Channel:
    """The worker's end of the pipe; sends are serialised (the collect and main threads share it)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self.closed = False

    def send(self, message: tuple) -> None:
        if self.closed:
            return
        with self._lock:
            self._send(message)

    def send_stats(self, pipeline: Pipeline) -> None:
        """Counters are taken and sent under the lock: two threads send them, and an older snapshot must
        never overtake a newer one (the supervisor's totals would go back)."""
        if self.closed:
            return
        with self._lock:
            self._send(("stats", pipeline.stats()))

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except (OSError, EOFError, ValueError):  # the supervisor is gone: stop quietly
            self.closed = True


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process (multiprocessing, spawn)."""
    # Ctrl-C in a terminal reaches the whole process group: the supervisor decides, the worker follows it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # reload/reopen is the supervisor's business
    config = spec.config
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker{spec.index} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    channel = _Channel(conn)
    streams = [s for s in config.streams if s.id in spec.stream_ids]
    last_stats = 0.0

    def emit(records: list[Record]) -> None:
        nonlocal last_stats
        now = time.monotonic()
        if now - last_stats >= 0.25:  # counters travel ahead of the lines they describe
            last_stats = now
            channel.send_stats(pipeline)
        channel.send(("lines", records))

    pipeline = Pipeline(config, streams, emit, device=spec.device, resume=spec.resume)
    # systemd (KillMode=control-group) or an operator may signal the worker directly: drain like "stop".
    signal.signal(signal.SIGTERM, lambda *_: pipeline.stop.set())
    try:
        pipeline.build()
    except StartupError as exc:
        channel.send(("error", exc.code, str(exc)))
        return
    except Exception as exc:
        log.debug("start-up failure", exc_info=True)
        channel.send(("error", EX_SOFTWARE, f"worker {spec.index}: {type(exc).__name__}: {exc}"))
        return
    # What start-up built lives as long as the process: the GC need not walk it again (~0.2 s pauses).
    gc.collect()
    gc.freeze()
    go = threading.Event()
    if not spec.hold:
        go.set()
    adoption: list[tuple[tuple[StreamConfig, ...], dict[str, Resume]]] = []  # a spare's streams ("adopt")
    commands = threading.Thread(
        target=_commands, args=(conn, channel, pipeline, go, adoption), name="commands"
    )
    commands.daemon = True
    commands.start()
    # A sign of life once a second for as long as the process lives (held, running, draining): a worker
    # that falls silent is wedged, and the supervisor kills it.
    threading.Thread(target=_heartbeat, args=(channel, pipeline), name="heartbeat", daemon=True).start()
    try:
        stages = pipeline.stages
        info = {
            "pid": os.getpid(),
            "engine": stages.engine.name if stages else "?",
            "gpu": bool(stages and stages.engine.on_device),
            "decoder": pipeline.decoder,
        }
        channel.send(("ready", info))
        while not go.wait(0.25):  # the first start: streams begin when every worker is built
            if pipeline.stop.is_set() or channel.closed:
                break
        if adoption:  # a spare taking over a dead worker's streams
            adopted, resume = adoption[0]
            pipeline.adopt(adopted, resume)
            channel.send(("ready", info))
        if go.is_set() and not pipeline.stop.is_set():
            pipeline.start()
        while not pipeline.join(timeout=0.5):
            channel.send_stats(pipeline)
            if channel.closed:
                pipeline.abort()
    finally:
        pipeline.close()
        logutil.flush_all()  # counts of repeated warnings still held back
        channel.send_stats(pipeline)
        channel.send(("done", pipeline.failed))


def _commands(
    conn: Connection,
    channel: _Channel,
    pipeline: Pipeline,
    go: threading.Event,
    adoption: list[tuple[tuple[StreamConfig, ...], dict[str, Resume]]],
) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the supervisor died: finish what is in flight and exit
            channel.closed = True
            pipeline.abort()
            return
        kind = message[0]
        if kind == "go":
            go.set()
        elif kind == "adopt":
            adoption.append((tuple(message[1]), dict(message[2])))
            go.set()
        elif kind == "streams":  # a reload, in place; off this thread: stopping a stream may take seconds
            threading.Thread(target=_reconfigure, args=(channel, pipeline, *message[1:]), daemon=True).start()
        elif kind == "stop":
            pipeline.stop.set()
        elif kind == "abort":
            pipeline.abort()
        elif kind == "snapshot":  # the status page asked: encode off the frame path, on this thread
            try:
                jpeg = pipeline.latest.jpeg(message[1])
            except Exception:
                log.exception("snapshot of %s failed", message[1])
                jpeg = None
            channel.send(("snapshot", message[1], jpeg))


def _reconfigure(
    channel: _Channel,
    pipeline: Pipeline,
    remove: Sequence[str],
    upsert: Sequence[StreamConfig],
    resume: dict[str, Resume],
) -> None:
    try:
        removed, refused = pipeline.reconfigure(remove, upsert, resume)
    except Exception:  # a reload must not take the other streams down
        log.exception("reload: changing streams in place failed")
        removed, refused = list(remove), [s.id for s in upsert]
    channel.send(("streams", removed, refused))


def _heartbeat(channel: _Channel, pipeline: Pipeline) -> None:
    while not channel.closed:
        time.sleep(1.0)
        channel.send_stats(pipeline)
