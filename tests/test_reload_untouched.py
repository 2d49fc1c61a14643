"""A reload disturbs nothing else: a stream added, changed and removed in the worker that carries live
streams, five times, through ``streamd reload`` (what ``systemctl reload`` runs); the untouched streams keep
their numbering, never pause (at most 1 s of frames dropped over the run, where the old reload lost 3-4 s per
reload) and decode every packet (each pts follows from its frame number). A refused config makes ``streamd
reload`` exit 1 and the running config stays."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import CLIP, CLIP_HEVC, MODEL, ROOT

PERIOD_S = 0.1  # samples/vtest.mp4 is 10 fps
MISSING_OK = 10  # frames an untouched stream may drop (counted) over the whole run: 1 s of it


def _config(path: Path, out: Path, untouched: int, third: str, settings: str) -> None:
    live = "    realtime: true\n    loop: true\n"
    streams = "".join(f"  - id: u{k}\n    url: {CLIP}\n{live}" for k in range(untouched))
    path.write_text(
        f"streams:\n{streams}{third}model:\n  path: {MODEL}\n{settings}"
        f"sinks:\n  - type: jsonl\n    path: {out}\n"
    )


def _lines(out: Path) -> list[dict]:
    if not out.exists():
        return []
    return [json.loads(x) for x in out.read_text().splitlines() if x.endswith("}")]


def test_reloads_never_pause_the_untouched_streams(tmp_path, assets) -> None:
    run_reloads(tmp_path, untouched=2, settings="pipeline:\n  workers: 1\n  batch_size: 4\n")


def run_reloads(tmp_path: Path, *, untouched: int, settings: str) -> None:
    """Five reloads (add, change, remove, add, change stream c) beside ``untouched`` live streams u0..; one
    refused config. ``settings``: the config's engine/pipeline sections."""
    out, cfg, run_dir = tmp_path / "out.jsonl", tmp_path / "live.yaml", tmp_path / "run"
    run_dir.mkdir()
    # c runs the detector on few frames: the test is about reloads, not about what two cores can carry
    c_file = f"  - id: c\n    url: {CLIP}\n    realtime: true\n    loop: true\n    detect_fps: 2\n"
    c_changed = f"  - id: c\n    url: {CLIP_HEVC}\n    realtime: true\n    loop: true\n    detect_fps: 3\n"
    steps = [("add c", c_file), ("change c", c_changed), ("remove c", ""), ("add c", c_file),
             ("change c", c_changed)]  # fmt: skip
    _config(cfg, out, untouched, "", settings)
    env = {**os.environ, "RUNTIME_DIRECTORY": str(run_dir), "PYTHONUNBUFFERED": "1"}
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip

    def wait(predicate, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            assert proc.poll() is None, err_path.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {err_path.read_text()[-3000:]}")

    def reload() -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "streamd", "reload", "--pid", str(proc.pid), "--timeout", "60"]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)

    def count(sid: str) -> int:
        return sum(1 for r in _lines(out) if r["stream"] == sid and "type" not in r)

    try:
        wait(lambda: (run_dir / "reload.json").exists() and count("u0") >= 20, "the first lines")
        for what, third in steps:
            _config(cfg, out, untouched, third, settings)
            before = count("c")
            done = reload()
            assert done.returncode == 0, f"{what}: {done.stderr}"
            assert "applied" in done.stderr, done.stderr
            if third:  # the new or changed stream writes again
                wait(lambda before=before: count("c") >= before + 4, f"{what}: c writes")
            else:
                time.sleep(3)
        cfg.write_text(cfg.read_text().replace("loop: true", "loop: maybe", 1))
        refused = reload()
        assert refused.returncode == 1 and "refused" in refused.stderr, refused.stderr
        n = count("u0")
        wait(lambda: count("u0") >= n + 20, "the old config still running")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    stderr = err_path.read_text()
    assert proc.returncode == 0, stderr[-3000:]
    lines = [r for r in _lines(out) if "type" not in r]
    for sid in (f"u{k}" for k in range(untouched)):
        mine = [r for r in lines if r["stream"] == sid]
        frames = [r["frame"] for r in mine]
        pts_steps = [b["pts"] - a["pts"] for a, b in itertools.pairwise(mine)]
        wall_gap = max(b["time"] - a["time"] for a, b in itertools.pairwise(mine))
        missing = sorted(set(range(frames[-1] + 1)) - set(frames))
        assert frames == sorted(set(frames)) and frames[0] == 0, f"{sid}: frames out of order or repeated"
        # A pause (the old reload moved every stream to a new process: 3-4 s, 20-30 frames dropped per reload,
        # five reloads) is far past this; a 2-core box stalled past the queue's 1 s lag bound by the reload's
        # own processes drops a few frames, counted, which is not what this test is about.
        print(f"{sid}: {len(frames)} frames, {len(missing)} dropped, pts step ≤ {max(pts_steps):.3f} s, "
              f"largest gap between lines {wall_gap:.2f} s")  # fmt: skip
        assert len(missing) <= MISSING_OK, f"{sid}: frames {missing[:40]} missing; {stderr[-2000:]}"
        # decode every packet: a frame's pts follows from its number (dropped frames were decoded first)
        for a, b in itertools.pairwise(mine):
            step, frames_step = b["pts"] - a["pts"], b["frame"] - a["frame"]
            assert 0 < step <= (frames_step + 1) * PERIOD_S + 1e-6, f"{sid}: pts jumped {step:.3f} s"
    c = [r["frame"] for r in lines if r["stream"] == "c"]
    assert c == sorted(c) and len(set(c)) == len(c), "c: numbering continues across its changes"
    assert stderr.count("reload: added c") == 2 and stderr.count("reload: removed c") == 1, stderr[-3000:]
