"""The daemon: a supervisor over worker processes.

One Python process carries only so many live cameras (the GIL, not the GPU, is the limit), so ``streamd run``
spreads the configured streams over worker processes (``pipeline.workers``), each running the whole pipeline
for its share (``streamd.worker``). The supervisor never touches CUDA or pixels; it owns what must be one per
daemon:

- the partition of streams over workers and GPUs, and restarting a worker that died (with backoff; its
  streams resume with their frame indices continuing, the other workers never notice);
- the sinks (one JSONL file for everyone; each stream's lines stay in order because a stream lives in one
  worker and a pipe keeps order);
- signals (SIGINT/SIGTERM: every worker drains, exit 0; a second Ctrl-C skips the drain), systemd notify
  (READY once every worker is ready; WATCHDOG only while every worker with running streams makes progress),
  the status line, ``/metrics`` and the exit status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from streamd import logutil, systemd
from streamd.config import Config
from streamd.exitcodes import EX_CANTCREAT, EX_FAILURE, EX_UNAVAILABLE, StartupError
from streamd.metrics import MetricsServer
from streamd.reload import plan_reload, reread
from streamd.sinks import SinkSet
from streamd.sinks.base import LineSink
from streamd.worker import Record, Resume, WorkerSpec, worker_main

log = logging.getLogger(__name__)

STREAMS_PER_WORKER = 16  # what one process carries cleanly on an H200 (live 1080p30, see bench/RESULTS.md)
COUNTERS = (
    "decoded",
    "inferred",
    "dropped",
    "skipped",
    "decode_errors",
    "read_errors",
    "reconnects",
    "stalls",
)


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
class _Worker:
    """One worker slot: its streams, and the process currently running them (restarted when it dies)."""

    index: int
    stream_ids: tuple[str, ...]
    device: int
    process: Any = None  # multiprocessing.Process
    conn: Connection | None = None
    reader: threading.Thread | None = None
    ready: bool = False
    done: bool = False  # finished on its own ("done" received)
    failed: bool = False  # a stream failed or a stage broke (reported in "done")
    gave_up: bool = False  # kept dying: its streams are lost
    retired: bool = False  # a reload took its streams away: it drains and finishes, never restarts
    error: tuple[int, str] | None = None  # a start-up failure the worker reported
    stats: dict[str, Any] = field(default_factory=dict)
    base: dict[str, dict[str, int]] = field(default_factory=dict)  # counters of earlier incarnations
    lines: int = 0  # lines received from every incarnation (progress)
    base_results: int = 0  # frames inferred by earlier incarnations
    restarts: int = 0
    crashes_in_a_row: int = 0
    started_at: float = 0.0
    ready_at: float = 0.0
    restart_at: float | None = None
    last_progress: float = 0.0
    last_results: int = -1

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


class Supervisor:
    RESTART_MIN_S = 0.5
    RESTART_MAX_S = 30.0
    HEALTHY_S = 60.0  # a worker that ran this long resets its restart backoff
    MAX_CRASHES = 5  # a worker that dies this many times in a row without becoming ready is given up
    STALL_S = 30.0  # no result for this long while streams run = stalled (health 503, watchdog withheld)
    DRAIN_S = 30.0  # after a stop: how long workers may take to finish what is in flight

    def __init__(self, config: Config, *, status_line: bool | None = None) -> None:
        self.config = config
        self.status_line = sys.stderr.isatty() if status_line is None else status_line
        self.stop = threading.Event()  # SIGINT/SIGTERM: stop reading, drain, exit
        self._abort = threading.Event()  # second Ctrl-C: skip the drain
        self._ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA state or threads
        self.workers = [_Worker(k, ids, dev) for k, (ids, dev) in enumerate(plan_workers(config))]
        self._owner = {sid: w for w in self.workers for sid in w.stream_ids}
        self._resume: dict[str, Resume] = {}
        self._info: dict[str, Any] = {}
        self._announced = False  # READY=1 sent
        # A built, idle worker that takes over the streams of one that dies (pipeline.spare_worker).
        self.spare: _Worker | None = None
        self._spare_at = 0.0  # monotonic time from which a (new) spare may be started
        self._want_spare = config.pipeline.spare_worker and len(self.workers) >= 2
        self._snapshots: dict[str, tuple[threading.Event, list[bytes | None]]] = {}  # pending page requests
        self._snapshot_lock = threading.Lock()
        self.sinks: list[LineSink] = []
        self.sink_set: SinkSet | None = None
        self._reopen = threading.Event()  # SIGHUP: reopen sink files (logrotate), then reload the config
        self._waiting: list[tuple[str, ...]] = []  # reload: stream groups whose old worker still drains
        self._leaving: dict[str, _Worker] = {}  # reload: removed streams whose worker still drains
        self._switches: list[tuple[_Worker, _Worker]] = []  # reload, new model: (running worker, successor)
        self.ready_at = self.last_result_at = 0.0  # perf_counter: every worker ready / last result received
        self._t0 = time.monotonic()
        self._last_ping = self._last_status = 0.0
        usec = systemd.watchdog_usec()
        self._watchdog_s = usec / 1e6 if usec else 0.0

    # -- signals ---------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._reopen.set()
            return
        if self.stop.is_set() and signum == signal.SIGINT:
            self._abort.set()  # second Ctrl-C: do not wait for the drain
        self.stop.set()

    def _outputs_gone(self) -> None:
        """Every sink's reader left (``streamd run | head``): stop like a Unix tool (exit 0)."""
        self.stop.set()

    # -- lifecycle -------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run to completion (every stream ended) or until signalled; returns the process exit code."""
        previous = {}
        if threading.current_thread() is threading.main_thread():  # embedders may run us in a thread
            handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            previous = {s: signal.signal(s, self._on_signal) for s in handled}
        metrics = None
        try:
            try:
                metrics = self._build()
            except StartupError as exc:
                log.error("%s", exc)
                return exc.code
            code = self._serve()
        finally:
            self._shutdown(metrics)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._finish(code)

    def _build(self) -> MetricsServer | None:
        """Metrics port and sinks first (a taken port or an unwritable file fails before any model loads)."""
        cfg = self.config
        metrics = None
        if cfg.metrics.enabled:
            try:
                metrics = MetricsServer(
                    cfg.metrics.host,
                    cfg.metrics.port,
                    self.snapshot,
                    frame_snapshot=self.frame_snapshot,
                    status_page=cfg.metrics.status_page,
                    snapshots_per_s=cfg.metrics.snapshots_per_s,
                )
            except OSError as exc:
                raise StartupError(
                    f"metrics.port: cannot listen on {cfg.metrics.host}:{cfg.metrics.port} ({exc}); "
                    "pick another port",
                    EX_UNAVAILABLE,
                ) from exc
        sink_set = SinkSet.from_config(cfg.sinks, on_all_gone=self._outputs_gone)  # every reader left: stop
        try:  # open outputs before any model loads: an unwritable file fails now, not after minutes
            sink_set.start()
        except (StartupError, OSError) as exc:
            if metrics is not None:
                metrics.close()
            if isinstance(exc, StartupError):
                raise
            raise StartupError(f"sink: cannot open the output ({exc})", EX_CANTCREAT) from exc
        self.sink_set, self.sinks = sink_set, sink_set.sinks
        if metrics is not None:
            metrics.start()
        return metrics

    def _serve(self) -> int:
        """Start every worker, wait until all are ready (READY=1), then supervise until all are done."""
        cfg = self.config
        for w in self.workers:
            self._spawn(w)
        log.info("streamd: %d stream(s) over %d worker process(es)", len(cfg.streams), len(self.workers))
        while True:
            if self._abort.is_set():
                for w in self.workers:
                    self._send(w, ("abort",))
            fatal = next((w.error for w in self.workers if w.error is not None), None)
            if fatal is not None and not self._announced:  # the model or GPU does not work: all would fail
                code, message = fatal
                log.error("%s", message)
                self.stop.set()
                self._stop_workers(abort=True)
                return code
            if (
                not self._announced
                and all(w.ready or w.gave_up for w in self.workers)
                and any(w.ready for w in self.workers)
            ):
                self._announced = True
                for w in self.workers:
                    self._send(w, ("go",))
                self.ready_at = time.perf_counter()
                engine, decoder = self._info.get("engine", "?"), self._info.get("decoder", "?")
                log.info("streamd: ready: engine %s, decoder %s", engine, decoder)
                systemd.notify("READY=1", f"STATUS=running {len(cfg.streams)} stream(s)")
            if self.stop.is_set():
                self._stop_workers(abort=self._abort.is_set())
                if self.sink_set is not None and self.sink_set.all_gone:
                    log.info("streamd: stopped: every output was closed by its reader")
                elif self._abort.is_set():
                    log.info("streamd: stopped by signal; frames in flight were not drained")
                else:
                    log.info("streamd: stopped by signal after draining frames in flight")
                return 0
            reloading = self._waiting or self._switches  # a reload has workers to start yet
            if all(w.done or w.gave_up or w.retired for w in self.workers) and not reloading:
                return 0
            self._check_workers()
            self._keep_spare()
            self._tick()
            self.stop.wait(0.25)

    def _shutdown(self, metrics: MetricsServer | None) -> None:
        systemd.notify("STOPPING=1", "STATUS=draining")
        self.stop.set()
        self._stop_workers(abort=True, quiet=True)
        if self.sink_set is not None:
            try:
                self.sink_set.close(timeout=10)
            except Exception:
                log.exception("closing the sinks failed")
        if metrics is not None:
            metrics.close()
        if self.status_line:
            self._print_status()
            sys.stderr.write("\n")

    def _finish(self, code: int) -> int:
        if code != 0:
            return code
        logutil.flush_all()
        self._log_summary()
        failed = [sid for sid, s in self.snapshot()["per_stream"].items() if s["state"] == "failed"]
        if failed:  # the others ran to the end; the exit status still says something was lost
            log.error("streamd: stream(s) failed: %s (see the errors above)", ", ".join(failed))
        broken = any(w.failed or w.gave_up for w in self.workers)
        lost = self.sink_set.summary() if self.sink_set is not None else None
        if lost:  # the exit status says output was lost (unless the config says those drops are fine)
            log.error("streamd: %s", lost)
        return EX_FAILURE if failed or broken or lost else 0

    # -- workers ---------------------------------------------------------------------------------------------
    def _keep_spare(self) -> None:
        """Once every worker runs, keep one spare built; replace it when it dies."""
        if not self._want_spare or not self._announced or self.stop.is_set():
            return
        spare = self.spare
        if spare is not None and (spare.alive or spare.process is None):
            return
        if spare is not None and spare.error is not None:
            log.warning("spare worker could not start (%s); running without a spare", spare.error[1])
            self.spare, self._want_spare = None, False
            return
        if spare is not None:  # it died while idle
            log.warning("spare worker (pid %d) died; starting another", spare.process.pid)
            self.spare, self._spare_at = None, time.monotonic() + 5.0
            return
        if time.monotonic() >= self._spare_at:
            self.spare = _Worker(-1, (), self.workers[0].device)
            self._spawn(self.spare, hold=True)

    def _adopt(self, dead: _Worker) -> bool:
        """Hand a dead worker's streams to the spare (already built: no engine build on the way back)."""
        spare = self.spare
        if spare is None or not spare.ready or not spare.alive or spare.device != dead.device:
            return False
        resume = {sid: self._resume[sid] for sid in dead.stream_ids if sid in self._resume}
        spare.index, spare.stream_ids = dead.index, dead.stream_ids
        spare.base, spare.lines, spare.base_results = dead.base, dead.lines, dead.base_results
        spare.restarts, spare.crashes_in_a_row = dead.restarts, dead.crashes_in_a_row
        spare.ready = False  # ready again once its streams run
        self.workers[self.workers.index(dead)] = spare
        for sid in dead.stream_ids:
            self._owner[sid] = spare
        self.spare, self._spare_at = None, time.monotonic() + 1.0
        self._send(spare, ("adopt", dead.stream_ids, resume))
        return True

    def _spawn(self, w: _Worker, *, hold: bool | None = None) -> None:
        resume = {sid: self._resume[sid] for sid in w.stream_ids if sid in self._resume}
        if hold is None:
            hold = not self._announced  # first start: streams begin together once every worker is built
        spec = WorkerSpec(w.index, self.config, w.stream_ids, w.device, resume, hold)
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=worker_main, args=(spec, child), name=f"streamd-worker{w.index}")
        proc.daemon = True  # never outlive the supervisor
        proc.start()
        child.close()
        w.process, w.conn = proc, parent
        w.ready = w.done = w.failed = False
        w.started_at = w.last_progress = time.monotonic()
        w.restart_at = None
        w.reader = threading.Thread(target=self._read, args=(w, parent), name=f"read-w{w.index}", daemon=True)
        w.reader.start()

    def _read(self, w: _Worker, conn: Connection) -> None:
        """One thread per worker process: its lines to the sinks, its stats, its state changes."""
        sink_set = self.sink_set
        assert sink_set is not None
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "lines":
                records: list[Record] = message[1]
                for rec in records:
                    sink_set.submit(rec.line, rec.stream_id)
                last = records[-1] if records else None
                if last is not None:
                    for rec in records:  # per stream: after the newest frame written
                        prev = self._resume.get(rec.stream_id)
                        if prev is None or rec.frame >= prev.index:
                            pts = rec.pts if rec.pts is not None or prev is None else prev.pts
                            self._resume[rec.stream_id] = Resume(rec.frame + 1, pts, rec.wall_time)
                    w.lines += len(records)
                    self.last_result_at = time.perf_counter()
            elif kind == "stats":
                w.stats = message[1]
            elif kind == "ready":
                self._info = message[1]
                w.ready, w.ready_at = True, time.monotonic()
                if w.index < 0:  # the spare, built and idle
                    log.info("spare worker ready (pid %d)", message[1]["pid"])
                    continue
                log.info(
                    "worker %d %s (pid %d): stream(s) %s",
                    w.index, "back" if w.restarts else "ready", message[1]["pid"], ", ".join(w.stream_ids),
                )  # fmt: skip
            elif kind == "snapshot":
                pending = self._snapshots.get(message[1])
                if pending is not None:
                    pending[1].append(message[2])
                    pending[0].set()
            elif kind == "error":
                w.error = (message[1], message[2])
            elif kind == "done":
                w.failed, w.done = bool(message[1]), True

    def frame_snapshot(self, stream_id: str, timeout: float = 2.0) -> bytes | None:
        """The status page's JPEG of a stream's latest frame, asked of the worker that carries the stream."""
        w = self._owner.get(stream_id)
        if w is None or not w.alive:
            return None
        with self._snapshot_lock:  # one request per stream at a time; the page rate-limits anyway
            done, box = self._snapshots[stream_id] = (threading.Event(), [])
            self._send(w, ("snapshot", stream_id))
            done.wait(timeout)
            self._snapshots.pop(stream_id, None)
        return box[0] if box else None

    def _send(self, w: _Worker, message: tuple) -> None:
        if w.conn is not None and w.alive:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(message)

    def _check_workers(self) -> None:
        """Restart workers that died without finishing (segfault in a native decoder, OOM kill, kill -9)."""
        now = time.monotonic()
        for w in self.workers:
            if w.done or w.gave_up or w.retired or self.stop.is_set():
                continue
            if w.error is not None:  # after start-up a failed restart is one more crash
                if not self._announced:
                    continue
                log.error("worker %d could not start again: %s", w.index, w.error[1])
                w.error = None
            if w.restart_at is not None:
                if now >= w.restart_at:
                    self._spawn(w)
                continue
            if w.alive:
                continue
            if w.reader is not None:
                w.reader.join(timeout=2)  # every line it sent is in the sinks before its streams resume
            if w.done:
                continue
            self._retire(w)
            code = w.process.exitcode
            why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            healthy = w.ready and now - w.ready_at >= self.HEALTHY_S
            w.crashes_in_a_row = 0 if healthy else w.crashes_in_a_row + 1
            if not w.ready and w.crashes_in_a_row >= self.MAX_CRASHES:
                w.gave_up = True
                log.error(
                    "worker %d died %d times in a row before it was ready (%s); giving up on stream(s) %s",
                    w.index, w.crashes_in_a_row, why, ", ".join(w.stream_ids),
                )  # fmt: skip
                continue
            w.restarts += 1
            if self._adopt(w):
                log.error(
                    "worker %d (pid %d) died (%s); stream(s) %s affected; moved to the spare worker",
                    w.index, w.process.pid, why, ", ".join(w.stream_ids),
                )  # fmt: skip
                continue
            delay = min(self.RESTART_MAX_S, self.RESTART_MIN_S * 2 ** max(0, w.crashes_in_a_row - 1))
            w.restart_at = now + delay
            w.ready = False
            log.error(
                "worker %d (pid %d) died (%s); stream(s) %s affected; restarting in %.1f s (restart %d)",
                w.index, w.process.pid, why, ", ".join(w.stream_ids), delay, w.restarts,
            )  # fmt: skip

    def _retire(self, w: _Worker) -> None:
        """Fold a dead incarnation's counters into the worker's base so totals never go back."""
        for sid, s in w.stats.get("per_stream", {}).items():
            base = w.base.setdefault(sid, dict.fromkeys(COUNTERS, 0))
            for key in COUNTERS:
                base[key] += int(s.get(key, 0))
        w.base_results += int(w.stats.get("results", 0))
        w.stats = {}
        if w.conn is not None:
            w.conn.close()
            w.conn = None

    def _stop_workers(self, *, abort: bool, quiet: bool = False) -> None:
        """Ask every worker to finish; wait for the drain (bounded), then end what is left."""
        everyone = [*self.workers, *([self.spare] if self.spare is not None else [])]
        for w in everyone:
            self._send(w, ("abort",) if abort else ("stop",))
        deadline = time.monotonic() + (5.0 if abort else self.DRAIN_S)
        for w in everyone:
            if w.process is None:
                continue
            while w.alive and time.monotonic() < deadline:
                w.process.join(timeout=0.25)
                if self._abort.is_set() and not abort:
                    self._send(w, ("abort",))
                self._tick()
            if w.alive:
                if not quiet:
                    log.error("worker %d did not finish in time; killing it", w.index)
                w.process.kill()
                w.process.join(timeout=5)
            if w.reader is not None:
                w.reader.join(timeout=5)

    # -- reload (SIGHUP / systemctl reload; issue 10 item 4, by ops) ----------------------------------------
    def _reload(self) -> None:
        """Re-read the config file. Invalid: refused with `streamd check`'s messages; the running config
        stays. Valid: sinks that changed are swapped (SinkSet.reconfigure); streams added or changed start in
        a new worker; removed or changed ones leave with their worker, which drains first (a stream sharing
        it moves to a new worker, its frame numbering continuing); the untouched streams never notice.
        Model, engine, pipeline and metrics changes need a restart: logged, not applied."""
        systemd.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            self._apply_reload()
        except Exception:  # a reload must never take the running streams down
            log.exception("reload failed; the running config stays")
        finally:
            systemd.notify("READY=1", f"STATUS=running {len(self.config.streams)} stream(s)")

    def _apply_reload(self) -> None:
        running = self.config
        path = None if running.source == "<bundled demo>" else running.source
        new, problems = reread(path, running)
        if new is None:
            log.error("reload refused (%d problem(s)); the running config stays:", len(problems))
            for problem in problems:
                log.error("  %s", problem)
            return
        plan = plan_reload(running, new)
        if plan.sinks_changed and self.sink_set is not None:
            try:
                self.sink_set.reconfigure(new.sinks)
            except StartupError as exc:
                log.error("reload refused: %s; the running config stays", exc)
                return
            self.sinks = self.sink_set.sinks
        # What a reload applies: streams, sinks, model/engine/tracking; pipeline and metrics need a restart.
        self.config = dataclasses.replace(
            running,
            streams=new.streams,
            sinks=new.sinks,
            model=new.model,
            engine=new.engine,
            tracking=new.tracking,
        )
        going = {s.id for s in plan.changed} | set(plan.removed)
        moving: list[str] = []
        for w in self.workers:
            if w.retired or w.done or w.gave_up or not going & set(w.stream_ids):
                continue
            w.retired = True
            self._send(w, ("stop",))  # drains what is in flight; every line it wrote stays
            moving += [sid for sid in w.stream_ids if sid not in going]
        for sid in plan.removed:
            leaving = self._owner.pop(sid, None)
            if leaving is not None:
                self._leaving[sid] = leaving  # sinks hear of it once its last line is out
        if moving:
            log.warning(
                "reload: stream(s) %s shared a worker with a changed stream; they move", ", ".join(moving)
            )
            self._waiting.append(tuple(moving))
        if plan.model_changed:  # before new workers start: those load the new model anyway
            self._switch_model()
        starting = tuple(s.id for s in (*plan.added, *plan.changed))
        if starting:
            self._waiting.append(starting)
        self._spawn_waiting()
        log.info("reload: %s", plan.describe())
        if plan.needs_restart:
            what = ", ".join(plan.needs_restart)
            log.warning("reload: %s changed; that needs a restart (kept the running one)", what)

    def _switch_model(self) -> None:
        """A new model or engine: beside each running worker a successor builds the new engine (held, no
        streams); once it is ready the running worker drains its last batches and finishes, then the
        successor adopts its streams with their frame numbering continuing (``_spawn_waiting``)."""
        for w in self.workers:
            if w.retired or w.done or w.gave_up or not w.stream_ids:
                continue
            for old, succ in [x for x in self._switches if x[0] is w]:  # a newer model replaces a pending one
                self._send(succ, ("abort",))
                self._switches.remove((old, succ))
            successor = _Worker(-1, (), w.device)
            self._spawn(successor, hold=True)
            self._switches.append((w, successor))
        if self.spare is not None:  # the spare holds the old model: build a new one later
            self._send(self.spare, ("abort",))
            self.spare, self._spare_at = None, time.monotonic() + 5.0

    def _advance_switches(self) -> None:
        for old, succ in list(self._switches):
            if succ.error is not None or (succ.process is not None and not succ.alive and not succ.ready):
                why = succ.error[1] if succ.error else "it died while building"
                log.error(
                    "reload: the new model could not start (%s); worker %d keeps the old one", why, old.index
                )
                self._send(succ, ("abort",))
                self._switches.remove((old, succ))
                continue
            if not succ.ready:
                continue
            if not old.retired:  # the new engine is built: the old worker finishes its batches in flight
                old.retired = True
                self._send(old, ("stop",))
                continue
            reader_done = old.reader is None or not old.reader.is_alive()
            if not (old.done or (not old.alive and reader_done)):
                continue
            resume = {sid: self._resume[sid] for sid in old.stream_ids if sid in self._resume}
            succ.index, succ.stream_ids, succ.ready = len(self.workers), old.stream_ids, False
            self.workers.append(succ)
            for sid in old.stream_ids:
                self._owner[sid] = succ
            self._switches.remove((old, succ))
            self._send(succ, ("adopt", old.stream_ids, resume))
            log.info("reload: stream(s) %s switched to the new model", ", ".join(old.stream_ids))

    def _spawn_waiting(self) -> None:
        """Start the workers a reload asked for once no older worker still carries one of their streams
        (frame numbers continue from the old worker's last line); tell the sinks about removed streams
        once their worker's last line is out (MQTT marks them offline); move streams to workers that
        built a new model."""
        self._advance_switches()
        for sid, w in list(self._leaving.items()):
            reader_done = w.reader is None or not w.reader.is_alive()
            if w.done or (not w.alive and reader_done):
                del self._leaving[sid]
                if self.sink_set is not None and sid not in self._owner:
                    self.sink_set.stream_removed(sid)
        for group in list(self._waiting):
            busy = any(
                w.alive and not w.done and set(w.stream_ids) & set(group) for w in self.workers if w.retired
            )
            if busy or self.stop.is_set():
                continue
            self._waiting.remove(group)
            devices = self.config.pipeline.devices or (self.config.engine.device,)
            w = _Worker(len(self.workers), group, devices[len(self.workers) % len(devices)])
            self.workers.append(w)
            for sid in group:
                self._owner[sid] = w
            self._spawn(w)

    # -- status ----------------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Counters for the status line, the summary and /metrics (plain values, no pipeline objects)."""
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        per_stream: dict[str, dict[str, Any]] = {}
        for w in self.workers:
            if w.retired:  # a reload moved or removed its streams
                continue
            current = w.stats.get("per_stream", {})
            for sid in w.stream_ids:
                s = dict(current.get(sid, {}))
                base = w.base.get(sid, {})
                for key in COUNTERS:
                    s[key] = int(s.get(key, 0)) + base.get(key, 0)
                if w.gave_up:
                    s["state"] = "failed"
                elif not w.alive and not w.done:
                    s["state"] = "restarting" if w.restarts else "starting"
                else:
                    s.setdefault("state", "starting")
                s["worker"] = w.index
                per_stream[sid] = s
        results = sum(w.base_results + w.stats.get("results", 0) for w in self.workers)
        return {
            "elapsed_s": elapsed,
            "results": results,
            "fps": results / elapsed,
            "dropped": sum(s["dropped"] for s in per_stream.values()),
            "decode_errors": sum(s["decode_errors"] for s in per_stream.values()),
            "skipped": sum(s["skipped"] for s in per_stream.values()),
            "streams": {sid: s["state"] for sid, s in per_stream.items()},
            "per_stream": per_stream,
            "workers": {
                w.index: {
                    "pid": w.process.pid if w.process is not None else None,
                    "alive": w.alive,
                    "restarts": w.restarts,
                    "lines": w.lines,
                    "streams": list(w.stream_ids),
                    "rss_bytes": _rss_bytes(w.process.pid) if w.alive else 0,
                }
                for w in self.workers
            },
            "batches": {
                w.index: {
                    "batches": w.stats.get("batches", 0),
                    "frames": w.stats.get("frames", 0),
                    "size": w.stats.get("batch_size", self.config.pipeline.batch_size),
                }
                for w in self.workers
            },
            "sinks": {s.name: s.dropped for s in self.sinks},
            "sink_stats": {s.name: s.stats() for s in self.sinks},
            "stalled": self._stalled(time.monotonic()),
        }

    def _stalled(self, now: float) -> bool:
        """Some worker has running streams but produced no result for STALL_S."""
        for w in self.workers:
            running = any(s.get("state") == "running" for s in w.stats.get("per_stream", {}).values())
            if running and w.alive and now - w.last_progress > self.STALL_S:
                return True
        return False

    def _tick(self) -> None:
        """Four times a second on the main thread: progress, systemd watchdog and status, the status line."""
        now = time.monotonic()
        for w in self.workers:
            if w.lines != w.last_results:
                w.last_results, w.last_progress = w.lines, now
        watchdog_due = self._watchdog_s and now - self._last_ping >= self._watchdog_s / 2
        if watchdog_due and self._announced and not self._stalled(now):
            systemd.notify("WATCHDOG=1")  # only while results keep coming: a wedged pipeline gets restarted
            self._last_ping = now
        if self._reopen.is_set():
            self._reopen.clear()
            if self.sink_set is not None:
                self.sink_set.reopen()
            if self._announced and not self.stop.is_set():
                self._reload()
        self._spawn_waiting()
        if now - self._last_status >= 5:
            s = self.snapshot()
            systemd.notify(f"STATUS={s['results']} frames, {s['fps']:.1f} fps, {s['dropped']} dropped")
            self._last_status = now
        if self.status_line:
            self._print_status()

    def _print_status(self) -> None:
        s = self.snapshot()
        running = sum(1 for st in s["streams"].values() if st == "running")
        sys.stderr.write(
            f"\r\x1b[Kstreamd: {running}/{len(s['streams'])} streams | {s['results']} frames | "
            f"{s['fps']:.1f} fps | dropped {s['dropped']} | decode errors {s['decode_errors']}"
        )
        sys.stderr.flush()

    def _log_summary(self) -> None:
        s = self.snapshot()
        sink_drops = sum(x.dropped for x in self.sinks)
        restarts = sum(w.restarts for w in self.workers)
        log.info(
            "streamd: done: %d frames in %.1f s (%.1f fps), %d skipped (detect_fps), "
            "%d dropped after decode, %d decode errors, %d sink lines dropped, %d worker restart(s)",
            s["results"],
            s["elapsed_s"],
            s["fps"],
            s["skipped"],
            s["dropped"],
            s["decode_errors"],
            sink_drops,
            restarts,
        )


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process from /proc (0 where unreadable)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
