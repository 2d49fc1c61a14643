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

This module is the lifecycle (signals, start-up, the serve loop, reload, shutdown, exit status); the worker
processes are kept in ``pool`` (partition, reader threads, restarts, spare, stop) and the merged
counters are computed and rendered in ``streamd.supervisor.status``.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
import time
from types import FrameType

from streamd import logutil, systemd
from streamd.analytics.tracker import missing_dependency
from streamd.cluster import join_cluster
from streamd.config import Config, StreamConfig
from streamd.exitcodes import EX_CANTCREAT, EX_CONFIG, EX_FAILURE, EX_UNAVAILABLE, StartupError
from streamd.protocol import Abort, Resume
from streamd.sinks import SinkSet
from streamd.sinks.base import LineSink
from streamd.supervisor import control, status
from streamd.supervisor.api import ControlApi, control_api
from streamd.supervisor.moves import StreamMoves
from streamd.supervisor.pool import WorkerPool, WorkerSlot, plan_workers
from streamd.supervisor.reload import plan_reload, reread
from streamd.supervisor.server import MetricsServer

__all__ = ["Supervisor", "plan_workers"]

log = logging.getLogger("streamd.supervisor")
STARTUP_GRACE_S = 30.0  # after READY: streams catching up from the start are no overload (yet)


class Supervisor:
    def __init__(self, config: Config, *, status_line: bool | None = None) -> None:
        self.status_line = sys.stderr.isatty() if status_line is None else status_line
        # The control API (metrics.api); the streams its state file keeps join before the workers are planned.
        self.api: ControlApi | None
        self.api, config, self._api_error = control_api(config, self)
        # cluster: on: this node registers in etcd and starts with its share of the streams (streamd.cluster).
        self.cluster, config, self._cluster_error = join_cluster(config)
        self.stop = threading.Event()  # SIGINT/SIGTERM: stop reading, drain, exit
        self._abort = threading.Event()  # second Ctrl-C: skip the drain
        # The worker processes: partition, start, restart, spare, stop (streamd.supervisor.pool).
        self.pool = WorkerPool(config, stop=self.stop, abort=self._abort, on_tick=self._tick)
        self.sinks: list[LineSink] = []
        self.sink_set: SinkSet | None = None
        self._reopen = threading.Event()  # SIGHUP: reopen sink files (logrotate), then reload the config
        self._moves = StreamMoves(self.pool, self.stop)  # what reloads change in the running workers
        self.ready_at = 0.0  # perf_counter: every worker ready
        self._ready_mono: float | None = None  # monotonic: READY sent (the overload warning's start-up grace)
        self._t0 = time.monotonic()
        self._last_ping = self._last_status = 0.0
        self._overloaded = False
        self._behind_ticks = 0  # status ticks in a row that saw a stream behind real time
        self._reloads = 0  # generation of the reload outcome (streamd.supervisor.control): SIGHUPs handled
        self._last_health = 0.0
        usec = systemd.watchdog_usec()
        self._watchdog_s = usec / 1e6 if usec else 0.0

    @property
    def config(self) -> Config:
        """The running config (a reload replaces its streams and sinks; the workers started later see it)."""
        return self.pool.config

    @config.setter
    def config(self, config: Config) -> None:
        self.pool.config = config

    @property
    def workers(self) -> list[WorkerSlot]:
        return self.pool.workers

    @property
    def spares(self) -> dict[int, WorkerSlot]:
        """The idle spare worker of each GPU in use, by device."""
        return self.pool.spares

    @property
    def last_result_at(self) -> float:
        """perf_counter of the last result received from any worker."""
        return self.pool.last_result_at

    def frame_snapshot(self, stream_id: str, timeout: float = 2.0) -> bytes | None:
        """The status page's JPEG of a stream's latest frame, asked of the worker that carries the stream."""
        return self.pool.frame_snapshot(stream_id, timeout)

    def request_reload(self) -> None:
        """What SIGHUP does: reopen the sink files, then reload the config (on the main loop, once every
        worker is ready)."""
        self._reopen.set()

    @property
    def reload_in_progress(self) -> bool:
        """A reload is not through yet: streams wait for a worker, leave one, or switch to a new model."""
        return self._moves.in_progress

    # -- signals ---------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self.request_reload()
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
        if self._api_error is not None:  # an unreadable token or state file
            raise self._api_error
        if self._cluster_error is not None:  # etcd unreachable, a bad stream list key
            raise self._cluster_error
        # tracking's lap now, not at its first ambiguous match; a cluster node checks the whole list it places
        streams = self.cluster.streams.streams if self.cluster is not None else cfg.streams
        missing = missing_dependency(streams, cfg.tracking)
        if missing:
            raise StartupError(missing, EX_CONFIG)
        if self.cluster is not None:
            self.pool.fence = self.cluster.may_write  # no line for a stream this node no longer holds
            self.cluster.start()
        if cfg.metrics.enabled:
            try:
                metrics = MetricsServer(
                    cfg.metrics.host,
                    cfg.metrics.port,
                    self.snapshot,
                    frame_snapshot=self.frame_snapshot,
                    status_page=cfg.metrics.status_page,
                    snapshots_per_s=cfg.metrics.snapshots_per_s,
                    stream_down=cfg.metrics.stream_down,
                    api=self.api,
                )
            except OSError as exc:
                raise StartupError(
                    f"metrics.port: cannot listen on {cfg.metrics.host}:{cfg.metrics.port} ({exc}); "
                    "pick another port",
                    EX_UNAVAILABLE,
                ) from exc
        sink_set = SinkSet.from_config(cfg.sinks, on_all_gone=self._outputs_gone)  # every reader left: stop
        sink_set.configured(cfg)  # e.g. MQTT's Home Assistant discovery announces the streams
        try:  # open outputs before any model loads: an unwritable file fails now, not after minutes
            sink_set.start()
        except (StartupError, OSError) as exc:
            if metrics is not None:
                metrics.close()
            if isinstance(exc, StartupError):
                raise
            raise StartupError(f"sink: cannot open the output ({exc})", EX_CANTCREAT) from exc
        self.sink_set, self.sinks = sink_set, sink_set.sinks
        if self.api is not None:
            sink_set.taps.append(self.api.events.tap)
        if metrics is not None:
            metrics.start()
        return metrics

    def _serve(self) -> int:
        """Start every worker, wait until all are ready (READY=1), then supervise until all are done."""
        assert self.sink_set is not None  # _build opened it
        self.pool.start(self.sink_set)
        streams, workers = len(self.config.streams), len(self.workers)
        log.info("streamd: %d stream(s) over %d worker process(es)", streams, workers)
        while True:
            if self._abort.is_set():
                for w in self.workers:
                    self.pool.send(w, Abort())
            fatal = next((w.error for w in self.workers if w.error is not None), None)
            if fatal is not None and not self.pool.announced:  # the model or GPU fails: every worker would
                log.error("%s", fatal.message)
                self.stop.set()
                self.pool.stop_workers(abort=True)
                return fatal.code
            self._announce_when_ready()
            if self.stop.is_set():
                return self._stop_all()
            finished = all(w.done or w.gave_up or (w.retired and not w.alive) for w in self.workers)
            if finished and not self.reload_in_progress and self.cluster is None:  # a node waits for streams
                return 0
            self.pool.check_workers()
            self._moves.drop_orphaned_switches()
            self.pool.keep_spare()
            self._tick()
            self.stop.wait(0.25)

    def _announce_when_ready(self) -> None:
        """Once every worker is built (or given up, with one ready): their streams start together, READY=1."""
        if self.pool.announced or not any(w.ready for w in self.workers):
            return
        if not all(w.ready or w.gave_up for w in self.workers):
            return
        self.pool.go()
        self.ready_at = time.perf_counter()
        self._ready_mono = time.monotonic()
        info = self.pool.info
        engine, decoder = (info.engine, info.decoder) if info is not None else ("?", "?")
        log.info("streamd: ready: engine %s, decoder %s", engine, decoder)
        control.write_outcome(0, True, "started")  # the baseline `streamd reload` waits past
        systemd.notify("READY=1", f"STATUS=running {len(self.config.streams)} stream(s)")

    def _stop_all(self) -> int:
        """Signalled (or every output gone): the workers drain (unless aborted) and finish; exit 0."""
        self._moves.abort_switches()
        self.pool.stop_workers(abort=self._abort.is_set())
        if self.sink_set is not None and self.sink_set.all_gone:
            log.info("streamd: stopped: every output was closed by its reader")
        elif self._abort.is_set():
            log.info("streamd: stopped by signal; frames in flight were not drained")
        else:
            log.info("streamd: stopped by signal after draining frames in flight")
        return 0

    def _shutdown(self, metrics: MetricsServer | None) -> None:
        systemd.notify("STOPPING=1", "STATUS=draining")
        self.stop.set()
        self.pool.stop_workers(abort=True, quiet=True)
        if self.cluster is not None:  # final positions saved, streams released, lease revoked
            self.cluster.close(self.pool.resume_for(tuple(self.cluster.held)))
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

    # -- reload (SIGHUP / systemctl reload) ------------------------------------------------------------------
    def _reload(self) -> None:
        """Re-read the config file. Invalid: refused with `streamd check`'s messages; the running config
        stays. Valid: sinks that changed are swapped (SinkSet.reconfigure); streams added or changed start in
        a new worker; removed or changed ones leave with their worker, which drains first (a stream sharing
        it moves to a new worker); the untouched streams never notice (``StreamMoves.edit_streams``). A
        model or engine change switches each worker to a successor (``StreamMoves.switch_model``); pipeline
        and metrics changes need a restart: logged, not applied.

        A stream id keeps its frame numbering and its counters for the whole run, whichever worker carries
        it: a moved stream continues after its newest line written, and so does a changed one (same id: a
        consumer keyed on stream and frame never sees an index twice, ``frame`` only increases), and its
        counters go on from where they were (summed over every worker that carried it, ``status.snapshot``;
        /metrics counters never go back). A removed stream's counts stay in the run's totals; if it is
        added back, it continues too."""
        systemd.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        ok, message = False, "reload failed; the running config stays"
        try:
            ok, message = self._apply_reload()
        except Exception:  # a reload must never take the running streams down
            log.exception("reload failed; the running config stays")
        finally:
            self._reloads += 1
            control.write_outcome(self._reloads, ok, message)  # what `streamd reload` waits for
            systemd.notify("READY=1", f"STATUS=running {len(self.config.streams)} stream(s)")

    def _apply_reload(self) -> tuple[bool, str]:
        """Returns (applied, one line saying what was applied or why the config was refused)."""
        running = self.config
        path = None if running.source == "<bundled demo>" else running.source
        new, problems = reread(path, running, self.api.overlay if self.api is not None else None)
        if new is None:
            log.error("reload refused (%d problem(s)); the running config stays:", len(problems))
            for problem in problems:
                log.error("  %s", problem)
            return False, f"refused ({len(problems)} problem(s)): " + "; ".join(problems)
        if self.cluster is not None:  # the new list is the cluster's; this node runs its share of it
            new = self.cluster.reloaded(new)
        plan = plan_reload(running, new)
        warnings: list[str] = []
        if plan.sinks_changed and self.sink_set is not None:
            try:
                self.sink_set.reconfigure(new.sinks)
            except StartupError as exc:
                log.error("reload refused: %s; the running config stays", exc)
                return False, f"refused: {exc}"
            self.sinks = self.sink_set.sinks
            warnings = list(self.sink_set.reload_warnings)
        # What a reload applies: streams, sinks, model/engine/tracking; pipeline and metrics need a restart.
        self.config = dataclasses.replace(
            running,
            streams=new.streams,
            sinks=new.sinks,
            model=running.model if plan.keeps_engine else new.model,
            engine=running.engine if plan.keeps_engine else new.engine,
            tracking=new.tracking,
        )
        if self.sink_set is not None:
            self.sink_set.configured(self.config)
        self._moves.edit_streams(plan)
        if plan.model_changed:
            self._moves.switch_model()
        self._moves.advance()
        log.info("reload: %s", plan.describe())
        message = f"applied: {plan.describe()}"
        if warnings:  # e.g. a new MQTT sink whose broker cannot be reached (it keeps trying)
            message += " (" + "; ".join(warnings) + ")"
        if plan.needs_restart:
            what = ", ".join(plan.needs_restart)
            log.warning("reload: %s changed; that needs a restart (kept the running one)", what)
            message += f" ({what} changed: needs a restart, kept the running one)"
        return True, message

    # -- the control API (streamd.supervisor.api) -----------------------------------------------------------
    @property
    def api_ready(self) -> bool:
        return self.pool.announced and not self.stop.is_set()

    def request_clip(self, stream_id: str) -> tuple[bool, str | None]:
        """A clip of the stream from now back by its pre-roll: (the worker answered, the clip's path)."""
        return self.pool.request_clip(stream_id)

    def change_streams(self, streams: tuple[StreamConfig, ...]) -> str:
        """Main loop: run ``streams`` from now on, with reload's rules (only the touched streams start or
        stop); returns what was applied, one line."""
        running = self.config
        plan = plan_reload(running, dataclasses.replace(running, streams=streams))
        self.config = dataclasses.replace(running, streams=streams)
        if self.sink_set is not None:
            self.sink_set.configured(self.config)
        self._moves.edit_streams(plan)
        self._moves.advance()
        return plan.describe()

    # -- status ----------------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Counters for the status line, the summary and /metrics (plain values, no pipeline objects); a
        stream's counters cover every process that carried it (restarts, reload moves: never back)."""
        owner = self.pool.owner  # each configured stream's slot, in config order (also the metrics thread)
        streams = {sid: w for sid in self.config.stream_ids if (w := owner.get(sid)) is not None}
        with self.pool.counters_lock:
            snap = status.snapshot(
                self.workers,
                self.sinks,
                owner=streams,
                past=self.pool.past,
                started=self._t0,
                batch_size=self.config.pipeline.batch_size,
                stalled=self.pool.stalled(),
                stale_after_s=self.config.metrics.stale_after_s,
            )
        if engines := self.pool.engines.stats():  # engine.shared: the engine processes' batches
            snap["engines"] = engines
        if self.cluster is not None:
            snap["cluster"] = self.cluster.status()
        return snap

    # -- what the cluster node asks of the supervisor (streamd.cluster.node.Host) ----------------------------
    def running_streams(self) -> set[str]:
        """Streams a worker still carries (removed ones until their worker has let them go)."""
        return set(self.pool.owner) | set(self._moves.leaving)

    def stream_positions(self, stream_ids: tuple[str, ...]) -> dict[str, Resume]:
        return self.pool.resume_for(stream_ids)

    def seed_positions(self, positions: dict[str, Resume]) -> None:
        self.pool.seed_resume(positions)

    def _tick(self) -> None:
        """Four times a second on the main thread (also while a stop waits for the drain)."""
        now = time.monotonic()
        self._note_progress(now)
        self._ping_watchdog(now)
        self._reload_on_sighup()
        if self.api is not None and self.pool.announced and not self.stop.is_set():
            self.api.apply_pending()  # stream changes asked through the control API
        if self.cluster is not None and self.pool.announced and not self.stop.is_set():
            self.cluster.apply(self)  # streams this node took or gave up
        self._moves.advance()
        self._publish_health(now)
        self._report_status(now)
        if self.status_line:
            self._print_status()

    def _note_progress(self, now: float) -> None:
        """When each worker last delivered lines (stall detection)."""
        for w in self.workers:
            if w.lines != w.last_results:
                w.last_results, w.last_progress = w.lines, now

    def _ping_watchdog(self, now: float) -> None:
        """WATCHDOG=1 only while results keep coming: systemd restarts a wedged pipeline."""
        due = self._watchdog_s and now - self._last_ping >= self._watchdog_s / 2
        if due and self.pool.announced and not self.pool.stalled(now):
            systemd.notify("WATCHDOG=1")
            self._last_ping = now

    def _reload_on_sighup(self) -> None:
        """SIGHUP: reopen the sink files (logrotate), then reload the config; one during start-up waits for
        READY."""
        if not self._reopen.is_set() or not self.pool.announced:
            return
        self._reopen.clear()
        if self.sink_set is not None:
            self.sink_set.reopen()
        if not self.stop.is_set():
            self._reload()

    def _publish_health(self, now: float) -> None:
        """Once a second: MQTT's retained per-stream status follows each stream's health."""
        if now - self._last_health >= 1.0 and self.sink_set is not None and self.pool.announced:
            self._last_health = now
            self.sink_set.stream_health(self.snapshot()["per_stream"])

    def _report_status(self, now: float) -> None:
        """Every 5 s: systemd's STATUS line; the log says when the box becomes overloaded and when it ends."""
        if now - self._last_status < 5:
            return
        s = self.snapshot()
        behind = s["overloaded"]
        note = f", OVERLOADED: {len(behind)} stream(s) behind real time" if behind else ""
        if waiting := status.count_state(s, "no_decoder"):
            note += f", {waiting} stream(s) waiting for a GPU decoder"
        systemd.notify(f"STATUS={s['results']} frames, {s['fps']:.1f} fps, {s['dropped']} dropped{note}")
        self._last_status = now
        # Said when it starts and when it ends, not every tick; it starts when two ticks in a row (>= 5 s) see
        # streams behind: a start-up's first seconds (decoders coming up, first batches) are not an overload.
        # Not within STARTUP_GRACE_S of READY: a start at scale catches up for longer (156 HEVC streams on an
        # H100: behind 3, 8 and 13 s after READY, none 18 s after; bench/RESULTS.md); one behind all through
        # it is said at the first tick after it.
        self._behind_ticks = self._behind_ticks + 1 if behind else 0
        starting = self._ready_mono is not None and now - self._ready_mono < STARTUP_GRACE_S
        if bool(behind) == self._overloaded or (behind and (starting or self._behind_ticks < 2)):
            return
        self._overloaded = bool(behind)
        if behind:
            log.warning(
                "streamd: overloaded: %d stream(s) behind real time (decoding under their frame rate or "
                "dropping), e.g. %s; fewer streams, lower resolution or detect_fps, or more GPUs",
                len(behind),
                ", ".join(behind[:5]),
            )
        else:
            log.info("streamd: no longer overloaded")

    def _print_status(self) -> None:
        status.print_status(self.snapshot())

    def _log_summary(self) -> None:
        status.log_summary(self.snapshot(), self.sinks, self.workers)
