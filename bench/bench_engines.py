#!/usr/bin/env python3
"""torch engine throughput: batch 1/8/32/64, eager vs CUDA graphs, FP32 vs FP16, on the bundled NanoDet.

    PYTHONPATH=<wheels> python bench/bench_engines.py [--out DIR] [--batches 1 8 32 64] [--seconds 1.0]

Runs the engine exactly as the pipeline does: ``enqueue`` on slot buffers (max batch) on a stream of ours. Two
figures per row, both medians over many calls after warm-up (the first call per batch captures the graph):
- ``GPU ms/call``: CUDA events around each call with calls queued back to back (per-call time when the queue
  is
  kept full; launch-bound engines show their launch time here, since the GPU waits for the host);
- ``latency ms``: host clock from ``enqueue`` to the stream's completion for a single call (what one batch
  waits when nothing else is queued).
Throughput = batch / GPU ms/call. Input: real frames of samples/vtest.mp4, letterboxed (never zeros).
Also an ablation of channels-last and cuDNN autotuning on FP16 with graphs. Writes ``bench_engines.md`` and
``bench_engines.json`` to ``--out`` (default: $OUT if set, else the current folder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "models" / "nanodet-coco.onnx"
CLIP = ROOT / "samples" / "vtest.mp4"


def real_frames(n: int, size: int = 416) -> np.ndarray:
    import cv2

    from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec

    spec = PreprocessSpec(size, size, "bgr", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395))
    prep = CpuPreprocessor(spec)
    cap = cv2.VideoCapture(str(CLIP))
    out = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        ok, image = cap.read()
        if not ok:
            raise SystemExit(f"{CLIP}: only {i} frames")
        prep(image, out[i])
    return out


def measure(engine, torch, x, y, batch: int, stream, seconds: float) -> dict:
    from streamd.gpu.cuda import Stream

    handle = Stream.borrow(stream.cuda_stream)  # engines take streamd's Stream objects
    for _ in range(3):  # warm-up: cuDNN autotuning, graph capture
        engine.enqueue(x.data_ptr(), y.data_ptr(), batch, handle)
    stream.synchronize()
    # Back to back, events around each call.
    pairs = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(pairs) < 20:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        engine.enqueue(x.data_ptr(), y.data_ptr(), batch, handle)
        end.record(stream)
        pairs.append((start, end))
        if len(pairs) % 50 == 0:
            stream.synchronize()
    stream.synchronize()
    gpu_ms = statistics.median(s.elapsed_time(e) for s, e in pairs)
    # One call at a time, host clock to completion.
    lat = []
    for _ in range(max(20, min(200, len(pairs) // 2))):
        t = time.perf_counter()
        engine.enqueue(x.data_ptr(), y.data_ptr(), batch, handle)
        stream.synchronize()
        lat.append((time.perf_counter() - t) * 1e3)
    return {
        "batch": batch,
        "gpu_ms": gpu_ms,
        "latency_ms": statistics.median(lat),
        "img_per_s": batch / gpu_ms * 1e3,
        "calls": len(pairs),
    }


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per row (back-to-back part)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--no-ablation", action="store_true")
    args = p.parse_args(argv)

    import torch

    from streamd.engines.options import EngineOptions
    from streamd.engines.torch import TorchEngine

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    top = max(args.batches)
    frames = torch.from_numpy(real_frames(top)).cuda()
    stream = torch.cuda.Stream()
    rows = []

    def run(label: str, precision: str, graph_modes: list[bool], **engine_kw) -> None:
        t0 = time.perf_counter()
        options = EngineOptions(max_batch=top, precision=precision, device=0, cuda_graphs=True, **engine_kw)
        engine = TorchEngine(MODEL, options)
        load_s = time.perf_counter() - t0
        y = torch.empty((top, *engine.output_shape[1:]), device="cuda")
        for graphs in graph_modes:  # eager first: no graph exists yet for any key
            engine.cuda_graphs = graphs
            for batch in args.batches:
                r = measure(engine, torch, frames, y, batch, stream, args.seconds)
                r.update(precision=precision, graphs=graphs, variant=label, load_s=round(load_s, 1))
                if graphs:
                    keys = [k for lane in engine._lanes for k in lane.graphs._graphs]
                    r["graph_captured"] = any(k[0] == batch for k in keys)
                rows.append(r)
                print(json.dumps(r), flush=True)
        engine.close()
        torch.cuda.empty_cache()

    for precision in ("fp32", "fp16"):
        run("default", precision, [False, True])
    if not args.no_ablation:
        run("no channels-last", "fp16", [True], channels_last=False)
        run("no cuDNN autotune", "fp16", [True], cudnn_benchmark=False)
        torch.backends.cudnn.benchmark = True

    props = torch.cuda.get_device_properties(0)
    meta = {
        "gpu": props.name,
        "driver": subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "commit": git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "model": MODEL.name,
    }
    lines = [
        f"GPU {meta['gpu']}, driver {meta['driver']}, torch {meta['torch']} (cuDNN {meta['cudnn']}), "
        f"commit {meta['commit']}, {meta['date']}; model {meta['model']}, input: real vtest frames.",
        "",
        "| variant | precision | CUDA graphs | batch | GPU ms/call | img/s | latency ms (1 call) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['precision']} | {'yes' if r['graphs'] else 'no'} | {r['batch']} | "
            f"{r['gpu_ms']:.3f} | {r['img_per_s']:,.0f} | {r['latency_ms']:.3f} |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_engines.md").write_text(table)
    (args.out / "bench_engines.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
