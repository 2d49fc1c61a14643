"""``sinks:`` — where the JSON lines go; each item is picked by its ``type:``.

Every sink has ``queue_size`` (lines buffered; beyond it lines are dropped and counted), ``skip_empty``
(leave out frames without detections) and ``drops_ok`` (dropped lines do not make the exit status non-zero).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Union

from streamd.config._fields import (
    RELATIVE_NOTE,
    Invalid,
    Problems,
    describe,
    existing_file,
    opt,
    path_text,
    read_section,
    required,
    resolve_path,
    suggest,
)
from streamd.config.home_assistant import HomeAssistantConfig, parse_home_assistant

_QUEUE_DOC = "lines buffered for this sink; when full, new lines are dropped and counted"
_SKIP_DOC = "leave out frames without detections"
_DROPS_DOC = "lines this sink drops do not make the exit status non-zero"


@dataclass(frozen=True)
class JsonlSinkConfig:
    """Append one JSON line per frame result to a file; rotation by size and/or age, reopen on SIGHUP."""

    path: Path = required(  # noqa: RUF009 (required() is a dataclasses.field)
        "the output file, relative to the config file's folder; its folder must exist",
        ask="the output file, relative to the config file's folder",
    )
    flush_every: int = opt(1, "flush the file after this many lines", ge=1)
    queue_size: int = opt(4096, _QUEUE_DOC, ge=1)
    rotate_bytes: int = opt(0, "rotate when the file reaches this many bytes; 0 = never by size", ge=0)
    rotate_interval_s: float = opt(
        0.0, "rotate when the file is this many seconds old; 0 = never by age", ge=0
    )
    keep: int = opt(5, "rotated files kept (path.1 is the newest); older ones are deleted", ge=1, le=1000)
    fsync: Literal["never", "rotate", "flush"] = opt(
        "rotate", "fsync the file: never, at rotation/reopen/close, or after every flush"
    )
    skip_empty: bool = opt(False, _SKIP_DOC)
    drops_ok: bool = opt(False, _DROPS_DOC)
    type: Literal["jsonl"] = field(default="jsonl", init=False)


@dataclass(frozen=True)
class StdoutSinkConfig:
    """Write one JSON line per frame result to standard output (logs go to stderr)."""

    queue_size: int = opt(4096, _QUEUE_DOC, ge=1)
    skip_empty: bool = opt(False, _SKIP_DOC)
    drops_ok: bool = opt(False, _DROPS_DOC)
    type: Literal["stdout"] = field(default="stdout", init=False)


_TOPIC = r"[^#+\s]+"  # publish topics take no wildcards


@dataclass(frozen=True)
class MqttSinkConfig:
    """Publish each JSON line to an MQTT broker (paho-mqtt), one topic per stream."""

    host: str = required(
        "the broker's host name or IP address",
        pattern=r"[^\s/]+",
        pattern_doc="a host name or IP address (no spaces or slashes)",
    )
    port: int = opt(1883, "the broker's TCP port (8883 is usual with tls: true)", ge=1, le=65535)
    tls: bool = opt(False, "connect with TLS (system CAs unless ca_file is given)")
    ca_file: Path | None = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        None, "CA certificate file (PEM) for tls: true; default: the system CAs"
    )
    username: str = opt("", "user name; empty = no login")
    password_file: Path | None = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        None, "file holding the password (first line); never logged"
    )
    password_env: str = opt(
        "",
        "environment variable holding the password (used when password_file is not given); never logged",
        pattern=r"[A-Za-z_][A-Za-z0-9_]*",
        pattern_doc="an environment variable name",
    )
    client_id: str = opt("", "MQTT client id; empty = streamd-<host name>-<process id>")
    topic: str = opt(
        "streamd/{stream}/detections",
        "topic of each line; {stream} is replaced by the stream id",
        pattern=_TOPIC,
        pattern_doc="an MQTT topic without wildcards or spaces; {stream} = the stream id",
    )
    qos: int = opt(1, "MQTT quality of service of the lines: 0, 1 or 2", ge=0, le=2)
    status_topic: str = opt(
        "streamd/{stream}/status",
        "retained per-stream status: online once the stream's first line is out, offline at exit",
        pattern=_TOPIC,
        pattern_doc="an MQTT topic without wildcards or spaces; {stream} = the stream id",
    )
    availability_topic: str = opt(
        "streamd/status",
        "retained online/offline of this streamd; the broker publishes offline (last will) if it dies",
        pattern=_TOPIC,
        pattern_doc="an MQTT topic without wildcards or spaces",
    )
    keepalive_s: int = opt(30, "MQTT keepalive; a dead broker is noticed within about 1.5 x this", ge=5)
    home_assistant: HomeAssistantConfig = field(
        default_factory=HomeAssistantConfig,
        metadata={"doc": "Home Assistant MQTT discovery of each stream's sensors (off by default)"},
    )
    reconnect_max_s: float = opt(30.0, "longest wait between reconnect attempts (backoff doubles)", ge=1)
    queue_size: int = opt(4096, _QUEUE_DOC, ge=1)
    skip_empty: bool = opt(False, _SKIP_DOC)
    drops_ok: bool = opt(False, _DROPS_DOC)
    type: Literal["mqtt"] = field(default="mqtt", init=False)


@dataclass(frozen=True)
class HttpSinkConfig:
    """POST the lines as JSON arrays (batches) to an HTTP endpoint (a webhook)."""

    url: str = required(
        "the endpoint, http:// or https://",
        pattern=r"https?://[^\s]+",
        pattern_doc="an http:// or https:// URL",
    )
    batch_size: int = opt(100, "most lines in one POST", ge=1, le=100000)
    batch_timeout_ms: float = opt(
        1000.0, "longest a line waits for its batch to fill before it is sent", ge=0
    )
    timeout_s: float = opt(10.0, "timeout of each request (connect and each read)", gt=0)
    retry_max_s: float = opt(
        30.0, "longest wait between retries of a batch after a 5xx or a connection error", ge=0.1
    )
    queue_size: int = opt(4096, _QUEUE_DOC, ge=1)
    skip_empty: bool = opt(False, _SKIP_DOC)
    drops_ok: bool = opt(False, _DROPS_DOC)
    type: Literal["http"] = field(default="http", init=False)


@dataclass(frozen=True)
class RedisSinkConfig:
    """Append each JSON line to a Redis Stream (XADD), at least once: while the server is away the lines wait
    in an on-disk spool, bounded in bytes, and are sent in order when it is back."""

    host: str = required(
        "the Redis server's host name or IP address",
        pattern=r"[^\s/]+",
        pattern_doc="a host name or IP address (no spaces or slashes)",
    )
    spool_dir: Path = required(  # noqa: RUF009 (required() is a dataclasses.field)
        "folder of the on-disk spool (lines wait there while the server is away; kept across restarts); "
        "created if missing, its parent must exist; one folder per sink",
        ask="a folder for the spool, relative to the config file's folder",
    )
    port: int = opt(6379, "the Redis server's TCP port", ge=1, le=65535)
    db: int = opt(0, "Redis database number", ge=0)
    username: str = opt("", "ACL user name; empty = the default user")
    password_file: Path | None = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        None, "file holding the password (first line); never logged"
    )
    password_env: str = opt(
        "",
        "environment variable holding the password (used when password_file is not given); never logged",
        pattern=r"[A-Za-z_][A-Za-z0-9_]*",
        pattern_doc="an environment variable name",
    )
    key: str = opt(
        "streamd:{stream}",
        "the Redis Stream each line is added to; {stream} is replaced by the stream id",
        pattern=r"\S+",
        pattern_doc="a Redis key without spaces; {stream} = the stream id",
    )
    maxlen: int = opt(
        100000, "each Redis Stream is trimmed to about this many entries (XADD MAXLEN ~); 0 = never", ge=0
    )
    batch_size: int = opt(100, "most lines sent in one round trip (pipelined XADDs)", ge=1, le=10000)
    timeout_s: float = opt(5.0, "timeout of the connect and of each reply", gt=0)
    retry_max_s: float = opt(5.0, "longest wait between attempts while the server is away", ge=0.1)
    spool_max_bytes: int = opt(
        1 << 30,
        "most bytes the spool holds; beyond it the oldest lines are dropped and counted",
        ge=1 << 20,
        le=1 << 40,
    )
    queue_size: int = opt(4096, _QUEUE_DOC, ge=1)
    skip_empty: bool = opt(False, _SKIP_DOC)
    drops_ok: bool = opt(False, _DROPS_DOC)
    type: Literal["redis"] = field(default="redis", init=False)


SinkConfig = Union[  # noqa: UP007
    JsonlSinkConfig, StdoutSinkConfig, MqttSinkConfig, HttpSinkConfig, RedisSinkConfig
]
SINK_TYPES: dict[str, type] = {
    "jsonl": JsonlSinkConfig,
    "stdout": StdoutSinkConfig,
    "mqtt": MqttSinkConfig,
    "http": HttpSinkConfig,
    "redis": RedisSinkConfig,
}
DEFAULT_SINKS: tuple[SinkConfig, ...] = (StdoutSinkConfig(),)


def check_output_file(value: object, path: str, base_dir: Path) -> Path:
    full = resolve_path(path_text(value, path, "the path of the output file"), base_dir)
    if full.is_dir():
        raise Invalid(f"{str(value)!r} is a folder ({full}); give a file path", path)
    if not full.parent.is_dir():
        note = "" if os.path.isabs(os.path.expanduser(str(value))) else f"; {RELATIVE_NOTE}"
        raise Invalid(
            f"folder not found: {str(full.parent)!r} (for {str(value)!r}{note}); create it first", path
        )
    return full


def check_topic_template(value: object, path: str, pattern: str, doc: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise Invalid(f"expected {doc}, got {describe(value)}", path)
    names = set(re.findall(r"\{([^{}]*)\}", value))
    if names - {"stream"}:
        wrong = sorted(names - {"stream"})[0]
        raise Invalid(f"unknown placeholder {{{wrong}}} in {value!r}; the only one is {{stream}}", path)
    return value


def check_spool_dir(value: object, path: str, base_dir: Path) -> Path:
    full = resolve_path(path_text(value, path, "the spool folder"), base_dir)
    if full.exists() and not full.is_dir():
        raise Invalid(f"{str(value)!r} is a file ({full}); give a folder for the spool", path)
    if not full.exists() and not full.parent.is_dir():
        note = "" if os.path.isabs(os.path.expanduser(str(value))) else f"; {RELATIVE_NOTE}"
        raise Invalid(
            f"folder not found: {str(full.parent)!r} (the parent of {str(value)!r}{note}); create it first",
            path,
        )
    return full


def _specials(cls: type, base_dir: Path) -> dict:
    if cls is JsonlSinkConfig:
        return {"path": lambda v, p: check_output_file(v, p, base_dir)}
    if cls is MqttSinkConfig:

        def file(v: object, p: str) -> Path:
            return existing_file(path_text(v, p, "a file path"), p, base_dir)

        def topic(doc: str) -> object:
            return lambda v, p: check_topic_template(v, p, _TOPIC, doc)

        return {
            "ca_file": file,
            "password_file": file,
            "topic": topic("an MQTT topic without wildcards or spaces; {stream} = the stream id"),
            "status_topic": topic("an MQTT topic without wildcards or spaces; {stream} = the stream id"),
        }
    if cls is RedisSinkConfig:
        return {
            "spool_dir": lambda v, p: check_spool_dir(v, p, base_dir),
            "password_file": lambda v, p: existing_file(path_text(v, p, "a file path"), p, base_dir),
            "key": lambda v, p: check_topic_template(v, p, r"\S+", "a Redis key without spaces"),
        }
    return {}


def parse_sinks(raw: object, problems: Problems, base_dir: Path) -> tuple[SinkConfig, ...]:
    """Check the ``sinks:`` list (absent = one stdout sink)."""
    types = ", ".join(repr(t) for t in SINK_TYPES)
    if not isinstance(raw, list):
        problems.add("sinks", f"expected a list of sinks (each with type: {types}), got {describe(raw)}")
        return DEFAULT_SINKS
    if not raw:
        problems.add("sinks", "the list is empty; add a sink, or delete sinks: to write to stdout")
        return DEFAULT_SINKS
    sinks: list[SinkConfig] = []
    first_use: dict[Path, int] = {}
    stdout_index: int | None = None
    for index, item in enumerate(raw):
        here = f"sinks[{index}]"
        if not isinstance(item, dict):
            problems.add(here, f"expected a mapping with type: ({types}), got {describe(item)}")
            continue
        kind = item.get("type")
        if kind is None:
            problems.add(f"{here}.type", f"required key missing; add type: with one of {types}")
            continue
        if not isinstance(kind, str) or kind not in SINK_TYPES:
            hint = suggest(kind, SINK_TYPES) if isinstance(kind, str) else ""
            shown = repr(kind) if isinstance(kind, str) else describe(kind)
            problems.add(f"{here}.type", f"unknown sink type {shown}; valid types: {types}{hint}")
            continue
        cls = SINK_TYPES[kind]
        before = len(problems.items)
        special = _specials(cls, base_dir)
        if cls is MqttSinkConfig:  # a nested section: its own problems, with their key paths
            special["home_assistant"] = lambda v, p: parse_home_assistant(v, p, problems)
        given = read_section(cls, item, here, problems, special=special, extra_keys=["type"])
        if given is None or len(problems.items) > before:
            continue
        sink = cls(**given)
        if isinstance(sink, JsonlSinkConfig):
            if sink.path in first_use:
                problems.add(
                    f"{here}.path",
                    f"{str(sink.path)!r} is already written by sinks[{first_use[sink.path]}]; "
                    "give each jsonl sink its own file",
                )
            first_use.setdefault(sink.path, index)
        elif isinstance(sink, StdoutSinkConfig):
            if stdout_index is not None:
                problems.add(
                    f"{here}.type",
                    f"stdout is already written by sinks[{stdout_index}]; keep one stdout sink",
                )
            else:
                stdout_index = index
        elif isinstance(sink, RedisSinkConfig):
            if sink.spool_dir in first_use:
                problems.add(
                    f"{here}.spool_dir",
                    f"{str(sink.spool_dir)!r} is already used by sinks[{first_use[sink.spool_dir]}]; "
                    "give each redis sink its own spool folder",
                )
            first_use.setdefault(sink.spool_dir, index)
        elif isinstance(sink, MqttSinkConfig) and sink.ca_file is not None and not sink.tls:
            problems.add(
                f"{here}.ca_file", "ca_file is given but tls is false; set tls: true or drop ca_file"
            )
        sinks.append(sink)
    return tuple(sinks)
