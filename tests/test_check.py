"""`streamd check` (the systemd unit's ExecStartPre) finds what `run` would trip over, quickly: stream files
that do not open as video, sinks the running user cannot write; `--no-model` needs no model file."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import CLIP, run_streamd


def test_no_model_does_not_need_the_model_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"streams:\n  - id: a\n    url: {CLIP}\nmodel:\n  path: models/absent.onnx\n")
    proc = run_streamd("check", "--no-model", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("OK (1 stream(s))"), proc.stderr
    proc = run_streamd("check", str(cfg))  # without --no-model the missing model is still a problem
    assert proc.returncode == 78, proc.stderr
    assert "c.yaml:5: model.path: model file not found: 'models/absent.onnx'" in proc.stderr
