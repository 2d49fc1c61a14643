"""The supervisor's view of how the daemon is doing: one snapshot dict built from the workers' typed stats
(for the status line, the summary, ``/metrics`` and the status page; each stream's health from
``streamd.supervisor.health``), and the two renderings of a snapshot for people (the status line and the
closing summary)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from streamd.latency import histograms_to_dict
from streamd.protocol import StreamCounters, StreamTotals, fold
from streamd.sinks.base import LineSink
from streamd.supervisor.health import STALE_AFTER_S, UNRESPONSIVE_S, stream_health
from streamd.supervisor.metrics import rss_bytes
from streamd.supervisor.pool import WorkerSlot

log = logging.getLogger("streamd.supervisor")  # the supervisor's own lines: one logger name for all of them


def snapshot(
    workers: Sequence[WorkerSlot],
    sinks: Sequence[LineSink],
    *,
    owner: Mapping[str, WorkerSlot],
    past: WorkerSlot | None = None,
    started: float,
    batch_size: int,
    stalled: bool,
    stale_after_s: float = STALE_AFTER_S,
) -> dict:
    """The snapshot dict (described in ``streamd.supervisor.metrics``), built from the workers' typed stats;
    plain values only. ``owner`` maps each configured stream, in config order, to the slot that carries it
    (or carried it, while a reload moves it); ``past`` holds the counters of archived slots
    (``WorkerPool.archive_finished``); ``started`` is the monotonic start time, ``batch_size`` the configured
    one (until a worker reports its own), ``stalled`` whether the pipeline is wedged (``WorkerPool.stalled``).

    A stream's counters and latency histograms are those of every process that ever carried it, so they
    never go back (``/metrics`` exports them as Prometheus counters, the summary counts the whole run): a
    slot's ``base`` holds its dead incarnations' (``WorkerPool.end_incarnation``), its ``stats`` the current
    or last process's, a slot a reload retired keeps its last stats until it is archived into ``past``; so
    when a reload moves a stream to another slot the sum goes on. Totals count every stream, also those a
    reload removed (until their removal).

    Each stream also gets ``health`` (``health.HEALTHS``) and ``health_reason`` (why it is down, in words
    that stay the same while the cause does, so a sink can publish on change), ``stale`` (running, but its
    last packet is older than ``health.stale_limit``) and ``last_packet_age_s`` as of now (a worker that went
    silent does not freeze it); ``state`` is ``unresponsive`` while a ready worker sends nothing for
    ``UNRESPONSIVE_S``. ``down`` maps each stream that is down to its reason. ``workers`` and ``batches``
    hold only the worker processes that exist or will be restarted (``exists``), so /metrics drops the series
    of the others."""
    now = time.monotonic()
    elapsed = max(now - started, 1e-9)
    counted = [w for w in workers if not w.archived]
    totals: dict[str, StreamTotals] = {}  # per stream, every process that carried it
    for w in [*counted, *([past] if past is not None else [])]:
        fold(totals, w.totals())
    per_stream = {
        sid: _stream(sid, w, totals.get(sid, StreamTotals()), now, stale_after_s) for sid, w in owner.items()
    }
    run = sum((t.counters for t in totals.values()), StreamCounters())  # the whole run, removed streams too
    current = [w for w in workers if exists(w)]
    results = sum(w.results for w in counted) + (past.results if past is not None else 0)
    return {
        "elapsed_s": elapsed,
        "results": results,
        "fps": results / elapsed,
        "dropped": run.dropped,
        "decode_errors": run.decode_errors,
        "skipped": run.skipped,
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
                "batches": w.stats.batches,
                "frames": w.stats.frames,
                "size": w.stats.batch_size if w.stats.batch_size is not None else batch_size,
            }
            for w in current
        },
        "sinks": {s.name: s.dropped for s in sinks},
        "sink_stats": {s.name: s.stats() for s in sinks},
        "stalled": stalled,
        # live streams decoding slower than their frame rate or dropping: more offered than the box takes
        "overloaded": sorted(sid for sid, s in per_stream.items() if s.get("behind")),
        "down": {sid: s["health_reason"] for sid, s in per_stream.items() if s["health"] == "down"},
    }


def _stream(
    sid: str, w: WorkerSlot, totals: StreamTotals, now: float, stale_after_s: float
) -> dict[str, Any]:
    """One stream's entry of the snapshot: what its worker last reported, its totals over every process that
    carried it, and what the supervisor knows better (its worker died, went silent, or a reload moves it)."""
    report = w.stats.per_stream.get(sid)
    heard = w.last_message  # monotonic time of the worker's last message (0: none)
    silent = now - heard if heard and w.alive and not w.done else 0.0
    s: dict[str, Any] = {}
    if report is not None:
        age = report.last_packet_age_s  # as the worker saw it when it sent its stats
        s = {
            "state": report.state,
            "fps": report.fps,
            "decode_fps": report.decode_fps,
            "behind": report.behind,
            "decoder": report.decoder,
            "last_error": report.last_error,
            "last_packet_age_s": round(float(age) + silent, 2) if age is not None else None,
            "nominal_fps": report.nominal_fps,
        }
    s.update(totals.counters.as_dict())
    s["latency"] = histograms_to_dict(totals.latency)
    for (line, label, direction), n in sorted(totals.crossings.items()):  # {line: {class: {direction: n}}}
        s.setdefault("crossings", {}).setdefault(line, {}).setdefault(label, {})[direction] = n
    reported = report.state if report is not None else None
    if w.gave_up:
        s["state"] = "failed"
    elif w.retired and not w.alive:  # a reload moves it: it starts again in a new worker
        s["state"], s["fps"], s["decode_fps"], s["behind"] = "starting", 0.0, 0.0, False
    elif not w.alive and not w.done:
        s["state"] = "restarting" if w.restarts else "starting"
    elif w.ready and silent > UNRESPONSIVE_S and reported not in ("ended", "failed"):
        s["state"], s["unresponsive_s"] = "unresponsive", round(silent, 1)
    else:
        s["state"] = reported or "starting"
    s["worker"], s["worker_exists"] = w.index, exists(w)
    s["health"], s["health_reason"], s["stale"] = stream_health(s, stale_after_s)
    return s


def exists(w: WorkerSlot) -> bool:
    """The worker's process runs, or will run (starting, or restarting after it died); not one a reload
    retired, that finished or that was given up, once its process is gone."""
    if w.alive:
        return True
    return not (w.archived or w.retired or w.done or w.gave_up)


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
