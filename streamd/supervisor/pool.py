"""The supervisor's worker processes: which streams each carries, starting them, reading what they send,
restarting the ones that die (with backoff, or onto the spare worker) and stopping them all.

A worker slot (``WorkerSlot``) outlives its processes: when the process dies, the slot keeps the counters of
the earlier incarnations and the streams resume in a new process with their frame indices continuing. Every
process gets one reader thread that feeds its JSON lines to the sinks in order.

Frame indices and counters belong to the stream id for the whole run, whichever process carries it: a stream
resumes after its newest line written (``resume_for``), and its counters are summed over every process that
carried it (``status.snapshot``): a dead incarnation's counters are folded into its slot's ``base``
(``end_incarnation``), and a slot that will never run again (a reload retired it, or it finished or gave up)
is folded, once its last stats are in, into the pool's ``past`` slot (``archive_finished``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from streamd.config import Config, StreamConfig
from streamd.protocol import (
    Abort,
    Adopt,
    ClipRequest,
    ClipStarted,
    Done,
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
    StreamTotals,
    ToSupervisor,
    ToWorker,
    WorkerStats,
    fold,
)
from streamd.sinks import SinkSet
from streamd.supervisor.engine_hosts import EngineHosts
from streamd.worker.process import WorkerSpec, worker_main

log = logging.getLogger("streamd.supervisor")  # the supervisor's own lines: one logger name for all of them

STREAMS_PER_WORKER = 16  # what one process carries cleanly on an H200 (live 1080p30, see bench/RESULTS.md)


def gpu_present() -> bool:
    """Whether an NVIDIA device node exists (no CUDA call: the supervisor stays out of CUDA)."""
    return os.path.exists("/dev/nvidiactl")


def plan_workers(config: Config) -> list[tuple[tuple[str, ...], int]]:
    """(stream ids, CUDA device) per worker. Streams go round robin in config order, devices round robin."""
    ids = config.stream_ids
    want = config.pipeline.workers
    if want == "auto":
        on_gpu = config.engine.type != "onnxruntime" and gpu_present()
        cores = os.cpu_count() or 1
        want = min(math.ceil(len(ids) / STREAMS_PER_WORKER), max(1, cores // 2)) if on_gpu else 1
    n = max(1, min(int(want), len(ids)))
    devices = config.pipeline.devices or (config.engine.device,)
    return [(ids[k::n], devices[k % len(devices)]) for k in range(n)]


@dataclass
class WorkerSlot:
    """One worker slot: its streams, and the process currently running them (restarted when it dies)."""

    index: int
    stream_ids: tuple[str, ...]
    device: int
    process: Any = None  # multiprocessing.Process
    conn: Connection | None = None
    reader: threading.Thread | None = None
    ready: bool = False
    done: bool = False  # finished on its own (Done received)
    failed: bool = False  # a stream failed or a stage broke (reported in Done)
    gave_up: bool = False  # kept dying: its streams are lost
    retired: bool = False  # a reload took its streams away: it drains and finishes, never restarts
    error: StartFailed | None = None  # a start-up failure the worker reported
    stats: WorkerStats = field(default_factory=WorkerStats)  # the current (or last) process's
    base: dict[str, StreamTotals] = field(default_factory=dict)  # per stream, of earlier incarnations
    archived: bool = False  # finished for good: its counters are in WorkerPool.past (stats kept for display)
    lines: int = 0  # lines received from every incarnation (progress)
    base_results: int = 0  # frames inferred by earlier incarnations
    restarts: int = 0
    crashes_in_a_row: int = 0
    started_at: float = 0.0
    ready_at: float = 0.0
    restart_at: float | None = None
    last_progress: float = 0.0
    last_results: int = -1
    last_message: float = 0.0  # monotonic time of the last message from its process (a sign of life)
    edits: list[StreamsEdited] = field(default_factory=list)  # replies to in-place edits, to act on

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def totals(self) -> dict[str, StreamTotals]:
        """Per stream, the counters of every incarnation of this slot (earlier ones and the current)."""
        return fold(dict(self.base), self.stats.totals())

    @property
    def results(self) -> int:
        """Frames inferred by every incarnation of this slot."""
        return self.base_results + self.stats.results


class WorkerPool:
    """The worker slots of one supervisor. ``stop``/``abort`` are the supervisor's events; ``on_tick`` is
    called while a stop waits for the workers to drain (the status line and watchdog keep going)."""

    RESTART_MIN_S = 0.5
    RESTART_MAX_S = 30.0
    HEALTHY_S = 60.0  # a worker that ran this long resets its restart backoff
    MAX_CRASHES = 5  # a worker that dies this many times in a row without becoming ready is given up
    DRAIN_S = 30.0  # after a stop: how long workers may take to finish what is in flight
    # A ready worker sends stats at least once a second; silent this long, it is wedged (SIGSTOP, a native
    # call that never returns, a deadlock): killed, and its streams resume elsewhere.
    SILENT_S = 6.0
    # No result for this long while streams run: the pipeline is stalled (health 503, watchdog withheld).
    STALL_S = 30.0

    def __init__(
        self,
        config: Config,
        *,
        stop: threading.Event,
        abort: threading.Event,
        on_tick: Callable[[], None],
    ) -> None:
        self.config = config
        self.stop = stop
        self._abort = abort
        self._on_tick = on_tick
        self._ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA state or threads
        self.workers = [WorkerSlot(k, ids, dev) for k, (ids, dev) in enumerate(plan_workers(config))]
        self.owner = {sid: w for w in self.workers for sid in w.stream_ids}
        self._resume: dict[str, Resume] = {}
        self.info: Ready | None = None  # the last Ready: engine and decoder in use
        self.announced = False  # every worker was ready and told to go (READY=1 sent)
        # Per GPU the workers use, a built, idle worker that takes over the streams of one that dies there
        # (pipeline.spare_worker): its engine is on that GPU, so no engine build on the way back.
        self.spares: dict[int, WorkerSlot] = {}
        self._spare_at: dict[int, float] = {}  # monotonic time from which a (new) spare may be started
        self._want_spare = config.pipeline.spare_worker and len(self.workers) >= 2
        self._no_spare: set[int] = set()  # GPUs where a spare could not start
        self._snapshots: dict[str, tuple[threading.Event, list[bytes | None]]] = {}  # pending page requests
        self._snapshot_lock = threading.Lock()
        self._clips: dict[str, tuple[threading.Event, list[str | None]]] = {}  # pending API clip requests
        self._clip_lock = threading.Lock()
        self.sink_set: SinkSet | None = None
        # Whether a stream's lines may still be written (a cluster node that lost the stream or its lease
        # writes none: streamd.cluster.node.ClusterNode.may_write); None: always.
        self.fence: Callable[[str], bool] | None = None
        self.last_result_at = 0.0  # perf_counter: last result received
        # Held while counters move between a slot's stats and its base (or to the spare) and while a
        # snapshot sums them: a snapshot never counts them twice, so totals never go back.
        self.counters_lock = threading.Lock()
        # The counters of slots that will never run again (archive_finished), in a slot's base fields.
        self.past = WorkerSlot(-1, (), 0)
        self.engines = EngineHosts.for_config(config, self._ctx)  # engine.shared: one engine process per GPU

    def start(self, sink_set: SinkSet) -> None:
        """Start a process for every slot; their lines go to ``sink_set``."""
        self.sink_set = sink_set
        self.engines.start()  # engine.shared: workers connect once it listens (its engine may take minutes)
        for w in self.workers:
            self.spawn(w)

    def go(self) -> None:
        """Every worker is built: their streams begin together."""
        self.announced = True
        for w in self.workers:
            self.send(w, Go())

    def add_worker(self, stream_ids: tuple[str, ...]) -> None:
        """A new slot for ``stream_ids`` (a reload), started at once."""
        devices = self.config.pipeline.devices or (self.config.engine.device,)
        w = WorkerSlot(len(self.workers), stream_ids, devices[len(self.workers) % len(devices)])
        self.workers.append(w)
        for sid in stream_ids:
            self.owner[sid] = w
        self.spawn(w)

    def stream_configs(self, stream_ids: tuple[str, ...]) -> tuple[StreamConfig, ...]:
        """The running config's settings of these streams (a worker built before a reload has old ones)."""
        wanted = set(stream_ids)
        return tuple(s for s in self.config.streams if s.id in wanted)

    def worker_for_new_stream(self) -> WorkerSlot | None:
        """Where a stream a reload adds goes: the running worker with the fewest streams; None (a new worker)
        when there is none, or when on a GPU with ``pipeline.workers: auto`` each carries its share."""
        running = [w for w in self.workers if not (w.retired or w.done or w.gave_up) and w.stream_ids]
        if not running:
            return None
        target = min(running, key=lambda w: len(w.stream_ids))
        auto_gpu = self.config.pipeline.workers == "auto" and self.config.engine.type != "onnxruntime"
        if auto_gpu and gpu_present() and len(target.stream_ids) >= STREAMS_PER_WORKER:
            return None
        return target

    def resume_for(self, stream_ids: tuple[str, ...]) -> dict[str, Resume]:
        """Where each of these streams continues (after its newest line written), for those that ran."""
        return {sid: self._resume[sid] for sid in stream_ids if sid in self._resume}

    def seed_resume(self, positions: dict[str, Resume]) -> None:
        """Where streams that ran elsewhere (another cluster node) continue here."""
        self._resume.update(positions)

    def hand_over(self, old: WorkerSlot, successor: WorkerSlot) -> None:
        """A reload built a new model in ``successor`` (held, no streams) and ``old`` has finished: the
        successor takes a new slot and adopts the old one's streams, their numbering continuing."""
        resume = self.resume_for(old.stream_ids)
        successor.index, successor.stream_ids, successor.ready = len(self.workers), old.stream_ids, False
        self.workers.append(successor)
        for sid in old.stream_ids:
            self.owner[sid] = successor
        self.send(successor, Adopt(self.stream_configs(old.stream_ids), resume))

    def drop_spare(self) -> None:
        """End the spares (they hold an old model); new ones are built a few seconds later."""
        for device, spare in list(self.spares.items()):
            self.send(spare, Abort())
            del self.spares[device]
            self._spare_at[device] = time.monotonic() + 5.0

    def keep_spare(self) -> None:
        """Once every worker runs, keep one spare built per GPU in use (a reload may add workers on another
        GPU); replace one that dies."""
        if not self._want_spare or not self.announced or self.stop.is_set():
            return
        in_use = {w.device for w in self.workers if not (w.done or w.gave_up)}
        for device in sorted(in_use - self._no_spare):
            spare = self.spares.get(device)
            if spare is not None and (spare.alive or spare.process is None):
                continue
            if spare is not None and spare.error is not None:
                why = spare.error.message
                where = f"on GPU {device} " if gpu_present() else ""
                log.warning("spare worker %scould not start (%s); none there", where, why)
                del self.spares[device]
                self._no_spare.add(device)
                continue
            if spare is not None:  # it died while idle
                log.warning("spare worker (pid %d) died; starting another", spare.process.pid)
                del self.spares[device]
                self._spare_at[device] = time.monotonic() + 5.0
                continue
            if time.monotonic() >= self._spare_at.get(device, 0.0):
                self.spares[device] = spare = WorkerSlot(-1, (), device)
                self.spawn(spare, hold=True)

    def move_to_spare(self, dead: WorkerSlot) -> bool:
        """Hand a dead worker's streams to the spare on its GPU (already built: no engine build on the way
        back); False when that GPU has no spare ready."""
        spare = self.spares.get(dead.device)
        if spare is None or not spare.ready or not spare.alive:
            return False
        resume = self.resume_for(dead.stream_ids)
        spare.index, spare.stream_ids = dead.index, dead.stream_ids
        with self.counters_lock:
            spare.base = dead.base
            spare.lines, spare.base_results = dead.lines, dead.base_results
            self.workers[self.workers.index(dead)] = spare
        spare.restarts, spare.crashes_in_a_row = dead.restarts, dead.crashes_in_a_row
        spare.ready = False  # ready again once its streams run
        for sid in dead.stream_ids:
            self.owner[sid] = spare
        del self.spares[dead.device]
        self._spare_at[dead.device] = time.monotonic() + 1.0
        self.send(spare, Adopt(self.stream_configs(dead.stream_ids), resume))
        return True

    def spawn(self, w: WorkerSlot, *, hold: bool | None = None) -> None:
        resume = self.resume_for(w.stream_ids)
        if hold is None:
            hold = not self.announced  # first start: streams begin together once every worker is built
        engine = self.engines.endpoint(w.device)  # engine.shared: its socket
        spec = WorkerSpec(w.index, self.config, w.stream_ids, w.device, resume, hold, engine)
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=worker_main, args=(spec, child), name=f"streamd-worker{w.index}")
        proc.daemon = True  # never outlive the supervisor
        proc.start()
        child.close()
        w.process, w.conn = proc, parent
        w.ready = w.done = w.failed = False
        w.started_at = w.last_progress = w.last_message = time.monotonic()
        w.restart_at = None
        w.reader = threading.Thread(target=self._read, args=(w, parent), name=f"read-w{w.index}", daemon=True)
        w.reader.start()

    def _read(self, w: WorkerSlot, conn: Connection) -> None:
        """One thread per worker process: its lines to the sinks, its stats, its state changes."""
        while True:
            try:
                message: ToSupervisor = conn.recv()
            except (EOFError, OSError):
                return
            w.last_message = time.monotonic()
            match message:
                case Lines(records):
                    self._lines(w, records)
                case WorkerStats():
                    with self.counters_lock:  # a late message of a retired process: already folded into base
                        if w.conn is conn:
                            w.stats = message
                case Ready():
                    self._ready(w, message)
                case ClipStarted(stream_id, path):
                    if (waiting := self._clips.get(stream_id)) is not None:
                        waiting[1].append(path)
                        waiting[0].set()
                case FrameJpeg(stream_id, jpeg):
                    pending = self._snapshots.get(stream_id)
                    if pending is not None:
                        pending[1].append(jpeg)
                        pending[0].set()
                case StartFailed():
                    w.error = message
                case StreamsEdited():  # a reload's in-place change is through
                    w.edits.append(message)
                case Done(failed):
                    w.failed, w.done = failed, True

    def _lines(self, w: WorkerSlot, records: list[Record]) -> None:
        """One batch to the sinks, in order; each stream resumes after its newest frame written."""
        sink_set = self.sink_set
        assert sink_set is not None
        if self.fence is not None:  # checked right before the lines go out
            records = [rec for rec in records if self.fence(rec.stream_id)]
        for rec in records:
            sink_set.submit(rec.line, rec.stream_id)
        if not records:
            return
        for rec in records:
            prev = self._resume.get(rec.stream_id)
            if prev is None or rec.frame >= prev.index:
                pts = rec.pts if rec.pts is not None or prev is None else prev.pts
                self._resume[rec.stream_id] = Resume(rec.frame + 1, pts, rec.wall_time)
        w.lines += len(records)
        self.last_result_at = time.perf_counter()

    def _ready(self, w: WorkerSlot, ready: Ready) -> None:
        self.info = ready
        w.ready, w.ready_at = True, time.monotonic()
        if w.index < 0:  # the spare, built and idle
            where = f" on GPU {w.device}" if ready.gpu else ""
            log.info("spare worker ready%s (pid %d)", where, ready.pid)
            return
        state = "back" if w.restarts else "ready"
        log.info("worker %d %s (pid %d): stream(s) %s", w.index, state, ready.pid, ", ".join(w.stream_ids))

    def stalled(self, now: float | None = None) -> bool:
        """Some worker has running streams but produced no result for ``STALL_S``."""
        now = time.monotonic() if now is None else now
        return any(
            w.stats.running() and w.alive and now - w.last_progress > self.STALL_S for w in self.workers
        )

    def frame_snapshot(self, stream_id: str, timeout: float = 2.0) -> bytes | None:
        """The status page's JPEG of a stream's latest frame, asked of the worker that carries the stream."""
        w = self.owner.get(stream_id)
        if w is None or not w.alive:
            return None
        with self._snapshot_lock:  # one request per stream at a time; the page rate-limits anyway
            done, box = self._snapshots[stream_id] = (threading.Event(), [])
            self.send(w, SnapshotRequest(stream_id))
            done.wait(timeout)
            self._snapshots.pop(stream_id, None)
        return box[0] if box else None

    def request_clip(self, stream_id: str, timeout: float = 5.0) -> tuple[bool, str | None]:
        """The control API's clip request, asked of the worker carrying the stream: (answered, its path)."""
        w = self.owner.get(stream_id)
        if w is None or not w.alive:
            return False, None
        with self._clip_lock:  # one request at a time: each only slices a packet ring
            done, box = self._clips[stream_id] = (threading.Event(), [])
            self.send(w, ClipRequest(stream_id))
            done.wait(timeout)
            self._clips.pop(stream_id, None)
        return bool(box), box[0] if box else None

    def send(self, w: WorkerSlot, message: ToWorker) -> None:
        if w.conn is not None and w.alive:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(message)

    def check_workers(self) -> None:
        """Restart workers that died without finishing (segfault in a native decoder, OOM kill, kill -9)."""
        self.archive_finished()
        self.engines.check(self.workers)  # restarted when dead; a start-up failure becomes the workers'
        now = time.monotonic()
        for w in self.workers:
            if w.done or w.gave_up or w.retired or self.stop.is_set():
                continue
            if w.error is not None:  # after start-up a failed restart is one more crash
                if not self.announced:
                    continue
                log.error("worker %d could not start again: %s", w.index, w.error.message)
                w.error = None
            if w.restart_at is not None:
                if now >= w.restart_at:
                    self.spawn(w)
                continue
            if w.alive:
                silent = now - w.last_message
                if w.ready and silent > self.SILENT_S:
                    streams = ", ".join(w.stream_ids)
                    what = "worker %d (pid %d) silent for %.0f s (wedged); killing it, stream(s) %s resume"
                    log.error(what, w.index, w.process.pid, silent, streams)
                    w.process.kill()
                    w.process.join(timeout=5)
                continue
            if w.reader is not None:
                w.reader.join(timeout=10)  # every line it sent is in the sinks before its streams resume
            if w.done:
                continue
            self.end_incarnation(w)
            code = w.process.exitcode
            why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            healthy = w.ready and now - w.ready_at >= self.HEALTHY_S
            w.crashes_in_a_row = 0 if healthy else w.crashes_in_a_row + 1
            if not w.ready and w.crashes_in_a_row >= self.MAX_CRASHES:
                w.gave_up = True
                what = "worker %d died %d times in a row before it was ready (%s); giving up on stream(s) %s"
                log.error(what, w.index, w.crashes_in_a_row, why, ", ".join(w.stream_ids))
                continue
            w.restarts += 1
            if self.move_to_spare(w):
                what = "worker %d (pid %d) died (%s); stream(s) %s affected; moved to the spare worker"
                log.error(what, w.index, w.process.pid, why, ", ".join(w.stream_ids))
                continue
            delay = min(self.RESTART_MAX_S, self.RESTART_MIN_S * 2 ** max(0, w.crashes_in_a_row - 1))
            w.restart_at = now + delay
            w.ready = False
            what = "worker %d (pid %d) died (%s); stream(s) %s affected; restarting in %.1f s (restart %d)"
            log.error(what, w.index, w.process.pid, why, ", ".join(w.stream_ids), delay, w.restarts)

    def archive_finished(self) -> None:
        """Fold the counters of slots that will never run again (retired by a reload, finished, given up)
        into ``past`` once their last stats are in, so a snapshot sums only the live slots however many
        reloads came before."""
        for w in self.workers:
            if w.archived or not (w.retired or w.done or w.gave_up) or w.alive:
                continue
            if w.reader is not None and w.reader.is_alive():  # its last stats may still be on the way
                continue
            with self.counters_lock:
                fold(self.past.base, w.totals())
                self.past.base_results += w.results
                w.archived = True

    def end_incarnation(self, w: WorkerSlot) -> None:
        """A worker's process died: fold its counters into the slot's base so totals never go back."""
        with self.counters_lock:
            w.base, w.base_results = w.totals(), w.results
            w.stats = WorkerStats()
            conn, w.conn = w.conn, None  # from here on its reader's stats are ignored
        if conn is not None:
            conn.close()

    def stop_workers(self, *, abort: bool, quiet: bool = False) -> None:
        """Ask every worker to finish; wait for the drain (bounded), then end what is left."""
        everyone = [*self.workers, *self.spares.values()]
        for w in everyone:
            self.send(w, Abort() if abort else Stop())
        deadline = time.monotonic() + (5.0 if abort else self.DRAIN_S)
        for w in everyone:
            if w.process is None:
                continue
            while w.alive and time.monotonic() < deadline:
                w.process.join(timeout=0.25)
                if self._abort.is_set() and not abort:
                    self.send(w, Abort())
                self._on_tick()
            if w.alive:
                if not quiet:
                    log.error("worker %d did not finish in time; killing it", w.index)
                w.process.kill()
                w.process.join(timeout=5)
            if w.reader is not None:
                w.reader.join(timeout=5)
        self.engines.stop()  # after the workers: their last batches need it
