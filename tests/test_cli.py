"""The CLI ends every start-up failure with one line and a documented exit code, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import streamd.supervisor
from streamd import cli
from streamd.exitcodes import EX_CANTCREAT, EX_SOFTWARE, EX_UNAVAILABLE, StartupError
from tests.conftest import CLIP, ROOT


@pytest.fixture
def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"streams:\n  - id: a\n    url: {CLIP}\n")
    return cfg


def test_startup_error_is_one_line_and_its_code(config: Path, monkeypatch, capsys) -> None:
    def fail(self) -> int:
        raise StartupError("sinks[0].path: cannot create /ro/out.jsonl: Permission denied", EX_CANTCREAT)

    monkeypatch.setattr(streamd.supervisor.Supervisor, "run", fail)
    assert cli.main(["run", str(config), "--no-status"]) == EX_CANTCREAT
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "streamd: sinks[0].path: cannot create /ro/out.jsonl: Permission denied"
    assert "Traceback" not in err


def test_unexpected_error_is_one_line_and_70(config: Path, monkeypatch, capsys) -> None:
    def fail(self) -> int:
        raise RuntimeError("cannot join thread before it is started")

    monkeypatch.setattr(streamd.supervisor.Supervisor, "run", fail)
    assert cli.main(["run", str(config), "--no-status"]) == EX_SOFTWARE
    err = capsys.readouterr().err
    assert "streamd: internal error: RuntimeError: cannot join thread before it is started" in err
    assert "Traceback" not in err


def test_sigterm_before_startup_finished_stops_with_a_line(config: Path, monkeypatch, capsys) -> None:
    before = signal.getsignal(signal.SIGTERM)

    def load_then_sigterm(path: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode, inside start-up
        raise AssertionError("not reached: the handler stops start-up")

    monkeypatch.setattr("streamd.config.load_config", load_then_sigterm)
    assert cli.main(["run", str(config)]) == 0
    assert "streamd: SIGTERM before start-up finished; stopped" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # handlers put back


def test_sigterm_in_a_real_process_during_startup(config: Path) -> None:
    """SIGTERM soon after launch: a log line and exit 0 (stopped before or after the daemon took over)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", str(config), "--no-status"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not _catches_sigterm(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.005)  # until streamd's handler is in place (before that, SIGTERM kills silently)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert "SIGTERM before start-up finished" in err or "stopped by signal" in err, err[-2000:]


def _catches_sigterm(pid: int) -> bool:
    """Linux: /proc/PID/status SigCgt is the mask of signals with a handler; SIGTERM is bit 15 - 1."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


def test_exit_codes_are_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    docs = (ROOT / "docs" / "config.md").read_text()
    for code in (0, 1, EX_UNAVAILABLE, EX_SOFTWARE, EX_CANTCREAT, 78):
        assert f"| {code} |" in readme and f"| {code} |" in docs, code


def test_read_only_output_is_one_line_and_73(tmp_path: Path) -> None:
    out = tmp_path / "ro.jsonl"
    out.touch()
    out.chmod(0o444)
    if os.access(out, os.W_OK):  # root writes anyway: a file the kernel never lets anyone write
        out = Path("/proc/version")
    cfg = tmp_path / "ro.yaml"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {CLIP}\nsinks:\n  - type: jsonl\n    path: {out}\n  - type: stdout\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "streamd", "run", str(cfg), "--no-status"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EX_CANTCREAT, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and str(out) in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
