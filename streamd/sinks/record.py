"""FrameResult -> one JSON object (the result record; schema in streamd/data/result.schema.json)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from streamd.types import FrameResult

SCHEMA_VERSION = 1


def to_record(result: FrameResult, names: Sequence[str]) -> dict:
    f, det = result.frame, result.detections
    boxes = np.round(det.xyxy.astype(np.float64), 1).tolist()
    scores = np.round(det.score.astype(np.float64), 4).tolist()
    classes = det.class_id.tolist()
    return {
        "v": SCHEMA_VERSION,
        "stream": f.stream_id,
        "frame": f.index,
        "pts": None if f.pts is None else round(f.pts, 6),
        "time": round(f.wall_time, 6),
        "width": f.width,
        "height": f.height,
        "latency_ms": result.latency_ms,
        "detections": [
            {
                "class_id": c,
                "label": names[c] if 0 <= c < len(names) else str(c),
                "score": s,
                "box": b,
            }
            for c, s, b in zip(classes, scores, boxes, strict=True)
        ],
    }


def to_json_line(result: FrameResult, names: Sequence[str]) -> str:
    return json.dumps(to_record(result, names), separators=(",", ":")) + "\n"
