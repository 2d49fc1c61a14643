"""The worker's output edge: results and analytics -> JSON lines, the one place JSON is made.

Two kinds of lines share the output (schema: streamd/data/result.schema.json): **frame lines** (no ``type``
key; one per processed frame, and with ``tracking.fill_skipped`` one per skipped frame, marked
``"predicted": true``) and **event lines** (``"type": "event"``: a track entering, dwelling in or leaving a
zone, or crossing a line).
Analytics add optional keys to each detection: ``zones`` (names of the zones it is in), ``track_id`` and
``track_age``. Keys are written in a fixed order and numbers rounded as below, so a line is byte-stable for
the same values. Lines are UTF-8 (labels are not escaped); orjson writes them, or ``json`` where orjson is
not installed or refuses a record (the same values; tiny floats are spelled differently, 0.00001 vs 1e-05,
and a non-finite number, which no model output should carry, is null with orjson and NaN with json).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np

from streamd.analytics.annotations import AnnotatedFrame, Annotations, FrameEvent, Output
from streamd.analytics.events import ZoneEvent
from streamd.analytics.lines import LineEvent
from streamd.types import Frame, FrameResult

SCHEMA_VERSION = 1


def _label(class_id: int, names: Sequence[str]) -> str:
    return names[class_id] if 0 <= class_id < len(names) else str(class_id)


def frame_record(result: FrameResult, names: Sequence[str], notes: Annotations | None = None) -> dict:
    """A frame line as a dict (``names``: model.class_names)."""
    f, det = result.frame, result.detections
    boxes = np.round(det.xyxy.astype(np.float64), 1).tolist()
    scores = np.round(det.score.astype(np.float64), 4).tolist()
    classes = det.class_id.tolist()
    detections = [
        {"class_id": c, "label": _label(c, names), "score": s, "box": b}
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
            ids, ages = notes.track_id.tolist(), notes.track_age.tolist()
            for d, tid, age in zip(detections, ids, ages, strict=True):
                if tid >= 0:
                    d["track_id"] = tid
                    d["track_age"] = age
    return record


def event_record(frame: Frame, event: ZoneEvent | LineEvent, names: Sequence[str]) -> dict:
    """An event line as a dict, stamped with ``frame``: ``enter``/``dwell``/``leave`` of a zone (the last two
    with ``time_in_zone_s``) or ``cross`` of a line (with its ``direction``)."""
    record = {
        "v": SCHEMA_VERSION,
        "type": "event",
        "event": event.event,
        "stream": frame.stream_id,
        "frame": frame.index,
        "pts": None if frame.pts is None else round(frame.pts, 6),
        "time": round(frame.wall_time, 6),
    }
    if isinstance(event, LineEvent):
        record["line"], record["direction"] = event.line, event.direction
    else:
        record["zone"] = event.zone
        if event.time_in_zone_s is not None:
            record["time_in_zone_s"] = round(event.time_in_zone_s, 3)
    record.update(track_id=event.track_id, class_id=event.class_id, label=_label(event.class_id, names))
    return record


def _dumps_stdlib(record: dict) -> str:
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:  # a lone surrogate (e.g. "\udc80" in class_names): escaped, still a line
            text = json.dumps(record, separators=(",", ":"))
    return text + "\n"


try:  # orjson (a dependency): a line costs 2-4x less than with json (bench_analytics), paid per frame
    import orjson

    def _dumps(record: dict) -> str:
        try:  # numpy scalars as json writes them (np.float64 is a float there)
            return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"
        except TypeError:  # anything else json takes and orjson does not: json's line, never a lost one
            return _dumps_stdlib(record)

except ImportError:  # a tree run on a box without it (the GPU box's image): the same lines, parsed equal
    _dumps = _dumps_stdlib


def frame_line(result: FrameResult, names: Sequence[str], notes: Annotations | None = None) -> str:
    """The JSON line of a frame without analytics (``notes`` None) or with them."""
    return _dumps(frame_record(result, names, notes))


def encode(output: Output, names: Sequence[str]) -> str:
    """One analytics output as its JSON line."""
    if isinstance(output, AnnotatedFrame):
        return _dumps(frame_record(output.result, names, output.notes))
    if isinstance(output, FrameEvent):
        return _dumps(event_record(output.frame, output.event, names))
    raise TypeError(f"not an analytics output: {output!r}")


def encode_all(outputs: Iterable[Output], names: Sequence[str]) -> list[str]:
    """Analytics outputs as JSON lines, in order."""
    return [encode(o, names) for o in outputs]
