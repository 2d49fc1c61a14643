"""The supervisor's view of how the daemon is doing: one snapshot dict merged from the workers' stats (for
the status line, the summary, ``/metrics`` and the status page), stall detection, and the two renderings of
a snapshot for people (the status line and the closing summary)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from streamd.config.metrics import MetricsConfig
from streamd.sinks.base import LineSink
from streamd.supervisor.pool import COUNTERS, WorkerSlot, add_counters, add_latency

log = logging.getLogger("streamd.supervisor")  # the supervisor's own lines: one logger name for all of them

STALE_AFTER_S = MetricsConfig.stale_after_s  # metrics.stale_after_s's default
STALE_FRAME_PERIODS = 10  # a slow camera (1 fps) is stale only after this many of its frame periods
UNRESPONSIVE_S = 4.0  # a ready worker that sent nothing for this long (it sends stats every 0.5 s)

# health of one stream: ok (delivering), starting (opening, not yet known), ended (a file finished), down
HEALTHS = ("ok", "starting", "ended", "down")


def snapshot(
    workers: Sequence[WorkerSlot],
    sinks: Sequence[LineSink],
    *,
    owner: Mapping[str, WorkerSlot],
    past: WorkerSlot | None = None,
    started: float,
    batch_size: int,
    stall_s: float,
    stale_after_s: float = STALE_AFTER_S,
) -> dict:
    """Counters of every worker (earlier incarnations included), plain values only. ``owner`` maps each
    configured stream, in config order, to the slot that carries it (or carried it, while a reload moves
    it); ``past`` holds the counters of archived slots (``WorkerPool.archive_finished``); ``started`` is the
    monotonic start time, ``batch_size`` the configured one (until a worker reports its own).

    A stream's counters and latency histograms are those of every process that ever carried it, so they
    never go back (``/metrics`` exports them as Prometheus counters, the summary counts the whole run): a
    slot's ``base`` holds its dead incarnations' (``WorkerPool._retire``), its ``stats`` the current or last
    process's, a slot a reload retired keeps its last stats until it is archived into ``past``; so when a
    reload moves a stream to another slot the sum goes on. Totals count every stream, also those a reload
    removed (until their removal).

    Each stream also gets ``health`` (``HEALTHS``) and ``health_reason`` (why it is down, in words that stay
    the same while the cause does, so a sink can publish on change), ``stale`` (running, but its last packet
    is older than ``stale_limit``) and ``last_packet_age_s`` as of now (a worker that went silent does not
    freeze it); ``state`` is ``unresponsive`` while a ready worker sends nothing for ``UNRESPONSIVE_S``.
    ``down`` maps each stream that is down to its reason. ``workers`` and ``batches`` hold only the worker
    processes that exist or will be restarted (``exists``), so /metrics drops the series of the others."""
    now = time.monotonic()
    elapsed = max(now - started, 1e-9)
    counts: dict[str, dict[str, int]] = {}  # per stream, every process that carried it
    latency: dict[str, dict[str, dict]] = {}
    counted = [w for w in workers if not w.archived]
    for w in [*counted, *([past] if past is not None else [])]:
        current = w.stats.get("per_stream", {})
        for sid, base in list(w.base.items()):
            add_counters(counts.setdefault(sid, dict.fromkeys(COUNTERS, 0)), base)
        for sid, lat in list(w.base_latency.items()):
            add_latency(latency.setdefault(sid, {}), lat)
        for sid, s in current.items():
            add_counters(counts.setdefault(sid, dict.fromkeys(COUNTERS, 0)), s)
            add_latency(latency.setdefault(sid, {}), s.get("latency", {}))
    per_stream: dict[str, dict[str, Any]] = {}
    for sid, w in owner.items():
        s = dict(w.stats.get("per_stream", {}).get(sid, {}))
        s.update(counts.get(sid, dict.fromkeys(COUNTERS, 0)))
        s["latency"] = latency.get(sid, {})
        heard = getattr(w, "last_message", 0.0)  # monotonic time of the worker's last message (0: none)
        silent = now - heard if heard and w.alive and not w.done else 0.0
        if s.get("last_packet_age_s") is not None:  # as the worker saw it when it sent its stats
            s["last_packet_age_s"] = round(float(s["last_packet_age_s"]) + silent, 2)
        if w.gave_up:
            s["state"] = "failed"
        elif w.retired and not w.alive:  # a reload moves it: it starts again in a new worker
            s["state"], s["fps"], s["decode_fps"], s["behind"] = "starting", 0.0, 0.0, False
        elif not w.alive and not w.done:
            s["state"] = "restarting" if w.restarts else "starting"
        elif w.ready and silent > UNRESPONSIVE_S and s.get("state") not in ("ended", "failed"):
            s["state"], s["unresponsive_s"] = "unresponsive", round(silent, 1)
        else:
            s.setdefault("state", "starting")
        s["worker"], s["worker_exists"] = w.index, exists(w)
        s["health"], s["health_reason"], s["stale"] = stream_health(s, stale_after_s)
        per_stream[sid] = s
    current = [w for w in workers if exists(w)]
    results = sum(w.base_results + w.stats.get("results", 0) for w in counted)
    results += past.base_results if past is not None else 0
    return {
        "elapsed_s": elapsed,
        "results": results,
        "fps": results / elapsed,
        # the whole run: streams a reload removed count until their removal
        "dropped": sum(c["dropped"] for c in counts.values()),
        "decode_errors": sum(c["decode_errors"] for c in counts.values()),
        "skipped": sum(c["skipped"] for c in counts.values()),
        "streams": {sid: s["state"] for sid, s in per_stream.items()},
        "per_stream": per_stream,
        "workers": {
            w.index: {
                "pid": w.process.pid if w.process is not None else None,
                "alive": w.alive,
                "restarts": w.restarts,
                "lines": w.lines,
                "streams": list(w.stream_ids),
                "rss_bytes": rss_bytes(w.process.pid) if w.alive else 0,
            }
            for w in current
        },
        "batches": {
            w.index: {
                "batches": w.stats.get("batches", 0),
                "frames": w.stats.get("frames", 0),
                "size": w.stats.get("batch_size", batch_size),
            }
            for w in current
        },
        "sinks": {s.name: s.dropped for s in sinks},
        "sink_stats": {s.name: s.stats() for s in sinks},
        "stalled": stalled(workers, time.monotonic(), stall_s),
        # live streams decoding slower than their frame rate or dropping: more offered than the box takes
        "overloaded": sorted(sid for sid, s in per_stream.items() if s.get("behind")),
        "down": {sid: s["health_reason"] for sid, s in per_stream.items() if s["health"] == "down"},
    }


def exists(w: WorkerSlot) -> bool:
    """The worker's process runs, or will run (starting, or restarting after it died); not one a reload
    retired, that finished or that was given up, once its process is gone."""
    if w.alive:
        return True
    return not (w.archived or w.retired or w.done or w.gave_up)


def stale_limit(s: Mapping[str, Any], stale_after_s: float) -> float:
    """Seconds without a packet after which a running stream is stale: ``stale_after_s``, or
    ``STALE_FRAME_PERIODS`` frame periods of a slow source when that is longer (once its rate is known)."""
    fps = s.get("nominal_fps") or 0.0
    return max(stale_after_s, STALE_FRAME_PERIODS / fps) if fps > 0 else stale_after_s


def stream_health(s: Mapping[str, Any], stale_after_s: float = STALE_AFTER_S) -> tuple[str, str, bool]:
    """(health, reason, stale) of one stream's snapshot entry. ``reason`` says why a stream is down in words
    that stay the same while the cause does (no running seconds in it)."""
    state = s.get("state") or "starting"
    error = s.get("last_error") or ""
    if state == "running":
        age = s.get("last_packet_age_s")
        limit = stale_limit(s, stale_after_s)
        if age is not None and age > limit:
            return "down", f"stale: no packet for more than {limit:g} s", True
        if s.get("stalled"):
            return "down", "stalled: no frame although it should deliver", False
        return "ok", "", False
    if state == "starting":
        return "starting", "", False
    if state == "ended":
        return "ended", "", False
    why = {
        "reconnecting": "reconnecting",
        "no_decoder": "waiting for a GPU decoder",
        "failed": "failed",
        "stalled": "stalled",
        "restarting": "its worker process died; restarting",
        "unresponsive": f"its worker process sent nothing for more than {UNRESPONSIVE_S:g} s",
    }.get(state, state)
    if error and state in ("reconnecting", "no_decoder", "failed", "stalled"):
        why += f": {error}"
    return "down", why, False


def stalled(workers: Sequence[WorkerSlot], now: float, stall_s: float) -> bool:
    """Some worker has running streams but produced no result for ``stall_s``."""
    for w in workers:
        running = any(s.get("state") == "running" for s in w.stats.get("per_stream", {}).values())
        if running and w.alive and now - w.last_progress > stall_s:
            return True
    return False


def count_state(s: dict, state: str) -> int:
    """Streams of a snapshot in ``state``."""
    return sum(1 for st in s["streams"].values() if st == state)


def print_status(s: dict) -> None:
    """The one-line status on a terminal (rewritten in place)."""
    running = count_state(s, "running")
    sys.stderr.write(
        f"\r\x1b[Kstreamd: {running}/{len(s['streams'])} streams | {s['results']} frames | "
        f"{s['fps']:.1f} fps | dropped {s['dropped']} | decode errors {s['decode_errors']}"
        + (f" | OVERLOADED: {len(s['overloaded'])} behind real time" if s.get("overloaded") else "")
        + (f" | {waiting} waiting for a GPU decoder" if (waiting := count_state(s, "no_decoder")) else "")
    )
    sys.stderr.flush()


def log_summary(s: dict, sinks: Sequence[LineSink], workers: Sequence[WorkerSlot]) -> None:
    """The closing ``streamd: done: …`` line."""
    sink_drops = sum(x.dropped for x in sinks)
    restarts = sum(w.restarts for w in workers)
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


def rss_bytes(pid: int) -> int:
    """Resident memory of a process from /proc (0 where unreadable)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
