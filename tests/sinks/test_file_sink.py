"""File and stdout sinks: rotation, SIGHUP reopen, skip_empty, fsync, unwritable outputs, closed stdout."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamd.exitcodes import EX_CANTCREAT, StartupError
from streamd.sinks import SinkSet
from streamd.sinks.jsonl import JsonlFileSink
from tests.conftest import ROOT, run_streamd
from tests.sinks._helpers import config_with_sinks, fake_lines


def frames_in(*paths: Path) -> list[int]:
    return [json.loads(line)["frame"] for p in paths if p.exists() for line in p.read_text().splitlines()]


def wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_rotation_by_size_keeps_the_newest_files_in_order(tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    lines = fake_lines(300)
    sink = JsonlFileSink(out, rotate_bytes=4000, keep=3, flush_every=10)
    sink.start()
    for line in lines:
        sink.submit(line, "demo")
    sink.close()
    kept = [out.with_name(f"r.jsonl.{n}") for n in (3, 2, 1)] + [out]
    assert all(p.exists() for p in kept) and not out.with_name("r.jsonl.4").exists()
    assert all(p.stat().st_size <= 4000 for p in kept)
    frames = frames_in(*kept)
    assert frames == list(range(300 - len(frames), 300)), "kept files hold the newest lines, in order"
    assert sink.rotations >= 4 and sink.written == 300 and sink.dropped == 0
    print(f"rotations={sink.rotations} kept_lines={len(frames)}")


def test_rotation_by_size_counts_bytes_of_utf8_lines(tmp_path) -> None:
    """Labels are written unescaped: a line of CJK labels has three bytes per character, and the size limit
    is on the file's bytes."""
    out = tmp_path / "u.jsonl"
    lines = [line.replace('"demo"', '"人人人人人人人人人人"') for line in fake_lines(200)]
    assert not lines[0].isascii()
    sink = JsonlFileSink(out, rotate_bytes=4000, keep=50, flush_every=10)
    sink.start()
    for line in lines:
        sink.submit(line, "demo")
    sink.close()
    files = [p for p in tmp_path.iterdir() if p.name.startswith("u.jsonl")]
    assert len(files) > 2 and all(p.stat().st_size <= 4000 for p in files)


def test_rotation_by_age(tmp_path) -> None:
    out = tmp_path / "t.jsonl"
    sink = JsonlFileSink(out, rotate_interval_s=0.3, keep=2, fsync="flush")
    sink.start()
    lines = fake_lines(3)
    sink.submit(lines[0], "demo")
    assert wait_for(lambda: out.with_name("t.jsonl.1").exists(), 5), "idle file rotated when it got old"
    sink.submit(lines[1], "demo")
    sink.close()
    assert frames_in(out.with_name("t.jsonl.1")) == [0] and frames_in(out) == [1]


def test_reopen_after_logrotate_moved_the_file(tmp_path) -> None:
    out = tmp_path / "o.jsonl"
    moved = tmp_path / "o.jsonl.moved"
    lines = fake_lines(20)
    sink = JsonlFileSink(out)
    sink.start()
    for line in lines[:10]:
        sink.submit(line, "demo")
    assert wait_for(lambda: sink.written == 10, 5)
    out.rename(moved)  # logrotate without copytruncate: move, then SIGHUP
    sink.reopen()
    for line in lines[10:]:
        sink.submit(line, "demo")
    sink.close()
    assert frames_in(moved) == list(range(10)) and frames_in(out) == list(range(10, 20))
    assert sink.reopens == 1


def test_skip_empty_and_drops_ok(tmp_path) -> None:
    out = tmp_path / "s.jsonl"
    sink = JsonlFileSink(out, skip_empty=True, queue_size=1000)
    sinks = SinkSet([sink])
    sinks.start()
    for line in fake_lines(30):
        sinks.submit(line, "demo")
    sinks.close()
    assert frames_in(out) == [i for i in range(30) if i % 3] and sink.skipped == 10
    assert sinks.lost == 0 and sinks.summary() is None


def test_full_queue_drops_are_counted_and_lost_unless_drops_ok(tmp_path) -> None:
    strict = JsonlFileSink(tmp_path / "a.jsonl", queue_size=5)
    relaxed = JsonlFileSink(tmp_path / "b.jsonl", queue_size=5, drops_ok=True)
    sinks = SinkSet([strict, relaxed])  # not started: nothing drains the queues
    for line in fake_lines(12):
        sinks.submit(line, "demo")
    assert strict.dropped == relaxed.dropped == 7 and sinks.lost == 7
    assert "jsonl:a.jsonl: 7" in (sinks.summary() or "")
    assert sinks.stats()["jsonl:a.jsonl"]["queued"] == 5


def test_read_only_file_fails_at_start_with_73(tmp_path) -> None:
    out = tmp_path / "ro.jsonl"
    out.write_text("")
    out.chmod(0o444)
    immutable = False
    if os.geteuid() == 0:  # root writes through 0444: make the file immutable instead
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(out)]).returncode != 0:
            pytest.skip("running as root and cannot make a read-only file (chattr +i failed)")
        immutable = True
    try:
        with pytest.raises(StartupError) as info:
            JsonlFileSink(out).start()
        assert info.value.code == EX_CANTCREAT and "cannot write" in str(info.value)
        cfg = config_with_sinks(tmp_path / "ro.yaml", f"  - type: jsonl\n    path: {out}\n")
        t0 = time.monotonic()
        proc = run_streamd("run", str(cfg), "--no-status", timeout=120)
        print(f"exit={proc.returncode} in {time.monotonic() - t0:.1f}s: {proc.stderr.strip()[-200:]}")
        assert proc.returncode == 73, proc.stderr[-2000:]
        assert f"cannot write {out}" in proc.stderr and proc.stderr.count("cannot write") == 1
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(out)])


def test_dev_full_is_logged_once_counted_and_exit_is_non_zero(tmp_path, assets) -> None:
    good = tmp_path / "good.jsonl"
    sinks = f"  - type: jsonl\n    path: /dev/full\n  - type: jsonl\n    path: {good}\n"
    proc = run_streamd("run", str(config_with_sinks(tmp_path / "f.yaml", sinks)), "--no-status")
    print(f"exit={proc.returncode}; {[x for x in proc.stderr.splitlines() if 'full' in x or 'lost' in x]}")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert len(good.read_text().splitlines()) == 100
    assert proc.stderr.count("output failed (No space left on device)") == 1
    assert "output lost: 100 line(s)" in proc.stderr and "jsonl:full: 100" in proc.stderr
    relaxed = sinks.replace("/dev/full\n", "/dev/full\n    drops_ok: true\n", 1)
    proc = run_streamd("run", str(config_with_sinks(tmp_path / "g.yaml", relaxed)), "--no-status")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_sighup_reopens_the_file_without_losing_a_frame(tmp_path, assets) -> None:
    out = tmp_path / "live.jsonl"
    moved = tmp_path / "live.jsonl.1"
    cfg = config_with_sinks(tmp_path / "h.yaml", f"  - type: jsonl\n    path: {out}\n", live=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert wait_for(lambda: len(frames_in(out)) >= 10), "first lines"
        out.rename(moved)
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: len(frames_in(out)) >= 10), "lines in the reopened file"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    before, after = frames_in(moved), frames_in(out)
    assert before + after == list(range(len(before) + len(after))), "contiguous across the reopen"
    assert "reopened" in err
    print(f"before={len(before)} after={len(after)}")


def test_closed_stdout_stops_like_a_unix_tool(tmp_path, assets) -> None:
    cfg = config_with_sinks(tmp_path / "p.yaml", "  - type: stdout\n", live=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = [proc.stdout.readline() for _ in range(5)]  # `| head -n 5`
        proc.stdout.close()
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    print(f"stopped {time.monotonic() - t0:.1f}s after the reader left, exit={proc.returncode}")
    assert all(json.loads(line)["stream"] == "cam" for line in first)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert "stopped: every output was closed by its reader" in err


def test_sink_names_stay_unique(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sinks = SinkSet([JsonlFileSink(tmp_path / "a" / "o.jsonl"), JsonlFileSink(tmp_path / "b" / "o.jsonl")])
    assert list(sinks.stats()) == ["jsonl:o.jsonl", "jsonl:o.jsonl#2"]


@pytest.mark.parametrize(("policy", "least", "most"), [("never", 0, 0), ("rotate", 3, 3), ("flush", 13, 99)])
def test_fsync_policy(tmp_path, monkeypatch, policy: str, least: int, most: int) -> None:
    """never: no fsync; rotate: at each rotation and at close; flush: after every flush (and those too)."""
    import streamd.sinks.jsonl as jsonl

    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(jsonl.os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    sink = JsonlFileSink(tmp_path / "f.jsonl", fsync=policy, rotate_bytes=1500, flush_every=1000)
    sink.start()
    lines = fake_lines(20)
    for i, line in enumerate(lines):
        sink.submit(line, "demo")
        if i % 2:
            assert wait_for(lambda i=i: sink.written == i + 1, 5)  # the queue ran empty: a flush each time
    sink.close()
    print(f"fsync={policy}: {len(calls)} calls, {sink.rotations} rotations")
    assert sink.rotations == 2 and least <= len(calls) <= most  # flush: >= 10 flushes + 2 rotations + close
