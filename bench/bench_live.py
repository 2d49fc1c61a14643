"""Live density: how many live-paced 1080p30 cameras one `streamd run` carries (issue 8), on the GPU box.

Every figure comes from one run of this script, side by side:

1. *Ceiling*: decode-only throughput of the same clip with plain PyNvVideoCodec in threads (what the NVDEC
   engines can do on this content, without streamd).
2. *Ramp*: for each N, one `streamd run` (a real subprocess: supervisor + workers) with N streams of the
   clip, ``realtime: true`` (paced like a camera), ``loop: true``; after READY a warm-up, then a window.
   From the JSONL output and /proc: offered vs delivered fps, drops (frame-index gaps inside the window =
   frames dropped after decode), p50/p99/max of ``latency_ms.arrival`` (packet in -> result) and p50/p99 of
   each stage of it (``STAGES``: decode, batcher queue, engine, host wait, ...), host CPU ms
   per frame (all streamd processes), RSS and GPU memory per process, and per-stream fairness: the slowest
   stream's fps over its offered fps (*min stream share*) and over its fair share (*min fair share*: the
   offered fps, or delivered / N when the box is past capacity -- max-min fairness with equal demands).
3. *Restart*: during a live run, ``kill -9`` of one worker: seconds until its streams write again, their
   frame indices continuing; gaps in every other stream; exit status at SIGTERM.
4. *Pipelined vs serialized*: the same frames (the bundled clip decoded once to host memory) through the same
   engine and stages at ``ring_slots`` 4 vs 1, batch 1 / 8 / 32, in-process.
5. ``--soak S``: one run of N streams for S seconds, RSS and GPU memory of every process sampled every 10 s.

Usage (GPU box; tools/gpu_run.sh calls it): ``python bench/bench_live.py --clip CLIP --out DIR [...]``.
Results: DIR/bench_live.md (table) and DIR/bench_live.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "models" / "nanodet-coco.onnx"
DEMO_CLIP = ROOT / "samples" / "vtest.mp4"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _yaml_key(key: str) -> str:
    """'ring_slots=6' or 'ring_slots:6' as the YAML line 'ring_slots: 6'."""
    return key if ": " in key else re.sub("[=:]", ": ", key, count=1)


def config_text(
    clip: Path,
    n: int,
    out: Path,
    *,
    batch: int,
    workers: str,
    engine: str = "torch",
    extra: str = "",
    realtime: bool = True,
    devices: tuple[int, ...] = (),
    model: Path = MODEL,
    model_keys: tuple[str, ...] = (),
    engine_keys: tuple[str, ...] = (),
    pipeline_keys: tuple[str, ...] = (),
    input_size: tuple[int, int] | None = None,
    detect_fps: float | None = None,
    fill_skipped: bool = True,
    precision: str | None = None,
    compile: bool = True,
    shared: bool = False,
    lanes: int = 1,
    metrics_port: int = 0,
) -> str:
    """``model_keys``: extra ``model:`` lines ("key: value"); ``detect_fps`` on every stream, with tracking's
    ``fill_skipped`` (every decoded frame then has a line, so frame-index gaps stay exact drops)."""
    pace = "true" if realtime else "false"
    if devices:  # workers round robin over these GPUs
        extra += f"  devices: [{', '.join(map(str, devices))}]\n"
    rate = f"    detect_fps: {detect_fps}\n" if detect_fps else ""
    streams = "".join(
        f"  - id: cam{i:03d}\n    url: {clip}\n    realtime: {pace}\n    loop: true\n{rate}" for i in range(n)
    )
    model_lines = f"  path: {model}\n"
    if input_size:
        model_lines += f"  input_size: [{input_size[0]}, {input_size[1]}]\n"
    model_lines += "".join(f"  {k}\n" for k in model_keys)
    precision = precision or ("fp16" if engine != "onnxruntime" else "fp32")
    lines = {"type": engine, "precision": precision, "max_batch": 64, "compile": str(compile).lower()}
    if shared:  # one engine process per GPU that the decode workers feed (docs/scaling.md)
        lines["shared"] = "true"
    if lanes != 1:
        lines["lanes"] = lanes
    # "key=value" and "key:value" too: tools/gpu_models.sh splits its ROWS on spaces
    engine_keys = tuple(_yaml_key(k) for k in engine_keys)
    given = {k.partition(":")[0].strip() for k in engine_keys}  # --engine-key 'max_batch: 32' replaces ours
    engine_lines = "".join(f"  {k}: {v}\n" for k, v in lines.items() if k not in given)
    engine_lines += "".join(f"  {k}\n" for k in engine_keys)
    pipeline_lines = "".join(f"  {_yaml_key(k)}\n" for k in pipeline_keys)
    tracking = ""
    if detect_fps and fill_skipped and "tracking:" not in extra:
        tracking = "tracking:\n  enabled: true\n  fill_skipped: true\n"
    return (
        f"streams:\n{streams}"
        f"model:\n{model_lines}"
        f"engine:\n{engine_lines}"
        f"pipeline:\n  batch_size: {batch}\n  workers: {workers}\n{extra}{pipeline_lines}"
        f"{tracking}"
        f"sinks:\n  - type: jsonl\n    path: {out}\n    queue_size: 200000\n"
        + (f"metrics:\n  enabled: true\n  port: {metrics_port}\n" if metrics_port else "")
        + "log_level: info\n"
    )


# -- processes ------------------------------------------------------------------------------------------
def mark_phase(word: str) -> None:
    """With ``BENCH_PHASE_FILE`` set, write ``$BENCH_PHASE_LABEL word`` there as the window starts and ends:
    tools/engine_under_load.py tags its samples with it (the engine's rate beside exactly this window)."""
    path = os.environ.get("BENCH_PHASE_FILE")
    if path:
        Path(path).write_text(f"{os.environ.get('BENCH_PHASE_LABEL', 'load')} {word}\n")


def descendants(pid: int) -> list[int]:
    """pid and every process below it (from /proc's ppid fields)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, ValueError, IndexError):
            pass
    return total


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_counters(port: int) -> tuple[float, float] | None:
    """engine.shared: (batches, rows) of the engine processes so far, summed over GPUs, from /metrics."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    total = {"batches": 0.0, "rows": 0.0}
    for name, value in re.findall(r"^streamd_engine_(batches|rows)_total\{[^}]*\} (\S+)$", text, re.M):
        total[name] += float(value)
    return total["batches"], total["rows"]


def fresh_engine_counters(port: int, wait_s: float = 1.5) -> tuple[float, float, float] | None:
    """(batches, rows, time.time()) just after the engine's counters move: they come with its beat, once a
    second, so a plain read is up to 1 s old (+-5 % on a 20-s window's rate). An engine that runs no batch
    never moves them: its counts are current anyway, the last read is returned after ``wait_s``."""
    first = engine_counters(port)
    if first is None:
        return None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = engine_counters(port)
        if now is not None and now != first:
            return (*now, time.time())
    return (*first, time.time())


def smi_csv(query: str) -> str:
    """nvidia-smi's answer to ``query`` (e.g. "--query-gpu=index,utilization.gpu") as csv without header or
    units; "" without nvidia-smi."""
    try:
        return subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def gpu_mem_mb() -> dict[int, float]:
    """GPU memory per process (nvidia-smi), pid -> MiB."""
    text = smi_csv("--query-compute-apps=pid,used_memory")
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            out[int(parts[0])] = float(parts[1]) if parts[1].replace(".", "").isdigit() else 0.0
    return out


# NVML's % of time: a kernel running, the memory controller busy, NVDEC busy
UTIL_FIELDS = ("gpu", "memory", "decoder")


def gpu_util() -> dict[int, tuple[float, ...]]:
    """Each GPU's utilization now (nvidia-smi), index -> UTIL_FIELDS in %; {} without nvidia-smi."""
    text = smi_csv("--query-gpu=index," + ",".join(f"utilization.{f}" for f in UTIL_FIELDS))
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 1 + len(UTIL_FIELDS) and all(p.replace(".", "").isdigit() for p in parts):
            out[int(parts[0])] = tuple(float(p) for p in parts[1:])
    return out


def mean_util(samples: list[dict[int, tuple[float, ...]]]) -> dict[str, dict[str, float]]:
    """The window's mean utilization per GPU: {"0": {"gpu": %, "memory": %, "decoder": %}}."""
    per_gpu: dict[int, list[tuple[float, ...]]] = defaultdict(list)
    for sample in samples:
        for index, values in sample.items():
            per_gpu[index].append(values)
    return {
        str(index): {f: round(float(np.mean([v[k] for v in values])), 1) for k, f in enumerate(UTIL_FIELDS)}
        for index, values in sorted(per_gpu.items())
    }


class Daemon:
    """`streamd run CONFIG` as a subprocess; stderr collected line by line."""

    def __init__(self, cfg: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.started = time.monotonic()
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            for line in list(self.log):
                if m := re.search(pattern, line):
                    return m
            time.sleep(0.1)
        return None

    def count(self, pattern: str, count: int, timeout: float) -> bool:
        """Wait until ``count`` log lines match ``pattern``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if sum(1 for line in list(self.log) if re.search(pattern, line)) >= count:
                return True
            time.sleep(0.1)
        return False

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


# -- one live run -------------------------------------------------------------------------------------------
def read_records(path: Path) -> list[dict]:
    """Every complete result line of the file (a half-written last line is left out)."""
    return Tail(path, from_start=True).records()


class Tail:
    """New complete lines of a growing JSONL file (a soak's file is ~1 GB: never re-read it per poll)."""

    def __init__(self, path: Path, *, from_start: bool = False) -> None:
        start = 0 if from_start or not path.exists() else path.stat().st_size
        self.path, self.offset, self.rest = path, start, b""

    def records(self) -> list[dict]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        out = []
        for line in lines:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "type" not in r:
                out.append(slim(r))
        return out


# where a detected frame's time goes (the lines' latency_ms): decode, decoded -> its batch starts (the
# worker's batcher and a free ring slot), preprocess, the engine (infer; with engine.shared: "engine", from
# the engine process's dispatch to its results), waiting for the results on the host, the whole batch
STAGES = ("decode", "queue", "preprocess", "infer", "engine", "host_wait", "batch")


def slim(r: dict) -> dict:
    """What the figures need of a line (a soak keeps ~1 M of them in memory)."""
    lat = r.get("latency_ms") or {}
    out = {"stream": r["stream"], "frame": r["frame"], "time": r["time"],
           "latency_ms": {"arrival": lat.get("arrival", lat.get("total"))}}  # fmt: skip
    stages = {k: lat[k] for k in STAGES if k in lat}
    if stages:
        out["stages"] = stages
    if r.get("predicted"):  # a skipped frame's tracker line (detect_fps + fill_skipped): not a detection
        out["predicted"] = True
    return out


def window_stats(records: list[dict], t0: float, t1: float, n: int, fps: float) -> dict:
    """Figures over lines whose decode time lies in [t0, t1)."""
    inside = [r for r in records if t0 <= r["time"] < t1]
    seconds = t1 - t0
    per_stream: dict[str, list[int]] = defaultdict(list)
    for r in inside:
        per_stream[r["stream"]].append(r["frame"])
    gaps = 0
    for frames in per_stream.values():
        frames.sort()
        gaps += sum(b - a - 1 for a, b in itertools.pairwise(frames) if b > a + 1)
    # latency of the detected frames (a predicted line of a skipped frame waits for its neighbours instead)
    detected = [r for r in inside if not r.get("predicted")]
    lat = np.array([r["latency_ms"]["arrival"] for r in detected if r["latency_ms"]["arrival"] is not None])
    lat = lat if lat.size else np.array([0.0])
    stage_p50, stage_p99 = {}, {}
    for k in STAGES:  # per stage over the detected frames (a stage the lines do not carry is left out)
        values = np.array([r["stages"][k] for r in detected if k in r.get("stages", {})])
        if values.size:
            stage_p50[k] = round(float(np.percentile(values, 50)), 2)
            stage_p99[k] = round(float(np.percentile(values, 99)), 2)
    counts = [len(per_stream.get(f"cam{i:03d}", [])) for i in range(n)]
    fair = (min(counts) / seconds) / fps if counts else 0.0
    # Max-min fair share with equal demands: each stream's offered fps, or an equal split of what was
    # delivered when the box is past its capacity.
    share = min(fps, len(inside) / seconds / max(1, n))
    fair_share = (min(counts) / seconds) / share if counts and share else 0.0
    # Delivered fps second by second ("for the whole window": a collapse shows as a low second).
    second = np.array([int(r["time"] - t0) for r in inside], dtype=np.int64)
    per_second = np.bincount(second, minlength=int(seconds))[: int(seconds)]
    return {
        "delivered_fps": round(len(inside) / seconds, 1),
        "min_1s_fps": int(per_second.min()) if per_second.size else 0,
        "max_1s_fps": int(per_second.max()) if per_second.size else 0,
        "per_second_fps": per_second.tolist(),
        "drops_in_window": gaps,
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "max_ms": round(float(lat.max()), 2),
        "min_stream_share": round(fair, 3) if np.isfinite(fps) else None,  # unpaced: nothing offered
        "min_fair_share": round(fair_share, 3),
        "max_stream_share": round((max(counts) / seconds) / fps, 3) if counts and np.isfinite(fps) else None,
        "streams_seen": len(per_stream),
        "detected_fps": round(len(detected) / seconds, 1),
        "stage_p50_ms": stage_p50,
        "stage_p99_ms": stage_p99,
    }


def start_stats(records: list[dict], ready: float, t0: float, n: int) -> dict:
    """The warm-up before the window, from READY: how long until every stream's first line, and what the
    daemon delivered second by second meanwhile (a start-up transient shows here, not in the window)."""
    first: dict[str, float] = {}
    for r in records:
        if r["time"] >= ready:
            first[r["stream"]] = min(first.get(r["stream"], r["time"]), r["time"])
    firsts = sorted(t - ready for t in first.values())
    early = {k: v for k, v in window_stats(records, ready, t0, n, float("inf")).items()
             if k in ("per_second_fps", "drops_in_window", "p99_ms")}  # fmt: skip
    return {
        "streams_started": len(firsts),
        "first_line_s": [round(firsts[0], 2), round(firsts[len(firsts) // 2], 2), round(firsts[-1], 2)]
        if firsts
        else None,  # earliest, median, last stream
        **early,
    }


_RUNS = itertools.count(1)  # numbers the daemon logs of one bench run


def live_run(
    args,
    n: int,
    tmp: Path,
    *,
    kill_worker: bool = False,
    soak_s: float = 0.0,
    extra: str = "",
    spare: bool = True,
    realtime: bool = True,
) -> dict:
    out = tmp / f"live-{n}.jsonl"
    out.unlink(missing_ok=True)
    cfg = tmp / f"live-{n}.yaml"
    spare = spare and not args.no_spare
    port = free_port() if args.shared else 0  # /metrics: the shared engine's batches in the window
    text = config_text(
        args.clip, n, out, batch=args.batch, workers=args.workers, engine=args.engine,
        extra="" if spare else "  spare_worker: false\n", realtime=realtime, devices=tuple(args.devices),
        model=args.model, model_keys=tuple(args.model_key), engine_keys=tuple(args.engine_key),
        pipeline_keys=tuple(args.pipeline_key), detect_fps=args.detect_fps,
        input_size=tuple(args.input_size) if args.input_size else None, fill_skipped=not args.no_fill_skipped,
        precision=args.precision, compile=args.compile, shared=args.shared, lanes=args.lanes,
        metrics_port=port,
    )  # fmt: skip
    filled = bool(args.detect_fps) and not args.no_fill_skipped
    # detect_fps with fill_skipped: the config has tracking on already (a second tracking: key is invalid)
    cfg.write_text(text + ("" if filled and extra.startswith("tracking:") else extra))
    d = Daemon(cfg)
    # Unpaced (realtime: false) files wait for room instead of dropping: what is delivered is the capacity.
    offered = n * args.fps if realtime else 0.0
    row: dict = {"streams": n, "offered_fps": offered, "workers": args.workers, "realtime": realtime}
    if args.devices:
        row["devices"] = list(args.devices)
    if extra:
        row["extra"] = extra.strip()
    if args.pipeline_key:
        row["pipeline_keys"] = list(args.pipeline_key)
    if args.engine_key:
        row["engine_keys"] = list(args.engine_key)
    if args.shared:
        row["shared_engine"] = True
    if args.model != MODEL:
        row["model"] = args.model.name
    if args.detect_fps:
        row["detect_fps"], row["fill_skipped"] = args.detect_fps, filled
    # a stream's lines per second: every frame's, or (skipped frames without lines) the detection rate
    per_stream_fps = args.fps if filled or not args.detect_fps else min(args.fps, args.detect_fps)
    try:
        if d.wait_for(r"streamd: ready", args.start_timeout) is None:
            row["error"] = "not ready: " + "".join(d.log)[-1500:]
            return row
        row["ready_after_s"] = round(time.monotonic() - d.started, 1)  # start-up: launch to READY (±0.1 s)
        m = d.wait_for(r"over (\d+) worker process", 1)
        row["workers_started"] = int(m.group(1)) if m else None
        row["spare_worker"] = spare
        if m and int(m.group(1)) >= 2 and spare:
            # The spare workers (one per GPU) are built after READY; a box that has run for a while has them
            # built and idle. Building them inside the window would charge their engine builds to the figures.
            t_wait = time.monotonic()
            # one per GPU in use; the line names the GPU only on a GPU engine
            built = d.count(r"spare worker ready\b", len(args.devices or [0]), 120)
            row["spare_ready_after_s"] = round(time.monotonic() - t_wait, 1) if built else None
        ready_wall = time.time()
        pids = descendants(d.proc.pid)
        row["processes"] = len(pids)
        time.sleep(args.warmup)
        if kill_worker:
            return restart_probe(args, d, out, row)
        duration = soak_s or args.window
        engine0 = fresh_engine_counters(port) if port else None  # the shared engine's batches in the window
        mark_phase("window")
        t0 = time.time()
        cpu0 = cpu_seconds(pids)
        samples = []
        next_sample = next_util = time.monotonic()
        utils: list[dict[int, tuple[float, ...]]] = []  # every 2 s: is the GPU, or NVDEC, the limit?
        # A soak's JSONL grows to ~1 GB: parse it as it grows (at each sample), never all at the end.
        tail = Tail(out) if soak_s else None
        history: list[dict] = []
        while time.time() - t0 < duration and d.proc.poll() is None:
            if time.monotonic() >= next_sample:
                if tail is not None:
                    history += tail.records()
                if tail is not None and len(samples) % 6 == 0:  # once a minute: it walks the whole history
                    window = [r for r in history if r["time"] >= t0]
                    live = window_stats(window, t0, time.time(), n, args.fps) if window else {}
                    row["so_far"] = {k: live.get(k) for k in ("delivered_fps", "drops_in_window", "p99_ms")}
                gpu = gpu_mem_mb()
                samples.append(
                    {"t": round(time.time() - t0, 1), "rss_mb": {p: round(rss_mb(p), 1) for p in pids},
                     "gpu_mb": {p: gpu.get(p, 0.0) for p in pids}}
                )  # fmt: skip
                next_sample += args.sample_every
            if time.monotonic() >= next_util:
                if util := gpu_util():
                    utils.append(util)
                next_util += 2.0
                if soak_s:  # kept as it goes: a soak cut short by the call's time limit still tells
                    partial = {**row, "samples": samples, "growth": growth(samples, skip_s=60.0)}
                    (args.out / "soak_partial.json").write_text(json.dumps(partial))
            time.sleep(0.2)
        t1 = time.time()
        mark_phase("after")
        cpu = cpu_seconds(pids) - cpu0
        if utils:
            row["gpu_util_pct"] = mean_util(utils)
        engine1 = fresh_engine_counters(port) if engine0 is not None else None
        if engine0 is not None and engine1 is not None and engine1[0] > engine0[0]:
            # rows per engine batch over the window, rows/s between the two beats read as they came
            row["engine_rows_per_batch"] = round((engine1[1] - engine0[1]) / (engine1[0] - engine0[0]), 1)
            row["engine_rows_per_s"] = round((engine1[1] - engine0[1]) / (engine1[2] - engine0[2]), 1)
        time.sleep(1.0)  # lines of the window's last frames
        if tail is not None:
            history += tail.records()
            records = history
        else:
            records = read_records(out)
        row.update(window_stats(records, t0, t1, n, per_stream_fps if realtime else float("inf")))
        row["start"] = start_stats(records, ready_wall, t0, n)
        row["host_cpu_ms_per_frame"] = round(cpu * 1e3 / max(1, row["delivered_fps"] * (t1 - t0)), 3)
        last = samples[-1] if samples else {"rss_mb": {}, "gpu_mb": {}}
        row["rss_mb_max_process"] = max(last["rss_mb"].values() or [0])
        row["gpu_mb_per_process"] = sorted(v for v in last["gpu_mb"].values() if v)
        row["warmup_s"] = round(t0 - ready_wall, 1)
        if soak_s:
            row["samples"] = samples
            row["growth"] = growth(samples, skip_s=60.0)
            if args.soak_kill:  # then the restart probe on the same daemon (spare worker ready by now)
                row["restart"] = restart_probe(args, d, out, {"streams": n}, history, tail)
    finally:
        row["exit"] = d.stop()
        row["warnings"] = warnings(d.log)
        if compiles := compile_times(d.log):
            row["compile_s"] = compiles
        name = f"daemon-{next(_RUNS):02d}-{n}{'-kill' if kill_worker else ''}.log"
        (args.out / name).write_text("".join(d.log))  # the whole log, for logs.tgz
        summary = [line.strip() for line in d.log if "streamd: done" in line]
        row["summary"] = summary[-1] if summary else "".join(d.log)[-600:]
        if args.detect_fps and not filled and "drops_in_window" in row:
            # skipped frames leave index gaps: the drops are the daemon's count (whole run, not the window)
            done = re.findall(r"(\d+) dropped after decode", row["summary"])
            row["drops_in_window"] = int(done[-1]) if done else None
            row["drops_source"] = "daemon count, whole run"
    return row


def compile_times(log: list[str]) -> dict[str, list[float]]:
    """``engine.compile``'s start-up cost per worker, from the daemon's log: seconds of each compile, and of
    each that failed (the model then ran uncompiled), 0 for each skipped (no C compiler or Python.h on the
    host); empty when nothing was compiled."""
    times: dict[str, list[float]] = {}
    for line in log:
        if m := re.search(r"torch engine: compiled in ([\d.]+) s", line):
            times.setdefault("compiled", []).append(float(m.group(1)))
        elif m := re.search(r"engine\.compile failed for this model after ([\d.]+) s", line):
            times.setdefault("failed", []).append(float(m.group(1)))
        elif "torch engine: engine.compile skipped:" in line:
            times.setdefault("skipped", []).append(0.0)
    return times


def warnings(log: list[str], keep: int = 12) -> dict[str, int]:
    """The daemon's WARNING/ERROR lines, counted by kind (stream ids and numbers masked): what went wrong."""
    kinds: dict[str, int] = defaultdict(int)
    for line in log:
        if " WARNING " in line or " ERROR " in line:
            text = line.split(" ", 3)[-1].strip()  # without the time stamp
            kinds[re.sub(r"\d+", "N", text)[:240]] += 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:keep])


def growth(samples: list[dict], skip_s: float) -> dict:
    """Largest relative growth of RSS / GPU memory of any process from the first sample after skip_s."""
    later = [s for s in samples if s["t"] >= skip_s]
    if len(later) < 2:
        return {}
    first, last = later[0], later[-1]
    out = {}
    for key in ("rss_mb", "gpu_mb"):
        ratios = [(last[key].get(p, 0) - v) / v for p, v in first[key].items() if v and last[key].get(p, 0)]
        out[key] = round(max(ratios) * 100, 2) if ratios else None
    return out


def restart_probe(
    args, d: Daemon, out: Path, row: dict, history: list[dict] | None = None, tail: Tail | None = None
) -> dict:
    """kill -9 worker ``--restart-worker`` mid-run: its streams' return time; gaps in all streams over the
    whole run."""
    k = args.restart_worker
    m = d.wait_for(rf"worker {k} (?:ready|back) \(pid (\d+)\): stream\(s\) (\S+)", 5)
    if m is None:
        row["error"] = f"no worker {k} line"
        return row
    row["killed_worker"] = k
    victim, first_stream = int(m.group(1)), m.group(2).rstrip(",")
    # live_run waited for the spare worker (pipeline.spare_worker, on with >= 2 workers) to be built.
    row["moved_to_spare_expected"] = d.wait_for(r"spare worker ready", 1) is not None
    if tail is None:
        tail = Tail(out)
    else:  # a soak's tail: keep what it has read so far
        assert history is not None
        history += tail.records()
    seen: list[dict] = []
    os.kill(victim, signal.SIGKILL)
    killed, killed_wall = time.monotonic(), time.time()
    back = None
    while time.monotonic() - killed < 60 and back is None:
        # back = a line of the stream for a frame decoded after the kill (the dead worker's last lines,
        # handed over late, do not count)
        new = tail.records()
        seen += new
        if any(r["stream"] == first_stream and r["time"] > killed_wall for r in new):
            back = time.monotonic() - killed
        time.sleep(0.05)
    row["restart_s"] = round(back, 2) if back is not None else None
    time.sleep(3)
    code = d.stop()
    row["exit"] = code
    records = read_records(out) if history is None else history + seen + tail.records()
    victims = set(re.findall(r"stream\(s\) ([^;]+) affected", "".join(d.log))[0].split(", "))
    row["moved_to_spare"] = "moved to the spare worker" in "".join(d.log)
    per_stream: dict[str, list[int]] = defaultdict(list)
    for r in records:
        per_stream[r["stream"]].append(r["frame"])
    row["victim_streams"] = len(victims)
    # every index once, none missing (from 0 when the whole file was read; a soak's history starts later)
    first_ok = (lambda v: v[0] == 0) if history is None else (lambda v: True)
    row["victims_contiguous"] = all(
        first_ok(v) and all(b == a + 1 for a, b in itertools.pairwise(v))
        for s, v in per_stream.items() if s in victims
    )  # fmt: skip
    row["others_gaps"] = sum(
        sum(b - a - 1 for a, b in itertools.pairwise(v) if b > a + 1)
        for s, v in per_stream.items() if s not in victims
    )  # fmt: skip
    row["victims_gaps"] = sum(
        sum(b - a - 1 for a, b in itertools.pairwise(v) if b > a + 1)
        for s, v in per_stream.items() if s in victims
    )  # fmt: skip
    row["victims_first_frames"] = sorted(v[0] for s, v in per_stream.items() if s in victims)
    # frames the pipeline was too far behind for (a busy box): dropped after decode, and counted by the daemon
    done = re.findall(r"streamd: done: .*?(\d+) dropped after decode", "".join(d.log))
    row["dropped_after_decode"] = int(done[-1]) if done else None
    row["others_first_frame_nonzero"] = sum(
        1 for s, v in per_stream.items() if s not in victims and v[0] != 0
    )
    return row


# -- decode-only ceiling -------------------------------------------------------------------------------------
def decode_frames(
    clip: Path, threads: int, seconds: float, start_at: float | None = None, warm: float = 4.0
) -> tuple[int, float, float]:
    """Plain PyNvVideoCodec (its own demuxer + decoder) in threads: (frames decoded in the window, window
    start, window end; wall times). The threads start at ``start_at`` (a time.time(); now when None); the
    window begins ``warm`` s later, once every decoder is created (creating dozens at once takes seconds
    and is not decoding), and lasts ``seconds``."""
    import PyNvVideoCodec as nvc

    t_start = start_at if start_at is not None else time.time()  # every process's window at the same times
    time.sleep(max(0.0, t_start - time.time()))
    stop = time.monotonic() + (t_start + warm + seconds + 0.5 - time.time())
    counts = [0] * threads

    def body(i: int) -> None:
        while time.monotonic() < stop:
            demux = nvc.CreateDemuxer(str(clip))
            dec = nvc.CreateDecoder(gpuid=0, codec=demux.GetNvCodecId(), usedevicememory=True)
            for packet in demux:
                counts[i] += len(dec.Decode(packet))
                if time.monotonic() >= stop:
                    break

    ts = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    time.sleep(max(0.0, t_start + warm - time.time()))
    c0, w0 = sum(counts), time.time()
    time.sleep(max(0.0, t_start + warm + seconds - time.time()))
    c1, w1 = sum(counts), time.time()
    for t in ts:
        t.join()
    return c1 - c0, w0, w1


def decode_ceiling(clip: Path, threads: int, seconds: float) -> float:
    """Decode-only frames/s of one process."""
    frames, w0, w1 = decode_frames(clip, threads, seconds)
    return frames / (w1 - w0)


def _decode_part(clip: Path, threads: int, seconds: float, start_at: float, results) -> None:
    try:
        results.put(decode_frames(clip, threads, seconds, start_at))
    except Exception as exc:  # the parent must not wait for a part that will never come
        results.put(repr(exc))


def decode_ceiling_processes(clip: Path, processes: int, threads: int, seconds: float) -> float:
    """The same in ``processes`` processes of ``threads`` threads, their windows at the same wall times:
    frames of all of them over the span from the first window start to the last window end (a late process
    lowers the figure, never inflates it). One Python process may be bound by its GIL before NVDEC is."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 8.0  # spawn + import in every process first
    procs = [
        ctx.Process(target=_decode_part, args=(clip, threads, seconds, start_at, results))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    parts = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    if failed := [p for p in parts if isinstance(p, str)]:
        raise RuntimeError(failed[0])
    return sum(f for f, _, _ in parts) / (max(e for _, _, e in parts) - min(b for _, b, _ in parts))


# -- pipelined vs serialized ---------------------------------------------------------------------------------
class _HeldLease:
    """A device NV12 picture that stays valid for the whole bench (no decoder pool behind it)."""

    def __init__(self, planes) -> None:
        self.planes = planes

    def wait(self, stream) -> None:
        pass

    def release(self, stream=None) -> None:
        pass


def _device_frames(stages, images: list[np.ndarray]) -> tuple[list, list[_HeldLease]]:
    """Each image as an NV12 picture in device memory (uploaded once), as NVDEC would hand it over."""
    import cv2

    from streamd.gpu.cuda import DeviceBuffer
    from streamd.types import Nv12Surface

    h, w = images[0].shape[:2]
    stages.ctx.activate()
    buffers, leases = [], []
    for img in images:
        i420 = cv2.cvtColor(img, cv2.COLOR_BGR2YUV_I420)
        u = i420[h : h + h // 4].reshape(h // 2, w // 2)
        v = i420[h + h // 4 :].reshape(h // 2, w // 2)
        nv12 = np.ascontiguousarray(np.concatenate([i420[:h], np.stack([u, v], axis=-1).reshape(h // 2, w)]))
        buf = DeviceBuffer(nv12.nbytes)
        buf.upload(nv12, stages.s1)
        stages.s1.synchronize()  # the host array goes away
        buffers.append(buf)
        leases.append(_HeldLease(Nv12Surface.contiguous(buf.ptr, w, h)))
    return buffers, leases


def pipelined_vs_serialized(
    batches: list[int], frames_total: int, frames: str = "host", engines: tuple[str, ...] = ("1",)
) -> list[dict]:
    """Same frames, same engine: ring_slots 4 (batches in different stages at once; with ``engine.lanes``
    2 also two in inference) vs 1 (serial: one batch at a time, so one lane). ``engines``: one row per
    spec, "2" = lanes 2, "2c" = lanes 2 and ``engine.compile``. ``frames`` "host": BGR arrays
    as the CPU decoder gives them (packed and uploaded by S1); "device": NV12 pictures already in device
    memory, as NVDEC gives them (S1 only launches the preprocess kernel)."""
    import cv2

    from streamd.config import parse_config
    from streamd.pipeline.batcher import Batcher
    from streamd.pipeline.build import build_stages
    from streamd.pipeline.scheduler import Scheduler
    from streamd.types import Frame

    cap = cv2.VideoCapture(str(DEMO_CLIP))
    images = []
    while len(images) < 200:
        ok, img = cap.read()
        if not ok:
            break
        images.append(img)
    h, w = images[0].shape[:2]
    rows = []
    for batch, spec in ((b, e) for b in batches for e in engines):
        lane_count, compiled = int(spec.rstrip("c")), spec.endswith("c")
        raw = {
            "streams": [{"id": "s", "url": str(DEMO_CLIP)}],
            "model": {"path": str(MODEL)},
            "engine": {
                "type": "torch",
                "precision": "fp16",
                "max_batch": 64,
                "lanes": lane_count,
                "compile": compiled,
            },
            "pipeline": {"batch_size": batch, "decoder": "cpu", "ring_slots": 4},  # the runs pick 4 or 1
        }
        config = parse_config(raw, ROOT)
        stages = build_stages(config)
        held: list = []
        try:
            result: dict = {"batch": batch, "frames": frames, "lanes": lane_count, "compile": compiled}
            leases: list = []
            if frames == "device":
                held, leases = _device_frames(stages, images)
            # Alternate, best of three each; at least 600 batches per timed run (3,000 frames of batch 32
            # took 0.2-0.4 s and the serial figure moved 10 % between runs).
            total = max(frames_total, 600 * batch)
            for slots in (4, 1, 4, 1, 4, 1):
                batcher = Batcher(batch, 0.05)
                q = batcher.add_stream("s", 4 * batch, "block")
                stop = threading.Event()

                def feed(q=q, stop=stop, leases=leases, total=total) -> None:
                    for i in range(total):
                        k = i % len(images)
                        pixels = {"surface": leases[k]} if leases else {"image": images[k]}
                        f = Frame("s", i, i / 30, w, h, **pixels, t_decoded=time.perf_counter())
                        if not q.put(f, stop):
                            return
                    q.close()

                done = []
                sched = Scheduler(batcher, stages, done.extend, ring_slots=slots)
                feeder = threading.Thread(target=feed, daemon=True)
                t0 = time.perf_counter()
                feeder.start()
                sched.start()
                sched.join()
                fps = len(done) / (time.perf_counter() - t0)
                key = f"fps_slots{slots}"
                if fps > result.get(key, 0.0):
                    result[key] = round(fps, 1)
                    # where a batch's time goes: host ms per batch in each stage thread, GPU ms per stage
                    nb = max(1, sched.batches)
                    result[f"host_ms_slots{slots}"] = {
                        k: round(v * 1e3 / nb, 3) for k, v in sched.busy_s.items()
                    }  # ... of which CPU (the rest: blocked on the GIL, the GPU or pack threads)
                    cpu = sched.cpu_s
                    result[f"cpu_ms_slots{slots}"] = {k: round(v * 1e3 / nb, 3) for k, v in cpu.items()}
                    result[f"gpu_ms_slots{slots}"] = {
                        k: round(float(np.mean([r.latency_ms[k] for r in done[::batch]])), 3)
                        for k in ("preprocess", "infer", "postprocess")
                    }  # CUDA events, per stage; and how long the collect thread waited for the GPU:
                    waits = [r.latency_ms["host_wait"] for r in done[::batch]]
                    result[f"host_wait_ms_slots{slots}"] = round(float(np.mean(waits)), 3)
            result["ratio"] = round(result["fps_slots4"] / result["fps_slots1"], 2)
            counts = getattr(stages.engine, "graph_counts", None)
            if counts is not None:  # a capture that failed runs eagerly: a ring far slower than the probe
                result["graphs"], result["graph_failures"] = counts()
            rows.append(result)
        finally:
            for buf in held:
                buf.close()
            stages.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, required=True, help="1080p30 H.264 clip, >= 30 s")
    ap.add_argument("--streams", type=int, nargs="*", default=[64, 96, 120])
    ap.add_argument("--overload", type=int, nargs="*", default=[], help="stream counts past the ceiling")
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--engine", default="torch", help="onnxruntime: a CPU smoke test of this script")
    ap.add_argument("--model", type=Path, default=MODEL, help="ONNX model (default: the bundled NanoDet)")
    ap.add_argument(
        "--model-key", action="append", default=[], metavar="'KEY: VALUE'",
        help="an extra model: line of the generated config, e.g. 'layout: yolov8' (repeatable)",
    )  # fmt: skip
    ap.add_argument(
        "--engine-key", action="append", default=[], metavar="'KEY: VALUE'",
        help="an extra engine: line, e.g. 'verify: false' for a model with random weights whose fp16 "
        "detections differ from fp32 (its cost is what is measured), or 'max_batch: 32' (a key given here "
        "replaces bench_live's own) (repeatable)",
    )  # fmt: skip
    ap.add_argument(
        "--pipeline-key", action="append", default=[], metavar="'KEY: VALUE'",
        help="an extra pipeline: line, e.g. 'ring_slots: 2' or ring_slots=2 (repeatable)",
    )  # fmt: skip
    ap.add_argument(
        "--no-spare", action="store_true",
        help="pipeline.spare_worker: false (its engine build, minutes on a loaded GPU, is not waited for)",
    )  # fmt: skip
    ap.add_argument(
        "--input-size", type=int, nargs=2, metavar=("W", "H"), default=None, help="model.input_size"
    )
    ap.add_argument(
        "--detect-fps", type=float, default=None,
        help="streams[].detect_fps; with tracking.fill_skipped on (every frame keeps a line, so frame gaps "
        "stay drops) unless --no-fill-skipped",
    )  # fmt: skip
    ap.add_argument(
        "--no-fill-skipped", action="store_true",
        help="with --detect-fps: no predicted lines; drops are then the daemon's count over the whole run",
    )  # fmt: skip
    ap.add_argument(
        "--precision", default=None, choices=["fp32", "fp16", "bf16", "int8"],
        help="engine.precision (default fp16; onnxruntime fp32)",
    )  # fmt: skip
    ap.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=True,
        help="engine.compile (the daemon's default since the twenty-first session: on; --no-compile: off)",
    )  # fmt: skip
    ap.add_argument("--shared", action="store_true", help="engine.shared: true (one engine process per GPU)")
    ap.add_argument("--p99-ms", type=float, default=50.0, help="p99 limit of the largest clean N")
    ap.add_argument(
        "--engine-img-s", type=float, default=0.0,
        help="the engine's own img/s at this batch and precision (bench_engines): each row's detected fps "
        "is reported as a share of it (the pipeline's efficiency when the engine is the bottleneck)",
    )  # fmt: skip
    ap.add_argument("--lanes", type=int, default=1, help="engine.lanes")
    ap.add_argument("--workers", default="auto")
    ap.add_argument(
        "--also-workers",
        nargs="*",
        default=[],
        help="run each --streams count again with these worker counts",
    )
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--start-timeout", type=float, default=240.0)
    ap.add_argument("--sample-every", type=float, default=10.0)
    ap.add_argument("--ceiling-threads", type=int, default=32)
    ap.add_argument(
        "--ceiling-processes",
        type=int,
        default=8,
        help="also the ceiling in N processes x --ceiling-process-threads threads (0: skip)",
    )
    ap.add_argument(
        "--ceiling-process-threads",
        type=int,
        default=16,
        help="decoders per ceiling process: each Decode() waits for its picture, so one decoder is bound by "
        "NVDEC's latency, and the ceiling needs about as many decoders as the streams it is compared with",
    )
    ap.add_argument(
        "--capacity",
        type=int,
        nargs="*",
        default=[],
        help="stream counts run unpaced (realtime: false: files wait for room, never drop): streamd's own "
        "throughput, the capacity --overload-factor also multiplies",
    )
    ap.add_argument(
        "--overload-factor",
        type=float,
        default=0.0,
        help="also a run offered this multiple of the (highest) decode-only ceiling, without a spare worker",
    )
    ap.add_argument("--restart", type=int, default=0, help="streams for the kill -9 probe (0: skip)")
    ap.add_argument("--restart-worker", type=int, default=0, help="the worker the kill -9 probe kills")
    ap.add_argument(
        "--devices", type=int, nargs="*", default=[], help="pipeline.devices: GPUs the workers spread over"
    )
    ap.add_argument("--pipelined", type=int, nargs="*", default=[], help="batch sizes (e.g. 1 8 32)")
    ap.add_argument(
        "--pipelined-frames",
        nargs="*",
        default=["host"],
        choices=["host", "device"],
        help="host: BGR arrays (the CPU decoder's); device: NV12 in device memory (NVDEC's)",
    )
    ap.add_argument(
        "--pipelined-engines", nargs="*", default=["1"], help='engine per row: lanes, "c" = compiled (1 2 2c)'
    )
    ap.add_argument("--single", action="store_true", help="one stream, default config (batch 4): p99")
    ap.add_argument("--soak", type=float, default=0.0, help="seconds of one soak run at --streams[0]")
    ap.add_argument(
        "--soak-kill", action="store_true", help="after the soak, kill -9 a worker (restart probe)"
    )
    ap.add_argument(
        "--tracking", type=int, nargs="*", default=[], help="stream counts to run with tracking on"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "out")
    ap.add_argument(
        "--tmp",
        type=Path,
        default=None,
        help="where the runs' configs and JSONL go (default /dev/shm; a soak "
        "writes ~1 GB of lines: give it a disk)",
    )
    args = ap.parse_args()
    args.clip = args.clip.resolve()  # the configs live elsewhere: relative paths would not resolve
    args.model = args.model.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": os.environ.get("STREAMD_COMMIT", "?"),
        "clip": args.clip.name,
        "model": args.model.name,
    }
    tmp_root = args.tmp or (Path("/dev/shm") if Path("/dev/shm").exists() else None)
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp_s:
        tmp = Path(tmp_s)
        if args.soak:
            results["soak"] = live_run(args, args.streams[0], tmp, soak_s=args.soak)
            print(json.dumps({k: v for k, v in results["soak"].items() if k != "samples"}), flush=True)
            if "restart" in results["soak"]:
                results["restart"] = results["soak"]["restart"]
        else:
            if args.ceiling_threads:
                ceiling = decode_ceiling(args.clip, args.ceiling_threads, 8.0)
                results["ceiling_fps"] = round(ceiling, 1)
                print(f"decode-only ceiling ({args.ceiling_threads} threads): {ceiling:.0f} fps", flush=True)
            if args.ceiling_processes:
                threads = args.ceiling_process_threads
                try:
                    ceiling = decode_ceiling_processes(args.clip, args.ceiling_processes, threads, 10.0)
                except Exception as exc:  # the rest of the bench still runs
                    print(f"decode-only ceiling in processes failed: {exc!r}", flush=True)
                    ceiling = 0.0
                results["ceiling_processes_fps"] = round(ceiling, 1)
                procs = args.ceiling_processes
                results["ceiling_processes"] = f"{procs} x {threads}"
                print(f"decode-only ceiling ({procs} processes x {threads}): {ceiling:.0f} fps", flush=True)
            results["capacity"] = []
            for n in args.capacity:  # no spare (as past capacity): nothing built during the window
                row = live_run(args, n, tmp, spare=False, realtime=False)
                results["capacity"].append(row)
                print(json.dumps(row), flush=True)
            top = max(
                [results.get("ceiling_fps", 0.0), results.get("ceiling_processes_fps", 0.0)]
                + [x.get("delivered_fps", 0.0) for x in results["capacity"]]
            )
            results["overload_reference_fps"] = top
            if args.overload_factor and top:
                args.overload.append(int(np.ceil(args.overload_factor * top / args.fps)))
            if args.single:
                saved = (args.batch, args.workers)
                args.batch, args.workers = 4, "auto"
                results["single"] = live_run(args, 1, tmp)
                args.batch, args.workers = saved
                print(json.dumps(results["single"]), flush=True)
            results["ramp"] = []
            for n in args.streams:
                row = live_run(args, n, tmp)
                results["ramp"].append(row)
                print(json.dumps(row), flush=True)
            for n in args.overload:  # no spare: its build (minutes under this load) would overlap the window
                row = live_run(args, n, tmp, spare=False)
                results["ramp"].append(row)
                print(json.dumps(row), flush=True)
            saved_workers = args.workers
            for workers in args.also_workers:  # the same stream counts over another number of processes
                args.workers = workers
                for n in args.streams:
                    row = live_run(args, n, tmp)
                    results["ramp"].append(row)
                    print(json.dumps(row), flush=True)
            args.workers = saved_workers
            for n in args.tracking:  # the same run with tracking on (issue 9: within 10 % of tracking off)
                row = live_run(args, n, tmp, extra="tracking:\n  enabled: true\n")
                results["ramp"].append(row)
                print(json.dumps(row), flush=True)
            if args.restart:
                results["restart"] = live_run(args, args.restart, tmp, kill_worker=True)
                print(json.dumps(results["restart"]), flush=True)
            if args.pipelined:
                results["pipelined"] = []
                for kind in args.pipelined_frames:  # one kind failing must not lose the other's rows
                    try:
                        results["pipelined"] += pipelined_vs_serialized(
                            args.pipelined, 3000, kind, tuple(args.pipelined_engines)
                        )
                    except Exception as exc:
                        print(f"pipelined ({kind} frames) failed: {exc!r}", flush=True)
                print(json.dumps(results["pipelined"]), flush=True)
    if args.engine_img_s:
        results["engine_img_s"] = args.engine_img_s
        for row in results.get("ramp", []):
            if row.get("detected_fps") is not None:  # frames the engine ran (skipped ones are not detected)
                row["engine_efficiency"] = round(row["detected_fps"] / args.engine_img_s, 3)
    if results.get("ramp"):
        results["p99_limit_ms"] = args.p99_ms
        results["largest_clean_streams"] = largest_clean(results["ramp"], args.p99_ms)
    (args.out / "bench_live.json").write_text(json.dumps(results, indent=1))
    (args.out / "bench_live.md").write_text(markdown(results))
    print(markdown(results))
    return 0


def largest_clean(rows: list[dict], p99_ms: float = 50.0) -> int | None:
    """The largest stream count whose live (paced) row carried every stream cleanly: 0 drops in the window,
    p99 <= ``p99_ms``, every stream seen (past the decoder limit some get none) and each at >= 95 % of its
    offered rate (a stream behind real time without dropping yet is not carried)."""
    clean = [
        x["streams"]
        for x in rows
        if "error" not in x
        and x.get("realtime", True)
        and x.get("drops_in_window") == 0
        and x.get("p99_ms") is not None
        and x["p99_ms"] <= p99_ms
        and x.get("streams_seen") == x["streams"]
        and x.get("min_stream_share", 0.0) >= 0.95
    ]
    return max(clean, default=None)


def markdown(r: dict) -> str:
    lines = [f"bench_live · {r['date']} · commit {r['commit']} · clip {r['clip']}", ""]
    if "ceiling_fps" in r:
        lines.append(f"decode-only ceiling (plain PyNvVideoCodec, 1 process): **{r['ceiling_fps']} fps**")
        lines.append("")
    if "ceiling_processes_fps" in r:
        lines.append(
            f"decode-only ceiling (plain PyNvVideoCodec, {r.get('ceiling_processes', '?')} processes x "
            f"decoders): **{r['ceiling_processes_fps']} fps**"
        )
        lines.append("")
    if r.get("overload_reference_fps"):
        lines += [f"highest ceiling / unpaced capacity: {r['overload_reference_fps']} fps", ""]
    rows = ([r["single"]] if "single" in r else []) + r.get("capacity", []) + r.get("ramp", [])
    if r.get("ramp"):
        limit = r.get("p99_limit_ms", 50.0)
        lines += [
            f"largest N with 0 drops and p99 <= {limit:g} ms: **{largest_clean(r['ramp'], limit)}**",
            "",
        ]
    if r.get("engine_img_s"):  # issue 26 point 3: how much of the engine's own rate the daemon delivers
        lines += [f"engine's own rate (bench_engines, same batch and precision): {r['engine_img_s']:g} img/s"]
        lines += [
            f"- {x['streams']} streams: detected {x.get('detected_fps')} img/s = "
            f"**{x['engine_efficiency']:.3f}** of it"
            for x in r.get("ramp", [])
            if x.get("engine_efficiency") is not None
        ]
        lines.append("")
    if rows:
        lines += [
            "| streams | workers | offered fps | delivered fps | slowest / fastest 1 s | drops | p50 ms "
            "| p99 ms | max ms | min stream share | min fair share | CPU ms/frame | procs | RSS MB max "
            "| GPU MB/proc | exit |",
            "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for x in rows:
            if "error" in x:
                lines.append(f"| {x['streams']} | {x['offered_fps']} | error: {x['error'][:200]} |")
                continue
            gpu = x.get("gpu_mb_per_process") or []
            label = f"{x['streams']}" + (" (tracking)" if "tracking" in x.get("extra", "") else "")
            if x.get("detect_fps"):
                label += f" (detect_fps {x['detect_fps']:g}{', filled' if x.get('fill_skipped') else ''})"
            if x.get("devices"):
                label += f" (GPUs {', '.join(map(str, x['devices']))})"
            offered = f"{x['offered_fps']:.0f}" if x.get("realtime", True) else "unpaced"
            lines.append(
                f"| {label} | {x.get('workers')} | {offered} | {x['delivered_fps']} "
                f"| {x.get('min_1s_fps')} / {x.get('max_1s_fps')} | {x['drops_in_window']} "
                f"| {x['p50_ms']} | {x['p99_ms']} | {x['max_ms']} | {x['min_stream_share']} "
                f"| {x.get('min_fair_share')} "
                f"| {x['host_cpu_ms_per_frame']} | {x.get('processes')} | {x['rss_mb_max_process']} "
                f"| {min(gpu, default=0):.0f}–{max(gpu, default=0):.0f} | {x['exit']} |"
            )
        notes = [x for x in rows if "engine_rows_per_batch" in x or "gpu_util_pct" in x]
        lines += [""] if notes else []
        for x in notes:  # the shared engine's merged batches, and which of the GPU's engines was busy
            parts = []
            if "engine_rows_per_batch" in x:
                rate = x.get("engine_rows_per_s")
                parts.append(f"engine {x['engine_rows_per_batch']} rows/batch, {rate} rows/s")
            for index, u in x.get("gpu_util_pct", {}).items():
                busy = f"kernels {u['gpu']} %, memory {u['memory']} %, NVDEC {u['decoder']} %"
                parts.append(f"GPU {index}: {busy}")
            lines.append(f"- {x['streams']} streams: " + "; ".join(parts))
    if "restart" in r:
        x = r["restart"]
        k = x.get("killed_worker", 0)
        lines += ["", f"kill -9 of worker {k} at {x['streams']} streams: back after {x.get('restart_s')} s, "
                  f"{x.get('victim_streams')} streams affected, "
                  f"indices contiguous: {x.get('victims_contiguous')}, "
                  f"gaps in other streams: {x.get('others_gaps')}, exit {x.get('exit')}, "
                  f"moved to the spare: {x.get('moved_to_spare')}"]  # fmt: skip
    if "pipelined" in r:
        lines += [
            "",
            "| frames | batch | engine lanes | compiled | ring_slots 4 fps | ring_slots 1 fps | ratio |",
            "|---|---:|---:|---|---:|---:|---:|",
        ]
        for x in r["pipelined"]:
            row = (x.get("frames", "host"), x["batch"], x.get("lanes", 1), x.get("compile", False))
            row += (x["fps_slots4"], x["fps_slots1"])
            row += (x["ratio"],)
            lines.append("| " + " | ".join(map(str, row)) + " |")
        for x in r["pipelined"]:
            for slots in (4, 1):
                host, gpu = x.get(f"host_ms_slots{slots}"), x.get(f"gpu_ms_slots{slots}")
                lines.append(
                    f"{x.get('frames', 'host')} frames, batch {x['batch']}, lanes {x.get('lanes', 1)}, "
                    f"compiled {x.get('compile', False)}, "
                    f"ring_slots {slots}: host ms/batch "
                    f"{host}, of it CPU {x.get(f'cpu_ms_slots{slots}')}, GPU ms {gpu}, "
                    f"host wait ms {x.get(f'host_wait_ms_slots{slots}')}, CUDA graphs {x.get('graphs')} "
                    f"(failed {x.get('graph_failures')})"
                )
    if "soak" in r:
        x = r["soak"]
        lines += ["", f"soak {x['streams']} streams: delivered {x.get('delivered_fps')} fps, drops "
                  f"{x.get('drops_in_window')}, p99 {x.get('p99_ms')} ms, "
                  f"growth after 1 min {x.get('growth')}, "
                  f"exit {x.get('exit')}"]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
