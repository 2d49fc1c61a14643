"""Daemon behaviour: metrics over a real socket; through the CLI, a broken sink and a bad model."""

from __future__ import annotations

import json

from tests.conftest import CLIP, CLIP_HEVC, MODEL, free_port, run_streamd
from tests.test_reference_detections import NANODET_MODEL, write_config


def test_metrics_and_health_over_http(tmp_path, metrics_daemon) -> None:
    cfg = tmp_path / "m.yaml"
    write_config(
        cfg, f"  - id: cam\n    url: {CLIP_HEVC}\n    realtime: true\n    loop: true", tmp_path / "o.jsonl"
    )
    daemon = metrics_daemon(cfg.read_text())

    def delivering() -> str | None:
        text = daemon.get("/metrics")[1].decode()
        return text if "streamd_frames_total" in text and "streamd_frames_total 0.0\n" not in text else None

    text = daemon.wait_for(delivering, "the first frames", 60)
    assert 'streamd_stream_up{stream="cam"} 1.0' in text, text
    assert 'streamd_stream_worker{stream="cam",worker="0"} 1.0' in text, text
    frames = float(
        next(line.split()[1] for line in text.splitlines() if line.startswith("streamd_frames_total"))
    )
    assert frames > 0
    code, health = daemon.healthz()
    assert code == 200 and health["ok"] is True and health["running_streams"] == ["cam"]
    assert daemon.stop() == 0


def test_broken_sink_does_not_stop_the_others(tmp_path, assets) -> None:
    good = tmp_path / "good.jsonl"
    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        f"streams:\n  - id: hevc\n    url: {CLIP_HEVC}\n{NANODET_MODEL}\n"
        f"sinks:\n  - type: jsonl\n    path: /dev/full\n  - type: jsonl\n    path: {good}\n"
    )
    proc = run_streamd("run", str(cfg), "--no-status")
    assert proc.returncode == 1, proc.stderr[-2000:]  # output was lost: the exit status says so
    assert len(good.read_text().splitlines()) == 100
    assert "output failed" in proc.stderr and "sink lines dropped" in proc.stderr


def test_model_that_does_not_load_is_a_config_error(tmp_path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"streams:\n  - id: a\n    url: {CLIP}\nmodel:\n  path: {bad}\n")
    proc = run_streamd("run", str(cfg), "--no-status")
    assert proc.returncode == 78
    assert "model.path" in proc.stderr and "bad.onnx" in proc.stderr


def test_input_size_mismatch_names_the_key(tmp_path, assets) -> None:
    cfg = tmp_path / "i.yaml"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {CLIP}\nmodel:\n  path: {MODEL}\n  input_size: [640, 640]\n"
    )
    proc = run_streamd("run", str(cfg), "--no-status")
    assert proc.returncode == 78
    assert "model.input_size" in proc.stderr and "[416, 416]" in proc.stderr


def test_broken_stream_does_not_stop_the_others_and_exit_status_says_so(tmp_path, assets) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"this is not a video" * 100)
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "b.yaml"
    write_config(cfg, f"  - id: bad\n    url: {bad}\n  - id: good\n    url: {CLIP_HEVC}", out)
    proc = run_streamd("run", str(cfg), "--no-status")
    assert proc.returncode == 1
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["frame"] for r in records if r["stream"] == "good"] == list(range(100))
    assert not any(r["stream"] == "bad" for r in records)
    assert "stream(s) failed: bad" in proc.stderr


def test_bad_model_with_metrics_enabled_exits_without_hanging(tmp_path) -> None:
    """The error path closes a metrics server that never started serving."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    cfg = tmp_path / "b.yaml"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {CLIP}\nmodel:\n  path: {bad}\n"
        f"metrics:\n  enabled: true\n  port: {free_port()}\n"
    )
    proc = run_streamd("run", str(cfg), "--no-status", timeout=60)
    assert proc.returncode == 78
