"""CPU benchmark: the full daemon vs ONNX Runtime alone on the same frames, same run.

"ORT alone" is the ceiling: every frame of the clip decoded and letterboxed up front, then only
``engine.infer`` timed, at the daemon's batch size. "Daemon" is ``streamd run`` in-process on the same
clip (decode, preprocess, inference, NMS, JSON to a file), timed from READY (model loaded) to the last result.
Runs alternate (ORT, daemon, ORT, daemon …) and the best of each is reported, so background noise
hits both alike.

    python bench/bench_cpu.py [--config configs/demo.yaml] [--repeats 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import av
import numpy as np

from streamd.config import JsonlSinkConfig, load_config
from streamd.engines import create_engine
from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec
from streamd.supervisor import Supervisor


def decode_all(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="bgr24") for f in c.decode(video=0)]


def ort_alone(config, images: list[np.ndarray]) -> float:
    m, e = config.model, config.engine
    engine = create_engine("onnxruntime", m.path, max_batch=e.max_batch, threads=e.threads)
    pre = CpuPreprocessor(
        PreprocessSpec(*m.input_size, m.channel_order, tuple(m.mean), tuple(m.std), m.resize)
    )
    batch = config.pipeline.batch_size
    inputs = np.empty((len(images), 3, m.input_size[1], m.input_size[0]), np.float32)
    for i, img in enumerate(images):
        pre(img, inputs[i])
    engine.infer(inputs[:batch])  # warm-up
    t = time.perf_counter()
    for i in range(0, len(inputs), batch):
        engine.infer(inputs[i : i + batch])
    elapsed = time.perf_counter() - t
    engine.close()
    return len(images) / elapsed


def daemon_run(config, out: Path) -> tuple[float, int]:
    cfg = dataclasses.replace(config, sinks=(JsonlSinkConfig(path=out),))
    if out.exists():
        out.unlink()
    d = Supervisor(cfg, status_line=False)
    assert d.run() == 0
    elapsed = d.last_result_at - d.ready_at  # model load excluded, as for ORT alone
    lines = sum(1 for _ in out.open())
    return lines / elapsed, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="config file (default: the bundled demo)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = load_config(args.config)
    if len(config.streams) != 1 or config.streams[0].is_live:
        raise SystemExit("bench_cpu: needs a config with one file stream")
    images = decode_all(config.streams[0].path)
    ort, dmn = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            ort.append(ort_alone(config, images))
            fps, lines = daemon_run(config, Path(tmp) / "out.jsonl")
            assert lines == len(images), (lines, len(images))
            dmn.append(fps)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "frames": len(images),
        "batch_size": config.pipeline.batch_size,
        "ort_alone_fps": round(max(ort), 2),
        "daemon_fps": round(max(dmn), 2),
        "ratio": round(max(dmn) / max(ort), 3),
        "runs_ort": [round(x, 2) for x in ort],
        "runs_daemon": [round(x, 2) for x in dmn],
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"frames {result['frames']}  batch {result['batch_size']}")
    print(f"ONNX Runtime alone : {result['ort_alone_fps']:8.2f} fps  runs {result['runs_ort']}")
    print(f"streamd daemon     : {result['daemon_fps']:8.2f} fps  runs {result['runs_daemon']}")
    print(f"ratio daemon / ORT : {result['ratio']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
