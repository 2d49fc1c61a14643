#!/usr/bin/env python3
"""torch engine throughput by batch, precision and engine settings (CUDA graphs, engine.compile, lanes).

    PYTHONPATH=<wheels> python bench/bench_engines.py [--model M.onnx --input-size W H | --config C.yaml]
        [--batches 1 8 16 32 64] [--precisions fp16 bf16 fp32] [--variants graphs eager lanes2 compile ...]
        (``compile+autotune``: engine.compile with Inductor's ``max_autotune``, Triton GEMM/conv templates
        benchmarked against cuBLAS/cuDNN at compile; a bench variant only, its compile time is unmeasured;
        ``compile+alldyn``: every input dimension symbolic, the compile before the nineteenth session;
        ``compile+cdt``: Inductor's ``coordinate_descent_tuning`` of its fused Triton kernels)
        [--seconds 1.0] [--budget-s 240] [--out DIR] [--device cpu]

Without ``--model``/``--config``: the bundled NanoDet, batch 1/8/32/64, fp32 and fp16 eager vs CUDA graphs,
plus an ablation of channels-last and cuDNN autotuning on fp16 with graphs (this script's historic rows).

The engine runs as the pipeline runs it: ``enqueue`` on slot buffers (max batch) on streams of ours. Per row,
medians over chunks of calls queued back to back after warm-up (the first call per batch captures the graph):
- ``GPU ms/call``: the span of a chunk of calls (>= ~50 ms; CUDA events: start before its first call, end
  after its last, on every stream used) over its calls; launch-bound engines show their launch time here,
  the GPU waiting for the host.
  ``lanes2`` feeds two streams of ours alternately, each with its own buffers, as two pipeline slots would;
- ``img/s`` = batch / GPU ms/call;
- ``latency ms``: host clock from ``enqueue`` to completion of a single call (nothing else queued).
Per engine (variant): start-up seconds (conversion, placement, compile; graph capture is in the first calls,
timed separately as ``first_calls_s``), GPU memory: torch's peak reserved (and the engine's share: less the
bench's frames and slot buffers) and nvidia-smi's figure for this process before the engine and after its
rows. Input: real frames of samples/vtest.mp4 preprocessed as the model wants (``--config``'s model section,
else ``--colour/--mean/--std``), never zeros. The config's engine keys are not read.

``--budget-s``: before each variant after the first, while the estimates of the variants left (build, measured
or guessed, plus rows) would pass the budget, the slowest of them is skipped (listed as skipped). The first
always runs and nothing is skipped before an engine is built: until one is timed, a compile's cost is only
a guess (150 s; YOLOv8s compiled in 30 s). The tables are rewritten after every variant, so a run cut short
by an outer timeout keeps what it measured.
``--device cpu``: the torch engine on the host (``infer``; a smoke test of this script, no GPU figures).
A variant or row that fails is reported as an error row and the run goes on. Writes ``bench_engines.md`` and
``bench_engines.json`` to ``--out`` (default: $OUT if set, else the current folder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "models" / "nanodet-coco.onnx"
CLIP = ROOT / "samples" / "vtest.mp4"
NANODET_PREP = ("bgr", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395))
COMPILE_GUESS_S = 150.0  # first torch.compile of a detector (Inductor) when none has been timed in this run


@dataclass(frozen=True)
class Variant:
    label: str
    precision: str
    graph_modes: tuple[bool, ...] = (True,)  # eager first: no graph exists yet for any key
    lanes: int = 1
    compile: bool = False
    extra: dict = field(default_factory=dict)  # EngineOptions overrides (ablations)
    inductor: dict = field(default_factory=dict)  # torch._inductor.config settings while it builds and runs
    dynamic: str = ""  # torch_compile.DYNAMIC_DIMS while it builds ("" = the engine's default)


def inductor_settings(values: dict) -> dict:
    """Set ``torch._inductor.config`` keys; returns their previous values (to set back)."""
    if not values:
        return {}
    import torch._inductor.config as config

    before = {k: getattr(config, k) for k in values}
    for k, v in values.items():
        setattr(config, k, v)
    return before


def plan(args: argparse.Namespace) -> list[Variant]:
    """Variants in the order they run: by precision as given, then default, lanes 2, compile, both."""
    if args.legacy:
        out = [Variant("default", p, (False, True)) for p in args.precisions]
        if not args.no_ablation:
            out += [Variant("no channels-last", "fp16", extra={"channels_last": False})]
            out += [Variant("no cuDNN autotune", "fp16", extra={"cudnn_benchmark": False})]
        return out
    want = set(args.variants)
    out = []
    for p in args.precisions:
        modes = tuple(m for m, name in ((False, "eager"), (True, "graphs")) if name in want)
        if modes:
            out.append(Variant("default", p, modes))
        if "lanes2" in want:
            out.append(Variant("lanes 2", p, lanes=2))
        if "compile" in want:
            out.append(Variant("compile", p, compile=True))
        if "compile+lanes2" in want:
            out.append(Variant("compile + lanes 2", p, lanes=2, compile=True))
        if "compile+autotune" in want:  # Inductor benchmarks Triton GEMM/conv templates against cuBLAS/cuDNN
            out.append(Variant("compile + max-autotune", p, compile=True, inductor={"max_autotune": True}))
        if "compile+cdt" in want:  # Inductor tunes its own Triton kernels' block sizes (not the convolutions)
            cdt = {"coordinate_descent_tuning": True}
            out.append(Variant("compile + coordinate descent", p, compile=True, inductor=cdt))
        if "compile+1x1mm" in want:  # 1x1 convolutions as matrix products (cuBLAS, bias/activation fusable)
            mm = {"conv_1x1_as_mm": True}
            out.append(Variant("compile + 1x1 conv as mm", p, compile=True, inductor=mm))
        if "compile+freeze" in want:  # weights as constants: Inductor folds and lays them out once
            out.append(Variant("compile + freezing", p, compile=True, inductor={"freezing": True}))
        if "compile+alldyn" in want:  # the compile before the nineteenth session: every dimension symbolic
            out.append(Variant("compile, every dim dynamic", p, compile=True, dynamic="all"))
    return out


def real_frames(n: int, w: int, h: int, prep: tuple[str, tuple, tuple]) -> np.ndarray:
    import cv2

    from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec

    colour, mean, std = prep
    pre = CpuPreprocessor(PreprocessSpec(w, h, colour, tuple(mean), tuple(std)))
    cap = cv2.VideoCapture(str(CLIP))
    out = np.empty((n, 3, h, w), np.float32)
    for i in range(n):
        ok, image = cap.read()
        if not ok:  # a short clip: start it again (the frames stay real)
            cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            ok, image = cap.read()
            if not ok:
                raise SystemExit(f"{CLIP}: cannot read frames")
        pre(image, out[i])
    return out


def smi_mb(pid: int) -> float | None:
    """nvidia-smi's used GPU memory of ``pid`` in MiB (None: no nvidia-smi or no entry)."""
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


class GpuRunner:
    """Calls of one engine on ``lanes`` streams of ours, each with its own input/output slot buffers."""

    def __init__(self, engine: Any, torch: Any, frames: Any, streams: int) -> None:
        from streamd.gpu.cuda import Stream

        self.engine, self.torch = engine, torch
        top = frames.shape[0]
        self.streams = [torch.cuda.Stream() for _ in range(streams)]
        self.handles = [Stream.borrow(s.cuda_stream) for s in self.streams]
        self.x = [frames] + [frames.clone() for _ in range(streams - 1)]
        self.y = [torch.empty((top, *engine.output_shape[1:]), device="cuda") for _ in range(streams)]
        self.turn = 0

    def call(self, batch: int) -> None:
        i = self.turn
        self.turn = (i + 1) % len(self.streams)
        self.engine.enqueue(self.x[i].data_ptr(), self.y[i].data_ptr(), batch, self.handles[i])

    def sync(self) -> None:
        for s in self.streams:
            s.synchronize()

    def chunk_ms(self, batch: int, calls: int) -> float:
        """GPU ms of ``calls`` calls queued back to back over all streams (events span them all)."""
        torch, main = self.torch, self.streams[0]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(main)
        for s in self.streams[1:]:
            s.wait_event(start)
        for _ in range(calls):
            self.call(batch)
        for s in self.streams[1:]:
            done = torch.cuda.Event()
            done.record(s)
            main.wait_event(done)
        end.record(main)
        end.synchronize()
        return start.elapsed_time(end)


class CpuRunner:
    """The host engine (``infer``): host clock only."""

    def __init__(self, engine: Any, frames: np.ndarray) -> None:
        self.engine, self.frames = engine, frames

    def call(self, batch: int) -> None:
        self.engine.infer(self.frames[:batch])

    def sync(self) -> None:
        pass

    def chunk_ms(self, batch: int, calls: int) -> float:
        t = time.perf_counter()
        for _ in range(calls):
            self.call(batch)
        return (time.perf_counter() - t) * 1e3


def measure(runner: Any, batch: int, seconds: float) -> dict:
    t = time.perf_counter()
    for _ in range(3 * len(getattr(runner, "streams", [0]))):  # warm-up: autotuning, capture per lane
        runner.call(batch)
    runner.sync()
    first_s = time.perf_counter() - t
    # Chunks of >= ~50 ms (4..64 calls, a multiple of the streams): the GPU's wait for the first launch after
    # the start event is then a negligible part of a chunk's span.
    lanes = len(getattr(runner, "streams", [0]))
    t = time.perf_counter()
    runner.call(batch)
    runner.sync()
    one_s = max(time.perf_counter() - t, 1e-5)
    chunk = lanes * max(2, min(64 // lanes, -(-int(0.05 / one_s) // lanes)))
    per_call, calls = [], 0
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(per_call) < 3:
        per_call.append(runner.chunk_ms(batch, chunk) / chunk)
        calls += chunk
    gpu_ms = statistics.median(per_call)
    lat = []
    for _ in range(max(10, min(200, calls // 2))):
        t = time.perf_counter()
        runner.call(batch)
        runner.sync()
        lat.append((time.perf_counter() - t) * 1e3)
    return {
        "batch": batch,
        "gpu_ms": round(gpu_ms, 4),
        "latency_ms": round(statistics.median(lat), 4),
        "img_per_s": round(batch / gpu_ms * 1e3, 1),
        "calls": calls,
        "first_calls_s": round(first_s, 2),
    }


def git_commit() -> str:
    """``STREAMD_COMMIT`` (set it on the GPU box, whose copy of the tree may carry a stale .git), else git."""
    if os.environ.get("STREAMD_COMMIT"):
        return os.environ["STREAMD_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def settings(args: argparse.Namespace) -> tuple[Path, tuple[int, int] | None, tuple[str, tuple, tuple]]:
    """(model path, input size (w, h) or None = the model's, preprocessing) from --config or the flags."""
    if args.config is not None:
        from streamd.config import load_config

        m = load_config(args.config).model
        size = tuple(args.input_size) if args.input_size else tuple(m.input_size)
        return Path(args.model or m.path), size, (m.channel_order, tuple(m.mean), tuple(m.std))  # type: ignore[return-value]
    size = tuple(args.input_size) if args.input_size else None
    if args.model is None:
        return MODEL, size, NANODET_PREP  # type: ignore[return-value]
    return Path(args.model), size, (args.colour, tuple(args.mean), tuple(args.std))  # type: ignore[return-value]


def run_all(
    args: argparse.Namespace, save: Callable[[list[dict], list[str], dict], object] | None = None
) -> tuple[list[dict], list[str], dict]:
    """Every variant's rows, the variants skipped and the run's facts; ``save`` gets them after each one."""
    import torch

    from streamd.engines import torch_compile
    from streamd.engines.options import EngineOptions
    from streamd.engines.torch import TorchEngine

    on_cpu = args.device == "cpu"
    if not on_cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --device cpu for a smoke test)")
    model, size, prep = settings(args)
    meta = run_facts(args, torch, model, size)
    top = max(args.batches)
    frames_cache: dict[tuple[int, int], Any] = {}
    rows: list[dict] = []
    skipped: list[str] = []
    t_start = time.monotonic()
    build_s: dict[tuple[str, bool], float] = {}  # (precision, compile) -> measured start-up

    def estimate(v: Variant) -> float:
        rows_s = len(v.graph_modes) * len(args.batches) * (args.seconds * 2.5 + 1.0)
        known = build_s.get((v.precision, v.compile)) or build_s.get(("fp16", v.compile))
        if known is None:
            base = max(build_s.values(), default=10.0)
            known = base + (COMPILE_GUESS_S if v.compile else 0.0)
        return known + rows_s

    todo = plan(args)
    while todo:
        # Over budget with what is left: skip the slowest variant left (by its estimate), until it fits.
        elapsed = time.monotonic() - t_start
        while build_s and todo and elapsed + sum(map(estimate, todo)) > args.budget_s:
            slowest = max(reversed(todo), key=estimate)  # of equals, the later one
            todo.remove(slowest)
            note = (
                f"{slowest.label} {slowest.precision}: skipped (budget {args.budget_s:.0f} s: "
                f"{elapsed:.0f} s used, ~{estimate(slowest):.0f} s estimated for it)"
            )
            skipped.append(note)
            print(note, flush=True)
        if not todo:
            break
        v = todo.pop(0)
        head = {"variant": v.label, "precision": v.precision, "lanes": v.lanes, "compile": v.compile}
        engine = None
        restore = inductor_settings(v.inductor)  # set back after this variant's rows
        try:
            if not on_cpu:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            smi_before = None if on_cpu else smi_mb(os.getpid())
            t0 = time.perf_counter()
            options = EngineOptions(
                max_batch=top, precision=v.precision, device="cpu" if on_cpu else 0, cuda_graphs=True,
                lanes=v.lanes, compile=v.compile, input_size=size, **v.extra,
            )  # fmt: skip
            dims_before = torch_compile.DYNAMIC_DIMS  # read when the engine compiles, in its constructor
            torch_compile.DYNAMIC_DIMS = v.dynamic or dims_before
            try:
                engine = TorchEngine(model, options)
            finally:
                torch_compile.DYNAMIC_DIMS = dims_before
            load_s = time.perf_counter() - t0
            build_s[(v.precision, v.compile)] = load_s
            if v.compile and engine.compile_failure:  # it runs uncompiled: its rows must not pass as compiled
                head = {
                    **head,
                    "variant": f"{v.label} (failed: runs uncompiled)",
                    "compile": False,
                    "compile_failure": engine.compile_failure,
                }
                print(f"{v.label} {v.precision}: engine.compile failed: {engine.compile_failure}", flush=True)
            _, h, w = engine.input_shape
            if (w, h) not in frames_cache:
                frames = real_frames(top, w, h, prep)
                frames_cache[(w, h)] = frames if on_cpu else torch.from_numpy(frames).cuda()
            frames = frames_cache[(w, h)]
            runner = CpuRunner(engine, frames) if on_cpu else GpuRunner(engine, torch, frames, v.lanes)
            head.update(load_s=round(load_s, 2), input=f"{w}x{h}", smi_before_mb=smi_before)
        except Exception as exc:  # a variant that cannot be built: one error row, the rest still runs
            rows.append({**head, "error": f"engine: {exc!r}"[:500]})
            print(json.dumps(rows[-1]), flush=True)
            if engine is not None:
                engine.close()
            inductor_settings(restore)
            if save is not None:
                save(rows, skipped, meta)
            continue
        first = len(rows)
        for graphs in v.graph_modes if not on_cpu else (False,):
            engine.cuda_graphs = graphs
            for batch in args.batches:
                row = {**head, "graphs": graphs, "batch": batch}
                try:
                    row.update(measure(runner, batch, args.seconds))
                    if graphs:
                        keys = [k for lane in engine._lanes for k in lane.graphs._graphs]
                        row["graph_captured"] = any(k[0] == batch for k in keys)
                except Exception as exc:
                    row["error"] = f"{exc!r}"[:500]
                rows.append(row)
                print(json.dumps(row), flush=True)
        # what a next engine like this one will cost: its build plus its first calls (compile, capture)
        build_s[(v.precision, v.compile)] = load_s + sum(r.get("first_calls_s", 0.0) for r in rows[first:])
        if not on_cpu:  # memory of this engine with all its rows' graphs and scratch
            peak = torch.cuda.max_memory_reserved() / 2**20
            # the bench's own input frames and slot buffers sit in the same allocator: the engine's share is
            # the rest (to the allocator's rounding)
            ours = sum(t.numel() * t.element_size() for t in runner.x + runner.y) / 2**20
            after = smi_mb(os.getpid())
            for row in rows[first:]:
                row.update(
                    max_reserved_mb=round(peak), engine_reserved_mb=round(peak - ours), smi_after_mb=after
                )
        engine.close()
        inductor_settings(restore)
        del runner, engine
        gc.collect()
        if save is not None:
            save(rows, skipped, meta)
    return rows, skipped, meta


def run_facts(args: argparse.Namespace, torch: Any, model: Path, size: Any) -> dict:
    meta = {
        "model": model.name,
        "input": "x".join(map(str, size)) if size else "model's",
        "device": args.device,
    }
    if args.device != "cpu":
        meta["gpu"] = torch.cuda.get_device_properties(0).name
        meta["cudnn"] = torch.backends.cudnn.version()
    meta["torch"] = torch.__version__
    meta.update(
        commit=git_commit(),
        date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        driver=_driver(),
    )
    return meta


def markdown(meta: dict, rows: list[dict], skipped: list[str]) -> str:
    lines = [
        f"GPU {meta.get('gpu', meta['device'])}, torch {meta['torch']} (cuDNN {meta.get('cudnn')}), "
        f"commit {meta['commit']}, {meta['date']}; model {meta['model']} at {meta['input']}, "
        "input: real vtest frames.",
        "",
        "| variant | precision | CUDA graphs | batch | GPU ms/call | img/s | latency ms (1 call) "
        "| start-up s | torch peak reserved MB (engine's) | nvidia-smi MB before → after |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        graphs = "yes" if r.get("graphs") else "no"
        lead = f"| {r['variant']} | {r['precision']} | {graphs} | {r.get('batch', '')} "
        if "error" in r:
            lines.append(lead + f"| error: {r['error'][:160]} | | | | | |")
            continue
        memory = f"{r['max_reserved_mb']} ({r['engine_reserved_mb']})" if "max_reserved_mb" in r else ""
        lines.append(
            lead + f"| {r['gpu_ms']:.3f} | {r['img_per_s']:,.0f} | {r['latency_ms']:.3f} | {r.get('load_s')} "
            f"| {memory} "
            f"| {r.get('smi_before_mb')} → {r.get('smi_after_mb')} |"
        )
    if skipped:
        lines += [
            "",
            "Skipped to stay within --budget-s (slowest variants first):",
            *(f"- {s}" for s in skipped),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="ONNX model (default: the bundled NanoDet)")
    p.add_argument("--config", type=Path, default=None, help="streamd config: its model section")
    p.add_argument("--input-size", type=int, nargs=2, metavar=("W", "H"), default=None)
    p.add_argument("--colour", choices=["rgb", "bgr"], default="rgb", help="with --model (YOLO: rgb)")
    p.add_argument("--mean", type=float, nargs=3, default=[0.0, 0.0, 0.0])
    p.add_argument("--std", type=float, nargs=3, default=[255.0, 255.0, 255.0])
    p.add_argument("--batches", type=int, nargs="+", default=None)
    p.add_argument("--precisions", nargs="+", default=None, choices=["fp16", "bf16", "fp32"])
    p.add_argument(
        "--variants", nargs="+", default=["eager", "graphs", "lanes2", "compile", "compile+lanes2"],
        choices=[
            "eager", "graphs", "lanes2", "compile", "compile+lanes2", "compile+autotune", "compile+alldyn",
            "compile+cdt", "compile+1x1mm", "compile+freeze",
        ],
        help="with --model/--config: engines per precision (eager and graphs share one engine)",
    )  # fmt: skip
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per row (back-to-back part)")
    p.add_argument(
        "--budget-s", type=float, default=None,
        help="seconds for the whole run, slowest variants skipped first (default 240; NanoDet rows: none)",
    )  # fmt: skip
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--no-ablation", action="store_true", help="bundled NanoDet: no channels-last/cuDNN rows")
    args = p.parse_args(argv)
    args.legacy = args.model is None and args.config is None
    if args.batches is None:
        args.batches = [1, 8, 32, 64] if args.legacy else [1, 8, 16, 32, 64]
    if args.precisions is None:
        args.precisions = ["fp32", "fp16"] if args.legacy else ["fp16", "bf16", "fp32"]
    if args.budget_s is None:
        args.budget_s = float("inf") if args.legacy else 240.0

    args.out.mkdir(parents=True, exist_ok=True)

    def save(rows: list[dict], skipped: list[str], meta: dict) -> str:
        table = markdown(meta, rows, skipped)
        (args.out / "bench_engines.md").write_text(table)
        (args.out / "bench_engines.json").write_text(
            json.dumps({"meta": meta, "rows": rows, "skipped": skipped}, indent=2)
        )
        return table

    rows, skipped, meta = run_all(args, save)
    print(save(rows, skipped, meta))
    return 0


def _driver() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""


if __name__ == "__main__":
    sys.exit(main())
