"""What the HTTP port serves (``streamd.supervisor.server``, default 127.0.0.1:9108), built from a snapshot.

``GET /metrics`` (Prometheus text from prometheus-client), ``GET /healthz`` (JSON: ``status`` ok | degraded |
unhealthy with the streams that are down and why; 503 when unhealthy, see ``health``),
``GET /`` (status page), ``GET /api/status`` (the page's JSON), ``GET /streams/{id}/snapshot.jpg`` (the latest
frame of a stream with its boxes). One daemon thread per request; this module knows nothing about the
pipeline: every number comes from the supervisor's ``snapshot()`` dict, read at scrape time.

The snapshot dict (every key optional except ``per_stream``)::

    elapsed_s: float                   seconds since start
    results: int                       frames whose results were produced, all streams
    stalled: bool                      the pipeline is wedged (streams run, no result for a while)
    per_stream: {stream_id: {
        state: str                     starting | running | reconnecting | no_decoder | stalled | ended |
                                       failed | restarting | unresponsive (no_decoder: waiting for room on
                                       the GPU's decoders; the last two: its worker process)
        health: str, health_reason: str   ok | starting | ended | down, and why (health.stream_health;
                                       derived from state when absent)
        stale: bool, last_packet_age_s: float | None, last_error: str
        stalled: bool                  this stream delivers nothing although it should (or state 'stalled')
        worker: str | int              the worker process carrying the stream (a label)
        worker_exists: bool            False once that process finished or a reload retired it (no series)
        decoded, inferred, skipped, dropped, decode_errors, read_errors, reconnects, stalls: int (counters)
        fps: float                     results per second, recent
        latency: LatencyHistograms.to_dict()   per-stage latency histograms (since the worker started)
        crossings: {line: {class label: {"in" | "out": int}}}   streams[].lines counters (absent: none yet)
    }}
    sinks: {name: dropped}  or  sink_stats: {name: LineSink.stats()}   (queue depth = stats' ``queued``)
    batches: {worker: {batches: int, frames: int, size: int}}         batch fill = frames / (batches * size)
    workers: {worker: {pid: int, rss_bytes: int, gpu_memory_bytes: int, restarts: int}}
    gpu_memory_bytes: {device: int}
    engines: {device: {batches: int, rows: int, waiting: int}}   engine.shared's engine processes

GPU memory needs no CUDA in the supervisor: where ``nvidia-smi`` exists, it is asked (at most every 5 s) for
each GPU's used memory and each process's, matched to the workers' ``pid`` (values in the snapshot win).

Histograms arrive as data, not as calls: each worker keeps one ``LatencyHistograms`` per stream, calls
``observe(result.latency_ms)`` per frame result (a few bisects) and ships its ``snapshot()`` in its
``protocol.WorkerStats`` at least once a second; the supervisor sums them over every process that carried the
stream (restarts, the spare, reload moves), so they never go back, and puts them in the snapshot dict in the
``to_dict()`` form above.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from streamd.cluster.report import cluster_families
from streamd.latency import LATENCY_BUCKETS_MS
from streamd.supervisor.health import HEALTHS
from streamd.supervisor.health import stream_health as derive_health

if TYPE_CHECKING:
    from prometheus_client.core import Metric
    from prometheus_client.registry import CollectorRegistry

# prometheus_client is imported where it is used: a box that never serves metrics needs none to run.

log = logging.getLogger(__name__)

Snapshot = Callable[[], dict]
FrameSnapshot = Callable[[str], "bytes | None"]

STATES = (
    "starting",
    "running",
    "reconnecting",
    "no_decoder",
    "stalled",
    "ended",
    "failed",
    "restarting",
    "unresponsive",
)
STREAM_DOWN = ("degraded", "unhealthy")  # metrics.stream_down
COUNTERS = {
    "decoded": "Frames decoded.",
    "inferred": "Frames that went through the detector.",
    "skipped": "Frames decoded but not sent to the detector (detect_fps).",
    "dropped": "Decoded frames dropped because the pipeline was behind.",
    "decode_errors": "Packets or pictures the decoder rejected.",
    "read_errors": "Demux/read failures.",
    "reconnects": "Reconnects of the source.",
    "stalls": "Times the source stopped delivering packets (stall timeout).",
}


def stream_stalled(stats: Mapping[str, Any]) -> bool:
    return bool(stats.get("stalled")) or stats.get("state") == "stalled"


def stream_health(stats: Mapping[str, Any]) -> tuple[str, str]:
    """(health, reason) of a stream: the snapshot's own (``health.stream_health``), else derived from its
    state here (a snapshot built by hand)."""
    if "health" in stats:
        return str(stats["health"]), str(stats.get("health_reason") or "")
    health, reason, _stale = derive_health(stats)
    return health, reason


def health(snapshot: Mapping[str, Any], stream_down: str = "degraded") -> tuple[bool, dict]:
    """(healthy, body). ``status`` is ``ok`` (every stream delivering, or starting, or ended), ``degraded``
    (some streams down: named in ``down_streams`` with the reason; HTTP 200 unless ``stream_down`` is
    ``unhealthy``) or ``unhealthy`` (HTTP 503: the pipeline is wedged, or every stream that should deliver is
    down, or some stream is down and ``stream_down`` is ``unhealthy``). ``ok`` is true only for ``ok``."""
    per_stream = snapshot.get("per_stream", {})
    streams = {}
    for sid, s in per_stream.items():
        h, reason = stream_health(s)
        streams[sid] = {
            "state": s.get("state"),
            "health": h,
            **({"reason": reason} if reason else {}),
            "stalled": stream_stalled(s),
            "stale": bool(s.get("stale")),
            "last_packet_age_s": s.get("last_packet_age_s"),
            "last_error": s.get("last_error") or None,
            "fps": round(float(s.get("fps", 0.0)), 2),
            "decoded": s.get("decoded", 0),
            "dropped": s.get("dropped", 0),
            "reconnects": s.get("reconnects", 0),
            **({"worker": s["worker"]} if "worker" in s else {}),
        }
    wedged = bool(snapshot.get("stalled"))
    down = {sid: s.get("reason", "") for sid, s in streams.items() if s["health"] == "down"}
    alive = [sid for sid, s in streams.items() if s["health"] in ("ok", "starting")]
    if wedged or (down and not alive) or (down and stream_down == "unhealthy"):
        state = "unhealthy"
    elif down:
        state = "degraded"
    else:
        state = "ok"
    body = {
        "ok": state == "ok",
        "status": state,
        "pipeline_wedged": wedged,
        "down_streams": down,
        "stalled_streams": sorted(sid for sid, s in streams.items() if s["stalled"]),
        "results": snapshot.get("results", 0),
        "running_streams": [sid for sid, s in streams.items() if s["state"] == "running"],
        "streams": streams,
    }
    return state != "unhealthy", body


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (this one by default) from /proc; 0 where unreadable."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class GpuMemory:
    """Used GPU memory per device and per process, from ``nvidia-smi`` (cached ``max_age_s``)."""

    def __init__(self, command: str = "nvidia-smi", max_age_s: float = 5.0) -> None:
        self._command = shutil.which(command)
        self._max_age_s = max_age_s
        self._at = -math.inf
        self._lock = threading.Lock()
        self.devices: dict[str, int] = {}
        self.processes: dict[int, int] = {}

    def read(self) -> tuple[dict[str, int], dict[int, int]]:
        """({device index: bytes used}, {pid: bytes used}); empty without nvidia-smi or a GPU."""
        if self._command is None:
            return {}, {}
        with self._lock:
            if time.monotonic() - self._at >= self._max_age_s:
                self._at = time.monotonic()
                self.devices = self._query("--query-gpu=index,memory.used", str)
                self.processes = self._query("--query-compute-apps=pid,used_memory", int)
            return self.devices, self.processes

    def _query(self, what: str, key: Callable[[str], Any]) -> dict:
        assert self._command is not None
        try:
            out = subprocess.run(
                [self._command, what, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=3,
            )
        except (OSError, subprocess.TimeoutExpired):
            self._command = None  # it does not work here; stop asking
            return {}
        found = {}
        for line in out.stdout.splitlines() if out.returncode == 0 else ():
            parts = [p.strip() for p in line.split(",")]
            with contextlib.suppress(ValueError, IndexError):
                found[key(parts[0])] = int(float(parts[1]) * 2**20)  # MiB
        return found


_GPU = GpuMemory()


class SnapshotCollector:
    """Turns one snapshot dict into metric families at scrape time (a prometheus_client collector)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        snap = self._snapshot()
        per_stream: Mapping[str, Mapping[str, Any]] = snap.get("per_stream", {})
        frames = CounterMetricFamily("streamd_frames", "Frames whose results were produced.")
        frames.add_metric([], snap.get("results", 0))
        yield frames
        yield _gauge(
            "streamd_uptime_seconds", "Seconds since the daemon started.", snap.get("elapsed_s", 0.0)
        )
        yield _gauge(
            "streamd_pipeline_stalled", "1 while the pipeline is wedged.", int(bool(snap.get("stalled")))
        )
        yield _gauge(
            "streamd_overloaded",
            "Live streams behind real time (decoding under their frame rate, or dropping); 0 = keeping up.",
            len(snap.get("overloaded", ())),
        )
        # Per-stream series are keyed by the stream alone: a stream moved to another worker (a reload, the
        # spare) keeps its series, so its counters never look reset. Which worker carries it: stream_worker.
        labels = ["stream"]

        def key(sid: str, s: Mapping[str, Any]) -> list[str]:
            return [sid]

        carrier = GaugeMetricFamily(
            "streamd_stream_worker",
            "1 for the worker process carrying the stream.",
            labels=["stream", "worker"],
        )
        for sid, s in per_stream.items():
            if s.get("worker_exists", True):  # not a finished or retired worker's
                carrier.add_metric([sid, str(s.get("worker", "0"))], 1)
        yield carrier

        for name, help_text in COUNTERS.items():
            family = CounterMetricFamily(f"streamd_stream_{name}", help_text, labels=labels)
            for sid, s in per_stream.items():
                if name in s:
                    family.add_metric(key(sid, s), s[name])
            yield family
        fps = GaugeMetricFamily(
            "streamd_stream_fps", "Results per second of the stream (recent).", labels=labels
        )
        up = GaugeMetricFamily(
            "streamd_stream_up",
            "1 while the stream is delivering (running, packets fresh); 0 while starting, down or ended.",
            labels=labels,
        )
        health_family = GaugeMetricFamily(
            "streamd_stream_health",
            "1 for the stream's current health: ok | starting | ended | down (refused, reconnecting, stale, "
            "failed, its worker restarting or not answering).",
            labels=[*labels, "health"],
        )
        age = GaugeMetricFamily(
            "streamd_stream_last_packet_age_seconds",
            "Seconds since the stream's last packet arrived (absent before the first).",
            labels=labels,
        )
        state = GaugeMetricFamily(
            "streamd_stream_state", "1 for the stream's current state.", labels=[*labels, "state"]
        )
        stalled = GaugeMetricFamily("streamd_stream_stalled", "1 while the stream is stalled.", labels=labels)
        behind = GaugeMetricFamily(
            "streamd_stream_behind", "1 while a live stream falls behind real time.", labels=labels
        )
        for sid, s in per_stream.items():
            behind.add_metric(key(sid, s), int(bool(s.get("behind"))))
            fps.add_metric(key(sid, s), float(s.get("fps", 0.0)))
            current_health, _reason = stream_health(s)
            up.add_metric(key(sid, s), int(current_health == "ok"))
            for h in HEALTHS:
                health_family.add_metric([*key(sid, s), h], int(h == current_health))
            if s.get("last_packet_age_s") is not None:
                age.add_metric(key(sid, s), float(s["last_packet_age_s"]))
            stalled.add_metric(key(sid, s), int(stream_stalled(s)))
            current = s.get("state", "")
            for st in (*STATES, *(() if current in STATES else (current,))):
                state.add_metric([*key(sid, s), st], int(st == current))
        yield from (fps, up, health_family, age, state, stalled, behind)
        yield _gauge(
            "streamd_streams_down",
            "Streams down now (refused, reconnecting, stale, failed, worker restarting); /healthz names them",
            sum(1 for s in per_stream.values() if stream_health(s)[0] == "down"),
        )
        latency = HistogramMetricFamily(
            "streamd_latency_seconds",
            "Per-stage latency of frame results (total: decode start to result; arrival: packet to result).",
            labels=[*labels, "stage"],
        )
        bounds = [str(b / 1000) for b in LATENCY_BUCKETS_MS] + ["+Inf"]
        for sid, s in per_stream.items():
            for stage, h in s.get("latency", {}).items():
                cumulative, running = [], 0
                for bound, count in zip(bounds, h["counts"], strict=True):
                    running += count
                    cumulative.append((bound, running))
                latency.add_metric([*key(sid, s), stage], cumulative, h["sum"] / 1000)
        yield latency
        crossings = CounterMetricFamily(
            "streamd_line_crossings",
            "Tracks that crossed a line (streams[].lines), per class and direction (in: onto its in_side).",
            labels=[*labels, "line", "class", "direction"],
        )
        for sid, s in per_stream.items():
            for line, by_class in s.get("crossings", {}).items():
                for label, by_direction in by_class.items():
                    for direction, n in by_direction.items():
                        crossings.add_metric([*key(sid, s), line, label, direction], n)
        yield crossings
        yield from _sink_families(snap)
        yield from _worker_families(snap)
        yield from _engine_families(snap.get("engines", {}))
        yield from cluster_families(snap.get("cluster"))  # nodes, leases, moves (cluster: only)


def _engine_families(engines: Mapping[int, Mapping[str, int]]) -> Iterator[Metric]:
    """engine.shared: each GPU's engine process. Rows / batches over a window is how full its merged batches
    run: at the engine's ``max_batch`` while Submits wait, it is the bottleneck."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if not engines:
        return
    batches = CounterMetricFamily(
        "streamd_engine_batches", "Batches the shared engine process ran, since start.", labels=["device"]
    )
    rows = CounterMetricFamily(
        "streamd_engine_rows", "Rows (frames) in those batches (workers' batches merged).", labels=["device"]
    )
    waiting = GaugeMetricFamily(
        "streamd_engine_waiting", "Workers' batches queued or in the engine's batches.", labels=["device"]
    )
    for device, e in engines.items():
        batches.add_metric([str(device)], e.get("batches", 0))
        rows.add_metric([str(device)], e.get("rows", 0))
        waiting.add_metric([str(device)], e.get("waiting", 0))
    yield from (batches, rows, waiting)


def _gauge(name: str, help_text: str, value: float) -> Metric:
    from prometheus_client.core import GaugeMetricFamily

    g = GaugeMetricFamily(name, help_text)
    g.add_metric([], value)
    return g


def _sink_families(snap: Mapping[str, Any]) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    stats: dict[str, Mapping[str, Any]] = dict(snap.get("sink_stats", {}))
    for name, dropped in snap.get("sinks", {}).items():
        stats.setdefault(name, {"dropped": dropped} if not isinstance(dropped, Mapping) else dropped)
    dropped = CounterMetricFamily("streamd_sink_dropped", "Lines a sink dropped.", labels=["sink"])
    written = CounterMetricFamily("streamd_sink_written", "Lines a sink delivered.", labels=["sink"])
    depth = GaugeMetricFamily("streamd_sink_queue_depth", "Lines waiting in a sink's queue.", labels=["sink"])
    broken = GaugeMetricFamily(
        "streamd_sink_broken",
        "1 while a sink cannot deliver: its output failed for good, or its broker cannot be reached.",
        labels=["sink"],
    )
    for name, s in stats.items():
        dropped.add_metric([name], s.get("dropped", 0))
        if "written" in s:
            written.add_metric([name], s["written"])
        if "queued" in s:
            depth.add_metric([name], s["queued"])
        broken.add_metric([name], int(bool(s.get("broken"))))
    yield from (dropped, written, depth, broken)


def _worker_families(snap: Mapping[str, Any]) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    fill = GaugeMetricFamily(
        "streamd_batch_fill_ratio", "Frames per batch / batch size, since start.", labels=["worker"]
    )
    batches = CounterMetricFamily("streamd_batches", "Batches run.", labels=["worker"])
    for wid, b in snap.get("batches", {}).items():
        batches.add_metric([str(wid)], b.get("batches", 0))
        if b.get("batches") and b.get("size"):
            fill.add_metric([str(wid)], b.get("frames", 0) / (b["batches"] * b["size"]))
    rss = GaugeMetricFamily(
        "streamd_resident_memory_bytes", "Resident memory of each process.", labels=["process"]
    )
    rss.add_metric(["supervisor"], rss_bytes())
    gpu = GaugeMetricFamily(
        "streamd_gpu_memory_bytes", "GPU memory in use by each worker process.", labels=["process", "device"]
    )
    devices, by_pid = _GPU.read()
    restarts = CounterMetricFamily(
        "streamd_worker_restarts", "Restarts of a worker process.", labels=["worker"]
    )
    for wid, w in snap.get("workers", {}).items():
        if "rss_bytes" in w:
            rss.add_metric([f"worker-{wid}"], w["rss_bytes"])
        used = w.get("gpu_memory_bytes", by_pid.get(w.get("pid") or -1))
        if used is not None:
            gpu.add_metric([f"worker-{wid}", str(w.get("device", 0))], used)
        if "restarts" in w:
            restarts.add_metric([str(wid)], w["restarts"])
    device_used = GaugeMetricFamily(
        "streamd_gpu_device_memory_used_bytes",
        "Memory in use on each GPU (every process).",
        labels=["device"],
    )
    for device, used in {**devices, **snap.get("gpu_memory_bytes", {})}.items():
        device_used.add_metric([str(device)], used)
    yield from (batches, fill, rss, gpu, device_used, restarts)


def _registry(snapshot: Snapshot) -> CollectorRegistry:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))  # type: ignore[arg-type]
    return registry


def render(snapshot: dict) -> str:
    """Prometheus exposition text for a snapshot."""
    from prometheus_client import generate_latest

    return generate_latest(_registry(lambda: snapshot)).decode()
