#!/usr/bin/env python3
"""The torch engine's img/s while something else uses the GPU (a diagnostic for issue 26 point 4).

    PYTHONPATH=<wheels>:. python tools/engine_under_load.py --model rtdetr-l.onnx --batch 56 \
        --phase-file /tmp/phase --ready-file /tmp/engine-ready --stop-file /tmp/engine-stop

At 168 cameras on ``detect_fps: 10`` the engine carries the rows per second of 56 cameras at full rate, yet
it saturates there: decoding three times the frames costs it throughput. This script says how much, and
whether a lever gives it back: it builds the engine as the shared engine process runs it (fp16,
``engine.compile``, CUDA graphs, a stream at the engine stage's priority), then calls it back to back at one
batch size and prints one JSON line per ``--interval`` seconds: img/s over the interval's wall clock (and over
the CUDA-event span from its first call to its last, which includes the host's waits) tagged with the text of
``--phase-file`` at that moment (``--no-compile``: an engine built in seconds, for a short call). A driver
script (tools/gpu_models.sh ``contend``) writes the phase's name there as it starts and stops loads beside
it (a daemon decoding cameras under a null detector, with or without an SM limit); at the end the medians per
phase are printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def read_phase(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--batch", type=int, default=56)
    p.add_argument("--input-size", type=int, nargs=2, default=[640, 640])
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--priority", type=int, default=-3, help="the engine stream's priority (lower = higher)")
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=600.0, help="stop after this long at the latest")
    p.add_argument("--phase-file", type=Path, required=True)
    p.add_argument("--ready-file", type=Path, required=True)
    p.add_argument("--stop-file", type=Path, required=True)
    args = p.parse_args(argv)

    import torch
    from bench_engines import real_frames

    from streamd.engines.options import EngineOptions
    from streamd.engines.torch import TorchEngine
    from streamd.gpu.cuda import Stream

    w, h = args.input_size
    t0 = time.perf_counter()
    engine = TorchEngine(
        args.model,
        EngineOptions(
            max_batch=args.batch, precision="fp16", device=0, cuda_graphs=True, compile=not args.no_compile,
            input_size=(w, h),
        ),
    )  # fmt: skip
    frames = torch.from_numpy(real_frames(args.batch, w, h, ("rgb", (0.0, 0.0, 0.0), (255.0,) * 3))).cuda()
    out = torch.empty((args.batch, *engine.output_shape[1:]), device="cuda")
    stream = torch.cuda.Stream(priority=args.priority)
    handle = Stream.borrow(stream.cuda_stream)

    def call() -> None:
        engine.enqueue(frames.data_ptr(), out.data_ptr(), args.batch, handle)

    for _ in range(5):  # compile, capture, autotune
        call()
    stream.synchronize()
    built = {"built_s": round(time.perf_counter() - t0, 1), "priority": stream.priority}
    print(json.dumps(built), flush=True)
    args.ready_file.write_text("ready\n")

    per_phase: dict[str, list[float]] = collections.defaultdict(list)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end and not args.stop_file.exists():
        phase = read_phase(args.phase_file)
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        w0, calls = time.perf_counter(), 0
        start_ev.record(stream)
        while time.perf_counter() - w0 < args.interval:
            for _ in range(4):
                call()
            calls += 4
            stream.synchronize()  # the host waits as the engine process does: one batch in flight at most
        end_ev.record(stream)
        end_ev.synchronize()
        wall = time.perf_counter() - w0
        gpu_s = start_ev.elapsed_time(end_ev) / 1e3
        if phase != read_phase(args.phase_file):
            continue  # the phase changed inside this interval: the sample belongs to neither
        rate = calls * args.batch / wall
        per_phase[phase].append(rate)
        print(json.dumps({
            "t": round(time.time(), 1), "phase": phase, "img_s": round(rate, 1),
            "img_s_gpu": round(calls * args.batch / gpu_s, 1), "calls": calls,
        }), flush=True)  # fmt: skip
    print("# medians per phase (img/s, samples)")
    for phase, rates in per_phase.items():
        print(f"{phase}: {statistics.median(rates):.1f} img/s over {len(rates)} samples, "
              f"min {min(rates):.1f} max {max(rates):.1f}")  # fmt: skip
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
