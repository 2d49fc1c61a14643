"""Host cost of the per-stream analytics per frame, on synthetic walkers: CPU time of
``StreamAnalytics.annotate`` and its JSON lines (tracking, zones, events, dwell, line crossings) vs the plain
JSON line (made by orjson; also through stdlib json, side by side), for several object counts. The analytics
run in the worker's result thread, so this is what tracking adds per frame to that thread (and to the GIL).

    python bench/bench_analytics.py [--frames 2000] [--objects 5 20 50] [--out DIR]

Writes DIR/bench_analytics.{json,md} when --out is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamd.analytics.stream import StreamAnalytics  # noqa: E402
from streamd.config import parse_config  # noqa: E402
from streamd.config.coco import COCO_NAMES  # noqa: E402
from streamd.types import Detections, Frame, FrameResult  # noqa: E402
from streamd.worker import output  # noqa: E402
from streamd.worker.output import encode_all, frame_line  # noqa: E402


def walkers(frames: int, objects: int, seed: int = 0) -> list[Detections]:
    """``objects`` boxes walking across a 1920x1080 picture with noise; some leave and new ones come."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform([0, 200], [1920, 1000], (objects, 2))
    vel = rng.normal(0, 4, (objects, 2))
    size = rng.uniform([40, 100], [80, 200], (objects, 2))
    out = []
    for _ in range(frames):
        pos += vel
        gone = (pos[:, 0] < 0) | (pos[:, 0] > 1920) | (pos[:, 1] < 100) | (pos[:, 1] > 1080)
        pos[gone] = rng.uniform([0, 200], [1920, 1000], (int(gone.sum()), 2))
        centre = pos + rng.normal(0, 1.5, pos.shape)
        xyxy = np.concatenate([centre - size / 2, centre + size / 2], 1).astype(np.float32)
        score = rng.uniform(0.3, 0.95, objects).astype(np.float32)
        shown = rng.uniform(0, 1, objects) > 0.05  # missed detections
        out.append(Detections(xyxy[shown], score[shown], np.zeros(int(shown.sum()), np.int32)))
    return out


def cpu_ms_per_frame(fn, dets: list[Detections]) -> float:
    t = time.process_time()
    for k, det in enumerate(dets):
        fn(FrameResult(Frame("cam", k, k / 30, 1920, 1080), det, {"decode": 1.0, "queue": 1.0, "total": 2.0}))
    return (time.process_time() - t) / len(dets) * 1e3


def skipped_cpu_ms(hook: StreamAnalytics, dets: list[Detections]) -> float:
    """CPU ms per skipped frame at 30 fps with ``detect_fps`` set: ``skip`` and the predicted line it hands
    back (``tracking.fill_skipped``); the detected frames' ``annotate`` runs but is not counted."""
    spent, skipped = 0.0, 0
    for k, det in enumerate(dets):
        frame = Frame("cam", k, k / 30, 1920, 1080, wall_time=k / 30)
        if hook.should_detect(frame):
            result = FrameResult(frame, det, {"decode": 1.0, "queue": 1.0, "total": 2.0})
            encode_all(hook.annotate(result), COCO_NAMES)
            continue
        t = time.process_time()
        encode_all(hook.skip(frame), COCO_NAMES)
        spent += time.process_time() - t
        skipped += 1
    return spent / max(skipped, 1) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--objects", type=int, nargs="*", default=[5, 20, 50])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "v.mp4").write_bytes(b"\0")
    zone = {"name": "left", "polygon": [[0, 0], [960, 0], [960, 1080], [0, 1080]]}
    lines = [{"name": f"x{x}", "points": [[x, 100], [x + 100, 1000]]} for x in (300, 700, 1100, 1500)]
    setups = {
        "plain line, stdlib json": "json",
        "plain line": None,
        "tracking": {"streams": [{"id": "cam", "url": "v.mp4"}], "tracking": {"enabled": True}},
        "tracking + zone + events": {
            "streams": [{"id": "cam", "url": "v.mp4", "zones": [zone]}],
            "tracking": {"enabled": True},
        },
        "+ dwell + 4 lines": {
            "streams": [{"id": "cam", "url": "v.mp4", "zones": [{**zone, "dwell_s": 2}], "lines": lines}],
            "tracking": {"enabled": True},
        },
        "fill: a skipped frame (detect_fps 10)": {
            "streams": [{"id": "cam", "url": "v.mp4", "detect_fps": 10}],
            "tracking": {"enabled": True, "fill_skipped": True},
        },
    }
    rows = []
    for n in args.objects:
        dets = walkers(args.frames, n)
        cpu_ms_per_frame(lambda r: frame_line(r, COCO_NAMES), dets[:200])  # warm both encoders' caches
        cpu_ms_per_frame(lambda r: output._dumps_stdlib(output.frame_record(r, COCO_NAMES)), dets[:200])
        row = {"objects": n}
        for name, data in setups.items():
            if data == "json":  # the same line through stdlib json (where orjson is not installed)
                fast, output._dumps = output._dumps, output._dumps_stdlib
                try:
                    row[name] = cpu_ms_per_frame(lambda r: frame_line(r, COCO_NAMES), dets)
                finally:
                    output._dumps = fast
            elif data is None:
                row[name] = cpu_ms_per_frame(lambda r: frame_line(r, COCO_NAMES), dets)
            elif name.startswith("fill"):
                hook = StreamAnalytics(parse_config(data, tmp).streams[0], COCO_NAMES)
                row[name] = skipped_cpu_ms(hook, dets)
            else:
                hook = StreamAnalytics(parse_config(data, tmp).streams[0], COCO_NAMES)
                row[name] = cpu_ms_per_frame(lambda r, h=hook: encode_all(h.annotate(r), COCO_NAMES), dets)
        rows.append(row)
    header = "| objects per frame | " + " | ".join(f"{k} (CPU ms/frame)" for k in setups) + " |"
    lines = [header, "|" + "---|" * (len(setups) + 1)]
    lines += ["| " + " | ".join([str(r["objects"])] + [f"{r[k]:.3f}" for k in setups]) + " |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_analytics.json").write_text(json.dumps(rows, indent=1))
        (args.out / "bench_analytics.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
