"""Retention: a stream's clip folder by age and total bytes, on files and through the writer on real clips."""

from __future__ import annotations

import os
import time
from pathlib import Path

from streamd.clips import enforce_retention
from tests.clips.test_clip_files import record


def _clip(folder: Path, name: str, size: int, age_s: float) -> Path:
    path = folder / name
    path.write_bytes(b"\0" * size)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_age_then_bytes_oldest_first(tmp_path):
    old = _clip(tmp_path, "a.mp4", 100, 5000)
    b = _clip(tmp_path, "b.mp4", 300, 400)
    c = _clip(tmp_path, "c.mp4", 300, 300)
    d = _clip(tmp_path, "d.mp4", 300, 200)
    _clip(tmp_path, ".e.mp4.part", 10_000, 9000)  # a clip being written is not the writer's to delete
    _clip(tmp_path, "notes.txt", 10_000, 9000)
    deleted = enforce_retention(tmp_path, max_bytes=650, max_age_s=3600)
    # a: too old; then 900 bytes > 650: b (the oldest) goes, 600 are left
    assert deleted == [old, b]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".e.mp4.part", "c.mp4", "d.mp4", "notes.txt"]
    assert enforce_retention(tmp_path, max_bytes=650, max_age_s=3600) == []
    assert enforce_retention(tmp_path, max_bytes=1, max_age_s=3600, keep=d) == [c]  # never the new one
    assert enforce_retention(tmp_path, max_bytes=10**6, max_age_s=100, keep=d) == []


def test_the_writer_keeps_the_newest_clips_within_max_bytes(sources, tmp_path):
    events = [5.0, 11.0, 17.0]  # three clips, each 3 s before to 2 s after
    first, _, _ = record(sources["h264"], tmp_path / "a", events)
    sizes = [Path(p).stat().st_size for p in first]  # remuxing is deterministic: the same sizes again
    paths, writer, _ = record(sources["h264"], tmp_path / "b", events, max_bytes=sizes[1] + sizes[2])
    assert writer.written == 3 and writer.deleted == 1
    left = sorted((tmp_path / "b" / "clips" / "cam").glob("*.mp4"))
    assert left == [Path(p) for p in paths[1:]]
    assert [p.stat().st_size for p in left] == sizes[1:]
