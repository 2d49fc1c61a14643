"""A worker process: runs one ``Pipeline`` and talks to the supervisor over a pipe, in the typed messages of
``streamd.protocol`` (its docstring lists them, both ways).

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
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from streamd import logutil
from streamd.config import Config
from streamd.exitcodes import EX_SOFTWARE, StartupError
from streamd.protocol import (
    Abort,
    Adopt,
    ClipRequest,
    ClipStarted,
    Done,
    EditStreams,
    FrameJpeg,
    Go,
    Lines,
    Ready,
    Record,
    Resume,
    SnapshotRequest,
    StartFailed,
    Stop,
    StreamsEdited,
    ToSupervisor,
    ToWorker,
)
from streamd.worker.pipeline import Pipeline

log = logging.getLogger("streamd.worker")


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    config: Config
    stream_ids: tuple[str, ...]
    device: int
    resume: dict[str, Resume] = field(default_factory=dict)
    hold: bool = False  # after Ready, wait for Go: every worker's streams start together
    engine: tuple[str, bytes] | None = None  # the GPU's engine process (socket, key) with engine.shared


class _Channel:
    """The worker's end of the pipe; sends are serialised (the collect and main threads share it)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self.closed = False

    def send(self, message: ToSupervisor) -> None:
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
            self._send(pipeline.stats())

    def _send(self, message: ToSupervisor) -> None:
        try:
            self.conn.send(message)
        except (OSError, EOFError, ValueError):  # the supervisor is gone: stop quietly
            self.closed = True


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process (multiprocessing, spawn): build, say Ready, run until the streams end
    or the supervisor says stop, say Done."""
    _set_up_process(spec)
    channel = _Channel(conn)
    streams = [s for s in spec.config.streams if s.id in spec.stream_ids]
    last_stats = 0.0

    def emit(records: list[Record]) -> None:
        nonlocal last_stats
        now = time.monotonic()
        if now - last_stats >= 0.25:  # counters travel ahead of the lines they describe
            last_stats = now
            channel.send_stats(pipeline)
        channel.send(Lines(records))

    pipeline = Pipeline(
        spec.config, streams, emit, device=spec.device, resume=spec.resume, shared_engine=spec.engine
    )
    # systemd (KillMode=control-group) or an operator may signal the worker directly: drain like Stop.
    signal.signal(signal.SIGTERM, lambda *_: pipeline.stop.set())
    if not _build(spec, pipeline, channel):
        return
    go = threading.Event()
    if not spec.hold:
        go.set()
    adoption: list[Adopt] = []  # a spare's streams
    threading.Thread(
        target=_commands, args=(conn, channel, pipeline, go, adoption), name="commands", daemon=True
    ).start()
    # A sign of life once a second for as long as the process lives (held, running, draining): a worker
    # that falls silent is wedged, and the supervisor kills it.
    threading.Thread(target=_heartbeat, args=(channel, pipeline), name="heartbeat", daemon=True).start()
    restart = False
    try:
        _run(pipeline, channel, go, adoption)
        # A stage failed (an exception in the worker's pipeline, not a stream's end). Endless streams
        # (cameras, looped files) would stay dark for the rest of the run: exit instead, without Done, and the
        # supervisor restarts the worker (with backoff, or onto the spare) and they go on after their newest
        # line, as after a crash. A finite file would start again from its first picture: it ends here,
        # counted as failed (exit 1), as before.
        endless = any(w.cfg.is_live or w.cfg.loop for w in list(pipeline.workers))
        restart = endless and pipeline.stage_failed and not pipeline.stop.is_set()
    finally:
        pipeline.close()
        logutil.flush_all()  # counts of repeated warnings still held back
        channel.send_stats(pipeline)
        if not restart:
            channel.send(Done(pipeline.failed))
    if restart:
        log.error("worker %d: a pipeline stage failed (above); exiting, its streams restart", spec.index)
        raise SystemExit(EX_SOFTWARE)


def _set_up_process(spec: WorkerSpec) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the supervisor decides, the worker follows it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # reload/reopen is the supervisor's business
    logging.basicConfig(
        level=spec.config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker{spec.index} %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _build(spec: WorkerSpec, pipeline: Pipeline, channel: _Channel) -> bool:
    """Build the engine and stages; a failure goes to the supervisor as StartFailed (False)."""
    try:
        pipeline.build()
    except StartupError as exc:
        channel.send(StartFailed(exc.code, str(exc)))
        return False
    except Exception as exc:
        log.debug("start-up failure", exc_info=True)
        channel.send(StartFailed(EX_SOFTWARE, f"worker {spec.index}: {type(exc).__name__}: {exc}"))
        return False
    # What start-up built lives as long as the process: the GC need not walk it again (~0.2 s pauses).
    gc.collect()
    gc.freeze()
    return True


def _run(pipeline: Pipeline, channel: _Channel, go: threading.Event, adoption: list[Adopt]) -> None:
    """Ready; wait for Go (or Adopt, for a spare); run until every frame has gone through."""
    stages = pipeline.stages
    engine = stages.engine if stages is not None else None
    ready = Ready(
        os.getpid(), engine.name if engine else "?", bool(engine and engine.on_device), pipeline.decoder
    )
    channel.send(ready)
    while not go.wait(0.25):  # the first start: streams begin when every worker is built
        if pipeline.stop.is_set() or channel.closed:
            break
    if adoption:  # a spare taking over a dead worker's streams
        pipeline.adopt(adoption[0].streams, adoption[0].resume)
        channel.send(ready)
    if go.is_set() and not pipeline.stop.is_set():
        pipeline.start()
    while not pipeline.join(timeout=0.5):
        channel.send_stats(pipeline)
        if channel.closed:
            pipeline.abort()


def _commands(
    conn: Connection, channel: _Channel, pipeline: Pipeline, go: threading.Event, adoption: list[Adopt]
) -> None:
    while True:
        try:
            message: ToWorker = conn.recv()
        except (EOFError, OSError):  # the supervisor died: finish what is in flight and exit
            channel.closed = True
            pipeline.abort()
            return
        match message:
            case Go():
                go.set()
            case Adopt():
                adoption.append(message)
                go.set()
            case EditStreams():  # a reload, in place; off this thread: stopping a stream may take seconds
                threading.Thread(target=_reconfigure, args=(channel, pipeline, message), daemon=True).start()
            case Stop():
                pipeline.stop.set()
            case Abort():
                pipeline.abort()
            case SnapshotRequest(stream_id):  # the status page asked: encode off the frame path, here
                try:
                    jpeg = pipeline.latest.jpeg(stream_id)
                except Exception:
                    log.exception("snapshot of %s failed", stream_id)
                    jpeg = None
                channel.send(FrameJpeg(stream_id, jpeg))
            case ClipRequest(stream_id):  # the control API asked: the recorder only slices its packet ring
                try:
                    path = pipeline.clips.trigger(stream_id, "api")
                except Exception:
                    log.exception("clip of %s failed", stream_id)
                    path = None
                channel.send(ClipStarted(stream_id, path))


def _reconfigure(channel: _Channel, pipeline: Pipeline, edit: EditStreams) -> None:
    try:
        removed, refused = pipeline.reconfigure(edit.remove, edit.upsert, edit.resume)
    except Exception:  # a reload must not take the other streams down
        log.exception("reload: changing streams in place failed")
        removed, refused = list(edit.remove), [s.id for s in edit.upsert]
    channel.send(StreamsEdited(removed, refused))


def _heartbeat(channel: _Channel, pipeline: Pipeline) -> None:
    while not channel.closed:
        time.sleep(1.0)
        channel.send_stats(pipeline)
