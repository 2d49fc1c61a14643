"""The batcher's host cost per frame at many cameras: this tree's vs an earlier revision's, side by side.

N producer threads put a frame each 1/fps seconds (live policy, as cameras), one consumer thread takes
batches (``next_batch``) and holds each for ``--service-ms`` (the ring's pace). Over the window: CPU ms per
frame of the whole process (producers + consumer; threads' own sleep/wake cost is the same for both), the
consumer thread's CPU per frame, and how often per batch the consumer went to sleep (its voluntary context
switches: waits for frames and for the GIL, plus the one service sleep). The same N, fps and batch for both
implementations in one run; rows alternate so drift hits both.

    python bench/bench_batcher.py --streams 24 56 112 --baseline-rev HEAD~1
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamd.types import Frame  # noqa: E402


def load_revision(rev: str) -> ModuleType:
    """``streamd/pipeline/batcher.py`` as of git revision ``rev``, as a module of its own."""
    text = subprocess.run(
        ["git", "show", f"{rev}:streamd/pipeline/batcher.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "batcher_baseline.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("batcher_baseline", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(module: ModuleType, n: int, fps: float, batch: int, service_ms: float, seconds: float) -> dict:
    b = module.Batcher(batch, 0.010)
    stop = threading.Event()
    queues = [b.add_stream(f"cam{i:03d}", 2, "latest") for i in range(n)]
    got = {"frames": 0, "batches": 0, "consumer_cpu": 0.0}
    measuring = threading.Event()

    def produce(q, phase: float) -> None:
        period, k = 1.0 / fps, 0
        start = time.perf_counter() + phase
        while not stop.is_set():
            due = start + k * period
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            now = time.perf_counter()
            q.put(Frame(q.stream_id, k, k * period, 1920, 1080, t_decoded=now, t_arrival=now), stop)
            k += 1

    def consume() -> None:
        while (frames := b.next_batch(stop)) is not None:
            if measuring.is_set():
                got["frames"] += len(frames)
                got["batches"] += 1
            t = time.thread_time()
            if service_ms:
                time.sleep(service_ms / 1e3)
            got["consumer_cpu"] -= time.thread_time() - t  # the service sleep is not the batcher's

    threads = [
        threading.Thread(target=produce, args=(q, i / (n * fps)), daemon=True) for i, q in enumerate(queues)
    ]
    consumer = threading.Thread(target=consume, daemon=True)
    for t in [*threads, consumer]:
        t.start()
    time.sleep(2.0)  # warm-up
    cpu0, thread0, switch0 = time.process_time(), _thread_cpu(consumer), _switches(consumer)
    got["consumer_cpu"] = 0.0
    measuring.set()
    time.sleep(seconds)
    measuring.clear()
    cpu, consumer_cpu = time.process_time() - cpu0, _thread_cpu(consumer) - thread0 + got["consumer_cpu"]
    switches = _switches(consumer) - switch0
    stop.set()
    for q in queues:
        q.close()
    consumer.join(5)
    frames = max(1, got["frames"])
    dropped = sum(q.dropped for q in queues)
    return {
        "streams": n,
        "frames_per_s": round(got["frames"] / seconds, 1),
        "mean_batch": round(got["frames"] / max(1, got["batches"]), 2),
        "process_cpu_us_per_frame": round(cpu * 1e6 / frames, 1),
        "consumer_cpu_us_per_frame": round(consumer_cpu * 1e6 / frames, 1),
        "sleeps_per_batch": round(switches / max(1, got["batches"]), 2),
        "dropped": dropped,
    }


def _thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds of ``thread`` (Linux: its /proc task entry)."""
    with open(f"/proc/self/task/{thread.native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _switches(thread: threading.Thread) -> int:
    """Voluntary context switches of ``thread``: each time it went to sleep (a wait, a sleep, the GIL)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="*", default=[24, 56, 112])
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--service-ms", type=float, default=2.0, help="how long the consumer holds each batch")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--baseline-rev", default="HEAD", help="git revision of the batcher to compare with")
    args = ap.parse_args()
    import streamd.pipeline.batcher as current

    impls = {args.baseline_rev: load_revision(args.baseline_rev), "this tree": current}
    print("| streams | batcher | frames/s | mean batch | process CPU µs/frame | consumer CPU µs/frame | "
          "consumer sleeps/batch | dropped |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n in args.streams:
        for name, module in impls.items():
            r = run(module, n, args.fps, args.batch, args.service_ms, args.seconds)
            print(
                f"| {n} | {name} | {r['frames_per_s']} | {r['mean_batch']} | "
                f"{r['process_cpu_us_per_frame']} | {r['consumer_cpu_us_per_frame']} | "
                f"{r['sleeps_per_batch']} | {r['dropped']} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
