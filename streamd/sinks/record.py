"""FrameResult -> one JSON object (the result record; schema in streamd/data/result.schema.json).

Two kinds of lines share the output: **frame lines** (no ``type`` key; one per processed frame, and with
``tracking.fill_skipped`` one per skipped frame, marked ``"predicted": true``) and **event lines**
(``"type": "event"``: a track entering or leaving a zone). Analytics add optional keys to each detection:
``zones`` (names of the zones it is in), ``track_id`` and ``track_age``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamd.types import Frame, FrameResult

SCHEMA_VERSION = 1


@dataclass(slots=True)
class Annotations:
    """Per-detection analytics of one frame (arrays parallel to its detections); None = key not written.

    ``track_id`` (n,) int, -1 for a detection no track took (its keys are then left out); ``track_age`` (n,)
    int; ``zones`` (n, z) bool membership over ``zone_names``."""

    track_id: np.ndarray | None = None
    track_age: np.ndarray | None = None
    zones: np.ndarray | None = None
    zone_names: Sequence[str] = ()
    predicted: bool = False


def to_record(result: FrameResult, names: Sequence[str], notes: Annotations | None = None) -> dict:
    f, det = result.frame, result.detections
    boxes = np.round(det.xyxy.astype(np.float64), 1).tolist()
    scores = np.round(det.score.astype(np.float64), 4).tolist()
    classes = det.class_id.tolist()
    detections = [
        {
            "class_id": c,
            "label": names[c] if 0 <= c < len(names) else str(c),
            "score": s,
            "box": b,
        }
        for c, s, b in zip(classes, scores, boxes, strict=True)
    ]
    record = {
        "v": SCHEMA_VERSION,
        "stream": f.stream_id,
        "frame": f.index,
        "pts": None if f.pts is None else round(f.pts, 6),
        "time": round(f.wall_time, 6),
        "width": f.width,
        "height": f.height,
        "latency_ms": result.latency_ms,
        "detections": detections,
    }
    if notes is not None:
        if notes.predicted:
            record["predicted"] = True
        if notes.zones is not None:
            zone_names = list(notes.zone_names)
            for d, row in zip(detections, notes.zones.tolist(), strict=True):
                d["zones"] = [zone_names[k] for k, inside in enumerate(row) if inside]
        if notes.track_id is not None and notes.track_age is not None:
            for d, tid, age in zip(
                detections, notes.track_id.tolist(), notes.track_age.tolist(), strict=True
            ):
                if tid >= 0:
                    d["track_id"] = tid
                    d["track_age"] = age
    return record


def to_json_line(result: FrameResult, names: Sequence[str], notes: Annotations | None = None) -> str:
    return json.dumps(to_record(result, names, notes), separators=(",", ":")) + "\n"


def event_record(
    frame: Frame, event: str, zone: str, track_id: int, class_id: int, names: Sequence[str]
) -> dict:
    """An ``enter``/``leave`` event of a track in a zone, at ``frame``."""
    return {
        "v": SCHEMA_VERSION,
        "type": "event",
        "event": event,
        "stream": frame.stream_id,
        "frame": frame.index,
        "pts": None if frame.pts is None else round(frame.pts, 6),
        "time": round(frame.wall_time, 6),
        "zone": zone,
        "track_id": track_id,
        "class_id": class_id,
        "label": names[class_id] if 0 <= class_id < len(names) else str(class_id),
    }


def event_json_line(*args: object, **kwargs: object) -> str:
    return json.dumps(event_record(*args, **kwargs), separators=(",", ":")) + "\n"  # type: ignore[arg-type]
