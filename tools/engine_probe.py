#!/usr/bin/env python3
"""Where the torch engine's time goes at one batch size (a diagnostic, not a benchmark of record).

    PYTHONPATH=<wheels>:. python tools/engine_probe.py [--batch 32] [--compile]

Prints: GPU ms per call back to back (graphs on, as the pipeline runs it), the top CUDA kernels of a few
eager calls (torch.profiler), and with ``--compile`` the same module through ``torch.compile`` (if Triton
is there), to see how far the converted model is from what the GPU can do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def per_call_ms(run, stream, torch, calls: int = 200) -> float:
    for _ in range(5):
        run()
    stream.synchronize()
    pairs = []
    for _ in range(calls):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        run()
        b.record(stream)
        pairs.append((a, b))
    stream.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs)


def max_pool_variants(engine, x, stream, torch) -> None:
    """The model's MaxPool on its real input: channels-last (as run), NCHW, and a max of strided slices."""
    seen = []
    pools = [m for m in engine.module.modules() if isinstance(m, torch.nn.MaxPool2d)]
    if not pools:
        return
    hook = pools[0].register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.cuda.stream(stream), torch.inference_mode():
        engine._forward(x)
    hook.remove()
    pool, a = pools[0], seen[0]
    k, st = pool.kernel_size, pool.stride
    nhwc = a.is_contiguous(memory_format=torch.channels_last)
    print(f"MaxPool {pool}: input {tuple(a.shape)} {a.dtype} channels_last={nhwc}")
    f = torch.nn.functional

    def strided():
        kh, kw = (k, k) if isinstance(k, int) else k
        sh, sw = (st, st) if isinstance(st, int) else st
        h = (a.shape[2] - kh) // sh + 1
        w = (a.shape[3] - kw) // sw + 1
        out = a[:, :, 0 : sh * (h - 1) + 1 : sh, 0 : sw * (w - 1) + 1 : sw]
        for i in range(kh):
            for j in range(kw):
                if i or j:
                    out = torch.maximum(
                        out, a[:, :, i : i + sh * (h - 1) + 1 : sh, j : j + sw * (w - 1) + 1 : sw]
                    )
        return out

    with torch.cuda.stream(stream), torch.inference_mode():
        want = pool(a)
        assert torch.equal(strided(), want)
        rows = {
            "as run": lambda: pool(a),
            "NCHW": lambda: f.max_pool2d(a.contiguous(), k, st).contiguous(memory_format=torch.channels_last),
            "strided max": strided,
        }
        for name, fn in rows.items():
            print(f"  maxpool {name}: {per_call_ms(fn, stream, torch, 100):.3f} ms")


def compiled_engine(plain, x, b: int, stream, handle, torch) -> None:
    """The engine with ``compile=True``: compile time, per-call time (graphs), agreement with plain."""
    from bench_engines import MODEL

    from streamd.engines import EngineOptions
    from streamd.engines.torch import TorchEngine

    try:
        t = time.perf_counter()
        engine = TorchEngine(
            MODEL, EngineOptions(max_batch=b, precision="fp16", device=0, cuda_graphs=True, compile=True)
        )
        if engine.compile_failure:  # the engine fell back to the uncompiled model
            print(f"torch.compile failed: {engine.compile_failure}")
            return
        print(f"compiled at start-up (batch 1 and 2) in {time.perf_counter() - t:.1f} s")
        for n in (b, 1):
            y = torch.empty((n, *engine.output_shape[1:]), device="cuda")
            want = torch.empty_like(y)
            t = time.perf_counter()
            engine.enqueue(x.data_ptr(), y.data_ptr(), n, handle)  # captures
            stream.synchronize()
            took = time.perf_counter() - t
            ms = per_call_ms(
                lambda n=n, y=y: engine.enqueue(x.data_ptr(), y.data_ptr(), n, handle), stream, torch
            )
            plain.enqueue(x.data_ptr(), want.data_ptr(), n, handle)
            stream.synchronize()
            err = float((y - want).abs().max())
            print(
                f"compiled, batch {n}: first call {took:.1f} s, {ms:.3f} ms/call, max diff vs plain {err:.4f}"
            )
    except Exception as exc:  # no Triton, or the converted graph does not compile
        print(f"torch.compile failed: {type(exc).__name__}: {str(exc)[:600]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    import torch
    from bench_engines import MODEL, real_frames

    from streamd.engines import EngineOptions
    from streamd.engines.torch import TorchEngine
    from streamd.gpu.cuda import Stream

    b = args.batch
    x = torch.from_numpy(real_frames(b)).cuda()
    stream = torch.cuda.Stream()
    handle = Stream.borrow(stream.cuda_stream)
    engine = TorchEngine(MODEL, EngineOptions(max_batch=b, precision="fp16", device=0, cuda_graphs=True))
    y = torch.empty((b, *engine.output_shape[1:]), device="cuda")
    ms = per_call_ms(lambda: engine.enqueue(x.data_ptr(), y.data_ptr(), b, handle), stream, torch)
    print(f"graphs, batch {b}: {ms:.3f} ms/call = {b / ms * 1e3:,.0f} img/s", flush=True)
    xh = x.half().contiguous(memory_format=torch.channels_last)
    with torch.cuda.stream(stream), torch.inference_mode():
        ms_h = per_call_ms(lambda: engine.module(xh), stream, torch, 100)
        ms_e = per_call_ms(lambda: engine._run(x, y), stream, torch, 100)
    print(f"eager, batch {b}: {ms_e:.3f} ms/call (fp32 in, cast, copy out); fp16 NHWC in: {ms_h:.3f}")
    from torch.profiler import ProfilerActivity, profile

    cuda = [ProfilerActivity.CUDA]
    with torch.cuda.stream(stream), torch.inference_mode(), profile(activities=cuda) as prof:
        for _ in range(10):
            engine._run(x, y)
        stream.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=70))
    cpu_cuda = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with (
        torch.cuda.stream(stream),
        torch.inference_mode(),
        profile(activities=cpu_cuda, record_shapes=True) as p2,
    ):
        for _ in range(10):
            engine._run(x, y)
        stream.synchronize()
    ops = p2.key_averages(group_by_input_shape=True)
    print(
        ops.table(
            sort_by="cuda_time_total", row_limit=30, max_name_column_width=40, max_shapes_column_width=70
        )
    )
    max_pool_variants(engine, x, stream, torch)
    if args.compile:
        compiled_engine(engine, x, b, stream, handle, torch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
