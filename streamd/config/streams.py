"""``streams:`` — the inputs: video files and RTSP cameras."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from streamd.config._fields import (
    Invalid,
    Problems,
    describe,
    existing_file,
    opt,
    read_section,
    required,
    value_of,
)

LIVE_SCHEMES = ("rtsp", "rtsps")
ID_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
_SECRET_PARAMS = {"password", "passwd", "pass", "pwd", "token", "key", "auth", "secret"}


@dataclass(frozen=True, repr=False)
class StreamConfig:
    """One input stream: a video file (read once, looped or paced) or a live RTSP camera."""

    id: str = required(
        "stream name, unique across streams; appears in every output line",
        pattern=ID_PATTERN,
        pattern_doc="1 to 64 characters from A-Z a-z 0-9 _ . -",
    )
    url: str = required(
        "a video file path (relative to the config file's folder; file:// allowed) or an rtsp:// or "
        "rtsps:// URL; file paths are stored resolved and absolute",
        ask="a video file path or an rtsp:// URL",
    )
    loop: bool = opt(False, "files only: start again from the beginning at the end of the file (never ends)")
    realtime: bool = opt(
        False, "files only: true = pace frames at the file's native frame rate; false = as fast as possible"
    )
    transport: Literal["tcp", "udp"] = opt(
        "tcp",
        "rtsp only: carry RTP over TCP (interleaved; robust) or UDP (lower latency; drops on lossy links)",
    )
    open_timeout_s: float = opt(10.0, "seconds to wait for the stream to open before the attempt fails", gt=0)
    read_timeout_s: float = opt(5.0, "seconds one read (a packet or a frame) may block before it fails", gt=0)
    stall_timeout_s: float = opt(
        10.0, "seconds without a new frame after which the stream counts as stalled and is reopened", gt=0
    )
    reconnect_initial_s: float = opt(
        0.5,
        "first wait before reopening a failed stream; the wait grows with each failure up to reconnect_max_s",
        gt=0,
    )
    reconnect_max_s: float = opt(
        30.0, "the longest wait between reopen attempts (>= reconnect_initial_s)", gt=0
    )
    reconnect_attempts: int = opt(
        0, "reopen attempts in a row before the stream is given up", ge=0, note="0 = retry forever"
    )

    def __repr__(self) -> str:  # the URL redacted, so logging a config never shows a password
        shown = (
            f"{f.name}={self.redacted_url if f.name == 'url' else getattr(self, f.name)!r}"
            for f in fields(self)
        )
        return f"StreamConfig({', '.join(shown)})"

    @property
    def is_live(self) -> bool:
        """True for rtsp:// and rtsps:// (live: no end, no pacing, no loop)."""
        return is_live_url(self.url)

    @property
    def path(self) -> Path | None:
        """The absolute file path of a file stream; None for a live stream."""
        if self.is_live:
            return None
        raw = self.url[len("file://") :] if self.url.lower().startswith("file://") else self.url
        return Path(os.path.abspath(os.path.expanduser(raw)))

    @property
    def redacted_url(self) -> str:
        """The URL safe to log: ``user:pass@`` becomes ``***@`` and password-like query values ``***``."""
        return redact_url(self.url)


def is_live_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in LIVE_SCHEMES if "://" in url else False


def redact_url(url: str) -> str:
    """``url`` with credentials replaced by ``***`` (user info and password-like query parameters)."""
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
            query = urlencode([(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_url(value: object, path: str, base_dir: Path) -> str:
    """A stream URL: an existing video file (returned absolute) or an rtsp(s):// URL with a host."""
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"expected a video file path or an rtsp:// URL, got {describe(value)}", path)
    url = value.strip()
    if "://" not in url:
        return str(existing_file(url, path, base_dir, "video file"))
    scheme = url.split("://", 1)[0].lower()
    if scheme == "file":
        return str(existing_file(url[len("file://") :], path, base_dir, "video file"))
    if scheme in LIVE_SCHEMES:
        shown = redact_url(url)
        try:
            parts = urlsplit(url)
            host, _ = parts.hostname, parts.port
        except ValueError as exc:
            raise Invalid(
                f"malformed {scheme} URL {shown!r}: {exc}; expected {scheme}://[user:pass@]host[:port]/path",
                path,
            ) from None
        if not host:
            raise Invalid(
                f"{scheme} URL {shown!r} has no host; expected {scheme}://[user:pass@]host[:port]/path", path
            )
        return url
    raise Invalid(
        f"unsupported URL scheme {scheme + '://'!r} in {redact_url(url)!r}; supported: a file path "
        "(optionally file://), rtsp://, rtsps://",
        path,
    )


def parse_streams(raw: object, problems: Problems, base_dir: Path) -> tuple[StreamConfig, ...]:
    """Check the ``streams:`` list; report every problem; return the streams that are valid."""
    if not isinstance(raw, list):
        problems.add("streams", f"expected a list of streams (each with id: and url:), got {describe(raw)}")
        return ()
    if not raw:
        problems.add("streams", "the list is empty; add at least one stream with id: and url:")
        return ()
    streams: list[StreamConfig] = []
    first_use: dict[str, int] = {}
    for index, item in enumerate(raw):
        here = f"streams[{index}]"
        given = read_section(
            StreamConfig,
            item,
            here,
            problems,
            special={"url": lambda v, p: check_url(v, p, base_dir)},
            what="a mapping with at least id: and url:",
        )
        if given is None:
            continue
        verify_stream_options(given, item, here, problems)
        stream_id = given.get("id")
        if stream_id is not None:
            if stream_id in first_use:
                problems.add(
                    f"{here}.id",
                    f"duplicate id {stream_id!r} (already used by streams[{first_use[stream_id]}]); "
                    "stream ids must be unique",
                )
            else:
                first_use[stream_id] = index
        if "id" in given and "url" in given:
            streams.append(StreamConfig(**given))
    return tuple(streams)


def verify_stream_options(given: dict[str, Any], raw: Any, path: str, problems: Problems) -> None:
    """Options that only fit one kind of stream, and reconnect_max_s >= reconnect_initial_s."""
    if "url" in given:
        live = is_live_url(given["url"])
        if live and raw.get("loop") is True:
            problems.add(
                f"{path}.loop",
                "loop applies to video files only; an rtsp stream is live and has no end. "
                "Delete loop: for this stream",
            )
        if not live and "transport" in raw:
            problems.add(
                f"{path}.transport", "transport applies to rtsp streams only; delete it for this file stream"
            )
    if problems.ok(f"{path}.reconnect_initial_s", f"{path}.reconnect_max_s"):
        initial = value_of(StreamConfig, given, "reconnect_initial_s")
        longest = value_of(StreamConfig, given, "reconnect_max_s")
        if longest < initial:
            problems.add(
                f"{path}.reconnect_max_s",
                f"reconnect_max_s {longest:g} is less than reconnect_initial_s {initial:g}; "
                f"raise reconnect_max_s to at least {initial:g} or lower reconnect_initial_s",
            )
