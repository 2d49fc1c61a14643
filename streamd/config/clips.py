"""``clips:`` — event clips with pre-roll (global; ``streams[].clips`` overrides keys for one stream).

Each stream with clips keeps a ring of its compressed packets (``streamd.ingest.packet_ring``); an event
named in ``on`` writes an MP4 from the last key frame before ``pre_roll_s`` to ``post_roll_s`` after the
event, remuxed from those packets (no decode, no encode; ``streamd.clips``). Writing a ``clips:`` section
turns clips on (``enabled: false`` turns them off again, e.g. for one stream). Clips go to
``dir/<stream id>/``; retention (``max_bytes``, ``max_age_s``) is per stream folder.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from streamd.config._fields import Invalid, Problems, describe, opt, path_text, read_section, resolve_path
from streamd.config.model import class_list, resolve_classes

TRIGGERS = ("enter", "leave", "cross", "dwell", "class", "api")
MAX_RETENTION_BYTES = 2**50  # a petabyte: a sanity ceiling, not a limit anyone should meet


@dataclass(frozen=True)
class ClipsConfig:
    """Event clips: which events write one, how much before and after, where, and how long they are kept."""

    enabled: bool = opt(False, "write clips (true as soon as a clips: section is written; false: none)")
    dir: str = opt(
        "", "folder of the clips (relative to the config file's folder); clips go to dir/<stream>/"
    )
    pre_roll_s: float = opt(
        5.0, "seconds before the event a clip starts (from the key frame before)", ge=0, le=300
    )
    post_roll_s: float = opt(5.0, "seconds after the event a clip ends", ge=0, le=300)
    max_length_s: float = opt(
        120.0,
        "the longest clip: overlapping events extend one clip up to this, then a new one starts",
        gt=0,
        le=3600,
    )
    max_ring_bytes: int = opt(
        32 * 2**20,
        "cap of the stream's ring of compressed packets in bytes (the pre-roll shrinks, counted, when a "
        "high-bitrate stream fills it)",
        ge=2**16,
    )
    on: tuple[str, ...] = opt(
        ("enter", "cross", "dwell", "api"),
        "what writes a clip: enter, leave (zones), cross (lines), dwell, class (a detection of a class in "
        "classes), api (a request through the control API)",
    )
    classes: tuple[int, ...] | None = opt(
        None, "class names or ids whose events (and, with on: [class], detections) write clips; default: all"
    )
    max_bytes: int = opt(
        10 * 2**30, "retention: the stream's clips take at most this many bytes (oldest go first)"
    )
    max_age_s: float = opt(7 * 86400.0, "retention: clips older than this are deleted", gt=0)


CLIPS_KEYS = tuple(f.name for f in dataclasses.fields(ClipsConfig))


def check_on(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise Invalid(f"expected a list of triggers from {', '.join(TRIGGERS)}, got {describe(value)}", path)
    for i, item in enumerate(value):
        if item not in TRIGGERS:
            raise Invalid(f"expected one of {', '.join(TRIGGERS)}, got {describe(item)}", f"{path}[{i}]")
    return tuple(dict.fromkeys(value))


def check_max_bytes(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 2**20 <= value <= MAX_RETENTION_BYTES:
        raise Invalid(f"expected an integer number of bytes >= 1048576 (1 MiB), got {describe(value)}", path)
    return value


def _read(raw: object, path: str, problems: Problems, base_dir: Path, names: tuple[str, ...]) -> dict | None:
    given = read_section(
        ClipsConfig,
        {} if raw is None else raw,
        path,
        problems,
        special={
            "dir": lambda v, p: str(resolve_path(path_text(v, p, "a folder path"), base_dir)),
            "on": check_on,
            "classes": lambda v, p: resolve_classes(class_list(v, p), names, p),
            "max_bytes": check_max_bytes,
        },
    )
    if given is not None and raw is not None:
        given.setdefault("enabled", True)  # writing the section (or a stream's) turns clips on
    return given


def parse_clips(
    raw: object, problems: Problems, base_dir: Path, names: tuple[str, ...], path: str = "clips"
) -> ClipsConfig:
    """Check the global ``clips:`` section (absent = clips off)."""
    given = _read(raw, path, problems, base_dir, names)
    if given is None:
        return ClipsConfig()
    config = ClipsConfig(**given)
    verify_clips(config, path, problems)
    return config


def override_clips(
    base: ClipsConfig, raw: object, problems: Problems, path: str, base_dir: Path, names: tuple[str, ...]
) -> ClipsConfig | None:
    """``streams[].clips``: the keys given replace those of the global ``clips:`` section."""
    given = _read(raw, path, problems, base_dir, names)
    if given is None:
        return None
    config = dataclasses.replace(base, **given)
    verify_clips(config, path, problems)
    return config


def verify_clips(config: ClipsConfig, path: str, problems: Problems) -> None:
    if config.enabled and not config.dir and problems.ok(f"{path}.dir"):
        problems.add(
            f"{path}.dir",
            "clips are on but have no folder; add dir: (e.g. /var/lib/streamd/clips) or set enabled: false",
        )
