"""One worker's pipeline: its share of the streams -> ingest -> batcher -> slot ring -> engine -> JSON lines.

``Pipeline`` is the whole data path of one process (what one ``streamd run`` was before it became a
supervisor); ``worker_main`` runs it in a worker process and talks to the supervisor over a pipe:

    worker -> supervisor   ("ready", info) · ("lines", [Record, ...]) per batch · ("stats", dict) twice a
                           second · ("error", exit_code, message) when it cannot start · ("done", failed)
    supervisor -> worker   ("go",) start the streams (first start: once every worker is built) · ("adopt",
                           stream_ids, resumes) a spare takes over a dead worker's streams, then starts ·
                           ("stop",) drain and finish · ("abort",) finish now · ("snapshot", stream_id)

Records carry the stream's frame index, pts and wall time next to the finished line, so the supervisor can
resume a restarted worker's streams where they stopped without parsing JSON. The worker never outlives its
supervisor: a closed pipe means stop.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from streamd import logutil
from streamd.analytics.stream import build_analytics
from streamd.config import Config, StreamConfig
from streamd.decode import wait_closed
from streamd.exitcodes import EX_CONFIG, EX_SOFTWARE, StartupError
from streamd.ingest import StreamWorker
from streamd.latency import LatencyHistograms
from streamd.pipeline.batcher import Batcher
from streamd.pipeline.cpu_stages import CpuStages
from streamd.pipeline.postprocess import ClassThresholds, PostprocessSpec, resolve_layout
from streamd.pipeline.preprocess import PreprocessSpec
from streamd.pipeline.scheduler import Scheduler
from streamd.pipeline.stages import Stages
from streamd.sinks.record import to_json_line
from streamd.types import FrameResult
from streamd.web.snapshot import LatestFrames, nv12_surface_to_bgr

log = logging.getLogger(__name__)
Totals = dict[str, tuple[int, int, int, bool]]  # per stream at a mark: results, decoded, dropped, running?
# A stream's StreamStats counters a worker reports (streamd.pool.COUNTERS adds inferred and dropped).
STREAM_COUNTERS = ("decoded", "skipped", "decode_errors", "read_errors", "reconnects", "stalls")


class Record(NamedTuple):
    """One finished frame as it travels to the supervisor."""

    stream_id: str
    frame: int
    pts: float | None
    wall_time: float
    line: str


@dataclass(frozen=True)
class Resume:
    """Where a restarted worker's stream continues: next frame index, last pts and its wall time."""

    index: int
    pts: float | None
    wall_time: float


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    config: Config
    stream_ids: tuple[str, ...]
    device: int
    resume: dict[str, Resume] = field(default_factory=dict)
    hold: bool = False  # after "ready", wait for ("go",): every worker's streams start together


def build_stages(config: Config, device: int | None = None) -> Stages:
    """Engine + the stage implementation that fits it (CUDA stages for a GPU engine, CPU twins otherwise).

    Raises StartupError: EX_CONFIG when the model does not fit the config, EX_UNAVAILABLE when the engine or
    the GPU cannot be brought up."""
    from streamd.config.engine import backend_options
    from streamd.engines import EngineError, create_engine  # engines load heavy libraries: on use only
    from streamd.engines.verify import VerifyPlan

    m, e = config.model, config.engine
    device = e.device if device is None else device
    try:
        engine = create_engine(
            e.type,
            m.path,
            max_batch=e.max_batch,
            precision=e.precision,
            threads=e.threads,
            device=device,
            verify=VerifyPlan.from_config(config),
            **backend_options(e),
        )
    except EngineError as exc:  # a StartupError already: 78 if the config does not fit, 69 if unavailable
        raise StartupError(str(exc), exc.code) from exc
    try:
        c, h, w = engine.input_shape
        if (w, h) != tuple(m.input_size) or c != 3:
            raise StartupError(
                f"model.input_size is {list(m.input_size)} (width, height) but the model takes "
                f"[{c}, {h}, {w}] (C, H, W); set model.input_size: [{w}, {h}]",
                EX_CONFIG,
            )
        try:
            layout = resolve_layout(m.layout, engine.output_shape, len(m.class_names))
        except ValueError as exc:
            raise StartupError(str(exc), EX_CONFIG) from exc
        pre = PreprocessSpec(w, h, m.channel_order, m.mean, m.std, m.resize, m.pad_value)
        post = PostprocessSpec(
            layout, len(m.class_names), m.score_threshold, m.iou_threshold, m.max_detections, m.top_k,
            thresholds=ClassThresholds.from_config(config),
        )  # fmt: skip
        if engine.on_device:  # GPU engine: the three-stream CUDA stages (imported only here)
            from streamd.gpu.stages import GpuStages

            return GpuStages(engine, pre, post, device=device, warm_batch=config.pipeline.batch_size)
        return CpuStages(engine, pre, post)
    except BaseException:
        engine.close()
        raise


def choose_decoder(requested: str, gpu_engine: bool) -> str:
    """``auto``: NVDEC when inference runs on the GPU (frames then never leave the device) and PyNvVideoCodec
    is installed; otherwise the CPU decoder."""
    if requested == "nvdec" and not gpu_engine:
        raise StartupError(
            "pipeline.decoder: nvdec keeps frames on the GPU, but the engine runs on the CPU; "
            "use decoder: cpu (or auto), or a GPU engine (engine.type: torch or tensorrt)",
            EX_CONFIG,
        )
    if requested != "auto":
        return requested
    return "nvdec" if gpu_engine and importlib.util.find_spec("PyNvVideoCodec") is not None else "cpu"


class Pipeline:
    """The data path for ``streams``: build (engine, stages), start, results via ``emit``, stop, close.

    ``emit`` gets the records of one batch at a time, in batch order, each stream's frames in order."""

    def __init__(
        self,
        config: Config,
        streams: Sequence[StreamConfig],
        emit: Callable[[list[Record]], None],
        *,
        device: int | None = None,
        resume: dict[str, Resume] | None = None,
    ) -> None:
        self.config = config
        self.streams = tuple(streams)
        self.device = config.engine.device if device is None else device
        self._emit = emit
        self._resume = resume or {}
        self.stop = threading.Event()  # stop reading, drain what is in flight
        self.stages: Stages | None = None
        self.scheduler: Scheduler | None = None
        self.batcher: Batcher | None = None
        self.workers: list[StreamWorker] = []
        self.decoder = ""
        self.analytics: dict[str, Any] = {}  # stream id -> StreamAnalytics (only streams that use any)
        self.latency = {s.id: LatencyHistograms() for s in self.streams}  # per stream, for /metrics
        # The status page: host frames by reference; NVDEC frames copied at ingest, only when asked (ops).
        self.latest = LatestFrames(config.model.class_names)
        # Rates over the last completed window of >= 2 s: results and decoded fps, and whether a live stream
        # is behind real time (decoding slower than its frame rate, or dropping): the box is overloaded.
        self._mark: tuple[float, Totals] = (time.monotonic(), {})
        self._rates: dict[str, tuple[float, float, bool]] = {}
        self.results = 0
        self._started = False

    def build(self) -> None:
        """Load the engine and set up the stages; raises StartupError (nothing left open) on failure."""
        cfg = self.config
        self.stages = build_stages(cfg, self.device)
        try:
            self.decoder = choose_decoder(cfg.pipeline.decoder, self.stages.engine.on_device)
        except StartupError:
            self.stages.close()
            self.stages = None
            raise
        self.batcher = Batcher(cfg.pipeline.batch_size, cfg.pipeline.batch_timeout_ms / 1e3)
        self._add_streams()
        self.scheduler = Scheduler(self.batcher, self.stages, self._on_results, cfg.pipeline.ring_slots)

    def adopt(self, streams: Sequence[StreamConfig], resume: dict[str, Resume]) -> None:
        """A spare worker (built, no streams) takes over the streams of a worker that died; before start()."""
        assert not self._started, "adopt() before start()"
        self.streams, self._resume = tuple(streams), dict(resume)
        self.latency = {s.id: LatencyHistograms() for s in self.streams}
        self._add_streams()

    def _add_streams(self) -> None:
        cfg, batcher = self.config, self.batcher
        assert batcher is not None
        # detect_fps, zones, tracking, events (issue 9), per stream; None where a stream uses none of them
        mine = {s.id for s in self.streams}
        self.analytics = {sid: a for sid, a in build_analytics(cfg).items() if sid in mine}
        options: dict[str, int] = {}
        if self.decoder == "nvdec":
            self.latest = LatestFrames(self.config.model.class_names, to_host=nv12_surface_to_bgr)
            # A stream's decoded surfaces are held by its queue, by the batch being filled and by one full
            # batch waiting for a free slot; the decoder must not run out of surfaces before those move on.
            options["pool_size"] = cfg.pipeline.frame_queue + 2 * cfg.pipeline.batch_size + 4
        for sc in self.streams:
            policy = "latest" if sc.is_live or sc.realtime else "block"
            q = batcher.add_stream(sc.id, cfg.pipeline.frame_queue, policy)
            worker = StreamWorker(
                sc, q, self.stop, decoder=self.decoder, device=self.device, decoder_options=options
            )
            if (hook := self.analytics.get(sc.id)) is not None:
                worker.analytics = hook  # detect_fps skips; predicted lines of skipped frames
                worker.on_lines = functools.partial(self._hook_lines, stream_id=sc.id)
            if (r := self._resume.get(sc.id)) is not None:
                worker.resume_at(r.index, r.pts, r.wall_time)
            if self.decoder == "nvdec":  # the status page: one surface copied to the host per request (ops)
                worker.on_frame = self.latest.capture
            self.workers.append(worker)

    def _on_results(self, results: list[FrameResult]) -> None:
        """One batch: plain streams go out as one message; a stream with analytics sends its lines under its
        hook's lock, so they stay in order with the lines its ingest thread writes for skipped frames."""
        names = self.config.model.class_names
        records = []
        for r in results:
            f = r.frame
            self.latency[f.stream_id].observe(r.latency_ms)
            self.latest.update(r)
            hook = self.analytics.get(f.stream_id)
            if hook is None:
                records.append(Record(f.stream_id, f.index, f.pts, f.wall_time, to_json_line(r, names)))
                continue
            with hook.lock:
                lines = hook.on_result(r)
                if lines:
                    self._emit([Record(f.stream_id, f.index, f.pts, f.wall_time, line) for line in lines])
        self.results += len(results)
        if records:
            self._emit(records)

    def _hook_lines(self, lines: list[str], stream_id: str) -> None:
        """Lines analytics writes outside a result (predicted boxes of skipped frames, held events)."""
        worker = next((w for w in self.workers if w.cfg.id == stream_id), None)
        r = self._resume.get(stream_id)
        index = worker._index - 1 if worker is not None else (r.index if r else 0)
        self._emit([Record(stream_id, index, None, time.time(), line) for line in lines])

    def start(self) -> None:
        assert self.scheduler is not None, "build() first"
        self._started = True
        self.scheduler.start()
        for w in self.workers:
            w.start()

    def abort(self) -> None:
        self.stop.set()
        if self.scheduler is not None:
            self.scheduler.abort.set()

    def join(self, timeout: float | None = None) -> bool:
        """True when every frame has gone through (all streams ended, or stopped and drained)."""
        return self.scheduler is None or not self._started or self.scheduler.join(timeout)

    def close(self) -> None:
        """Stop inputs, drain the pipeline (bounded), release the engine. Never raises."""
        self.stop.set()
        try:
            for w in self.workers:
                w.join(timeout=5)
            wait_closed(10.0)  # decoders the streams handed to the closer go before the engine's context
            if self.scheduler is not None and self._started and not self.scheduler.join(timeout=10):
                self.scheduler.abort.set()
                self.scheduler.join(timeout=5)
            for sid, hook in self.analytics.items():  # lines held after the last result
                with hook.lock:
                    if lines := hook.finish():
                        self._hook_lines(lines, sid)
        finally:  # stage threads still running may use the buffers: then leak them rather than free them
            idle = not self._started or self.scheduler is None or self.scheduler.join(0)
            if self.stages is not None and idle:
                try:
                    self.stages.close()
                except Exception:  # cleanup must not hide the real outcome
                    log.exception("closing the engine failed")
                self.stages = None

    @property
    def failed(self) -> bool:
        """A stage failed or a stream gave up."""
        error = self.scheduler is not None and self.scheduler.error is not None
        return error or any(w.stats.state == "failed" for w in self.workers)

    def _window_rates(
        self, before: Totals, totals: Totals, dt: float
    ) -> dict[str, tuple[float, float, bool]]:
        """(results fps, decoded fps, behind) per stream over a window; ``behind``: a live stream (camera, or
        a file paced in real time) that dropped frames, or decoded under 90 % of its frame rate in a window
        it ran all through (one that began mid-window, e.g. at a busy start, has not fallen behind)."""
        rates = {}
        for w in self.workers:
            sid = w.cfg.id
            if sid not in before or sid not in totals:
                continue
            (r0, d0, x0, ran), (r1, d1, x1, _) = before[sid], totals[sid]
            fps, decode_fps = (r1 - r0) / dt, (d1 - d0) / dt
            live = w.cfg.is_live or w.cfg.realtime
            nominal = w.nominal_fps
            slow = nominal > 0 and decode_fps < 0.9 * nominal
            behind = live and w.stats.state == "running" and ((ran and slow) or x1 > x0)
            rates[sid] = (fps, decode_fps, behind)
        return rates

    def stats(self) -> dict[str, Any]:
        """Plain counters: per stream, plus the pipeline's own (read from another thread; values may be a
        tick apart, never inconsistent in type)."""
        queues = self.batcher.queues if self.batcher is not None else ()
        per_stream: dict[str, dict[str, Any]] = {}
        now = time.monotonic()
        mark, before = self._mark
        totals = {
            w.cfg.id: (self.latency[w.cfg.id].results, w.stats.decoded, q.dropped, w.stats.state == "running")
            for w, q in zip(self.workers, queues, strict=False)
        }
        if now - mark >= 2.0:
            self._mark, self._rates = (now, totals), self._window_rates(before, totals, now - mark)
        for w, q in zip(self.workers, queues, strict=False):
            s = w.stats
            sid = w.cfg.id
            fps, decode_fps, behind = self._rates.get(sid, (0.0, 0.0, False))
            per_stream[sid] = {
                "state": s.state,
                **{k: getattr(s, k) for k in STREAM_COUNTERS},
                "dropped": q.dropped,
                "inferred": totals[sid][0],
                "fps": round(fps, 2),
                "decode_fps": round(decode_fps, 2),
                "behind": behind,
                "latency": self.latency[sid].to_dict(),
                "decoder": s.decoder,
                "last_error": s.last_error,
                "last_packet_age_s": s.last_packet_age_s,
            }
        sched = self.scheduler
        return {
            "results": self.results,
            "behind": sorted(sid for sid, st in per_stream.items() if st["behind"]),
            "batches": sched.batches if sched else 0,
            "frames": sched.frames if sched else 0,
            "batch_size": self.config.pipeline.batch_size,
            "early_batches": self.batcher.early if self.batcher else 0,
            "error": repr(sched.error) if sched and sched.error else None,
            "per_stream": per_stream,
        }


# -- the worker process -------------------------------------------------------------------------------------


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
    adoption: list[tuple[tuple[str, ...], dict[str, Resume]]] = []  # a spare's streams, given with "adopt"
    commands = threading.Thread(
        target=_commands, args=(conn, channel, pipeline, go, adoption), name="commands"
    )
    commands.daemon = True
    commands.start()
    try:
        engine = pipeline.stages.engine.name if pipeline.stages else "?"
        channel.send(("ready", {"pid": os.getpid(), "engine": engine, "decoder": pipeline.decoder}))
        while not go.wait(0.25):  # the first start: streams begin when every worker is built
            if pipeline.stop.is_set() or channel.closed:
                break
        if adoption:  # a spare taking over a dead worker's streams
            ids, resume = adoption[0]
            pipeline.adopt([s for s in config.streams if s.id in ids], resume)
            channel.send(("ready", {"pid": os.getpid(), "engine": engine, "decoder": pipeline.decoder}))
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
    adoption: list[tuple[tuple[str, ...], dict[str, Resume]]],
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
