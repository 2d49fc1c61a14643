"""``metrics:`` — the optional HTTP endpoint: Prometheus metrics, health, the status page, and the control
API (``metrics.api``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from streamd.config._fields import (
    Invalid,
    Problems,
    existing_file,
    opt,
    path_text,
    read_section,
    resolve_path,
)


@dataclass(frozen=True, repr=False)
class ApiConfig:
    """``metrics.api``: list, add, change and remove streams at run time, trigger clips, read recent events
    (``/api/streams``, ``/api/events``) on the metrics port. A bearer token is required once the port is
    bound to anything but a loopback address."""

    enabled: bool = opt(False, "serve the control API under /api/ on the metrics port")
    token: str = opt("", "bearer token every API request must carry (Authorization: Bearer ...)")
    token_file: Path | None = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        None, "file holding the token (first line), instead of token:; never logged"
    )
    state_file: Path | None = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        None,
        "JSON file where the API's stream changes are kept so a restart keeps them; its entries win over "
        "the config file's streams of the same id; default: changes last until the process ends",
    )
    events: int = opt(1000, "recent event lines kept in memory for GET /api/events", ge=1, le=100000)
    max_body_bytes: int = opt(65536, "largest request body accepted (413 beyond)", ge=1024, le=16 << 20)
    timeout_s: float = opt(
        10.0, "a request's socket timeout and the longest it waits for its change to apply", gt=0, le=300
    )

    def __repr__(self) -> str:  # a logged config never shows the token
        shown = ", ".join(
            f"{f.name}={'***' if f.name == 'token' and self.token else getattr(self, f.name)!r}"
            for f in fields(self)
        )
        return f"ApiConfig({shown})"


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
    api: ApiConfig = field(default_factory=ApiConfig, metadata={"doc": "the control API (off by default)"})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1): nobody else can connect."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parse_api(raw: object, path: str, problems: Problems) -> ApiConfig | None:
    base_dir = problems.base_dir

    def token_file(value: object, here: str) -> Path:
        return existing_file(path_text(value, here, "a file path"), here, base_dir)

    def state_file(value: object, here: str) -> Path:
        full = resolve_path(path_text(value, here, "a file path"), base_dir)
        if full.is_dir():
            raise Invalid(f"{str(value)!r} is a folder ({full}); give a file path", here)
        if not full.parent.is_dir():
            raise Invalid(f"folder not found: {str(full.parent)!r}; create it first", here)
        return full

    given = read_section(
        ApiConfig, raw, path, problems, special={"token_file": token_file, "state_file": state_file}
    )
    if given is None:
        return None
    if given.get("token") and given.get("token_file"):
        problems.add(f"{path}.token", "give token or token_file, not both; keep token_file")
    return ApiConfig(**given)


def parse_metrics(raw: object, problems: Problems) -> MetricsConfig:
    """Check the ``metrics:`` section (absent or empty = all defaults)."""
    given = read_section(
        MetricsConfig,
        {} if raw is None else raw,
        "metrics",
        problems,
        special={"api": lambda v, p: _parse_api(v, p, problems)},
    )
    if given is None:
        return MetricsConfig()
    if given.get("api") is None:
        given.pop("api", None)
    config = MetricsConfig(**given)
    verify_api(config, problems)
    return config


def verify_api(config: MetricsConfig, problems: Problems) -> None:
    """The API serves on the metrics port, and changes streams: off-loopback it must ask for a token."""
    api = config.api
    if not api.enabled or not problems.ok("metrics.api", "metrics.host"):
        return
    if not config.enabled:
        problems.add(
            "metrics.api.enabled",
            "the control API is served on the metrics port, which is off; set metrics.enabled: true",
        )
    if not is_loopback(config.host) and not (api.token or api.token_file):
        problems.add(
            "metrics.api.token",
            f"metrics.host {config.host!r} lets other machines reach the control API, so it needs a bearer "
            "token: set metrics.api.token_file (or token), or bind metrics.host: 127.0.0.1",
        )
