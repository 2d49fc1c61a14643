"""A worker that stops answering (SIGSTOP here; a native call that never returns in the field) is found
within 10 s, logged, killed and restarted, and its streams resume with their numbering continuing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from tests.conftest import CLIP, MODEL, ROOT


def test_a_wedged_worker_is_killed_and_its_streams_resume(tmp_path, assets) -> None:
    out, cfg, err_path = tmp_path / "out.jsonl", tmp_path / "w.yaml", tmp_path / "stderr.txt"
    cfg.write_text(
        f"streams:\n  - id: cam\n    url: {CLIP}\n    realtime: true\n    loop: true\n"
        f"model:\n  path: {MODEL}\npipeline:\n  workers: 1\n  spare_worker: false\n"
        f"sinks:\n  - type: jsonl\n    path: {out}\n    flush_every: 1\n"
    )
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    def frames() -> list[int]:
        if not out.exists():
            return []
        return [json.loads(x)["frame"] for x in out.read_text().splitlines() if x.endswith("}")]

    def wait(predicate, what: str, timeout: float = 90) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if predicate():
                return time.monotonic() - start
            assert proc.poll() is None, err_path.read_text()[-3000:]
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {err_path.read_text()[-3000:]}")

    try:
        wait(lambda: len(frames()) >= 20, "the first lines")
        pid = int(re.findall(r"worker 0 ready \(pid (\d+)\)", err_path.read_text())[0])
        os.kill(pid, signal.SIGSTOP)
        stopped_at = len(frames())
        found = wait(lambda: "(wedged)" in err_path.read_text(), "the wedge to be found", timeout=30)
        back = wait(lambda: len(frames()) >= stopped_at + 10, "the stream to resume", timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    stderr = err_path.read_text()
    print(f"wedge found {found:.1f} s after SIGSTOP; stream back {back:.1f} s after that")
    assert found <= 10.0, stderr[-3000:]
    assert re.search(r"worker 0 \(pid \d+\) silent for \d+ s \(wedged\)", stderr), stderr[-3000:]
    assert "worker 0 back" in stderr, stderr[-3000:]
    got = frames()
    assert got == sorted(set(got)), "numbering continues after the restart, never repeats"
    assert proc.returncode == 0, stderr[-3000:]
