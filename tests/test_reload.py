"""Reload planning: what changed between the running config and the file as it is now."""

from __future__ import annotations

from streamd.config import load_config
from streamd.supervisor.reload import plan_reload, reread
from tests.conftest import CLIP, CLIP_HEVC, MODEL


def write(path, streams: str, sinks: str = "  - type: stdout\n", extra: str = "") -> str:
    path.write_text(f"streams:\n{streams}model:\n  path: {MODEL}\nsinks:\n{sinks}{extra}")
    return str(path)


def test_plan_names_added_removed_changed_and_untouched_streams(tmp_path) -> None:
    old = load_config(write(tmp_path / "a.yaml", f"  - id: a\n    url: {CLIP}\n  - id: b\n    url: {CLIP}\n"))
    new = load_config(
        write(
            tmp_path / "b.yaml",
            f"  - id: a\n    url: {CLIP}\n  - id: b\n    url: {CLIP_HEVC}\n  - id: c\n    url: {CLIP}\n",
            sinks=f"  - type: jsonl\n    path: {tmp_path / 'o.jsonl'}\n",
            extra="pipeline:\n  batch_size: 2\n",
        )
    )
    plan = plan_reload(old, new)
    assert [s.id for s in plan.added] == ["c"] and [s.id for s in plan.changed] == ["b"]
    assert plan.unchanged == ("a",) and plan.removed == () and plan.sinks_changed
    assert not plan.model_changed and plan.needs_restart == ("pipeline",)
    assert plan.describe() == "added c; changed b; sinks changed; needs a restart to apply: pipeline"
    assert plan_reload(old, old).empty and plan_reload(new, old).removed == ("c",)


def test_a_model_change_with_a_shared_engine_needs_a_restart(tmp_path) -> None:
    streams = f"  - id: a\n    url: {CLIP}\n"
    old = load_config(write(tmp_path / "a.yaml", streams, extra="engine:\n  shared: true\n"))
    new = load_config(write(tmp_path / "b.yaml", streams, extra="engine:\n  shared: true\n  max_batch: 16\n"))
    plan = plan_reload(old, new)
    # the engine process serves the running model: no successor workers, the running engine stays
    assert not plan.model_changed and plan.keeps_engine
    assert plan.needs_restart == ("model/engine (engine.shared)",)
    unshared = load_config(write(tmp_path / "c.yaml", streams, extra="engine:\n  max_batch: 16\n"))
    assert plan_reload(unshared, new).keeps_engine  # turning it on (or off) is a restart too
    plain = plan_reload(unshared, load_config(write(tmp_path / "d.yaml", streams)))
    assert plain.model_changed and not plain.keeps_engine and not plain.needs_restart


def test_a_bad_config_on_reload_gives_the_check_messages(tmp_path) -> None:
    good = load_config(write(tmp_path / "c.yaml", f"  - id: a\n    url: {CLIP}\n"))
    write(tmp_path / "c.yaml", f"  - id: a\n    url: {CLIP}\n  - id: a\n    url: nowhere.mp4\n")
    new, problems = reread(tmp_path / "c.yaml", good)
    assert new is None and problems
    assert all(p.startswith(f"{tmp_path / 'c.yaml'}:") for p in problems), problems
    assert any("streams[1]" in p for p in problems), problems


def test_live_reload_adds_and_removes_a_stream_without_a_gap(tmp_path, assets) -> None:
    """5 reloads adding and removing a stream while another loops, one refused bad config in between: the
    untouched stream's frame indices stay contiguous; systemd hears RELOADING=1 + MONOTONIC_USEC, READY=1."""
    import contextlib
    import itertools
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "live.yaml"
    loop = f"  - id: loop\n    url: {CLIP_HEVC}\n    loop: true\n"
    extra = f"  - id: extra\n    url: {CLIP_HEVC}\n    loop: true\n"
    sinks = f"  - type: jsonl\n    path: {out}\n"
    second = tmp_path / "second.jsonl"
    write(cfg, loop, sinks)
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.setblocking(False)
    err_path = tmp_path / "stderr.txt"
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path), "PYTHONUNBUFFERED": "1"}
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip

    def lines(stream: str) -> list[int]:
        if not out.exists():
            return []
        return [r["frame"] for r in map(json.loads, out.read_text().splitlines()) if r["stream"] == stream]

    def wait(predicate, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            assert proc.poll() is None, err_path.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {err_path.read_text()[-3000:]}")

    messages: list[str] = []

    def notes() -> list[str]:
        with contextlib.suppress(BlockingIOError):
            while True:
                messages.extend(sock.recv(4096).decode().splitlines())
        return messages

    try:
        wait(lambda: len(lines("loop")) >= 20, "the first lines")
        for n in range(1, 6):
            adding = n % 2 == 1
            more = f"  - type: jsonl\n    path: {second}\n" if n == 3 else ""  # a sink for one round
            write(cfg, loop + (extra if adding else ""), sinks + more)
            before = len(lines("extra"))
            proc.send_signal(signal.SIGHUP)
            if adding:
                wait(lambda before=before: len(lines("extra")) >= before + 10, f"reload {n}: extra writes")
            else:
                wait(lambda n=n: err_path.read_text().count("reload: ") >= n, f"reload {n}: extra removed")
                seen = [len(lines("extra"))]  # its worker drains what was in flight, then nothing comes

                def settled(seen=seen) -> bool:
                    time.sleep(1.0)
                    seen.append(len(lines("extra")))
                    return len(seen) >= 4 and seen[-1] == seen[-4]

                wait(settled, f"reload {n}: extra stops writing", timeout=60)
            wait(lambda n=n: notes().count("READY=1") >= n + 1, f"READY=1 after reload {n}")
        cfg.write_text(cfg.read_text().replace("loop: true", "loop: maybe", 1))  # invalid: refused
        proc.send_signal(signal.SIGHUP)
        wait(lambda: "reload refused" in err_path.read_text(), "the refusal")
        count = len(lines("loop"))
        wait(lambda: len(lines("loop")) >= count + 20, "the old config still running")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        notes()
        sock.close()
    stderr = err_path.read_text()
    assert proc.returncode == 0, stderr[-3000:]
    frames = lines("loop")
    extra_frames = lines("extra")
    gaps = sum(1 for a, b in itertools.pairwise(frames) if b != a + 1)
    print(f"loop: {len(frames)} frames, gaps {gaps}; "
          f"extra: {len(extra_frames)}; RELOADING=1 x{messages.count('RELOADING=1')}, "
          f"READY=1 x{messages.count('READY=1')}")  # fmt: skip
    assert frames == list(range(len(frames))), "the untouched stream: no gap, no repeat"
    assert extra_frames == sorted(extra_frames) and len(set(extra_frames)) == len(extra_frames)
    assert (
        messages.count("RELOADING=1") == 6 and any
    )  # 5 applied + 1 refused(m.startswith("MONOTONIC_USEC=") for m in messages)
    added_sink = [
        r["frame"] for r in map(json.loads, second.read_text().splitlines()) if r["stream"] == "loop"
    ]
    assert added_sink and added_sink == list(range(added_sink[0], added_sink[-1] + 1)), (
        "sink added for a round"
    )
    assert added_sink[-1] < frames[-1], "and removed again"
    assert "streams[0].loop" in stderr and "true or false" in stderr, "the same message as streamd check"


def test_a_model_change_switches_workers_without_a_gap(tmp_path, assets) -> None:
    """model.score_threshold changes on reload: a successor builds the new model beside the running worker,
    takes the stream over after the old one drained; frame numbers stay contiguous, new lines use 0.8."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "model.yaml"
    loop = f"  - id: loop\n    url: {CLIP_HEVC}\n    loop: true\n"
    sinks = f"  - type: jsonl\n    path: {out}\n"
    write(cfg, loop, sinks)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip

    def records() -> list[dict]:
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []

    def wait(predicate, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            assert proc.poll() is None, err_path.read_text()[-3000:]
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}: {err_path.read_text()[-3000:]}")

    try:
        wait(lambda: len(records()) >= 30, "the first lines")
        cfg.write_text(cfg.read_text().replace("model:\n", "model:\n  score_threshold: 0.8\n", 1))
        proc.send_signal(signal.SIGHUP)
        wait(lambda: "switched to the new model" in err_path.read_text(), "the switch")
        switched = len(records())
        wait(lambda: len(records()) >= switched + 30, "lines from the new model")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    stderr = err_path.read_text()
    assert proc.returncode == 0, stderr[-3000:]
    recs = records()
    frames = [r["frame"] for r in recs]
    assert frames == list(range(len(frames))), "contiguous across the switch"
    scores = [[d["score"] for d in r["detections"]] for r in recs]
    low_before = sum(1 for s in scores[:switched] for x in s if x < 0.8)
    after = [x for s in scores[switched:] for x in s]
    print(f"{len(frames)} frames, switch after ~{switched}; before: {low_before} scores < 0.8; after: "
          f"{len(after)} detections, min {min(after, default=1):.2f}")  # fmt: skip
    assert low_before > 0 and after and min(after) >= 0.8
