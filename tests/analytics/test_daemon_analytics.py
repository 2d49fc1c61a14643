"""The daemon with analytics on a real clip (the 100-frame HEVC sample, 10 fps): detect_fps skips are counted
as ``skipped`` in the snapshot (what the status line, the summary and /metrics read), not as drops; with
fill_skipped every frame still gets a line, in order, and every line validates against the schema."""

from __future__ import annotations

import json
import logging

import jsonschema
import pytest

from streamd.config import load_config
from streamd.supervisor import Supervisor
from tests.conftest import CLIP_HEVC, MODEL, SCHEMA

pytest.importorskip("lap")


def test_detect_fps_skips_are_counted_and_filled(tmp_path, caplog) -> None:
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        f"streams:\n  - id: cam\n    url: {CLIP_HEVC}\n    detect_fps: 5\n    classes: [person]\n"
        "    zones:\n      - name: left\n        polygon: [[0, 0], [384, 0], [384, 576], [0, 576]]\n"
        f"model:\n  path: {MODEL}\n  score_threshold: 0.35\n  iou_threshold: 0.5\n"
        "engine:\n  type: onnxruntime\n"
        "tracking:\n  enabled: true\n  fill_skipped: true\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )
    daemon = Supervisor(load_config(cfg), status_line=False)
    with caplog.at_level(logging.INFO, logger="streamd"):
        assert daemon.run() == 0
    snap = daemon.snapshot()
    stream = snap["per_stream"]["cam"]
    assert stream["skipped"] == 50 and stream["dropped"] == 0 and stream["decoded"] == 100, stream
    assert snap["results"] == 50
    assert "50 skipped (detect_fps), 0 dropped after decode" in caplog.text
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for r in records:
        validator.validate(r)
    frames = [r for r in records if "type" not in r]
    assert [r["frame"] for r in frames] == list(range(100))
    assert [bool(r.get("predicted")) for r in frames] == [i % 2 == 1 for i in range(100)]
    assert all(
        d["label"] == "person" and "track_id" in d and "zones" in d for r in frames for d in r["detections"]
    )
