"""Kernel benchmarks on the GPU, each against its CPU twin on the same inputs in the same run.

- Device copy bandwidth: a 1 GiB device-to-device copy (bytes read + written per second), the ceiling.
- Preprocess: real video frames upscaled to 1920x1080 NV12 (a distinct device buffer per frame) ->
  640x640 float16 letterbox, batch 1/16/64. GPU: the kernel alone (parameters uploaded once), per batch;
  achieved bytes/s = (NV12 bytes in + tensor bytes out) / time, as % of the copy bandwidth. CPU: OpenCV
  NV12 -> BGR (cv2.cvtColor) + the CPU twin (CpuPreprocessor: letterbox + normalise, float32) on the same
  frames, summed over the batch.
- NMS: YOLOv8 [B, 84, 8400] (80 classes) synthetic outputs, batch 1/16/64, typical (3% positives) and dense
  (every candidate above threshold -> top 1000). GPU: memset + decode + NMS kernels per batch, and with the
  one D2H copy of the results into pinned memory. CPU: the numpy twin (CpuPostprocessor). Results compared.
- Start-up: two fresh processes loading both kernel modules with one new cache dir: compile vs cubin cache.

GPU times: CUDA events around ``reps`` back-to-back calls, divided by ``reps``, median of 7 such runs after
warm-up. CPU times: perf_counter, median over repeats.

Usage: python bench/bench_kernels.py [--out DIR] [--quick]   (writes DIR/bench_kernels.{json,md})
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamd.gpu.cuda import Context, DeviceBuffer, Event, Stream, copy_dtod  # noqa: E402
from streamd.gpu.kernels import KernelLoader  # noqa: E402
from streamd.stages.postprocess.cpu import CpuPostprocessor, PostprocessSpec  # noqa: E402
from streamd.stages.postprocess.cuda import GpuPostprocessor  # noqa: E402
from streamd.stages.preprocess.cpu import CpuPreprocessor, PreprocessSpec  # noqa: E402
from streamd.stages.preprocess.cuda import GpuPreprocessor, Nv12Surface  # noqa: E402
from tests.gpu.reference import bgr_to_nv12, synthetic_output  # noqa: E402

CLIP = ROOT / "samples" / "vtest.mp4"
BATCHES = (1, 16, 64)


REPS_SCALE = 1.0


def gpu_time_ms(fn, stream: Stream, reps: int, runs: int = 7) -> float:
    """Median over ``runs`` of (event time of ``reps`` back-to-back ``fn()`` calls) / reps."""
    reps = max(1, round(reps * REPS_SCALE))
    start, end = Event(timing=True), Event(timing=True)
    for _ in range(3):
        fn()
    stream.synchronize()
    samples = []
    for _ in range(runs):
        start.record(stream)
        for _ in range(reps):
            fn()
        end.record(stream)
        end.synchronize()
        samples.append(start.elapsed_ms(end) / reps)
    return statistics.median(samples)


def cpu_time_ms(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def copy_bandwidth(stream: Stream) -> dict:
    nbytes = 1 << 30
    a, b = DeviceBuffer(nbytes), DeviceBuffer(nbytes)
    a.fill_u32(0x3F800000, stream)
    ms = gpu_time_ms(lambda: copy_dtod(b.ptr, a.ptr, nbytes, stream), stream, reps=5)
    a.close()
    b.close()
    return {"bytes": nbytes, "ms": ms, "gbps": 2 * nbytes / ms / 1e6}  # read + written


def video_frames(count: int) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(CLIP))
    frames = []
    while len(frames) < count * 8:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    picked = frames[:: max(1, len(frames) // count)][:count]
    while len(picked) < count:  # short clip: reuse frames, flipped so each buffer differs
        picked.append(cv2.flip(picked[len(picked) % len(frames)], 1))
    return [cv2.resize(f, (1920, 1080), interpolation=cv2.INTER_CUBIC) for f in picked]


def bench_preprocess(
    ctx: Context, loader: KernelLoader, stream: Stream, copy_gbps: float, quick: bool
) -> list[dict]:
    spec = PreprocessSpec(640, 640, "rgb", (0.0, 0.0, 0.0), (255.0, 255.0, 255.0), "letterbox", 114)
    n = max(BATCHES)
    frames = video_frames(n)
    nv12 = [bgr_to_nv12(f) for f in frames]
    host_nv12 = [np.concatenate([y.reshape(-1), uv.reshape(-1)]).reshape(1620, 1920) for y, uv in nv12]
    dev = []
    for arr in host_nv12:
        buf = DeviceBuffer(arr.nbytes)
        buf.upload(arr, stream)
        dev.append(buf)
    stream.synchronize()
    surfaces = [Nv12Surface.contiguous(b.ptr, 1920, 1080, matrix="bt601") for b in dev]
    pre = GpuPreprocessor(spec, ctx, max_batch=n, dtype="float16", loader=loader)
    out = DeviceBuffer(pre.output_nbytes(n))
    cpu = CpuPreprocessor(spec)
    cpu_out = np.empty((3, 640, 640), np.float32)

    def cpu_one(i: int) -> None:
        bgr = cv2.cvtColor(host_nv12[i], cv2.COLOR_YUV2BGR_NV12)
        cpu(bgr, cpu_out)

    def cpu_batch_ms(batch: int, threads: int) -> float:
        """The CPU twin's time for ``batch`` frames with OpenCV using ``threads`` threads."""
        cv2.setNumThreads(threads)
        cpu_one(0)
        if batch == 1:
            return cpu_time_ms(lambda: cpu_one(0), 5)
        if quick:
            per_frame = [cpu_time_ms(lambda i=i: cpu_one(i % n), 1) for i in range(8)]
            return statistics.median(per_frame) * batch
        return cpu_time_ms(lambda: [cpu_one(i) for i in range(batch)], 1)

    all_threads = os.cpu_count() or 1
    rows = []
    for batch in BATCHES:
        prepared = pre.prepare(surfaces[:batch], stream)
        gpu_ms = gpu_time_ms(
            lambda p=prepared: pre.launch(p, out, stream), stream, reps=20 if batch > 1 else 100
        )
        t = time.perf_counter()
        for _ in range(20):
            pre.prepare(surfaces[:batch], stream)
        host_ms = (time.perf_counter() - t) / 20 * 1e3
        stream.synchronize()
        cpu_1t = cpu_batch_ms(batch, 1)
        cpu_ms = cpu_batch_ms(batch, all_threads)
        moved = batch * (1920 * 1080 * 3 // 2 + 3 * 640 * 640 * 2)
        gbps = moved / gpu_ms / 1e6
        rows.append(
            {
                "batch": batch,
                "gpu_ms": gpu_ms,
                "gpu_us_per_frame": gpu_ms * 1e3 / batch,
                "host_prepare_ms": host_ms,
                "cpu_ms": cpu_ms,
                "cpu_1thread_ms": cpu_1t,
                "speedup": cpu_ms / gpu_ms,
                "speedup_1thread": cpu_1t / gpu_ms,
                "gbps": gbps,
                "pct_of_copy": 100 * gbps / copy_gbps,
            }
        )
        print(f"preprocess b={batch}: {rows[-1]}", flush=True)
    for buf in (*dev, out):
        buf.close()
    pre.close()
    return rows


def bench_nms(ctx: Context, loader: KernelLoader, stream: Stream, quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    scenarios = {
        "typical": (PostprocessSpec("yolov8", 80, 0.25, 0.45, 100, 1000), 0.03),
        "dense": (PostprocessSpec("yolov8", 80, 0.0, 0.45, 100, 1000), 1.0),
    }
    for name, (spec, positive) in scenarios.items():
        raw_all = synthetic_output(rng, "yolov8", max(BATCHES), 8400, 80, positive=positive)
        dev = DeviceBuffer(raw_all.nbytes)
        dev.upload(raw_all, stream)
        stream.synchronize()
        post = GpuPostprocessor(spec, ctx, max_batch=max(BATCHES), num_anchors=8400, loader=loader)
        res, host = post.new_results(), post.new_host_results()
        cpu = CpuPostprocessor(spec)
        for batch in BATCHES:
            row = nms_batch(post, cpu, dev, raw_all[:batch], stream, res, host, quick)
            rows.append({"scenario": name, **row})
            print(f"nms {name} b={batch}: {rows[-1]}", flush=True)
        for obj in (post, res, host, dev):
            obj.close()
    return rows


def nms_batch(post, cpu, dev, raw: np.ndarray, stream: Stream, res, host, quick: bool) -> dict:
    batch = raw.shape[0]
    reps = 20 if batch > 1 else 50
    gpu_ms = gpu_time_ms(lambda: post(dev, batch, stream, res), stream, reps)

    def with_copy() -> None:
        post(dev, batch, stream, res)
        res.download(host, stream, batch)

    gpu_copy_ms = gpu_time_ms(with_copy, stream, reps)
    stream.synchronize()
    got = host.detections(batch)
    want = cpu(raw)
    identical = all(
        np.array_equal(g.xyxy, w.xyxy)
        and np.array_equal(g.score, w.score)
        and np.array_equal(g.class_id, w.class_id)
        for g, w in zip(got, want, strict=True)
    )
    cpu_ms = cpu_time_ms(lambda: cpu(raw), 1 if (batch > 16 or quick) else 3)
    return {
        "batch": batch,
        "candidates_per_frame": int((raw[:, 4:].max(1) > post.spec.score_threshold).sum() / batch),
        "detections_per_frame": sum(len(d) for d in got) / batch,
        "gpu_ms": gpu_ms,
        "gpu_with_d2h_ms": gpu_copy_ms,
        "cpu_ms": cpu_ms,
        "speedup": cpu_ms / gpu_ms,
        "identical": identical,
    }


STARTUP = """
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from streamd.gpu.cuda import Context
from streamd.gpu.kernels import KernelLoader
ctx = Context(0)
t1 = time.perf_counter()
loader = KernelLoader(ctx, cache_dir={cache!r})
mods = [loader.module(m) for m in ("preprocess", "postprocess")]
t2 = time.perf_counter()
print(json.dumps({{"how": [m.info.how for m in mods], "load_s": t2 - t1, "context_s": t1 - t0}}))
"""


def bench_startup() -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        code = STARTUP.format(root=str(ROOT), cache=cache)
        for start in ("first", "second"):
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            info = json.loads(out.stdout.strip().splitlines()[-1])
            info.update(start=start, process_s=time.perf_counter() - t)
            rows.append(info)
            print(f"startup {start}: {info}", flush=True)
    return rows


def environment(ctx: Context) -> dict:
    def cmd(*args: str) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=20, cwd=ROOT).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = os.environ.get("STREAMD_COMMIT") or cmd("git", "rev-parse", "--short", "HEAD") or "unknown"
    if not os.environ.get("STREAMD_COMMIT") and cmd("git", "status", "--porcelain"):
        commit += " + uncommitted"
    from streamd.gpu.kernels import nvrtc_version

    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "gpu": ctx.name,
        "compute_capability": "{}.{}".format(*ctx.compute_capability),
        "driver": cmd("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()[:1],
        "driver_cuda": ctx.driver_version,
        "nvrtc": "{}.{}".format(*nvrtc_version()),
        "commit": commit,
        "cpu_count": os.cpu_count(),
    }


def markdown(result: dict) -> str:
    env = result["env"]
    lines = [
        f"Date {env['date']} · GPU {env['gpu']} (CC {env['compute_capability']}) · driver "
        f"{(env['driver'] or ['?'])[0]} "
        f"(CUDA {env['driver_cuda'] // 1000}.{env['driver_cuda'] % 1000 // 10}) · "
        f"NVRTC {env['nvrtc']} · commit {env['commit']} · CPU baselines on the same host ({env['cpu_count']} "
        "cores)",
        "",
        f"Device copy bandwidth (D2D 1 GiB, read + write): **{result['copy']['gbps']:.0f} GB/s**",
        "",
        "Preprocess 1920x1080 NV12 -> 640x640 fp16 letterbox "
        "(GPU: kernel; CPU: cvtColor NV12->BGR + CpuPreprocessor)",
        "",
        "| batch | GPU ms | GPU µs/frame | CPU ms (all cores) | speed-up | CPU ms (1 thread) | speed-up "
        "| GB/s moved | % of copy BW | host prepare ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["preprocess"]:
        lines.append(
            f"| {r['batch']} | {r['gpu_ms']:.3f} | {r['gpu_us_per_frame']:.1f} | {r['cpu_ms']:.1f} | "
            f"{r['speedup']:.0f}x | {r['cpu_1thread_ms']:.1f} | {r['speedup_1thread']:.0f}x | "
            f"{r['gbps']:.0f} | {r['pct_of_copy']:.0f}% | {r['host_prepare_ms']:.3f} |"
        )
    lines += [
        "",
        "NMS YOLOv8 [B, 84, 8400], 80 classes, top_k 1000, max_det 100 "
        "(GPU: memset + decode + NMS; CPU: numpy twin)",
        "",
        "| scenario | batch | cand./frame | det./frame | GPU ms | GPU + D2H ms | CPU ms | speed-up "
        "| identical |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["nms"]:
        lines.append(
            f"| {r['scenario']} | {r['batch']} | {r['candidates_per_frame']} | "
            f"{r['detections_per_frame']:.1f} | "
            f"{r['gpu_ms']:.3f} | {r['gpu_with_d2h_ms']:.3f} | {r['cpu_ms']:.1f} | {r['speedup']:.0f}x | "
            f"{'yes' if r['identical'] else 'NO'} |"
        )
    lines += [
        "",
        "Kernel start-up (new process, both modules)",
        "",
        "| start | how | module load s | process s |",
    ]
    lines.append("|---|---|---:|---:|")
    for r in result["startup"]:
        lines.append(f"| {r['start']} | {'/'.join(r['how'])} | {r['load_s']:.3f} | {r['process_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "out", help="folder for bench_kernels.{json,md}")
    parser.add_argument(
        "--quick", action="store_true", help="fewer CPU repeats (CPU batch time from per-frame)"
    )
    parser.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes")
    parser.add_argument("--reps-scale", type=float, default=1.0, help="scale the back-to-back repetitions")
    args = parser.parse_args()
    global BATCHES, REPS_SCALE
    BATCHES = tuple(int(b) for b in args.batches.split(","))
    REPS_SCALE = args.reps_scale
    ctx = Context(0)
    with tempfile.TemporaryDirectory() as cache:
        loader = KernelLoader(ctx, cache_dir=cache)
        stream = Stream(ctx)
        result: dict = {"env": environment(ctx)}
        result["copy"] = copy_bandwidth(stream)
        print(f"copy bandwidth: {result['copy']}", flush=True)
        result["preprocess"] = bench_preprocess(ctx, loader, stream, result["copy"]["gbps"], args.quick)
        result["nms"] = bench_nms(ctx, loader, stream, args.quick)
        stream.close()
        loader.close()
    result["startup"] = bench_startup()
    ctx.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_kernels.json").write_text(json.dumps(result, indent=2))
    md = markdown(result)
    (args.out / "bench_kernels.md").write_text(md)
    print(md)
    return 0 if all(r["identical"] for r in result["nms"]) else 1


if __name__ == "__main__":
    sys.exit(main())
