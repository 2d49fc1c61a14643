"""Tracking's ``lap`` is asked for at start-up: a missing one ends ``streamd check`` and ``streamd run``
in one line naming the key and the fix (exit 78), and a reload that turns tracking on is refused, instead of
a worker's pipeline stopping at the first ambiguous match minutes into a run (the fifteenth session's GPU
box)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from streamd.analytics.tracker import missing_dependency
from streamd.config import parse_config
from tests.conftest import CLIP, ROOT, run_streamd


def _streamd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m streamd ARGS`` where ``import lap`` fails as it does where the package is not installed."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "lap.py").write_text("raise ModuleNotFoundError(\"No module named 'lap'\", name='lap')\n")
    return run_streamd(*args, timeout=120, env={"PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])})


def _config(tmp_path: Path, tracking: bool) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {CLIP}\n  - id: b\n    url: {CLIP}\n"
        f"    tracking: {{enabled: {'true' if tracking else 'false'}}}\n"
        f"sinks:\n  - type: jsonl\n    path: {tmp_path / 'out.jsonl'}\n"
    )
    return cfg


def test_check_and_run_name_the_key_and_exit_78(tmp_path):
    cfg = _config(tmp_path, tracking=True)
    for args in (("check", str(cfg), "--no-model"), ("run", str(cfg), "--no-status")):
        proc = _streamd(tmp_path, *args)
        assert proc.returncode == 78, (args, proc.stderr)
        assert "streams[1].tracking.enabled (stream b): tracking needs the lap package" in proc.stderr
        assert "pip install 'lap>=0.5'" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert "worker" not in proc.stderr  # `run` stopped before starting any worker process
    assert not (tmp_path / "out.jsonl").exists() or not (tmp_path / "out.jsonl").read_text()


def test_a_config_without_tracking_does_not_need_it(tmp_path):
    proc = _streamd(tmp_path, "check", str(_config(tmp_path, tracking=False)), "--no-model")
    assert proc.returncode == 0, proc.stderr


def test_installed_lap_passes(tmp_path):
    streams = [{"id": "a", "url": str(CLIP), "tracking": {"enabled": True}}]
    assert missing_dependency(parse_config({"streams": streams}, tmp_path).streams) is None


def test_a_reload_that_turns_tracking_on_is_refused(tmp_path, monkeypatch):
    from streamd.config import load_config
    from streamd.supervisor.reload import reread

    running = load_config(_config(tmp_path, tracking=False))
    monkeypatch.setitem(sys.modules, "lap", None)  # `import lap` now fails as when it is not installed
    new, problems = reread(_config(tmp_path, tracking=True), running)
    assert new is None
    assert len(problems) == 1 and "streams[1].tracking.enabled (stream b)" in problems[0]
    new, problems = reread(_config(tmp_path, tracking=False), running)
    assert new is not None and problems == []


def test_the_control_api_and_the_cluster_list_refuse_a_tracked_stream(tmp_path, monkeypatch):
    from streamd.cluster.streams import parse_stream_list
    from streamd.config import ConfigError, load_config
    from streamd.supervisor.api_state import check_stream

    config = load_config(_config(tmp_path, tracking=False))
    monkeypatch.setitem(sys.modules, "lap", None)
    tracked = {"id": "c", "url": str(CLIP), "tracking": {"enabled": True}}
    stream, problems = check_stream(tracked, config, prefix="streams.c.")
    assert stream is None and problems[0].startswith(
        "streams.c.tracking.enabled: tracking needs the lap package"
    )
    stream, problems = check_stream({"id": "c", "url": str(CLIP)}, config)
    assert stream is not None and problems == []
    text = f"streams:\n  - id: c\n    url: {CLIP}\n    tracking: {{enabled: true}}\n"
    try:
        parse_stream_list(text, "etcd key /streamd/streams", config)
    except ConfigError as exc:
        assert "etcd key /streamd/streams: streams[0].tracking.enabled (stream c)" in exc.problems[0]
    else:
        raise AssertionError("a tracked stream list was accepted without lap")


def test_the_global_tracking_section_is_named_when_it_turned_tracking_on(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "lap", None)
    data = {
        "streams": [{"id": "a", "url": str(CLIP)}, {"id": "b", "url": str(CLIP)}],
        "tracking": {"enabled": True},
    }
    config = parse_config(data, tmp_path)
    line = missing_dependency(config.streams, config.tracking)
    assert line is not None and line.startswith(
        "tracking.enabled (stream a and 1 more): tracking needs the lap"
    )
