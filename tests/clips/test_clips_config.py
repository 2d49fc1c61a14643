"""The clips: section and streams[].clips: defaults, overrides, and bad values named by key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamd.config import ConfigError, load_config, parse_config
from tests.conftest import CLIP, run_streamd


def _config(tmp_path: Path, **top):
    streams = top.pop("streams", [{"id": "a", "url": str(CLIP)}])
    return parse_config({"streams": streams, **top}, tmp_path)


def _problems(tmp_path: Path, **top) -> str:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, **top)
    return str(err.value)


def test_off_by_default_and_on_once_written(tmp_path):
    assert not _config(tmp_path).streams[0].clips.enabled
    c = _config(tmp_path, clips={"dir": "clips", "pre_roll_s": 3})
    clips = c.streams[0].clips
    assert clips.enabled and clips.dir == str(tmp_path / "clips") and clips.pre_roll_s == 3.0
    assert clips.on == ("enter", "cross", "dwell", "api") and clips.max_ring_bytes == 32 * 2**20


def test_a_stream_overrides_keys(tmp_path):
    streams = [
        {"id": "a", "url": str(CLIP), "clips": {"enabled": False}},
        {"id": "b", "url": str(CLIP), "clips": {"post_roll_s": 9, "on": ["class"], "classes": ["car", 0]}},
        {"id": "c", "url": str(CLIP)},
    ]
    a, b, c = _config(tmp_path, streams=streams, clips={"dir": "/x", "pre_roll_s": 4}).streams
    assert not a.clips.enabled
    assert b.clips.enabled and b.clips.pre_roll_s == 4 and b.clips.post_roll_s == 9
    assert b.clips.on == ("class",) and b.clips.classes == (0, 2)
    assert c.clips.enabled and c.clips.post_roll_s == 5
    # only one stream has clips: its own section turns them on
    (only,) = _config(tmp_path, streams=[{"id": "a", "url": str(CLIP), "clips": {"dir": "/y"}}]).streams
    assert only.clips.enabled and only.clips.dir == "/y"


@pytest.mark.parametrize(
    ("clips", "expected"),
    [
        ({"pre_roll_s": 3}, "clips.dir: clips are on but have no folder; add dir:"),
        ({"dir": "/x", "on": ["enter", "appear"]}, "clips.on[1]: expected one of enter, leave, cross, dwell"),
        ({"dir": "/x", "on": "enter"}, "clips.on: expected a list of triggers"),
        ({"dir": "/x", "pre_roll_s": 301}, "clips.pre_roll_s: expected a number between 0 and 300"),
        ({"dir": "/x", "max_ring_bytes": 100}, "clips.max_ring_bytes: expected an integer >= 65536"),
        ({"dir": "/x", "max_bytes": "10G"}, "clips.max_bytes: expected an integer number of bytes"),
        ({"dir": "/x", "classes": ["unicorn"]}, "clips.classes[0]"),
        ({"dir": "/x", "pre_rol_s": 3}, "clips.pre_rol_s: unknown key; did you mean 'pre_roll_s'?"),
    ],
)
def test_bad_values_name_the_key(tmp_path, clips, expected):
    assert expected in _problems(tmp_path, clips=clips)


def test_a_stream_key_path_and_the_cli_exit_78(tmp_path):
    streams = [{"id": "a", "url": str(CLIP), "clips": {"post_roll_s": -1}}]
    assert "streams[0].clips.post_roll_s: expected a number between 0 and 300" in _problems(
        tmp_path, streams=streams, clips={"dir": "/x"}
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"streams:\n  - id: a\n    url: {CLIP}\nclips:\n  on: [enter]\n")
    proc = run_streamd("check", str(cfg), "--no-model", timeout=120)
    assert proc.returncode == 78, proc.stderr
    assert "c.yaml:4: clips.dir: clips are on but have no folder" in proc.stderr
    with pytest.raises(ConfigError):
        load_config(cfg)
