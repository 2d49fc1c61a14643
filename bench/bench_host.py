"""Host cost of one worker: CPU ms per frame of the daemon's own Python, without decode or inference cost.

A worker carries ≈ 700–900 frames/s on the GPU box before its Python (one core: the GIL) is the limit
(bench/RESULTS.md, "Live density with real-size detectors"), and the cost per frame rose from ≈ 1.2 ms at 24
cameras to 7 ms at 112. This bench isolates that cost on any machine: live-paced streams of a small clip
(320x240, so decoding is cheap) through a *null detector* (an ONNX model whose output is a fixed set of
YOLOv8-layout candidates, ≈ ``--objects`` boxes per frame after NMS, computed in microseconds), on the CPU
path (onnxruntime, CPU decode). What is left per frame is the daemon: ingest thread, batcher, scheduler,
pre- and postprocess twins, results, JSON lines, the pipe to the supervisor and the sink.

    python bench/bench_host.py --streams 8 24 48 --out out/host [--profile]
    python bench/bench_host.py --engine torch --clip .assets-work/live1080.mp4 --streams 24 56 112   # GPU box

With ``--engine torch`` (GPU box) the same null detector runs on the GPU path (NVDEC, the CUDA stages, the
torch engine in CUDA graphs), so what is left per frame is that path's host cost.

Each N is one ``bench/bench_live.py`` row (one `streamd run`, one worker, batch 16, no spare); ``--profile``
adds ``py-spy record --gil`` of the worker (needs py-spy on PATH) and prints the functions that held the GIL.
Rows: DIR/bench_live.md, profiles: DIR/gil-N.txt.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CLIP = ROOT / ".assets-work" / "host-320x240-30fps.mp4"
SIZE = 160  # the null detector's input (the preprocess twin still letterboxes every frame to it)


def null_detector(path: Path, objects: int, seed: int = 0) -> Path:
    """A YOLOv8-layout model ([B, 84, A], A = 525 at 160) whose candidates are fixed: ``objects`` boxes
    that survive NMS (spread over the picture, scores 0.5–0.9) among low-score ones. The output depends on
    the input only through a ``0 * mean`` term, so the graph cannot be folded away, and costs microseconds."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    anchors = (SIZE // 8) ** 2 + (SIZE // 16) ** 2 + (SIZE // 32) ** 2
    out = np.zeros((1, 84, anchors), np.float32)
    out[0, 0:2] = rng.uniform(10, SIZE - 10, (2, anchors))  # cx, cy
    out[0, 2:4] = rng.uniform(4, 12, (2, anchors))  # w, h: small, so NMS keeps most
    out[0, 4:] = rng.uniform(0.0, 0.05, (80, anchors))  # below the threshold
    keep = rng.choice(anchors, objects, replace=False)
    out[0, 4 + rng.integers(0, 80, objects), keep] = rng.uniform(0.5, 0.9, objects)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["images"], ["m"], axes=[1, 2, 3], keepdims=1),
            helper.make_node("Mul", ["m", "zero"], ["z"]),  # [B, 1, 1, 1]
            helper.make_node("Reshape", ["z", "shape3"], ["z3"]),  # [B, 1, 1]
            helper.make_node("Add", ["z3", "candidates"], ["output0"]),  # [B, 84, A]
        ],
        "null_detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 84, anchors])],
        [
            numpy_helper.from_array(np.zeros((), np.float32), "zero"),
            numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "shape3"),
            numpy_helper.from_array(out, "candidates"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def small_clip(path: Path, passes: int = 2) -> Path:
    """320x240 30 fps H.264 with B-frames from the bundled clip (its 795 pictures, ``passes`` times: 53 s)."""
    if path.exists():
        return path
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    src = av.open(str(ROOT / "streamd" / "bundled" / "samples" / "vtest.mp4"))
    out = av.open(str(path), "w")
    st = out.add_stream("libx264", rate=30)
    st.width, st.height, st.pix_fmt = 320, 240, "yuv420p"
    st.options = {"bf": "2", "g": "60", "crf": "26", "preset": "fast"}
    n = 0
    for _ in range(passes):
        src.seek(0)
        for f in src.decode(video=0):
            img = f.reformat(width=320, height=240, format="yuv420p")
            img.pts, img.time_base = n, Fraction(1, 30)
            out.mux(st.encode(img))
            n += 1
    out.mux(st.encode())
    out.close()
    src.close()
    return path


def gil_profile(pid: int, seconds: float, out: Path) -> str:
    """``py-spy record --gil`` of ``pid``'s worker processes; the top functions by GIL samples."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "py-spy not on PATH: no profile"
    subprocess.run(
        [spy, "record", "--gil", "--subprocesses", "--nonblocking", "-r", "100", "-d", str(int(seconds)),
         "-f", "raw", "-o", str(out), "--pid", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=seconds + 60, check=False,
    )  # fmt: skip
    return summarize(out)


def summarize(raw: Path, top: int = 25) -> str:
    """Inclusive and self GIL samples per function from py-spy's raw (collapsed) output."""
    incl: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    if not raw.exists():
        return f"{raw}: no samples"
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if "(" in f]
        total += n
        if frames:
            own[frames[-1]] += n
            for f in set(frames):
                incl[f] += n
    lines = [f"GIL samples: {total}"]
    lines += [f"{v:6d} {100 * v / max(total, 1):5.1f}% incl {k[:150]}" for k, v in incl.most_common(top)]
    lines += [f"{v:6d} {100 * v / max(total, 1):5.1f}% self {k[:150]}" for k, v in own.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="*", default=[8, 24, 48])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--objects", type=int, default=30, help="detections per frame after NMS")
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--detect-fps", type=float, default=None)
    ap.add_argument("--profile", action="store_true", help="py-spy --gil of the worker during the window")
    ap.add_argument("--engine", default="onnxruntime", help="onnxruntime (CPU path) or torch (GPU path)")
    ap.add_argument("--workers", default="1")
    ap.add_argument("--clip", type=Path, default=CLIP)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "host")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = null_detector(args.out / f"null-yolov8-{SIZE}-{args.objects}.onnx", args.objects)
    clip = small_clip(args.clip)
    cmd = [
        sys.executable, str(ROOT / "bench" / "bench_live.py"), "--clip", str(clip), "--engine", args.engine,
        "--model", str(model), "--input-size", str(SIZE), str(SIZE), "--model-key", "layout: yolov8",
        "--model-key", "channel_order: rgb", "--model-key", "mean: [0, 0, 0]",
        "--model-key", "std: [255, 255, 255]", "--model-key", "score_threshold: 0.3",
        "--workers", args.workers, "--batch", str(args.batch), "--no-spare", "--ceiling-threads", "0",
        "--ceiling-processes", "0", "--warmup", str(args.warmup), "--window", str(args.window),
        "--p99-ms", "100", "--out", str(args.out), "--streams",
    ]  # fmt: skip
    if args.detect_fps:
        cmd[-1:-1] = ["--detect-fps", str(args.detect_fps)]
    if not args.profile:
        return subprocess.call([*cmd, *map(str, args.streams)], cwd=ROOT)
    for n in args.streams:  # one bench_live call per N, profiled from here during its window
        proc = subprocess.Popen([*cmd, str(n)], cwd=ROOT)
        daemon = _wait_daemon(proc.pid, timeout=120)
        if daemon is not None:
            time.sleep(args.warmup + 2)
            report = gil_profile(daemon, max(5.0, args.window - 6), args.out / f"gil-{n}.txt")
            (args.out / f"gil-{n}.summary").write_text(report + "\n")
            print(f"--- {n} streams: GIL holders\n{report}", flush=True)
        proc.wait()
        shutil.copy(args.out / "bench_live.md", args.out / f"bench_live-{n}.md")
    return 0


def _wait_daemon(parent: int, timeout: float) -> int | None:
    """The `streamd run` process bench_live started (its child), once its log says ready is not visible
    from here: wait until it has a worker child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"streamd" in cmdline:
                return int(entry)
        time.sleep(0.5)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
