"""Lines on a real clip: the daemon (CPU engine, real decoder, worker process) on the bundled pedestrian clip
(768x576, 10 fps, 795 frames) with a line across the walkway, against an independent count.

The expected crossings come from ``tools/count_crossings.py``: a separate script, run as a subprocess,
that reads only the frame lines' boxes and track ids and applies the documented rule with its own geometry
(no streamd import). streamd's ``cross`` events, its snapshot counters, /metrics and /api/status's source
must all agree with it, and the clip must give a count worth checking (at least 5 crossings, both ways).
The same run has a zone with ``dwell_s``: its events validate and carry their times. A second run, on the
clip's first 25 s (``first_gop_clip``), detects 5 frames a second of the 10 and fills the others with
predicted boxes: a track then moves in one step from one detected frame to the next, and the predicted
frames count nothing (the script skips them).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import jsonschema
import pytest

from streamd.config import load_config
from streamd.supervisor import Supervisor
from streamd.supervisor.metrics import render
from tests.conftest import CLIP, MODEL, ROOT, SCHEMA

pytest.importorskip("lap")

STREET = (480, 120, 540, 560)  # across the walkway, top to bottom: its left side is the right of the picture


@pytest.mark.parametrize(
    "rate",
    ["", "    detect_fps: 5\n    tracking: {fill_skipped: true}\n"],
    ids=["every-frame", "detect-fps-5"],
)
def test_crossings_on_the_pedestrian_clip_match_an_independent_count(tmp_path, rate: str, request) -> None:
    # the whole clip detected every frame; its first 25 s (13 crossings) at detect_fps 5
    clip = request.getfixturevalue("first_gop_clip") if rate else CLIP
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "lines.yaml"
    x1, y1, x2, y2 = STREET
    cfg.write_text(
        f"streams:\n  - id: demo\n    url: {clip}\n    classes: [person]\n{rate}"
        f"    lines:\n      - name: street\n        points: [[{x1}, {y1}], [{x2}, {y2}]]\n"
        "        in_side: left\n        classes: [person]\n"
        "    zones:\n      - name: west\n        polygon: [[0, 0], [384, 0], [384, 576], [0, 576]]\n"
        "        dwell_s: 3\n"
        f"model:\n  path: {MODEL}\n  score_threshold: 0.35\n  iou_threshold: 0.5\n"
        "engine:\n  type: onnxruntime\ntracking:\n  enabled: true\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )
    daemon = Supervisor(load_config(cfg), status_line=False)
    assert daemon.run() == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    for r in records:
        validator.validate(r)

    tool = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools/count_crossings.py"),
            str(out),
            "--line",
            "street:" + ",".join(map(str, STREET)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    expected = json.loads(tool.stdout)
    want = expected["counts"]["street"]
    print(f"independent count: {want}; {len(expected['events'])} crossings")
    assert want["in"] >= 2 and want["out"] >= 2 and want["in"] + want["out"] >= 5, want

    crossed = [r for r in records if r.get("event") == "cross"]
    got = [[r["line"], r["direction"], r["track_id"], r["frame"]] for r in crossed]
    assert got == expected["events"]
    assert all(r["label"] == "person" for r in crossed)

    snap = daemon.snapshot()
    assert snap["per_stream"]["demo"]["crossings"] == {"street": {"person": want}}
    metrics = render(snap)
    for direction in ("in", "out"):
        labels = f'class="person",direction="{direction}",line="street",stream="demo"'
        sample = f"streamd_line_crossings_total{{{labels}}} {float(want[direction])}"
        assert sample in metrics, metrics[-1500:]

    zone = [r for r in records if r.get("zone") == "west"]
    kinds = collections.Counter(r["event"] for r in zone)
    assert kinds["enter"] == kinds["leave"] > 0 and kinds["dwell"] > 0, kinds
    dwell_time: dict[int, float] = {}
    visits: dict[int, list[str]] = collections.defaultdict(list)  # per track: its events, in order
    for r in zone:
        tid, kind = r["track_id"], r["event"]
        visits[tid].append(kind)
        if kind == "dwell":
            assert r["time_in_zone_s"] >= 3, r
            dwell_time[tid] = r["time_in_zone_s"]
        elif kind == "leave" and tid in dwell_time:  # a visit with a dwell lasts at least that long
            assert r["time_in_zone_s"] >= dwell_time.pop(tid), r
    for kinds in visits.values():  # each visit: enter, at most one dwell, leave
        assert " ".join(kinds).replace("enter dwell leave", "").replace("enter leave", "").strip() == "", (
            kinds
        )
