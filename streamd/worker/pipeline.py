"""One worker's pipeline: its share of the streams -> ingest -> batcher -> slot ring -> engine -> JSON lines.

``Pipeline`` is the whole data path of one worker process (``streamd.worker.process`` runs it and talks to
the supervisor). Results leave as ``protocol.Record``s, one list per batch, each stream's frames in order;
a record carries the frame index, pts and wall time next to the finished line, so the supervisor can resume
a stream in another process where it stopped (``protocol.Resume``) without parsing JSON. ``stats()`` is
the worker's ``protocol.WorkerStats``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from streamd.analytics.annotations import Output
from streamd.analytics.stream import StreamAnalytics
from streamd.clips import ClipHooks
from streamd.config import Config, StreamConfig
from streamd.exitcodes import EX_CONFIG, StartupError
from streamd.ingest.decode import wait_closed
from streamd.ingest.reader import StreamReader
from streamd.latency import LatencyHistograms
from streamd.pipeline.batcher import Batcher, StreamQueue
from streamd.pipeline.build import build_stages
from streamd.pipeline.scheduler import Scheduler
from streamd.protocol import Crossings, Record, Resume, StreamCounters, StreamReport, WorkerStats
from streamd.stages.contract import Stages
from streamd.types import FrameResult
from streamd.web.snapshot import LatestFrames, nv12_surface_to_bgr
from streamd.worker.output import encode_all, frame_line

log = logging.getLogger(__name__)
Totals = dict[str, tuple[int, int, int, bool]]  # per stream at a mark: results, decoded, dropped, running?


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


class _StopAll(threading.Event):
    """The pipeline's stop event; setting it also stops every stream. Each stream reads its own event, so a
    reload can stop one stream while the others go on."""

    def __init__(self) -> None:
        super().__init__()
        self._streams: list[threading.Event] = []

    def set(self) -> None:
        super().set()
        for event in list(self._streams):
            event.set()

    def stream_event(self) -> threading.Event:
        event = threading.Event()
        if self.is_set():
            event.set()
        self._streams.append(event)
        return event

    def forget(self, event: threading.Event) -> None:
        if event in self._streams:
            self._streams.remove(event)


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
        shared_engine: tuple[str, bytes] | None = None,
    ) -> None:
        self.config = config
        self._shared_engine = shared_engine  # (socket, key) of the GPU's engine process (engine.shared)
        self.streams = tuple(streams)
        self.device = config.engine.device if device is None else device
        self._emit = emit
        self._resume = resume or {}
        self.stop = _StopAll()  # stop reading, drain what is in flight
        self.stages: Stages | None = None
        self.scheduler: Scheduler | None = None
        self.batcher: Batcher | None = None
        self.workers: list[StreamReader] = []
        self.decoder = ""
        self.analytics: dict[str, Any] = {}  # stream id -> StreamAnalytics (only streams that use any)
        self.clips = ClipHooks()  # event clips: a packet ring per stream that has them, one writer thread
        self.latency = {s.id: LatencyHistograms() for s in self.streams}  # per stream, for /metrics
        # The status page: host frames by reference; NVDEC frames copied at ingest, only when asked.
        self.latest = LatestFrames(config.model.class_names)
        # Rates over the last completed window of >= 2 s: results and decoded fps, and whether a live stream
        # is behind real time (decoding slower than its frame rate, or dropping): the box is overloaded.
        self._mark: tuple[float, Totals] = (time.monotonic(), {})
        self._rates: dict[str, tuple[float, float, bool]] = {}
        self.results = 0
        self._started = False
        # Counters of stream incarnations a reload replaced or removed (per stream id): a stream's counters
        # never go back, whichever StreamReader carries it.
        self._carried: dict[str, StreamCounters] = {}
        self._crossings: dict[str, Crossings] = {}  # line counters per stream id, every incarnation's
        self._queues: dict[StreamReader, StreamQueue] = {}  # each stream thread's queue in the batcher
        self._edit_lock = threading.Lock()  # one reconfiguration at a time; start() waits for it

    def build(self) -> None:
        """Load the engine and set up the stages; raises StartupError (nothing left open) on failure."""
        cfg = self.config
        if self._shared_engine is not None:
            from streamd.shared_engine.client import remote_stages

            self.stages = remote_stages(cfg, *self._shared_engine, self.device)
        else:
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
        self.stages.warmed()  # the slots are made (and warmed): start-up's own memory goes back

    def adopt(self, streams: Sequence[StreamConfig], resume: dict[str, Resume]) -> None:
        """A spare worker (built, no streams) takes over the streams of a worker that died; before start()."""
        assert not self._started, "adopt() before start()"
        self.streams, self._resume = tuple(streams), dict(resume)
        self.latency = {s.id: LatencyHistograms() for s in self.streams}
        self._add_streams()

    def _add_streams(self) -> None:
        if self.decoder == "nvdec":
            self.latest = LatestFrames(self.config.model.class_names, to_host=nv12_surface_to_bgr)
        for sc in self.streams:
            self._set_classes(sc)
            self.workers.append(self._stream_worker(sc, self._resume.get(sc.id)))

    def _set_classes(self, sc: StreamConfig) -> None:
        """The stream's class filter in the stages, before its first frame. The stages were built from the
        run's first config; a reload, the control API or a cluster may have changed ``classes`` since. A
        removed stream keeps its row (its last batches may still be in flight; a row is C floats)."""
        assert self.stages is not None
        model = self.config.model
        self.stages.set_classes(sc.id, None if sc.classes is None else model.thresholds(sc.classes))

    def _stream_worker(self, sc: StreamConfig, resume: Resume | None) -> StreamReader:
        """A stream's ingest thread (not started), its queue in the batcher and its analytics hook (its class
        filter is the caller's: ``_set_classes``)."""
        cfg, batcher = self.config, self.batcher
        assert batcher is not None
        options: dict[str, int] = {}
        if self.decoder == "nvdec":
            # A stream's decoded surfaces are held by its queue, by the batch being filled and by one full
            # batch waiting for a free slot; the decoder must not run out of surfaces before those move on.
            options["pool_size"] = cfg.pipeline.frame_queue + 2 * cfg.pipeline.batch_size + 4
        policy = "latest" if sc.is_live or sc.realtime else "block"
        q = batcher.add_stream(sc.id, cfg.pipeline.frame_queue, policy)
        worker = StreamReader(
            sc, q, self.stop.stream_event(), decoder=self.decoder, device=self.device, decoder_options=options
        )
        self._queues[worker] = q
        worker.packet_tap = self.clips.recorder(sc)
        # detect_fps, zones, tracking, events; none where the stream uses none of them
        hook = StreamAnalytics(sc, cfg.model.class_names, self._crossings.setdefault(sc.id, {}))
        if hook.active:
            self.analytics[sc.id] = hook
            worker.analytics = hook  # detect_fps skips; predicted lines of skipped frames
            worker.on_lines = functools.partial(self._hook_lines, stream_id=sc.id)
        else:
            self.analytics.pop(sc.id, None)
        if resume is not None:
            worker.resume_at(resume.index, resume.pts, resume.wall_time)
        if self.decoder == "nvdec":  # the status page: one surface copied to the host per request
            worker.on_frame = self.latest.capture
        self.latency.setdefault(sc.id, LatencyHistograms())
        return worker

    def reconfigure(
        self, remove: Sequence[str], upsert: Sequence[StreamConfig], resume: dict[str, Resume] | None = None
    ) -> tuple[list[str], list[str]]:
        """A reload, in place: streams in ``remove`` stop; each of ``upsert`` starts, or replaces the running
        stream of its id (its frame numbering and timeline continue; a stream new to this process continues
        from ``resume``, where it stopped in the run). The other streams never pause: only
        the touched streams' threads stop and start. Returns (removed ids, refused ids): refused when the
        pipeline has already finished (every stream ended), so the supervisor starts them elsewhere."""
        with self._edit_lock:
            if self._started and self.scheduler is not None and self.scheduler.join(0):
                return [], [s.id for s in upsert]
            assert self.batcher is not None
            with self.batcher.held():  # a process's only stream replaced: not "every stream ended"
                return self._swap(remove, upsert, resume)

    def _swap(
        self, remove: Sequence[str], upsert: Sequence[StreamConfig], resume: dict[str, Resume] | None
    ) -> tuple[list[str], list[str]]:
        """The body of ``reconfigure``, under its lock and the batcher's hold."""
        touched = set(remove) | {s.id for s in upsert}
        leaving = [w for w in self.workers if w.cfg.id in touched]
        for w in leaving:  # stop the touched streams; their queued frames still go through
            w.stop.set()
        positions: dict[str, Resume] = {}
        for w in leaving:
            w.join(timeout=10)
            self.stop.forget(w.stop)
            self._retire_counters(w)
            self.workers.remove(w)
            index, pts, arrived = w.position()
            if index:  # where its successor continues: frame numbering and timeline
                wall = time.time() - max(0.0, time.monotonic() - arrived)
                positions[w.cfg.id] = Resume(index, pts, wall)
        # The successors' queues join the batcher before the old ones are gone: a worker whose only
        # stream changes must not read as finished in between.
        arriving = [
            self._stream_worker(sc, positions.get(sc.id) or (resume or {}).get(sc.id)) for sc in upsert
        ]
        for w in leaving:
            q = self._queues.pop(w)
            self._wait_drained(q)
            assert self.batcher is not None
            self.batcher.discard(q)
            self._finish_analytics(w)
        for sc in upsert:  # the new frames use it; old ones in batches not yet postprocessed may too
            self._set_classes(sc)
        self.streams = tuple(s for s in self.streams if s.id not in touched) + tuple(upsert)
        for worker in arriving:
            self.workers.append(worker)
            if self._started:
                worker.start()
        return [w.cfg.id for w in leaving if w.cfg.id in set(remove)], []

    def _wait_drained(self, q: Any, timeout: float = 10.0) -> None:
        """Until the batcher has taken every frame of a stopped stream's queue: its successor's frames then
        come in later batches, so a stream's lines stay in frame order."""
        deadline = time.monotonic() + timeout
        while len(q) and time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(0.005)

    def _retire_counters(self, w: StreamReader) -> None:
        before = self._carried.get(w.cfg.id, StreamCounters())
        self._carried[w.cfg.id] = before + _counters(w, self._queues[w])

    def _finish_analytics(self, w: StreamReader) -> None:
        """A stopped stream's tracks leave their zones (also when a changed stream's successor has its own
        hook by now)."""
        hook = w.analytics
        if hook is None:  # a plain stream (it never had a hook in self.analytics)
            return
        if self.analytics.get(w.cfg.id) is hook:  # removed; a replaced id already maps to its new hook
            del self.analytics[w.cfg.id]
        with hook.lock:
            if outputs := hook.flush():
                self._hook_lines(outputs, w.cfg.id)

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
                self.clips.result(r)
                records.append(Record(f.stream_id, f.index, f.pts, f.wall_time, frame_line(r, names)))
                continue
            with hook.lock:
                outputs = hook.annotate(r)
                lines = self.clips.result(r, outputs, encode_all(outputs, names))
                if lines:
                    self._emit([Record(f.stream_id, f.index, f.pts, f.wall_time, line) for line in lines])
        self.results += len(results)
        if records:
            self._emit(records)

    def _hook_lines(self, outputs: list[Output], stream_id: str) -> None:
        """What analytics writes outside a result (predicted boxes of skipped frames, held events, the
        leaves at a stream's end), as JSON lines."""
        lines = encode_all(outputs, self.config.model.class_names)
        worker = next((w for w in reversed(self.workers) if w.cfg.id == stream_id), None)
        r = self._resume.get(stream_id)
        index = worker.position()[0] - 1 if worker is not None else (r.index if r else 0)
        self._emit([Record(stream_id, index, None, time.time(), line) for line in lines])

    def start(self) -> None:
        assert self.scheduler is not None, "build() first"
        with self._edit_lock:
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
            self.clips.close()  # open clips end with what they have; queued ones are written
            for sid, hook in self.analytics.items():  # lines held after the last result
                with hook.lock:
                    if outputs := hook.flush():
                        self._hook_lines(outputs, sid)
        finally:  # stage threads still running may use the buffers: then leak them rather than free them
            idle = not self._started or self.scheduler is None or self.scheduler.join(0)
            if self.stages is not None and idle:
                try:
                    self.stages.close()
                except Exception:  # cleanup must not hide the real outcome
                    log.exception("closing the engine failed")
                self.stages = None

    @property
    def stage_failed(self) -> bool:
        """A stage of the pipeline raised (the scheduler stopped): a bug or a broken engine, not a stream."""
        return self.scheduler is not None and self.scheduler.error is not None

    @property
    def failed(self) -> bool:
        """A stage failed or a stream gave up."""
        return self.stage_failed or any(w.stats.state == "failed" for w in self.workers)

    def stats(self) -> WorkerStats:
        """The worker's counters, per stream and its own (read from another thread: values may be a tick
        apart, never inconsistent in type)."""
        workers = list(self.workers)  # a reload may edit the list meanwhile
        now = time.monotonic()
        mark, before = self._mark
        counts = {}
        for w in workers:
            # the queue is gone once a reload retired the stream since the list was taken (counts carried)
            c = _counters(w, self._queues.get(w)) + self._carried.get(w.cfg.id, StreamCounters())
            counts[w.cfg.id] = c
        totals: Totals = {}
        for w in workers:
            c = counts[w.cfg.id]
            running = w.stats.state == "running"
            totals[w.cfg.id] = (self.latency[w.cfg.id].results, c.decoded, c.dropped, running)
        if now - mark >= 2.0:
            self._mark, self._rates = (now, totals), window_rates(workers, before, totals, now - mark)
        per_stream: dict[str, StreamReport] = {}
        for w in workers:
            s, sid = w.stats, w.cfg.id
            fps, decode_fps, behind = self._rates.get(sid, (0.0, 0.0, False))
            per_stream[sid] = StreamReport(
                s.state,
                dataclasses.replace(counts[sid], inferred=totals[sid][0]),
                self.latency[sid].snapshot(),
                fps=round(fps, 2),
                decode_fps=round(decode_fps, 2),
                behind=behind,
                decoder=s.decoder,
                last_error=s.last_error,
                last_packet_age_s=s.last_packet_age_s,
                nominal_fps=w.nominal_fps,
                crossings=dict(self._crossings.get(sid, {})),
            )
        for sid, carried in list(self._carried.items()):  # removed by a reload: its counts stay counted
            if sid not in per_stream:
                latency = self.latency[sid]
                inferred = dataclasses.replace(carried, inferred=latency.results)
                crossings = dict(self._crossings.get(sid, {}))
                per_stream[sid] = StreamReport("removed", inferred, latency.snapshot(), crossings=crossings)
        sched = self.scheduler
        return WorkerStats(
            results=self.results,
            batches=sched.batches if sched else 0,
            frames=sched.frames if sched else 0,
            batch_size=self.config.pipeline.batch_size,
            early_batches=self.batcher.early if self.batcher else 0,
            error=repr(sched.error) if sched and sched.error else None,
            per_stream=per_stream,
        )


def _counters(w: StreamReader, queue: StreamQueue | None) -> StreamCounters:
    """A stream thread's counters; dropped: the frames its queue dropped (none once the queue is gone) and
    the NVDEC pictures that found no free pooled buffer (the pipeline behind as well)."""
    s = w.stats
    return StreamCounters(
        decoded=s.decoded,
        skipped=s.skipped,
        decode_errors=s.decode_errors,
        read_errors=s.read_errors,
        reconnects=s.reconnects,
        stalls=s.stalls,
        dropped=(queue.dropped if queue is not None else 0) + s.dropped_surfaces,
    )


def window_rates(
    workers: Sequence[StreamReader], before: Totals, totals: Totals, dt: float
) -> dict[str, tuple[float, float, bool]]:
    """(results fps, decoded fps, behind) per stream over a window; ``behind``: a live stream (camera, or a
    file paced in real time) that dropped frames, or decoded under 90 % of its frame rate in a window it ran
    all through (one that began mid-window, e.g. at a busy start, has not fallen behind)."""
    rates = {}
    for w in workers:
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
