"""``metrics:`` — the optional HTTP endpoint: Prometheus metrics, health, the status page."""

from __future__ import annotations

from dataclasses import dataclass

from streamd.config._fields import Problems, opt, read_section


@dataclass(frozen=True)
class MetricsConfig:
    """HTTP endpoint: ``/metrics`` (Prometheus), ``/healthz`` (JSON; 503 when stalled), ``/`` (status)."""

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


def parse_metrics(raw: object, problems: Problems) -> MetricsConfig:
    """Check the ``metrics:`` section (absent or empty = all defaults)."""
    given = read_section(MetricsConfig, {} if raw is None else raw, "metrics", problems)
    return MetricsConfig(**given) if given is not None else MetricsConfig()
