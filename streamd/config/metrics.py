"""``metrics:`` — the optional Prometheus-style HTTP endpoint."""

from __future__ import annotations

from dataclasses import dataclass

from streamd.config._fields import Problems, opt, read_section


@dataclass(frozen=True)
class MetricsConfig:
    """An HTTP endpoint serving counters and latencies (``GET /metrics``)."""

    enabled: bool = opt(False, "serve metrics over HTTP")
    host: str = opt(
        "127.0.0.1",
        "address to listen on; 0.0.0.0 = every interface",
        pattern=r"[^\s/]+",
        pattern_doc="a host name or IP address (no spaces or slashes)",
    )
    port: int = opt(9108, "TCP port to listen on", ge=1, le=65535)


def parse_metrics(raw: object, problems: Problems) -> MetricsConfig:
    """Check the ``metrics:`` section (absent or empty = all defaults)."""
    given = read_section(MetricsConfig, {} if raw is None else raw, "metrics", problems)
    return MetricsConfig(**given) if given is not None else MetricsConfig()
