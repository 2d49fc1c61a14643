#!/usr/bin/env python3
"""RT-DETR-l's HGNetv2 stem alone, compiled several ways (a diagnostic for issue 26, not a benchmark).

    python tools/stem_bench.py [--batch 32] [--size 640]

tools/kernel_profile.py found the stem's fused pad + 2x2 max-pool (stride 1) + concat to be compiled
RT-DETR-l's largest kernel: 1.67 of 17.2 ms at batch 32, for ~840 MB of traffic. This builds the stem as
Ultralytics' export runs it (conv 3x3/2 + ReLU, pad, two 2x2 convs, the pool, concat, conv 3x3/2, conv 1x1;
random weights, fp16, channels-last) and times it compiled with only the batch symbolic (the engine's
default since the nineteenth session) and with every dimension symbolic (before), each with the pool as
``F.max_pool2d`` and as a max of four shifted slices; plus uncompiled. Per variant: GPU ms per call (CUDA
events, median) and its three most expensive kernels; every variant's output is checked against uncompiled.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from engine_probe import per_call_ms  # tools/: the same timing as kernel_profile's


class Stem(torch.nn.Module):
    def __init__(self, shift_max: bool) -> None:
        super().__init__()
        conv = torch.nn.Conv2d
        self.stem1, self.stem2a = conv(3, 32, 3, 2, 1), conv(32, 16, 2, 1, 0)
        self.stem2b, self.stem3, self.stem4 = conv(16, 32, 2, 1, 0), conv(64, 32, 3, 2, 1), conv(32, 48, 1)
        self.shift_max = shift_max

    def pool(self, p: torch.Tensor) -> torch.Tensor:
        if not self.shift_max:
            return F.max_pool2d(p, 2, 1, 0, ceil_mode=True)
        top = torch.maximum(p[:, :, :-1, :-1], p[:, :, :-1, 1:])
        return torch.maximum(top, torch.maximum(p[:, :, 1:, :-1], p[:, :, 1:, 1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem1(x))
        x = F.pad(x, [0, 1, 0, 1])
        x2 = F.relu(self.stem2b(F.pad(F.relu(self.stem2a(x)), [0, 1, 0, 1])))
        x = torch.cat([self.pool(x), x2], 1)
        return F.relu(self.stem4(F.relu(self.stem3(x))))


def top_kernels(fn, x, n: int = 3) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn(x)
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:n]
    return [f"{e.self_device_time_total / 5e3:.3f} ms {e.key[:90]}" for e in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=640)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.rand(args.batch, 3, args.size, args.size, device="cuda", dtype=torch.half)
    x = x.contiguous(memory_format=torch.channels_last)
    plain = Stem(False).cuda().half().eval().to(memory_format=torch.channels_last)
    shifted = Stem(True).cuda().half().eval().to(memory_format=torch.channels_last)
    shifted.load_state_dict(plain.state_dict())
    head = f"stem at batch {args.batch}, {args.size}x{args.size}, fp16, channels-last"
    print(f"{head} (torch {torch.__version__})")
    with torch.inference_mode():
        want = plain(x)
        variants = [("uncompiled", plain, None)]
        for name, m in (("max_pool2d", plain), ("shift max", shifted)):
            variants += [(f"compiled, batch dynamic, {name}", m, None)]
            variants += [(f"compiled, every dim dynamic, {name}", m, True)]
        for label, m, dynamic in variants:
            run = m
            if label != "uncompiled":
                # Dynamo's cache is per code object, not per torch.compile call: without a reset the second
                # compile of a module would reuse the first's graph
                torch._dynamo.reset()
                compiled = torch.compile(m, dynamic=dynamic)

                def run(t, compiled=compiled, mark=dynamic is None):
                    if mark:
                        torch._dynamo.maybe_mark_dynamic(t, 0)
                    return compiled(t)

            got = run(x)
            diff = (got.float() - want.float()).abs().max().item()
            ms = per_call_ms(lambda run=run: run(x), torch.cuda.current_stream(), torch, 50)
            print(f"{label}: {ms:.3f} ms per call, max |diff| vs uncompiled {diff:.3g}")
            for line in top_kernels(run, x):
                print("    " + line)


if __name__ == "__main__":
    main()
