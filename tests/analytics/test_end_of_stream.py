"""The end of a stream closes its zones: every track still inside gets a ``leave`` (the fields of any other
leave event, stamped with the stream's last frame) after the lines of every frame still in the detector,
once. The ingest thread signals the end (``StreamAnalytics.stream_ended``) when its file ends, so a stream
that ends while others of the same worker go on gets its leaves then, not when the worker closes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from streamd.analytics.stream import StreamAnalytics
from streamd.config.coco import COCO_NAMES
from streamd.config.streams import StreamConfig
from streamd.ingest.reader import StreamReader
from streamd.pipeline.batcher import Batcher
from streamd.worker.output import encode_all
from tests.analytics.test_stream_analytics import config, frame, parse, person, result
from tests.conftest import CLIP, GOP_FRAMES
from tests.sources.conftest import make_camera_clip

pytest.importorskip("lap")

ALL = {"name": "all", "polygon": [[0, 0], [768, 0], [768, 576], [0, 576]]}
LEFT = {"name": "left", "polygon": [[0, 0], [384, 0], [384, 576], [0, 576]]}


def text(outputs: list) -> list[str]:
    """Analytics outputs as the JSON lines the worker writes."""
    return encode_all(outputs, COCO_NAMES)


def hook(tmp_path, **stream) -> StreamAnalytics:
    cfg = config(tmp_path, zones=[ALL, LEFT], **stream)
    return StreamAnalytics(cfg.streams[0], COCO_NAMES)


def events(lines: list[str]) -> list[tuple]:
    return [
        (r["event"], r["zone"], r["track_id"], r["frame"]) for r in parse(lines) if r.get("type") == "event"
    ]


def test_tracks_inside_leave_when_the_stream_ends(tmp_path) -> None:
    a = hook(tmp_path)
    lines: list[str] = []
    for t in range(5):  # track 1 in both zones, track 2 in "all" only
        assert a.should_detect(frame(t))
        lines += text(a.annotate(result(t, [person(t), [600, 100, 640, 200]])))
    end = text(a.stream_ended())
    assert events(end) == [("leave", "all", 1, 4), ("leave", "left", 1, 4), ("leave", "all", 2, 4)]
    enter = next(r for r in parse(lines) if r.get("type") == "event")
    leave = parse(end)[0]
    assert set(leave) == {*enter, "time_in_zone_s"} and leave["pts"] == 0.4 and leave["label"] == "person"
    assert leave["time_in_zone_s"] == 0.4  # in from frame 0 (0.0 s), last seen inside at frame 4 (0.4 s)
    assert text(a.stream_ended()) == [] and text(a.flush()) == []  # once


def test_the_leaves_wait_for_the_frames_in_the_detector(tmp_path) -> None:
    a = hook(tmp_path)
    for t in range(4):
        assert a.should_detect(frame(t))
    out = text(a.annotate(result(0, [person(0)]))) + text(a.annotate(result(1, [person(1)])))
    assert text(a.stream_ended()) == []  # frames 2 and 3 are still being detected
    out += text(a.annotate(result(2, [person(2)])))
    out += text(a.annotate(result(3, [person(3)])))
    records = parse(out)
    assert [(r.get("event"), r["frame"]) for r in records] == [
        (None, 0), ("enter", 0), ("enter", 0), (None, 1), (None, 2), (None, 3), ("leave", 3), ("leave", 3)
    ]  # fmt: skip


def test_a_skipped_last_frame_stamps_the_leave(tmp_path) -> None:
    a = hook(tmp_path, detect_fps=5)  # every other frame of a 10 fps stream
    out: list[str] = []
    for t in range(6):
        if a.should_detect(frame(t)):
            out += text(a.annotate(result(t, [person(t)])))
        else:
            out += text(a.skip(frame(t)))
    assert events(text(a.stream_ended())) == [("leave", "all", 1, 5), ("leave", "left", 1, 5)]


def test_finish_closes_the_zones_too(tmp_path) -> None:
    """A stream removed by a reload or a worker closing: whatever is in flight is given up."""
    a = hook(tmp_path)
    a.should_detect(frame(0))
    a.should_detect(frame(1))
    text(a.annotate(result(0, [person(0)])))
    assert events(text(a.flush())) == [("leave", "all", 1, 0), ("leave", "left", 1, 0)]
    assert text(a.stream_ended()) == []


def test_the_ingest_thread_signals_the_end_of_its_file(tmp_path) -> None:
    """A real file through a StreamReader, a stand-in detector answering each frame with one box: the leaves
    come through ``on_lines`` (or the last result) when the file ends, without any pipeline closing."""
    clip = make_camera_clip(tmp_path / "c.mp4", 12, 10, bframes=0)
    a = hook(tmp_path)
    written: list[str] = []
    batcher = Batcher(4, 0.01)
    q = batcher.add_stream("cam", 4, "block")
    worker = StreamReader(
        StreamConfig(id="cam", url=str(clip)),
        q,
        threading.Event(),
        analytics=a,
        on_lines=lambda o: written.extend(text(o)),
    )

    def detector() -> None:
        while (batch := batcher.next_batch(threading.Event())) is not None:
            for f in batch:  # the synthetic result of frame f.index (pts index / 10, as the 10 fps clip's)
                with a.lock:
                    written.extend(text(a.annotate(result(f.index, [person(f.index)]))))

    thread = threading.Thread(target=detector)
    thread.start()
    worker.start()
    assert worker.join(20)
    thread.join(10)
    records = parse(written)
    assert [r["frame"] for r in records if "type" not in r] == list(range(12))
    assert events(written) == [
        ("enter", "all", 1, 0), ("enter", "left", 1, 0), ("leave", "all", 1, 11), ("leave", "left", 1, 11)
    ]  # fmt: skip
    assert records[-1].get("event") == "leave"  # after every frame line


def test_the_daemon_closes_every_zone_of_the_bundled_clip(tmp_path, third_gop_clip) -> None:
    """``streamd run`` on configs/analytics-zones.yaml (the left half as a zone) with 25 s of the bundled
    clip (its third GOP: people leave at the bottom edge, some are still inside at the end) plus a short
    stream in the same worker that ends early: every ``enter`` gets its ``leave`` by the end of the output,
    the short stream's at its own end; membership at the frame's bottom border and the event count per
    track follow the boxes written (a real-clip check of the zone edges)."""
    root = Path(__file__).resolve().parent.parent.parent
    cfg = yaml.safe_load((root / "configs" / "analytics-zones.yaml").read_text())
    demo = cfg["streams"][0]
    assert (root / "configs" / demo["url"]).resolve() == CLIP
    demo["url"] = str(third_gop_clip)
    cfg["model"]["path"] = str((root / "configs" / cfg["model"]["path"]).resolve())
    short = make_camera_clip(tmp_path / "short.mp4", 60, 10, bframes=0)  # the clip's first 6 s
    cfg["streams"].append({**demo, "id": "short", "url": str(short)})
    out = tmp_path / "out.jsonl"
    cfg["sinks"] = [{"type": "jsonl", "path": str(out)}]
    (tmp_path / "z.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", "streamd", "run", "--no-status", str(tmp_path / "z.yaml")],
        capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for sid, frames in (("demo", GOP_FRAMES), ("short", 60)):
        assert len([r for r in records if r["stream"] == sid and "type" not in r]) == frames
        open_: dict[tuple, int] = {}
        pairs = 0
        for r in records:
            if r["stream"] != sid or r.get("type") != "event":
                continue
            key = (r["track_id"], r["zone"])
            if r["event"] == "enter":
                assert key not in open_, r
                open_[key] = r["frame"]
            else:
                assert open_.pop(key) <= r["frame"], r
                pairs += 1
        assert not open_, f"{sid}: enters without a leave: {open_}"
        assert pairs > 0
    # the short stream's leaves come at its end, long before the other stream's end
    last_short = max(i for i, r in enumerate(records) if r["stream"] == "short")
    assert records[last_short].get("event") == "leave"
    later = [r["frame"] for r in records[last_short:] if r["stream"] == "demo" and "type" not in r]
    assert len(later) > GOP_FRAMES // 2, "the short stream's leaves waited for the worker's end"
    closed = [r for r in records if r["stream"] == "demo" and r.get("event") == "leave"]
    assert any(r["frame"] == GOP_FRAMES - 1 for r in closed), "nobody was inside at the end: nothing closed"

    # Real-clip check of the zone's edges on the demo stream (zone: x < 384, the full height).
    inside: dict[int, list[tuple[float, bool]]] = {}
    at_bottom = 0
    for r in records:
        if r["stream"] != "demo" or "type" in r:
            continue
        for d in r["detections"]:
            x1, _, x2, y2 = d["box"]
            cx, member = (x1 + x2) / 2, "left" in d["zones"]
            if d["label"] == "person" and abs(cx - 384) > 0.1:
                assert member == (cx < 384), (r["frame"], d)  # boxes cut off at the bottom (y2 576) included
                at_bottom += member and y2 >= 575.95
            inside.setdefault(d["track_id"], []).append((r["pts"], member))
    assert at_bottom > 0  # the clip has such boxes
    # Per track: one enter when first inside, another only after having been out for 0.5 s (leave_after_s).
    for tid, seen in inside.items():
        expected, counted, out_since = 0, False, None
        for pts, member in seen:
            if member:
                expected += not counted
                counted, out_since = True, None
            elif counted:
                out_since = pts if out_since is None else out_since
                if pts - out_since >= 0.5 - 1e-6:
                    counted, out_since = False, None
        enters = [
            e for e in records if e.get("event") == "enter" and e["stream"] == "demo" and e["track_id"] == tid
        ]
        assert len(enters) == expected, (tid, len(enters), expected)


def test_a_stream_removed_by_a_reload_closes_its_zones(tmp_path) -> None:
    """Pipeline.reconfigure removing a running (paced) stream: its tracks leave their zones then."""
    from streamd.config import parse_config
    from streamd.worker.pipeline import Pipeline

    root = Path(__file__).resolve().parent.parent.parent
    clip = str(root / "samples" / "vtest.mp4")
    stream = {"url": clip, "realtime": True, "zones": [LEFT]}
    data = {
        "streams": [{"id": "gone", **stream}, {"id": "stays", **stream}],
        "model": {"path": str(root / "models" / "nanodet-coco.onnx")},
        "engine": {"type": "onnxruntime"},
        "tracking": {"enabled": True},
    }
    cfg = parse_config(data, root)
    lines: list[str] = []
    lock = threading.Lock()

    def emit(records) -> None:
        with lock:
            lines.extend(r.line for r in records)

    pipe = Pipeline(cfg, cfg.streams, emit)
    pipe.build()
    try:
        pipe.start()
        deadline = time.monotonic() + 60
        while (
            sum('"gone"' in line and '"enter"' in line for line in lines) < 2 and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert pipe.reconfigure(["gone"], []) == (["gone"], [])
        with lock:
            at_removal = len(lines)
    finally:
        pipe.abort()
        pipe.close()
    gone = [
        r for r in map(json.loads, lines[:at_removal]) if r["stream"] == "gone" and r.get("type") == "event"
    ]
    inside: set[tuple] = set()
    for e in gone:
        key = (e["track_id"], e["zone"])
        if e["event"] == "enter":
            inside.add(key)
        else:
            inside.remove(key)
    assert len(gone) >= 2 and not inside, inside
