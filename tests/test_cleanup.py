"""Cleanup never raises: closing what was made but never started (a stop before the streams started)."""

from __future__ import annotations

import threading
from pathlib import Path

from streamd.config import load_config
from streamd.ingest.reader import StreamReader
from streamd.pipeline.batcher import Batcher


def test_a_stream_worker_that_never_started_joins_quietly() -> None:
    config = load_config(None)
    queue = Batcher(1, 0.01).add_stream("demo", 2, "block")
    worker = StreamReader(config.streams[0], queue, threading.Event())
    assert worker.join(timeout=0.1) is True
    assert worker.join() is True


def test_stop_during_startup_leaves_no_traceback(tmp_path: Path) -> None:
    """SIGTERM while the worker loads the model: one 'stopped' line, exit 0, no traceback from cleanup."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "run", "--no-status"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)  # supervisor up, worker starting (before its first frame on a loaded machine or not)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "stopped" in err or "done:" in err, err[-3000:]
