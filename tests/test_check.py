"""`streamd check` (the systemd unit's ExecStartPre) finds what `run` would trip over, quickly: stream files
that do not open as video, sinks the running user cannot write; `--no-model` needs no model file."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLIP, ROOT, run_streamd

NOBODY = 65534


def test_no_model_does_not_need_the_model_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"streams:\n  - id: a\n    url: {CLIP}\nmodel:\n  path: models/absent.onnx\n")
    proc = run_streamd("check", "--no-model", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("OK (1 stream(s))"), proc.stderr
    proc = run_streamd("check", str(cfg))  # without --no-model the missing model is still a problem
    assert proc.returncode == 78, proc.stderr
    assert "c.yaml:5: model.path: model file not found: 'models/absent.onnx'" in proc.stderr


def _audio_only(path: Path) -> Path:
    """An M4A file with one AAC stream and no video, written with PyAV."""
    import av
    import numpy as np

    out = av.open(str(path), "w")
    stream = out.add_stream("aac", rate=8000)
    for i in range(5):
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 8000, i * 1024
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()
    return path


def test_stream_files_that_do_not_open_as_video_are_config_problems(tmp_path: Path) -> None:
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "notes.mp4").write_text("camera 3: replace the lens\n" * 50)
    _audio_only(tmp_path / "audio.m4a")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "streams:\n"
        f"  - id: good\n    url: {CLIP}\n"
        "  - id: empty\n    url: empty.mp4\n"
        "  - id: text\n    url: notes.mp4\n"
        "  - id: audio\n    url: audio.m4a\n"
    )
    for extra in (["--no-model"], []):
        proc = run_streamd("check", *extra, str(cfg))
        assert proc.returncode == 78, proc.stderr
        lines = proc.stderr.splitlines()
        assert lines[0] == "streamd: invalid config (3 problem(s)):", proc.stderr
        assert lines[1:] == [
            f"  {cfg}:5: streams[1].url: 'empty.mp4' does not open as video: the file is empty (0 bytes)",
            f"  {cfg}:7: streams[2].url: 'notes.mp4' does not open as video: not a video file "
            "(FFmpeg recognises no container format in it)",
            f"  {cfg}:9: streams[3].url: 'audio.m4a' does not open as video: no video stream in it "
            "(only audio)",
        ], proc.stderr


def test_a_sink_file_not_even_root_may_write_is_a_config_problem(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    sink = "sinks:\n  - type: jsonl\n    path: /proc/version\n"  # the kernel lets no one append to it
    cfg.write_text(f"streams:\n  - id: a\n    url: {CLIP}\n{sink}")
    proc = run_streamd("check", "--no-model", str(cfg))
    assert proc.returncode == 78, proc.stderr
    assert f"{cfg}:6: sinks[0].path: cannot write '/proc/version' as user " in proc.stderr, proc.stderr


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder under /tmp that another user can traverse (pytest's tmp_path is private to its owner)."""
    folder = Path(tempfile.mkdtemp(prefix="streamd-check-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_sinks_are_checked_as_the_user_running_check(shared_dir: Path) -> None:
    """As the service user does in the unit's ExecStartPre: files and folders owned by someone else (root
    here, the test running check as nobody through setpriv) are problems; nothing is created or changed."""
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot run check as another user")
    as_user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"] if root else []
    theirs, mine = shared_dir / "theirs", shared_dir / "mine"
    theirs.mkdir()
    mine.mkdir()
    existing = theirs / "old.jsonl"
    existing.write_text('{"v":1}\n')
    kept = mine / "kept.jsonl"
    kept.write_text('{"v":1}\n')
    if root:
        os.chown(mine, NOBODY, NOBODY)
        os.chown(kept, NOBODY, NOBODY)
    else:  # the check's own user: take the write bits away instead
        existing.chmod(0o444)
        theirs.chmod(0o555)
    os.utime(existing, (1_000_000_000, 1_000_000_000))
    os.utime(kept, (1_000_000_000, 1_000_000_000))
    cfg = shared_dir / "c.yaml"
    cfg.write_text(
        f"streams:\n  - id: a\n    url: {CLIP}\nsinks:\n"
        f"  - type: jsonl\n    path: {existing}\n"
        f"  - type: jsonl\n    path: {theirs / 'new.jsonl'}\n"
        f"  - type: jsonl\n    path: {mine / 'new.jsonl'}\n"
        f"  - type: jsonl\n    path: {kept}\n    rotate_bytes: 1000000\n"
    )
    cfg.chmod(0o644)
    check = [*as_user, sys.executable, "-m", "streamd", "check", "--no-model", str(cfg)]
    proc = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 78, proc.stderr
    user = f"'nobody' (uid {NOBODY})" if root else f"uid {os.geteuid()}"
    lines = proc.stderr.splitlines()
    assert lines[0] == "streamd: invalid config (2 problem(s)):", proc.stderr
    assert (
        lines[1] == f"  {cfg}:6: sinks[0].path: cannot write '{existing}' as user {user}: Permission denied"
    ), proc.stderr
    assert lines[2] == (
        f"  {cfg}:8: sinks[1].path: the folder '{theirs}' is not writable by user {user}; "
        "streamd needs that to create the file"
    ), proc.stderr
    # nothing created, nothing changed
    assert sorted(p.name for p in theirs.iterdir()) == ["old.jsonl"]
    assert sorted(p.name for p in mine.iterdir()) == ["kept.jsonl"]
    for file in (existing, kept):
        assert file.read_text() == '{"v":1}\n' and file.stat().st_mtime == 1_000_000_000
    if root:  # the same config is fine for root, who may write there
        proc = subprocess.run(check[len(as_user) :], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr


HEAVY = ("onnx", "onnxruntime", "cv2", "torch", "tensorrt", "google.protobuf", "ml_dtypes")


def test_check_without_the_model_is_quick(tmp_path: Path) -> None:
    """`check --no-model` (a file stream opened, a jsonl sink checked) imports none of the heavy modules and
    costs less than 0.5 s of CPU. CPU time, not wall time: on a busy box a process waits for a core, but
    what it computes stays the same (the onnx import alone cost about 0.4 s of it)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"streams:\n  - id: a\n    url: {CLIP}\nsinks:\n  - type: jsonl\n    path: out.jsonl\n")
    check = [sys.executable, "-X", "importtime", "-m", "streamd", "check", "--no-model", str(cfg)]
    proc = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "av" in imported  # the stream file was opened with PyAV, the backend run uses
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY or m in HEAVY)
    assert not heavy, heavy
    cpu = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert run_streamd("check", "--no-model", str(cfg)).returncode == 0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print(f"check --no-model: {min(cpu):.3f} s of CPU (best of 3)")
    assert min(cpu) < 0.5, cpu
