"""Lifecycle: config -> sinks, engine, pipeline, streams -> run until done or signalled -> drain -> close.

Never touches CUDA itself: GPU work lives behind the engine and stage implementations. Signal handlers only
set events; the main thread waits on them, drains within a grace timeout and closes in reverse order.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import signal
import sys
import threading
import time
from types import FrameType

from streamd import logutil, systemd
from streamd.analytics.stream import build_analytics
from streamd.config import EX_CONFIG, Config
from streamd.engines import EngineError, create_engine
from streamd.engines.verify import VerifyPlan
from streamd.exitcodes import StartupError
from streamd.ingest import StreamWorker
from streamd.metrics import LatencyHistograms, MetricsServer
from streamd.pipeline.batcher import Batcher
from streamd.pipeline.postprocess import ClassThresholds, PostprocessSpec, resolve_layout
from streamd.pipeline.preprocess import PreprocessSpec
from streamd.pipeline.scheduler import Scheduler
from streamd.pipeline.stages import CpuStages, Stages
from streamd.sinks import SinkSet
from streamd.sinks.base import LineSink
from streamd.sinks.record import to_json_line
from streamd.types import FrameResult
from streamd.web.snapshot import LatestFrames

log = logging.getLogger(__name__)


def build_stages(config: Config) -> Stages:
    m, e = config.model, config.engine
    engine = create_engine(
        e.type,
        m.path,
        max_batch=e.max_batch,
        precision=e.precision,
        threads=e.threads,
        device=e.device,
        cache_dir=e.cache_dir,
        cuda_graphs=e.cuda_graphs,
        verify=VerifyPlan.from_config(config),
    )
    try:
        c, h, w = engine.input_shape
        if (w, h) != tuple(m.input_size) or c != 3:
            raise ValueError(
                f"model.input_size is {list(m.input_size)} (width, height) but the model takes "
                f"[{c}, {h}, {w}] (C, H, W); set model.input_size: [{w}, {h}]"
            )
        layout = resolve_layout(m.layout, engine.output_shape, len(m.class_names))
        pre = PreprocessSpec(w, h, m.channel_order, m.mean, m.std, m.resize, m.pad_value)
        post = PostprocessSpec(
            layout, len(m.class_names), m.score_threshold, m.iou_threshold, m.max_detections, m.top_k,
            thresholds=ClassThresholds.from_config(config),
        )  # fmt: skip
        if engine.on_device:  # GPU engine: the three-stream CUDA stages (imported only here)
            from streamd.gpu.stages import GpuStages

            return GpuStages(engine, pre, post, device=e.device, warm_batch=config.pipeline.batch_size)
        return CpuStages(engine, pre, post)
    except Exception:
        engine.close()
        raise


def choose_decoder(requested: str, gpu_engine: bool) -> str:
    """``auto``: NVDEC when inference runs on the GPU (frames then never leave the device) and PyNvVideoCodec
    is installed; otherwise the CPU decoder."""
    if requested == "nvdec" and not gpu_engine:
        raise ValueError(
            "pipeline.decoder: nvdec keeps frames on the GPU, but the engine runs on the CPU; "
            "use decoder: cpu (or auto), or a GPU engine (engine.type: torch or tensorrt)"
        )
    if requested != "auto":
        return requested
    return "nvdec" if gpu_engine and importlib.util.find_spec("PyNvVideoCodec") is not None else "cpu"


class Daemon:
    def __init__(self, config: Config, *, status_line: bool | None = None) -> None:
        self.config = config
        self.status_line = sys.stderr.isatty() if status_line is None else status_line
        self.stop = threading.Event()  # set by SIGINT/SIGTERM: stop reading, drain, exit
        self.results = 0
        self.workers: list[StreamWorker] = []
        self.sinks: list[LineSink] = []
        self.batcher: Batcher | None = None
        self._abort = threading.Event()  # second Ctrl-C: skip the drain
        self._reopen = threading.Event()  # SIGHUP: reopen sink files (logrotate)
        self._latency = {sc.id: LatencyHistograms() for sc in config.streams}  # per stream, for /metrics
        self._latest = LatestFrames(config.model.class_names)  # for the status page's snapshots
        self.ready_at = self.last_result_at = 0.0  # perf_counter: model loaded and warm / last result out
        self._t0 = time.monotonic()
        self._last_results, self._last_progress = -1, self._t0
        self._last_ping = self._last_status = 0.0
        usec = systemd.watchdog_usec()
        self._watchdog_s = usec / 1e6 if usec else 0.0

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._reopen.set()
            return
        if self.stop.is_set() and signum == signal.SIGINT:
            self._abort.set()  # second Ctrl-C: do not wait for the drain
        self.stop.set()

    def run(self) -> int:
        """Run to completion (files ended) or until signalled; returns the process exit code."""
        cfg = self.config
        metrics = None
        if cfg.metrics.enabled:  # bind first: a taken port must fail before anything starts
            try:
                metrics = MetricsServer(
                    cfg.metrics.host,
                    cfg.metrics.port,
                    self.snapshot,
                    frame_snapshot=self._latest.jpeg,
                    status_page=cfg.metrics.status_page,
                    snapshots_per_s=cfg.metrics.snapshots_per_s,
                )
            except OSError as exc:
                log.error(
                    "metrics.port: cannot listen on %s:%d (%s); pick another port",
                    cfg.metrics.host,
                    cfg.metrics.port,
                    exc,
                )
                return 1
        sink_set = SinkSet.from_config(cfg.sinks, on_all_gone=self.stop.set)  # every reader left: stop
        try:  # open outputs before the model loads: an unwritable file fails now, not after minutes
            sink_set.start()
        except StartupError as exc:
            log.error("%s", exc)
            if metrics is not None:
                metrics.close()
            return exc.code
        self.sinks = sink_set.sinks
        stages: Stages | None = None
        try:
            stages = build_stages(cfg)
            decoder = choose_decoder(cfg.pipeline.decoder, stages.engine.on_device)
        except (EngineError, ValueError) as exc:  # the model does not fit the config
            log.error("%s", exc)
            for owner in (stages, metrics):
                if owner is not None:
                    owner.close()
            sink_set.close(timeout=1)
            return EX_CONFIG
        batcher = self.batcher = Batcher(cfg.pipeline.batch_size, cfg.pipeline.batch_timeout_ms / 1e3)
        options: dict[str, int] = {}
        if decoder == "nvdec":
            # A stream's decoded surfaces are held by its queue, by the batch being filled and by one full
            # batch waiting for a free slot; the decoder must not run out of surfaces before those move on.
            options["pool_size"] = cfg.pipeline.frame_queue + 2 * cfg.pipeline.batch_size + 4
        names = cfg.model.class_names
        analytics = build_analytics(cfg)  # detect_fps, zones, tracking, events (issue 9), per stream

        def submit(lines: list[str], stream_id: str) -> None:
            for line in lines:
                sink_set.submit(line, stream_id)

        for sc in cfg.streams:
            policy = "latest" if sc.is_live or sc.realtime else "block"
            q = batcher.add_stream(sc.id, cfg.pipeline.frame_queue, policy)
            worker = StreamWorker(
                sc, q, self.stop, decoder=decoder, device=cfg.engine.device, decoder_options=options
            )
            worker.analytics = analytics.get(sc.id)  # detect_fps skips, predicted lines of skipped frames
            worker.on_lines = functools.partial(submit, stream_id=sc.id)
            self.workers.append(worker)
        sinks = self.sinks

        def on_result(result: FrameResult) -> None:
            sid = result.frame.stream_id
            self._latency[sid].observe(result.latency_ms)
            self._latest.update(result)
            hook = analytics.get(sid)
            if hook is None:
                sink_set.submit(to_json_line(result, names), sid)
            else:
                with hook.lock:  # ordered with the lines its ingest thread writes for skipped frames
                    submit(hook.on_result(result), sid)
            self.results += 1
            self.last_result_at = time.perf_counter()

        scheduler = Scheduler(batcher, stages, on_result, cfg.pipeline.ring_slots)
        log.info(
            "streamd: %d stream(s), decoder %s, engine %s, batch %d",
            len(cfg.streams), decoder, stages.engine.name, batcher.batch_size,
        )  # fmt: skip
        previous = {}
        if threading.current_thread() is threading.main_thread():  # embedders may run us in a thread
            handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            previous = {s: signal.signal(s, self._on_signal) for s in handled}
        try:
            if metrics is not None:
                metrics.start()
            scheduler.start()
            for w in self.workers:
                w.start()
            self.ready_at = time.perf_counter()
            systemd.notify("READY=1", f"STATUS=running {len(cfg.streams)} stream(s)")
            while not scheduler.join(timeout=0.5):
                self._tick()
                if self._abort.is_set():
                    scheduler.abort.set()
            if self.stop.is_set():
                log.info("streamd: stopped by signal after draining frames in flight")
        finally:
            # Reverse order of start: inputs, pipeline, outputs, engine, metrics.
            systemd.notify("STOPPING=1", "STATUS=draining")
            self.stop.set()
            for w in self.workers:
                w.join(timeout=5)
            if not scheduler.join(timeout=10):
                scheduler.abort.set()
                scheduler.join(timeout=5)
            for sid, hook in analytics.items():  # predicted lines held after the last result
                with hook.lock:
                    submit(hook.finish(), sid)
            sink_set.close(timeout=10)
            stages.close()
            if metrics is not None:
                metrics.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.status_line:
                self._print_status()
                sys.stderr.write("\n")
        logutil.flush_all()  # counts of repeated warnings still held back
        self._log_summary(sinks)
        failed = [w.cfg.id for w in self.workers if w.stats.state == "failed"]
        if failed:  # the others ran to the end; the exit status still says something was lost
            log.error("streamd: stream(s) failed: %s (see the errors above)", ", ".join(failed))
        lost = sink_set.summary()
        if lost:  # the exit status says output was lost (unless the config says those drops are fine)
            log.error("streamd: %s", lost)
        return 1 if scheduler.error is not None or failed or lost else 0

    def snapshot(self) -> dict:
        """Counters for the status line, the summary and /metrics (plain values, no pipeline objects)."""
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        per_stream = {
            w.cfg.id: {
                "state": w.stats.state,
                "decoded": w.stats.decoded,
                "dropped": q.dropped,
                "decode_errors": w.stats.decode_errors,
                "read_errors": w.stats.read_errors,
                "skipped": w.stats.skipped,
                "worker": 0,
                "fps": self._latency[w.cfg.id].results / elapsed,
                "latency": self._latency[w.cfg.id].to_dict(),
            }
            for w, q in zip(self.workers, self.batcher.queues if self.batcher else (), strict=False)
        }
        return {
            "elapsed_s": elapsed,
            "results": self.results,
            "fps": self.results / elapsed,
            "dropped": sum(s["dropped"] for s in per_stream.values()),
            "decode_errors": sum(s["decode_errors"] for s in per_stream.values()),
            "skipped": sum(s["skipped"] for s in per_stream.values()),
            "streams": {sid: s["state"] for sid, s in per_stream.items()},
            "per_stream": per_stream,
            "sinks": {s.name: s.dropped for s in self.sinks},
            "sink_stats": {s.name: s.stats() for s in self.sinks},
            "stalled": self._stalled(time.monotonic()),
        }

    STALL_S = 30.0  # no result for this long while streams run = stalled (health 503, watchdog withheld)

    def _tick(self) -> None:
        """Twice a second on the main thread: progress, systemd watchdog and status, the status line."""
        now = time.monotonic()
        if self.results != self._last_results:
            self._last_results, self._last_progress = self.results, now
        if self._watchdog_s and not self._stalled(now) and now - self._last_ping >= self._watchdog_s / 2:
            systemd.notify("WATCHDOG=1")  # only while results keep coming: a wedged pipeline gets restarted
            self._last_ping = now
        if self._reopen.is_set():
            self._reopen.clear()
            for sink in self.sinks:
                sink.reopen()
        if now - self._last_status >= 5:
            s = self.snapshot()
            systemd.notify(f"STATUS={s['results']} frames, {s['fps']:.1f} fps, {s['dropped']} dropped")
            self._last_status = now
        if self.status_line:
            self._print_status()

    def _stalled(self, now: float) -> bool:
        running = any(w.stats.state == "running" for w in self.workers)
        return running and now - self._last_progress > self.STALL_S

    def _print_status(self) -> None:
        s = self.snapshot()
        running = sum(1 for st in s["streams"].values() if st == "running")
        sys.stderr.write(
            f"\r\x1b[Kstreamd: {running}/{len(s['streams'])} streams | {s['results']} frames | "
            f"{s['fps']:.1f} fps | dropped {s['dropped']} | decode errors {s['decode_errors']}"
        )
        sys.stderr.flush()

    def _log_summary(self, sinks: list[LineSink]) -> None:
        s = self.snapshot()
        sink_drops = sum(x.dropped for x in sinks)
        log.info(
            "streamd: done: %d frames in %.1f s (%.1f fps), %d skipped (detect_fps), "
            "%d dropped after decode, %d decode errors, %d sink lines dropped",
            s["results"],
            s["elapsed_s"],
            s["fps"],
            s["skipped"],
            s["dropped"],
            s["decode_errors"],
            sink_drops,
        )
