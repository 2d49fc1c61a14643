#!/usr/bin/env python3
"""GPU memory per worker and per camera, measured from outside: `streamd run` at N live-paced cameras,
nvidia-smi per process (issue 26).

    python bench/bench_memory.py --clip CLIP_1080p_h264.mp4 [--model M.onnx --input-size W H]
        [--streams 16 64 120] [--variants baseline expandable cudnn-ws lean] [--variant 'NAME:K=V,K=V']
        [--warmup 20] [--window 20] [--out DIR]

For each variant and N: one `streamd run` (a real subprocess: supervisor + workers) with N streams of the
clip (``realtime: true``, ``loop: true``), READY, a warm-up, then ``nvidia-smi
--query-compute-apps=pid,used_memory`` every ``--sample-every`` s over the window, kept for the daemon's own
processes (its descendants). Per run: MB
of every process (its largest sample), the total, total / N, delivered fps and drops (the same figures as
bench_live), the exit status. Per variant, a line fitted over its N: **MB per camera** (the slope) and **MB
per worker** (what is left at N = 0, over the processes holding GPU memory, spare included).

Variants cut what may be waste; a variant is a name plus settings, each either an environment variable of the
daemon (UPPER_CASE=value) or a config key (``section.key=value``, YAML value):
- ``baseline``: the config as generated (the daemon's defaults: ``engine.compile`` on since the
  twenty-first session; rows before it ran uncompiled);
- ``uncompiled``: engine.compile=false (baseline before the twenty-first session);
- ``expandable``: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the caching allocator maps what it uses
  instead of reserving whole segments);
- ``cudnn-ws``: CUDNN_CONV_WSCAP_DBG=256 (cuDNN picks convolution algorithms within a 256 MiB workspace)
  and CUBLAS_WORKSPACE_CONFIG=:4096:2 (cuBLAS keeps 2 workspaces of 4 MiB);
- ``no-graphs``: engine.cuda_graphs=false (no CUDA graph pools; slower, measured for its share);
- ``small-pool``: pipeline.frame_queue=1 (the NVDEC surface pool per stream is frame_queue + 2 x batch + 4);
- ``batch16``: pipeline.batch_size=16 (smaller surface pools, activations and graph pools);
- ``no-spare``: pipeline.spare_worker=false (the spare holds a whole engine);
- ``lean``: expandable + cudnn-ws together;
- ``keep-cache``: STREAMD_KEEP_ALLOCATOR_CACHE=1, the worker as before it gave start-up's memory back
  (``Stages.warmed``: the start-up check's staging buffers, the allocator's free blocks): baseline's "before";
- ``shared``: engine.shared=true, one engine process per GPU fed by decode workers that hold no engine: the
  engine process (named by the daemon's "engine process ready ... (pid N)" line) is reported on its own and
  left out of the per-camera / per-worker fit, which then covers the decode workers.
``--variant 'NAME:K=V,K=V'`` adds one. ``--nvidia-smi PATH`` replaces the tool (tests pass a shim).
Results: DIR/bench_memory.md and DIR/bench_memory.json. A run that fails is an error row; the rest goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_live import MODEL, descendants, read_records, window_stats  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {
    "baseline": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cudnn-ws": {"CUDNN_CONV_WSCAP_DBG": "256", "CUBLAS_WORKSPACE_CONFIG": ":4096:2"},
    "no-graphs": {"engine.cuda_graphs": "false"},
    "small-pool": {"pipeline.frame_queue": "1"},
    "batch16": {"pipeline.batch_size": "16"},
    "no-spare": {"pipeline.spare_worker": "false"},
    "lean": {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "CUDNN_CONV_WSCAP_DBG": "256",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:2",
    },
    "keep-cache": {"STREAMD_KEEP_ALLOCATOR_CACHE": "1"},
    "shared": {"engine.shared": "true"},
    "uncompiled": {"engine.compile": "false"},
}
ENGINE_PID = re.compile(r"engine process (?:ready|back) on device \d+ \(pid (\d+)\)")


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """'NAME:K=V,K=V' -> (NAME, {K: V})."""
    name, _, rest = text.partition(":")
    settings = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--variant {text!r}: settings are KEY=VALUE, comma separated")
        settings[key.strip()] = value.strip()
    return name, settings


def split_settings(settings: dict[str, str]) -> tuple[dict[str, str], dict[str, object]]:
    """(environment variables, config keys ``section.key`` -> YAML value)."""
    env = {k: v for k, v in settings.items() if "." not in k}
    cfg = {k: yaml.safe_load(v) for k, v in settings.items() if "." in k}
    return env, cfg


def config_dict(args: argparse.Namespace, n: int, out: Path, overrides: dict[str, object]) -> dict:
    model: dict = {"path": str(args.model)}
    if args.input_size:
        model["input_size"] = list(args.input_size)
    for item in args.model_key:
        key, _, value = item.partition(":")
        model[key.strip()] = yaml.safe_load(value)
    cfg: dict = {
        "streams": [
            {"id": f"cam{i:03d}", "url": str(args.clip), "realtime": True, "loop": True} for i in range(n)
        ],
        "model": model,
        "engine": {"type": args.engine, "precision": args.precision, "max_batch": max(64, args.batch)},
        "pipeline": {"batch_size": args.batch, "workers": args.workers},
        "sinks": [{"type": "jsonl", "path": str(out), "queue_size": 200000}],
        "log_level": "info",
    }
    if args.decoder:
        cfg["pipeline"]["decoder"] = args.decoder
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        cfg.setdefault(section, {})[name] = value
    return cfg


def smi_used_mb(command: str) -> dict[int, float]:
    """pid -> MiB used, from ``command --query-compute-apps=pid,used_memory`` (empty when it fails)."""
    try:
        text = subprocess.run(
            [command, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=15,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[int, float] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                out[int(parts[0])] = out.get(int(parts[0]), 0.0) + float(parts[1])
            except ValueError:  # "[N/A]"
                continue
    return out


class Daemon:
    """`streamd run CONFIG` with extra environment variables; stderr kept line by line."""

    def __init__(self, cfg: Path, env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self.lines: list[str] = []
        full = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=full,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if any("streamd: ready" in line for line in list(self.lines)):
                return True
            time.sleep(0.2)
        return False

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = -9
        self._reader.join(timeout=5)
        self.log_path.write_text("".join(self.lines))
        return code


def one_run(args: argparse.Namespace, name: str, settings: dict[str, str], n: int, tmp: Path) -> dict:
    env, overrides = split_settings(settings)
    out = tmp / f"{name}-{n}.jsonl"
    out.unlink(missing_ok=True)
    cfg = tmp / f"{name}-{n}.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(args, n, out, overrides), sort_keys=False))
    row: dict = {"variant": name, "streams": n, "settings": settings}
    d = Daemon(cfg, env, args.out / f"daemon-{name}-{n}.log")
    try:
        if not d.wait_ready(args.start_timeout):
            row["error"] = "not ready: " + "".join(d.lines)[-1200:]
            return row
        m = re.search(r"over (\d+) worker process", "".join(d.lines))
        row["workers"] = int(m.group(1)) if m else None
        time.sleep(args.warmup)
        t0 = time.time()
        peak: dict[int, float] = {}
        samples = 0
        while time.time() - t0 < args.window and d.proc.poll() is None:
            ours = set(descendants(d.proc.pid))
            for pid, mb in smi_used_mb(args.nvidia_smi).items():
                if pid in ours:
                    peak[pid] = max(peak.get(pid, 0.0), mb)
            samples += 1
            time.sleep(max(0.0, min(args.sample_every, args.window - (time.time() - t0))))
        t1 = time.time()
        if d.proc.poll() is not None:
            row["error"] = f"daemon ended during the window (exit {d.proc.returncode})"
        time.sleep(1.0)  # lines of the window's last frames
        stats = window_stats(read_records(out), t0, t1, n, args.fps)
        row.update({k: stats[k] for k in ("delivered_fps", "drops_in_window", "p99_ms", "streams_seen")})
        row["samples"] = samples
        row["gpu_mb_per_process"] = {str(p): round(v) for p, v in sorted(peak.items())}
        row["gpu_processes"] = len(peak)
        row["gpu_mb_total"] = round(sum(peak.values()))
        engines = {int(pid) for pid in ENGINE_PID.findall("".join(d.lines))} & set(peak)
        row["engine_processes"] = len(engines)
        row["gpu_mb_engines"] = round(sum(peak[p] for p in engines))
        row["gpu_mb_per_camera_naive"] = round(sum(peak.values()) / n, 1)
        row["gpu_mb_per_process_max"] = round(max(peak.values(), default=0.0))
    finally:
        row["exit"] = d.stop()
    return row


def fit(rows: list[dict]) -> dict:
    """MB per camera (slope of the total over N) and MB per worker (intercept over the processes), from the
    variant's rows without errors; one row: the naive split only."""
    good = [r for r in rows if "error" not in r and r.get("gpu_processes")]
    if len(good) < 2:
        return {}
    n = np.array([r["streams"] for r in good], float)
    # the engine processes of engine.shared hold no camera's memory: out of the fit, reported on their own
    engines = np.array([r.get("gpu_mb_engines", 0) for r in good], float)
    total = np.array([r["gpu_mb_total"] for r in good], float) - engines
    procs = np.array([r["gpu_processes"] - r.get("engine_processes", 0) for r in good], float)
    # total = per_camera * N + per_worker * processes: least squares over the runs
    a = np.stack([n, procs], axis=1)
    (per_camera, per_worker), *_ = np.linalg.lstsq(a, total, rcond=None)
    out = {"mb_per_camera": round(float(per_camera), 1), "mb_per_worker": round(float(per_worker), 1)}
    if engines.any():
        out["mb_per_engine_process"] = round(float(engines.max()))
    return out


def markdown(results: dict) -> str:
    lines = [
        f"bench_memory · {results['date']} · commit {results['commit']} · clip {results['clip']} · "
        f"model {results['model']}",
        "",
        "| variant | streams | GPU processes | total MB | MB / camera (total / N) | largest process MB "
        "| engine process MB | delivered fps | drops | p99 ms | exit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        if "error" in r and "gpu_mb_total" not in r:
            lines.append(f"| {r['variant']} | {r['streams']} | error: {r['error'][:200]} | | | | | | | | |")
            continue
        lines.append(
            f"| {r['variant']} | {r['streams']} | {r['gpu_processes']} | {r['gpu_mb_total']:,} "
            f"| {r['gpu_mb_per_camera_naive']} | {r['gpu_mb_per_process_max']:,} "
            f"| {r.get('gpu_mb_engines') or ''} | {r['delivered_fps']} "
            f"| {r['drops_in_window']} | {r['p99_ms']} | {r['exit']} |"
        )
    if results["fits"]:
        lines += [
            "",
            "| variant | MB per camera (fit) | MB per worker (fit) | engine process MB | settings |",
            "|---|---:|---:|---:|---|",
        ]
        for name, f in results["fits"].items():
            settings = ", ".join(f"{k}={v}" for k, v in results["variants"][name].items()) or "as generated"
            lines.append(
                f"| {name} | {f.get('mb_per_camera', '')} | {f.get('mb_per_worker', '')} "
                f"| {f.get('mb_per_engine_process', '')} | {settings} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, required=True, help="1080p30 H.264 clip")
    ap.add_argument("--model", type=Path, default=MODEL, help="ONNX model (default: the bundled NanoDet)")
    ap.add_argument("--model-key", action="append", default=[], metavar="'KEY: VALUE'")
    ap.add_argument("--input-size", type=int, nargs=2, metavar=("W", "H"), default=None)
    ap.add_argument("--streams", type=int, nargs="+", default=[16, 64, 120])
    ap.add_argument("--variants", nargs="*", default=["baseline", "lean"], choices=sorted(VARIANTS))
    ap.add_argument("--variant", action="append", default=[], help="'NAME:K=V,K=V' (env or section.key)")
    ap.add_argument("--engine", default="torch", help="engine.type (onnxruntime: a CPU smoke test)")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--decoder", default=None, help="pipeline.decoder (default: the config's auto)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", default="auto")
    ap.add_argument("--fps", type=float, default=30.0, help="the clip's frame rate (drops, shares)")
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--sample-every", type=float, default=2.0)
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--nvidia-smi", default="nvidia-smi")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "out")))
    ap.add_argument("--tmp", type=Path, default=None, help="configs and JSONL (default /dev/shm)")
    args = ap.parse_args(argv)
    args.clip, args.model = args.clip.resolve(), args.model.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    variants = {name: VARIANTS[name] for name in args.variants}
    variants.update(parse_variant(text) for text in args.variant)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
    ).stdout.strip()
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": os.environ.get("STREAMD_COMMIT", commit or "?"),
        "clip": args.clip.name,
        "model": args.model.name,
        "variants": variants,
        "rows": [],
        "fits": {},
    }
    tmp_root = args.tmp or (Path("/dev/shm") if Path("/dev/shm").exists() else None)
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp_s:
        for name, settings in variants.items():
            rows = []
            for n in args.streams:
                try:
                    row = one_run(args, name, settings, n, Path(tmp_s))
                except Exception as exc:  # one run failing must not lose the others
                    row = {"variant": name, "streams": n, "error": repr(exc)[:500]}
                rows.append(row)
                print(json.dumps(row), flush=True)
                (args.out / "bench_memory.json").write_text(
                    json.dumps({**results, "rows": results["rows"] + rows})
                )
            results["rows"] += rows
            results["fits"][name] = fit(rows)
    (args.out / "bench_memory.json").write_text(json.dumps(results, indent=1))
    (args.out / "bench_memory.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
