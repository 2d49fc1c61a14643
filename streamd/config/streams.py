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
    coerce,
    describe,
    existing_file,
    opt,
    read_section,
    required,
    value_of,
)
from streamd.config.clips import ClipsConfig, override_clips
from streamd.config.coco import COCO_NAMES
from streamd.config.lines import LineConfig, parse_lines
from streamd.config.model import class_list, resolve_classes
from streamd.config.tracking import TrackingConfig, override_tracking
from streamd.geometry import polygon_problem

LIVE_SCHEMES = ("rtsp", "rtsps")
ID_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
_SECRET_PARAMS = {"password", "passwd", "pass", "pwd", "token", "key", "auth", "secret"}


ZONE_NAME_PATTERN = r"[A-Za-z0-9_.-]{1,64}"


@dataclass(frozen=True)
class ZoneConfig:
    """A named area of one stream's picture, a polygon in source pixels."""

    name: str = required(
        "zone name, unique within the stream; listed in each detection's zones and in events",
        pattern=ZONE_NAME_PATTERN,
        pattern_doc="1 to 64 characters from A-Z a-z 0-9 _ . -",
    )
    polygon: tuple[tuple[float, float], ...] = required(
        "at least 3 points [x, y] in source pixels (>= 0), in order around the area, not crossing itself",
        ask="a list of at least 3 points [x, y] in source pixels",
    )
    classes: tuple[int, ...] | None = opt(None, "class names or ids this zone counts; default: every class")
    anchor: Literal["bottom_center", "center", "top_center", "bottom_left", "bottom_right"] = opt(
        "bottom_center", "the point of a box that must lie inside the polygon"
    )
    leave_after_s: float = opt(
        0.5,
        "seconds (stream time) a track must be seen outside the zone before it leaves; 0 = at once",
        ge=0,
    )
    dwell_s: float | None = opt(
        None,
        "seconds (stream time) a track must stay in the zone for one 'dwell' event per visit (needs "
        "tracking); default: no dwell events",
        gt=0,
    )


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
    detect_fps: float | None = opt(
        None,
        "run the detector on at most this many frames per second of this stream (by pts); the frames in "
        "between are decoded but not inferred, counted as skipped. Default: every frame",
    )
    classes: tuple[int, ...] | None = opt(
        None, "class names or ids to detect on this stream, replacing model.classes"
    )
    zones: tuple[ZoneConfig, ...] = opt((), "named polygons; each detection lists the zones it is in")
    zones_only: bool = opt(False, "drop detections that are in no zone (needs zones)")
    lines: tuple[LineConfig, ...] = opt(
        (), "named directed segments; tracks crossing one give cross events and counters (needs tracking)"
    )
    tracking: TrackingConfig = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        TrackingConfig(), "keys of the global tracking: section to override for this stream"
    )
    clips: ClipsConfig = opt(  # noqa: RUF009 (opt() is a dataclasses.field)
        ClipsConfig(), "keys of the global clips: section to override for this stream"
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


def check_detect_fps(value: object, path: str) -> float:
    return coerce(value, float, {"gt": 0}, path)  # type: ignore[no-any-return]


def check_polygon(value: object, path: str) -> tuple[tuple[float, float], ...]:
    if not isinstance(value, list):
        raise Invalid(f"expected a list of at least 3 points [x, y], got {describe(value)}", path)
    points = []
    for i, point in enumerate(value):
        here = f"{path}[{i}]"
        if (
            not isinstance(point, list)
            or len(point) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in point)
        ):
            raise Invalid(f"expected a point [x, y] of two numbers, got {describe(point)}", here)
        if min(point) < 0:
            raise Invalid(f"expected coordinates >= 0 (source pixels), got {point}", here)
        points.append((float(point[0]), float(point[1])))
    why = polygon_problem(points)
    if why:
        raise Invalid(why, path)
    return tuple(points)


def parse_zones(
    raw: object, path: str, problems: Problems, names: tuple[str, ...]
) -> tuple[ZoneConfig, ...] | None:
    if not isinstance(raw, list) or not raw:
        problems.add(path, f"expected a list of zones, each {{name:, polygon:}}, got {describe(raw)}")
        return None
    zones: list[ZoneConfig] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(raw):
        here = f"{path}[{index}]"
        given = read_section(
            ZoneConfig,
            item,
            here,
            problems,
            special={
                "polygon": check_polygon,
                "classes": lambda v, p: resolve_classes(class_list(v, p), names, p),
                "dwell_s": lambda v, p: coerce(v, float, {"gt": 0}, p),
            },
            what="a mapping with name: and polygon:",
        )
        if given is None:
            continue
        name = given.get("name")
        if name is not None:
            if name in seen:
                problems.add(
                    f"{here}.name",
                    f"duplicate zone name {name!r} (already used by {path}[{seen[name]}]); "
                    "zone names must be unique within a stream",
                )
            seen[name] = index
        if "name" in given and "polygon" in given:
            zones.append(ZoneConfig(**given))
    return tuple(zones)


def verify_needs_tracking(given: dict[str, Any], path: str, problems: Problems) -> None:
    """Lines and zones' dwell_s follow tracks: without tracking they could never say anything."""
    tracking = given.get("tracking")
    if tracking is None or tracking.enabled:
        return
    fix = f"set tracking: {{enabled: true}} (globally, or {path}.tracking)"
    if given.get("lines"):
        problems.add(
            f"{path}.lines", f"lines count tracks crossing them, but tracking is off for this stream; {fix}"
        )
    for k, zone in enumerate(given.get("zones") or ()):
        if zone.dwell_s is not None:
            problems.add(
                f"{path}.zones[{k}].dwell_s",
                f"dwell_s times tracks in the zone, but tracking is off for this stream; {fix} "
                "or delete dwell_s",
            )


def parse_streams(
    raw: object,
    problems: Problems,
    base_dir: Path,
    class_names: tuple[str, ...] = COCO_NAMES,
    tracking: TrackingConfig | None = None,
    clips: ClipsConfig | None = None,
) -> tuple[StreamConfig, ...]:
    """Check the ``streams:`` list; report every problem; return the streams that are valid.

    ``class_names`` (model.class_names) resolve the class names of ``classes`` and zones; ``tracking`` is the
    global section that ``streams[].tracking`` overrides."""
    base_tracking = tracking or TrackingConfig()
    base_clips = clips or ClipsConfig()
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
            special={
                "url": lambda v, p: check_url(v, p, base_dir),
                "detect_fps": check_detect_fps,
                "classes": lambda v, p: resolve_classes(class_list(v, p), class_names, p),
                "zones": lambda v, p: parse_zones(v, p, problems, class_names),
                "lines": lambda v, p: parse_lines(v, p, problems, class_names),
                "tracking": lambda v, p: override_tracking(base_tracking, v, problems, p),
                "clips": lambda v, p: override_clips(base_clips, v, problems, p, base_dir, class_names),
            },
            what="a mapping with at least id: and url:",
        )
        if given is None:
            continue
        for key in ("zones", "lines", "tracking", "clips"):  # None: the problems were reported inside
            if given.get(key, ()) is None:
                del given[key]
        given.setdefault("tracking", base_tracking)
        given.setdefault("clips", base_clips)
        if given.get("zones_only") and not item.get("zones"):
            problems.add(
                f"{here}.zones_only",
                "zones_only: true drops detections outside every zone, but this stream has no zones; "
                "add zones: or delete zones_only",
            )
        verify_stream_options(given, item, here, problems)
        verify_needs_tracking(given, here, problems)
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
