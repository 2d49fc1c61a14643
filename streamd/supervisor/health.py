"""A stream's health from its snapshot entry (``ok``, ``starting``, ``ended`` or ``down``, and why): the
supervisor's snapshot computes it, and ``/metrics``, ``/healthz`` and the status page derive it the same way
from a snapshot made without it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamd.config.metrics import MetricsConfig

STALE_AFTER_S = MetricsConfig.stale_after_s  # metrics.stale_after_s's default
STALE_FRAME_PERIODS = 10  # a slow camera (1 fps) is stale only after this many of its frame periods
UNRESPONSIVE_S = 4.0  # a ready worker that sent nothing for this long (it sends stats every 0.5 s)

# health of one stream: ok (delivering), starting (opening, not yet known), ended (a file finished), down
HEALTHS = ("ok", "starting", "ended", "down")


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
