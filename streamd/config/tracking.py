"""``tracking:`` — ByteTrack-style object tracking per stream (global; ``streams[].tracking`` overrides keys).

The tracker itself is ``streamd.analytics.tracker``. Detections scoring at least ``high_score`` are matched to
tracks first (IoU >= ``match_iou``); the others (between the model's score threshold and ``high_score``) then
continue tracks that are still unmatched (IoU >= 0.3), as ByteTrack does. A detection left over that scores at
least ``new_track_score`` starts a new track; one that does neither is not written (with tracking on, every
written detection has a track_id). A track not seen for ``lost_timeout_s`` seconds is ended.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from streamd.config._fields import Problems, opt, read_section


@dataclass(frozen=True)
class TrackingConfig:
    """Object tracking: a stable ``track_id`` per object while it stays in view."""

    enabled: bool = opt(False, "give every detection a track_id and track_age (and zones enter/leave events)")
    fill_skipped: bool = opt(
        False,
        "with streams[].detect_fps below the stream's rate: write a line for each skipped frame with the "
        'tracks\' predicted boxes, marked "predicted": true (needs enabled: true)',
    )
    high_score: float = opt(
        0.4,
        "detections scoring at least this are matched to tracks first (ByteTrack's high group)",
        gt=0,
        lt=1,
    )
    new_track_score: float = opt(
        0.25,
        "an unmatched detection scoring at least this starts a new track; one below it that continues no "
        "track is not written",
        gt=0,
        lt=1,
    )
    match_iou: float = opt(
        0.2, "least IoU between a track's predicted box and a high-score detection to match them", gt=0, lt=1
    )
    lost_timeout_s: float = opt(
        1.0, "seconds a track may go unseen (occlusion) and still take its id back; then it ends", gt=0
    )
    class_aware: bool = opt(True, "match detections only to tracks of the same class")


TRACKING_KEYS = tuple(f.name for f in dataclasses.fields(TrackingConfig))


def parse_tracking(raw: object, problems: Problems, path: str = "tracking") -> TrackingConfig:
    """Check the ``tracking:`` section (absent or empty = all defaults: tracking off)."""
    given = read_section(TrackingConfig, {} if raw is None else raw, path, problems)
    if given is None:
        return TrackingConfig()
    config = TrackingConfig(**given)
    verify_tracking(config, given, path, problems)
    return config


def override_tracking(
    base: TrackingConfig, raw: object, problems: Problems, path: str
) -> TrackingConfig | None:
    """``streams[].tracking``: the keys given replace those of the global ``tracking:`` section."""
    given = read_section(TrackingConfig, {} if raw is None else raw, path, problems)
    if given is None:
        return None
    config = dataclasses.replace(base, **given)
    verify_tracking(config, given, path, problems)
    return config


def verify_tracking(config: TrackingConfig, given: dict, path: str, problems: Problems) -> None:
    # Only where fill_skipped is written: a stream that turns tracking off (enabled: false) under a global
    # fill_skipped: true simply has no predicted lines.
    if config.fill_skipped and not config.enabled and "fill_skipped" in given:
        problems.add(
            f"{path}.fill_skipped",
            "fill_skipped: true needs tracking (enabled: true): predicted boxes come from the tracks; "
            "set enabled: true or delete fill_skipped",
        )
