#!/usr/bin/env python3
"""GPU path vs CPU path, end to end, on the same clips: F1 of the detections at IoU >= 0.9 (issue 25 point 5).

Both sides run the daemon (``streamd run``) on the same clips with the bundled NanoDet (score 0.35, NMS 0.5):

- ``run --side cpu``: PyAV demux + CpuDecoder (FFmpeg) + CPU preprocess + ONNX Runtime + numpy NMS;
- ``run --side gpu``: NVDEC + preprocess kernel + torch engine (fp32 unless ``--precision``) + NMS kernel;
  ``--no-tf32`` sets NVIDIA_TF32_OVERRIDE=0 (cuDNN/cuBLAS then never use TF32 for FP32 convolutions), to
  separate the engine's arithmetic from the preprocessing; ``--ignore-colour-signal`` makes NVDEC's pictures
  keep the source's default matrix/range (what it did before it read the SPS: with the OpenCV demuxer, BT.601
  limited under 720 lines whatever the stream says), through a sitecustomize in a temporary folder;
- ``compare CPU.jsonl GPU.jsonl``: per stream and frame, detections of the same class matched one to one
  (greedily, highest IoU first) at IoU >= 0.9: F1 = 2 TP / (2 TP + FP + FN), CPU taken as the truth. Also
  the share of strong CPU detections (score >= 0.38) matched at IoU >= 0.95.

Clips: the bundled vtest.mp4 (768x576 H.264, B-frames) and vtest-hevc.mp4, plus the low-resolution clips
``tools/make_lowres_clip.sh`` makes (384x288 H.264, 3 B-frames: BT.601 limited, BT.709 limited, BT.601 full
range), where present. The two sides run on different machines (the GPU box has no PyAV): run each, bring
the JSONL files together, compare.

    python bench/bench_preprocess_f1.py run --side cpu --out out/f1          # here (2 cores: ~3 min)
    python bench/bench_preprocess_f1.py run --side gpu --out out/f1 [--no-tf32]   # on the GPU box
    python bench/bench_preprocess_f1.py compare out/f1/cpu.jsonl out/f1/gpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIPS = {
    "vtest": ROOT / "samples" / "vtest.mp4",
    "vtest-hevc": ROOT / "samples" / "vtest-hevc.mp4",
    "lowres-bt601": ROOT / ".assets-work" / "lowres" / "vtest-384-bt601.mp4",
    "lowres-bt709": ROOT / ".assets-work" / "lowres" / "vtest-384-bt709.mp4",
    "lowres-full": ROOT / ".assets-work" / "lowres" / "vtest-384-full.mp4",
}
MODEL = """model:
  path: {root}/models/nanodet-coco.onnx
  input_size: [416, 416]
  channel_order: bgr
  mean: [103.53, 116.28, 123.675]
  std: [57.375, 57.12, 58.395]
  resize: letterbox
  layout: yolov8
  class_names: coco
  score_threshold: 0.35
  iou_threshold: 0.5
"""


IGNORE_SIGNAL = """import streamd.ingest.decode.nvdec as nvdec
nvdec.with_colour = lambda info, sps: info
"""


def run(
    side: str, out: Path, precision: str, tf32: bool, names: list[str], ignore_signal: bool = False
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tag = side if side == "cpu" else f"gpu-{precision}{'' if tf32 else '-notf32'}"
    tag += "-nosignal" if ignore_signal else ""
    jsonl, cfg = out / f"{tag}.jsonl", out / f"{tag}.yaml"
    clips = {n: CLIPS[n] for n in names if CLIPS[n].exists()}
    missing = sorted(set(names) - set(clips))
    if missing:
        print(f"skipped (clip not made: tools/make_lowres_clip.sh): {', '.join(missing)}", file=sys.stderr)
    streams = "".join(f"  - id: {n}\n    url: {p}\n" for n, p in clips.items())
    engine = (
        "engine:\n  type: onnxruntime\n  max_batch: 4\npipeline:\n  batch_size: 4\n  decoder: cpu\n"
        if side == "cpu"
        else f"engine:\n  type: torch\n  precision: {precision}\n  max_batch: 16\n  compile: false\n"
        "pipeline:\n  batch_size: 16\n  decoder: nvdec\n"
    )
    cfg.write_text(
        f"streams:\n{streams}{MODEL.format(root=ROOT)}{engine}sinks:\n  - type: jsonl\n    path: {jsonl}\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not tf32:
        env["NVIDIA_TF32_OVERRIDE"] = "0"
    if ignore_signal:  # every process of the daemon (workers too) imports it at start-up
        site = out / "nosignal-site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(IGNORE_SIGNAL)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(ROOT), env.get("PYTHONPATH", "")]))
    jsonl.unlink(missing_ok=True)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    (out / f"{tag}.log").write_text(proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"streamd run ({tag}) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    print(f"{tag}: {sum(1 for _ in jsonl.open())} lines in {time.monotonic() - started:.0f} s -> {jsonl}")
    return jsonl


def load(path: Path) -> dict[str, dict[int, list[dict]]]:
    out: dict[str, dict[int, list[dict]]] = defaultdict(dict)
    for line in path.open():
        r = json.loads(line)
        if "detections" in r:
            out[r["stream"]][r["frame"]] = r["detections"]
    return out


def iou(a: list[float], b: list[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match(ref: list[dict], got: list[dict], threshold: float) -> list[tuple[int, int, float]]:
    """One-to-one pairs (ref index, got index, IoU) of the same class with IoU >= threshold, best first."""
    pairs = sorted(
        (
            (iou(r["box"], g["box"]), i, j)
            for i, r in enumerate(ref)
            for j, g in enumerate(got)
            if r["class_id"] == g["class_id"]
        ),
        reverse=True,
    )
    used_r, used_g, out = set(), set(), []
    for v, i, j in pairs:
        if v < threshold:
            break
        if i not in used_r and j not in used_g:
            used_r.add(i)
            used_g.add(j)
            out.append((i, j, v))
    return out


def compare(cpu_path: Path, gpu_path: Path, strong: float = 0.38) -> list[dict]:
    cpu, gpu = load(cpu_path), load(gpu_path)
    rows = []
    for stream in sorted(cpu):
        ref, got = cpu[stream], gpu.get(stream, {})
        tp = fp = fn = strong_total = strong_hit = 0
        frames = sorted(set(ref) | set(got))
        for f in frames:
            r, g = ref.get(f, []), got.get(f, [])
            pairs = match(r, g, 0.9)
            tp += len(pairs)
            fp += len(g) - len(pairs)
            fn += len(r) - len(pairs)
            strong_idx = {i for i, d in enumerate(r) if d["score"] >= strong}
            strong_total += len(strong_idx)
            strong_hit += sum(1 for i, _, v in match(r, g, 0.95) if i in strong_idx)
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
        rows.append(
            {
                "stream": stream,
                "frames_cpu": len(ref),
                "frames_gpu": len(got),
                "cpu_dets": tp + fn,
                "gpu_dets": tp + fp,
                "f1_iou90": round(f1, 4),
                "strong_matched_iou95": round(strong_hit / strong_total, 4) if strong_total else None,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--side", choices=["cpu", "gpu"], required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    r.add_argument("--no-tf32", action="store_true")
    r.add_argument("--ignore-colour-signal", action="store_true")
    r.add_argument("--clips", nargs="+", default=list(CLIPS), choices=list(CLIPS))
    c = sub.add_parser("compare")
    c.add_argument("cpu", type=Path)
    c.add_argument("gpu", type=Path)
    c.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.side, args.out, args.precision, not args.no_tf32, args.clips, args.ignore_colour_signal)
        return
    rows = compare(args.cpu, args.gpu)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| clip | frames (CPU / GPU) | detections (CPU / GPU) | F1 at IoU 0.9 | strong matched IoU 0.95 |")
    print("|---|---:|---:|---:|---:|")
    for x in rows:
        print(
            f"| {x['stream']} | {x['frames_cpu']} / {x['frames_gpu']} | {x['cpu_dets']} / {x['gpu_dets']} "
            f"| {x['f1_iou90']:.4f} | {x['strong_matched_iou95']} |"
        )


if __name__ == "__main__":
    main()
