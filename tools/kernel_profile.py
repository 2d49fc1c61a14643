#!/usr/bin/env python3
"""Where a real-size model's GPU time goes, by kernel family (a diagnostic for issue 26, not a benchmark).

    PYTHONPATH=<wheels>:. python tools/kernel_profile.py --model rtdetr-l.onnx [--batch 32] [--compile]

For the torch engine at fp16 (channels-last, as the pipeline runs it) it prints, per model call: the GPU time
of each kernel family (convolutions, GEMMs, Inductor's fused Triton kernels, grid_sample, sorts and top-k,
layout changes and copies, the rest) and the top kernels by time. Uncompiled, it also prints the ATen
operators by CUDA time (which ops the converted graph spends its time in). The calls run without CUDA
graphs, so every kernel shows; the engine's ceiling with graphs is bench/bench_engines.py's figure.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# first match wins: cuDNN's convolution kernels carry "fprop"/"conv" in their names, its GEMM-shaped ones too
FAMILIES = (
    ("convolution", re.compile(r"fprop|conv|implicit_gemm|depthwise|winograd|cudnn", re.I)),
    ("GEMM", re.compile(r"gemm|cutlass|cublas|s16816|wmma|matmul|splitk", re.I)),
    ("fused (Triton)", re.compile(r"^triton_", re.I)),
    ("grid_sample", re.compile(r"grid_sampler", re.I)),
    ("sort / top-k", re.compile(r"sort|topk|radix|scan", re.I)),
    ("layout / copy / cast", re.compile(r"nchw|nhwc|copy|transpose|permute|cat|memcpy|memset", re.I)),
    ("elementwise / reduce (ATen)", re.compile(r"elementwise|reduce|vectorized|softmax|norm", re.I)),
)


def family(name: str) -> str:
    return next((label for label, rx in FAMILIES if rx.search(name)), "other")


def kernel_table(events, calls: int, top: int) -> str:
    """Per-call GPU ms by family, then the top kernels (the profiler's device events, by name)."""
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = e.self_cuda_time_total
        if us <= 0 or getattr(e, "device_type", None) is None:
            continue
        if str(e.device_type).endswith("CPU"):
            continue
        row = by_name[e.key]
        row[0] += us / 1e3
        row[1] += e.count
    total = sum(ms for ms, _ in by_name.values()) or 1.0
    fams: dict[str, float] = collections.Counter()
    for name, (ms, _) in by_name.items():
        fams[family(name)] += ms
    lines = [f"GPU kernel time per call: {total / calls:.3f} ms", "", "| family | ms per call | share |"]
    lines.append("|---|---:|---:|")
    for label, ms in sorted(fams.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {label} | {ms / calls:.3f} | {ms / total:.1%} |")
    lines += ["", "| kernel | family | ms per call | launches per call | share |", "|---|---|---:|---:|---:|"]
    for name, (ms, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        cells = f"{family(name)} | {ms / calls:.3f} | {n / calls:.1f} | {ms / total:.1%}"
        lines.append(f"| `{short}` | {cells} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--input-size", type=int, nargs=2, default=(640, 640), metavar=("W", "H"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--compile", action="store_true", help="engine.compile (Inductor)")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    import torch
    from engine_probe import per_call_ms  # tools/: the same timing as engine_probe's rows
    from torch.profiler import ProfilerActivity, profile

    from streamd.engines import EngineOptions
    from streamd.engines.torch import TorchEngine

    w, h, b = args.input_size[0], args.input_size[1], args.batch
    t = time.perf_counter()
    engine = TorchEngine(
        args.model,
        EngineOptions(
            max_batch=b,
            precision="fp16",
            device=0,
            cuda_graphs=False,
            compile=args.compile,
            input_size=(w, h),
        ),
    )
    what = "compiled" if args.compile and engine.compile_failure is None else "uncompiled"
    print(f"# {args.model.name}, batch {b}, fp16, {what} (start-up {time.perf_counter() - t:.1f} s)")
    if args.compile and engine.compile_failure:
        print(f"compile failed: {engine.compile_failure}")
    x = torch.rand((b, 3, h, w), device="cuda")
    ms = per_call_ms(lambda: engine._forward(x), torch.cuda.current_stream(), torch, args.calls)
    print(f"GPU ms per call without graphs (median): {ms:.3f} ms = {b / ms * 1e3:,.0f} img/s\n")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            engine._forward(x)
        torch.cuda.synchronize()
    print(kernel_table(prof.key_averages(), args.calls, args.top))
    if what == "compiled":  # what the compile changed in the output, against the same model uncompiled
        plain = TorchEngine(
            args.model,
            EngineOptions(max_batch=b, precision="fp16", device=0, cuda_graphs=False, input_size=(w, h)),
        )
        got, want = engine._forward(x), plain._forward(x)
        pairs = zip(got, want, strict=True) if isinstance(got, (tuple, list)) else [(got, want)]
        for k, (a, e) in enumerate(pairs):
            diff = (a.float() - e.float()).abs()
            print(
                f"\noutput {k} {tuple(a.shape)}: max |compiled - uncompiled| {float(diff.max()):.4g}, "
                f"mean {float(diff.mean()):.3g}, max |uncompiled| {float(e.float().abs().max()):.4g}"
            )
    if what == "uncompiled":
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as p2:
            for _ in range(args.calls):
                engine._forward(x)
            torch.cuda.synchronize()
        print("\nATen operators by CUDA time (all calls):")
        print(p2.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=50))
        convs = p2.key_averages(group_by_input_shape=True)
        print("\nATen operators by input shape (all calls; the convolutions' shapes among them):")
        print(
            convs.table(
                sort_by="cuda_time_total", row_limit=20, max_name_column_width=30, max_shapes_column_width=90
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
