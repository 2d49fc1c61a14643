"""The daemon with clips on a real clip: zone enter events from real detections and tracks write clips, the
event lines name them (schema-valid), every clip named exists once the run ends and passes ffprobe/ffmpeg."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import jsonschema
import pytest

from streamd.config import load_config
from streamd.supervisor import Supervisor
from tests.clips.conftest import assert_valid_clip
from tests.conftest import MODEL, SCHEMA

pytest.importorskip("lap")
PRE, POST = 2.0, 1.0
LENGTH = 20.0  # the source's duration (s)


def test_event_lines_name_valid_clips(sources, tmp_path) -> None:
    out, clips = tmp_path / "out.jsonl", tmp_path / "clips"
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        f"streams:\n  - id: cam\n    url: {sources['h264']}\n    classes: [person]\n"
        "    zones:\n      - name: left\n        polygon: [[0, 0], [384, 0], [384, 576], [0, 576]]\n"
        f"model:\n  path: {MODEL}\n  score_threshold: 0.35\n  iou_threshold: 0.5\n"
        "engine:\n  type: onnxruntime\ntracking:\n  enabled: true\n"
        f"clips:\n  dir: {clips}\n  pre_roll_s: {PRE}\n  post_roll_s: {POST}\n  on: [enter]\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )
    assert Supervisor(load_config(cfg), status_line=False).run() == 0
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for r in records:
        validator.validate(r)
    events = [r for r in records if r.get("type") == "event"]
    enters = [r for r in events if r["event"] == "enter"]
    assert enters, "no enter events: the test needs some"
    assert all("clip" in r for r in enters) and not any("clip" in r for r in events if r["event"] != "enter")
    named: dict[str, list[float]] = {}
    for r in enters:
        named.setdefault(r["clip"], []).append(r["pts"])
    on_disk = sorted(str(p) for p in (clips / "cam").glob("*.mp4"))
    assert on_disk == sorted(named), "every clip named is written, and nothing else"
    for path, times in named.items():
        # from the first event's pre-roll to the last one's post-roll, inside the file
        asked = min(LENGTH, max(times) + POST) - max(0.0, min(times) - PRE)
        assert_valid_clip(Path(path), asked, sources["h264"])
    # overlapping events share a clip: two clips' windows never overlap
    windows = sorted((min(t) - PRE, max(t) + POST) for t in named.values())
    assert all(a[1] < b[0] for a, b in itertools.pairwise(windows)), windows
