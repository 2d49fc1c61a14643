"""Whole-daemon throughput and latency: the GPU pipeline vs its CPU twin, and the GPU pipeline at scale.

    PYTHONPATH=/path/to/wheels python bench/bench_pipeline.py [--streams 1 8 32] [--json OUT]

1. *Twins, same run*: the bundled demo clip (768×576 H.264, 795 frames) through the full daemon, once with
   the GPU path (NVDEC, preprocess kernel, torch engine fp16 + CUDA graphs, NMS kernel on three CUDA streams)
   and once with the CPU path (FFmpeg decode, OpenCV letterbox, ONNX Runtime CPU, numpy NMS): fps and ratio.
2. *Scale*: N streams of the synthetic 1080p30 H.264 clip (``bench_decode.py --make-clip``) read as fast as
   possible, GPU path, batch 32: total fps, and per-frame end-to-end latency (decode start to result)
   p50/p99 from the JSON lines.

Each run is a ``Supervisor`` in-process writing JSON lines to a file, timed from READY (model loaded,
engine warmed up) to the last result.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamd.config import parse_config  # noqa: E402
from streamd.supervisor import Supervisor  # noqa: E402

CLIP = ROOT / "samples" / "vtest.mp4"
CLIP_1080 = ROOT / ".cache" / "bench" / "synthetic-1080p30-h264.mp4"
MODEL = {
    "path": str(ROOT / "models" / "nanodet-coco.onnx"),
    "input_size": [416, 416],
    "channel_order": "bgr",
    "mean": [103.53, 116.28, 123.675],
    "std": [57.375, 57.12, 58.395],
    "layout": "yolov8",
    "score_threshold": 0.35,
    "iou_threshold": 0.5,
}


def run(clips: list[Path], engine: str, decoder: str, batch: int, out: Path) -> dict:
    raw = {
        "streams": [{"id": f"s{i}", "url": str(c)} for i, c in enumerate(clips)],
        "model": MODEL,
        "engine": {
            "type": engine,
            "precision": "fp16" if engine != "onnxruntime" else "fp32",
            "max_batch": 64,
            "compile": False,  # as its rows were measured (README's table); compile's are bench_engines'
        },
        "pipeline": {"batch_size": batch, "ring_slots": 4, "frame_queue": 8, "decoder": decoder},
        "sinks": [{"type": "jsonl", "path": str(out), "queue_size": 65536}],
        "log_level": "warning",
    }
    config = parse_config(raw, ROOT)
    out.unlink(missing_ok=True)
    daemon = Supervisor(config, status_line=False)
    rc = daemon.run()
    elapsed = daemon.last_result_at - daemon.ready_at  # model load and warm-up excluded
    records = [json.loads(line) for line in out.open()]
    total = np.array([r["latency_ms"]["total"] for r in records])
    return {
        "engine": engine,
        "decoder": decoder,
        "streams": len(clips),
        "batch": batch,
        "rc": rc,
        "frames": len(records),
        "seconds": round(elapsed, 3),
        "fps": round(len(records) / elapsed, 1),
        "latency_p50_ms": round(float(np.percentile(total, 50)), 2),
        "latency_p99_ms": round(float(np.percentile(total, 99)), 2),
        "detections_per_frame": round(sum(len(r["detections"]) for r in records) / max(1, len(records)), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.jsonl"
        gpu = run([CLIP], "torch", "nvdec", 16, out)  # the first run also converts the model and warms up
        gpu = run([CLIP], "torch", "nvdec", 16, out)
        rows.append(gpu)
        if importlib.util.find_spec("av") is not None:  # the CPU decoder needs PyAV
            cpu = run([CLIP], "onnxruntime", "cpu", 16, out)
            rows.append(cpu)
            print(
                f"twins on {CLIP.name}: GPU {gpu['fps']} fps vs CPU {cpu['fps']} fps "
                f"= {gpu['fps'] / cpu['fps']:.1f}x"
            )
        else:
            print(
                "PyAV missing: CPU twin run skipped (the GPU box gets no PyAV wheel; see tests/pipeline/gpu)"
            )
        if CLIP_1080.exists():
            for n in args.streams:
                rows.append(run([CLIP_1080] * n, "torch", "nvdec", 32, out))
        else:
            print(f"{CLIP_1080} missing: scale runs skipped (make it with bench/bench_decode.py --make-clip)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    print(f"commit {commit.stdout.strip()}  date {time.strftime('%Y-%m-%d %H:%M')}")
    print("| engine | decoder | streams | batch | frames | fps | p50 ms | p99 ms | det/frame |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['decoder']} | {r['streams']} | {r['batch']} | {r['frames']} | {r['fps']} "
            f"| {r['latency_p50_ms']} | {r['latency_p99_ms']} | {r['detections_per_frame']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
