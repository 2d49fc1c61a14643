"""The JSON lines of the analytics outputs are byte-stable: synthetic walkers through ``StreamAnalytics``
(typed outputs) and ``streamd.worker.output`` give exactly the lines the encoder wrote when analytics still
returned finished strings (the SHA-256 of each config's lines below was taken from that code, same inputs),
for a plain stream, zones with events, tracking with predicted frames, and every feature at once. Since
then ``leave`` lines carry ``time_in_zone_s``: taking that key out gives those bytes again."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable

import jsonschema
import numpy as np
import pytest

from streamd.analytics.stream import StreamAnalytics
from streamd.config import parse_config
from streamd.config.coco import COCO_NAMES
from streamd.types import Detections, Frame, FrameResult
from streamd.worker import output
from streamd.worker.output import encode_all, frame_line
from tests.conftest import SCHEMA

pytest.importorskip("lap")
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
LEFT = {"name": "left", "polygon": [[0, 0], [384, 0], [384, 576], [0, 576]], "classes": ["person"]}
TOP = {"name": "top", "polygon": [[0, 0], [768, 0], [768, 250], [0, 250]]}
CONFIGS: dict[str, tuple[dict, dict]] = {  # name -> (stream keys, tracking section)
    "plain": ({}, {}),
    "zones": ({"zones": [LEFT]}, {"enabled": True}),
    "fill_skipped": ({"detect_fps": 5, "tracking": {"fill_skipped": True}}, {"enabled": True}),
    "everything": (
        {"detect_fps": 4, "zones": [LEFT, TOP], "zones_only": True, "tracking": {"fill_skipped": True}},
        {"enabled": True},
    ),
}
GOLDEN = {
    "plain": "c0a493f3237b8e08147fb20d5c4884a02c5d51275451d1afa639a578447ec426",
    "zones": "c7fcc07171f8d5e85cad53ec007c355c3436a65c52e953cda728c039eb7ea43a",
    "fill_skipped": "706b5de159e447604d39632a6f3d00876a1be23b7e9c13a2bb6b4c62d50a5ba3",
    "everything": "90640df2bdcf35c51418da6e15cc805257161d80981e1bdb8dfdb58a01207dd1",
}


def walkers(frames: int = 240, objects: int = 12, seed: int = 3) -> list[Detections]:
    """People (class 0) and a few cars (class 2) walking across a 768x576 picture (boxes clipped to it), some
    missed, some leaving."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform([0, 120], [768, 560], (objects, 2))
    vel = rng.normal(0, 6, (objects, 2))
    size = rng.uniform([20, 50], [50, 110], (objects, 2))
    classes = np.where(np.arange(objects) % 4 == 3, 2, 0).astype(np.int32)
    out = []
    for _ in range(frames):
        pos += vel
        gone = (pos[:, 0] < 0) | (pos[:, 0] > 768) | (pos[:, 1] < 60) | (pos[:, 1] > 576)
        pos[gone] = rng.uniform([0, 120], [768, 560], (int(gone.sum()), 2))
        centre = pos + rng.normal(0, 1.5, pos.shape)
        xyxy = np.concatenate([centre - size / 2, centre + size / 2], 1).astype(np.float32)
        np.clip(xyxy[:, 0::2], 0, 768, out=xyxy[:, 0::2])
        np.clip(xyxy[:, 1::2], 0, 576, out=xyxy[:, 1::2])
        score = rng.uniform(0.2, 0.95, objects).astype(np.float32)
        shown = rng.uniform(0, 1, objects) > 0.08
        out.append(Detections(xyxy[shown], score[shown], classes[shown]))
    return out


def replay(
    a: StreamAnalytics,
    detected: Callable[[FrameResult], list[str]],
    skipped: Callable[[Frame], list[str]],
    ended: Callable[[], list[str]],
    flushed: Callable[[], list[str]],
) -> list[str]:
    """Frames at 10 fps, results in batches of 4 behind the ingest (as the pipeline delivers them)."""
    lines: list[str] = []
    pending: list[FrameResult] = []
    for i, det in enumerate(walkers()):
        f = Frame("cam", i, i / 10, 768, 576, wall_time=1.7e9 + i / 10, t_decoded=-1e9, decode_ms=1.5)
        if a.active and not a.should_detect(f):
            lines += skipped(f)
            continue
        pending.append(FrameResult(f, det, {"decode": 1.5, "queue": 0.25, "total": 9.0}))
        if len(pending) == 4:
            for r in pending:
                lines += detected(r)
            pending.clear()
    lines += ended()
    for r in pending:
        lines += detected(r)
    return lines + flushed()


@pytest.mark.parametrize("encoder", ["orjson", "stdlib"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_lines_are_byte_identical_to_the_string_encoder(name, encoder, tmp_path, monkeypatch):
    monkeypatch.setattr("time.perf_counter", lambda: 0.0)  # predicted frames' total latency: fixed
    if encoder == "stdlib":  # a box without orjson writes the same bytes (the golden hashes predate orjson)
        monkeypatch.setattr(output, "_dumps", output._dumps_stdlib)
    else:
        assert output._dumps is not output._dumps_stdlib, "orjson is a dependency: it must be in use"
    stream, tracking = CONFIGS[name]
    (tmp_path / "v.mp4").write_bytes(b"\0")
    data = {"streams": [{"id": "cam", "url": "v.mp4", **stream}], "tracking": tracking}
    a = StreamAnalytics(parse_config(data, tmp_path).streams[0], COCO_NAMES)
    if a.active:
        lines = replay(
            a,
            lambda r: encode_all(a.annotate(r), COCO_NAMES),
            lambda f: encode_all(a.skip(f), COCO_NAMES),
            lambda: encode_all(a.stream_ended(), COCO_NAMES),
            lambda: encode_all(a.flush(), COCO_NAMES),
        )
    else:
        lines = replay(a, lambda r: [frame_line(r, COCO_NAMES)], list, list, list)
    for line in lines[::7]:
        VALIDATOR.validate(json.loads(line))
    leaves = [line for line in lines if '"event":"leave"' in line]
    assert all(re.search(r',"time_in_zone_s":\d+(\.\d+)?,"track_id"', line) for line in leaves)
    before = re.sub(r',"time_in_zone_s":[^,]+', "", "".join(lines))
    assert hashlib.sha256(before.encode()).hexdigest() == GOLDEN[name]


def test_both_encoders_write_utf8_labels_and_equal_values() -> None:
    """Labels are written as UTF-8 by both encoders (not escaped); tiny floats are spelled differently
    (0.00001 vs 1e-05) but parse to the same values."""
    det = Detections(
        np.array([[1, 2, 3, 4]], np.float32), np.array([0.5], np.float32), np.array([0], np.int32)
    )
    r = FrameResult(Frame("cámara-1", 0, 0.00001, 640, 480, wall_time=1.7e9), det, {"total": 1.0})
    fast = output._dumps(output.frame_record(r, ["persona ñ"]))
    slow = output._dumps_stdlib(output.frame_record(r, ["persona ñ"]))
    assert '"label":"persona ñ"' in fast and '"label":"persona ñ"' in slow and '"stream":"cámara-1"' in fast
    assert json.loads(fast) == json.loads(slow) and json.loads(fast)["pts"] == 0.00001
    # numpy scalars (json writes np.float64, a float subclass; orjson needs its numpy option) and a value
    # orjson refuses but json takes (an int past 64 bits) give json's line, never an exception
    scalars = {"pts": np.float64(0.5), "frame": np.int64(7)}
    assert json.loads(output._dumps(scalars)) == {"pts": 0.5, "frame": 7}
    assert json.loads(output._dumps({"big": 2**70})) == {"big": 2**70}
    # a lone surrogate (YAML's "\udc80" in class_names) cannot be UTF-8: both encoders escape it, so every
    # sink can still write the line
    for dumps in (output._dumps, output._dumps_stdlib):
        line = dumps({"label": "person\udc80"})
        assert line.encode() and json.loads(line) == {"label": "person\udc80"}
