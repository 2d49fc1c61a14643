"""systemd integration without systemd: the notify protocol over a real datagram socket, and the unit file
scored offline by systemd-analyze."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import CLIP_HEVC, ROOT
from tests.test_reference_detections import write_config

UNIT = ROOT / "systemd" / "streamd.service"


def test_notify_ready_watchdog_stopping(tmp_path, assets) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.5)
    cfg = tmp_path / "n.yaml"
    write_config(
        cfg, f"  - id: cam\n    url: {CLIP_HEVC}\n    realtime: true\n    loop: true", tmp_path / "o.jsonl"
    )
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "2000000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    messages: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and messages.count("WATCHDOG=1") < 2:
            with contextlib.suppress(TimeoutError):
                messages += sock.recv(4096).decode().splitlines()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        while True:
            try:
                messages += sock.recv(4096).decode().splitlines()
            except (TimeoutError, BlockingIOError):
                break
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "READY=1" in messages and "STOPPING=1" in messages, messages
    assert messages.index("READY=1") < messages.index("WATCHDOG=1") < messages.index("STOPPING=1")
    assert any(m.startswith("STATUS=") for m in messages)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_unit_file_is_hardened() -> None:
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for streamd.service: ([0-9.]+)", proc.stdout + proc.stderr)
    assert match, proc.stdout[-2000:] + proc.stderr[-2000:]
    print(f"exposure {match.group(1)}")
    assert float(match.group(1)) <= 2.0


def test_unit_file_runs_the_daemon_as_notify_with_watchdog() -> None:
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "RestartPreventExitStatus=78",
        "RuntimeDirectory=streamd",  # where `streamd reload` finds the daemon's reload outcome
        "ExecReload=/opt/streamd/bin/streamd reload --pid $MAINPID",  # fails when the config is refused
        "SystemCallErrorNumber=EPERM",
    ):
        assert line in text
    # A failing ExecStartPre is restarted whatever its exit status (RestartPreventExitStatus sees only the
    # main process), so a bad config at start would loop; `run` checks the config itself.
    assert not re.search(r"^ExecStartPre=", text, re.M)
