"""``metrics:`` — the optional HTTP endpoint: Prometheus metrics, health, the status page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streamd.config._fields import Problems, opt, read_section


@dataclass(frozen=True)
class MetricsConfig:
    """HTTP endpoint: ``/metrics`` (Prometheus), ``/healthz`` (JSON: ok | degraded | unhealthy; 503 when
    unhealthy), ``/`` (status). ``stale_after_s`` also drives the MQTT per-stream status."""

    enabled: bool = opt(False, "serve metrics over HTTP")
    host: str = opt(
        "127.0.0.1",
        "address to listen on; 0.0.0.0 = every interface",
        pattern=r"[^\s/]+",
        pattern_doc="a host name or IP address (no spaces or slashes)",
    )
    port: int = opt(9108, "TCP port to listen on", ge=1, le=65535)
    status_page: bool = opt(True, "serve the status page (/) and the latest frame of each stream as a JPEG")
    snapshots_per_s: float = opt(
        2.0,
        "most JPEG snapshots encoded per stream per second (a cached one is served in between)",
        gt=0,
        le=30,
    )
    stream_down: Literal["degraded", "unhealthy"] = opt(
        "degraded",
        "/healthz while some stream is down (refused, reconnecting, stale, failed) but not all: degraded = "
        "200 with status degraded naming the streams; unhealthy = 503 (any camera down is an outage)",
    )
    stale_after_s: float = opt(
        5.0,
        "a running stream whose last packet is older than this (or than 10 of its frame periods, when "
        "longer) counts as down (stale) before the source's stall_timeout_s reopens it",
        gt=0,
        le=3600,
    )


def parse_metrics(raw: object, problems: Problems) -> MetricsConfig:
    """Check the ``metrics:`` section (absent or empty = all defaults)."""
    given = read_section(MetricsConfig, {} if raw is None else raw, "metrics", problems)
    return MetricsConfig(**given) if given is not None else MetricsConfig()
