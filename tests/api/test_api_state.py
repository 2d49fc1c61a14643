"""The control API's overlay on the config file, without a daemon: which wins, what a bad entry says, the
state file's round trip, JSON Merge Patch, the ``metrics.api`` section's checks."""

from __future__ import annotations

import json

import pytest

from streamd.config import ConfigError, load_config
from streamd.supervisor.api import EventRing
from streamd.supervisor.api_state import (
    apply_overlay,
    check_stream,
    file_streams,
    load_state,
    merge_patch,
    save_state,
)
from tests.conftest import CLIP, CLIP_HEVC, MODEL


def _config(tmp_path, metrics: str = ""):
    path = tmp_path / "c.yaml"
    path.write_text(
        f"x-cam: &cam\n  url: {CLIP}\n  loop: true\n"
        f"streams:\n  - id: a\n    <<: *cam\n  - id: b\n    url: {CLIP}\nmodel:\n  path: {MODEL}\n{metrics}"
    )
    return load_config(path)


def test_the_overlay_wins_for_its_ids_and_the_file_for_the_others(tmp_path) -> None:
    config = _config(tmp_path)
    overlay = {"b": {"id": "b", "url": str(CLIP_HEVC)}, "a": None, "n": {"id": "n", "url": str(CLIP)}}
    merged = apply_overlay(config, overlay, "state.json")
    assert merged.stream_ids == ("b", "n")  # a removed, b replaced in place, n appended
    assert merged.streams[0].url == str(CLIP_HEVC) and merged.model == config.model
    assert file_streams(config)["a"] == {"id": "a", "url": str(CLIP), "loop": True}  # the << merge resolved
    with pytest.raises(ConfigError) as info:
        apply_overlay(config, {"a": None, "b": None}, "state.json")
    assert "removes every stream" in str(info.value)


def test_a_bad_overlay_entry_names_the_state_file_the_key_and_the_fix(tmp_path) -> None:
    config = _config(tmp_path)
    with pytest.raises(ConfigError) as info:
        apply_overlay(config, {"n": {"id": "n", "url": str(CLIP), "detect_fps": 0, "clases": [0]}}, "s.json")
    problems = info.value.problems
    assert any(
        p.startswith("s.json: streams.n.clases: unknown key; did you mean 'classes'?") for p in problems
    )
    assert any(p.startswith("s.json: streams.n.detect_fps: expected a number > 0, got 0") for p in problems)
    assert all("fix or delete this entry of s.json" in p for p in problems)


def test_check_stream_uses_the_model_class_names(tmp_path) -> None:
    config = _config(tmp_path)
    stream, problems = check_stream({"id": "z", "url": str(CLIP), "classes": ["person", "persn"]}, config)
    assert stream is None and len(problems) == 1 and problems[0].startswith("classes[1]: "), problems
    assert "person" in problems[0]
    stream, problems = check_stream({"id": "z", "url": str(CLIP), "classes": ["car"]}, config)
    assert problems == [] and stream is not None and stream.classes == (2,)


def test_state_file_round_trip_and_errors(tmp_path) -> None:
    path = tmp_path / "state.json"
    assert load_state(path) == {}
    save_state(path, {"a": None, "b": {"id": "b", "url": "x.mp4"}})
    assert load_state(path) == {"a": None, "b": {"id": "b", "url": "x.mp4"}}
    assert json.loads(path.read_text())["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left
    path.write_text("{nope")
    with pytest.raises(ConfigError, match="not JSON"):
        load_state(path)
    path.write_text('{"streams": [1]}')
    with pytest.raises(ConfigError, match="fix it or delete the file"):
        load_state(path)


def test_merge_patch_follows_rfc_7396() -> None:
    target = {"id": "a", "loop": True, "tracking": {"enabled": True, "max_age": 5}, "zones": [1, 2]}
    patch = {"loop": None, "tracking": {"max_age": 9}, "zones": [3], "detect_fps": 2}
    assert merge_patch(target, patch) == {
        "id": "a",
        "tracking": {"enabled": True, "max_age": 9},
        "zones": [3],
        "detect_fps": 2,
    }


def test_metrics_api_section_checks(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, "metrics:\n  api:\n    enabled: true\n    tokn: x\n")
    text = str(info.value)
    assert "metrics.api.tokn: unknown key; did you mean 'token'?" in text
    assert "metrics.api.enabled: the control API is served on the metrics port, which is off" in text
    (tmp_path / "tok").write_text("s3cret\n")
    config = _config(
        tmp_path,
        "metrics:\n  enabled: true\n  host: 0.0.0.0\n  api:\n    enabled: true\n    token_file: tok\n",
    )
    assert config.metrics.api.token_file == tmp_path / "tok"
    config = _config(tmp_path, "metrics:\n  enabled: true\n  api:\n    enabled: true\n    token: s3cret\n")
    assert "s3cret" not in repr(config)


def test_event_ring_keeps_the_newest_and_pages() -> None:
    ring = EventRing(3)
    for k in range(5):
        ring.tap(f'{{"v":1,"type":"event","event":"enter","stream":"s{k % 2}","frame":{k}}}\n', "s")
        ring.tap(f'{{"v":1,"stream":"s0","frame":{k},"detections":[]}}\n', "s0")  # frame lines are not kept
    events, nxt = ring.read(0, 10)
    assert [e["frame"] for e in events] == [2, 3, 4] and [e["seq"] for e in events] == [3, 4, 5] and nxt == 5
    events, nxt = ring.read(0, 2)
    assert [e["seq"] for e in events] == [3, 4] and nxt == 4
    assert ring.read(4, 10) == (
        [{"seq": 5, "v": 1, "type": "event", "event": "enter", "stream": "s0", "frame": 4}],
        5,
    )
    assert [e["frame"] for e in ring.read(0, 10, "s1")[0]] == [3]


def test_a_reload_keeps_the_api_changes_and_checks_them_against_the_new_file(tmp_path) -> None:
    from streamd.supervisor.reload import plan_reload, reread

    running = _config(tmp_path)
    overlay = {"n": {"id": "n", "url": str(CLIP), "classes": ["person"]}, "a": None}
    new, problems = reread(tmp_path / "c.yaml", running, overlay)
    assert problems == [] and new is not None and new.stream_ids == ("b", "n")
    assert plan_reload(apply_overlay(running, overlay, "s"), new).empty  # SIGHUP alone changes nothing
    # The file now names a model without 'person': the API's stream no longer passes; the reload is refused.
    text = (tmp_path / "c.yaml").read_text()
    (tmp_path / "c.yaml").write_text(text + "  class_names: [car, bus]\n")
    new, problems = reread(tmp_path / "c.yaml", running, overlay, "state.json")
    assert new is None and any(p.startswith("state.json: streams.n.classes[0]:") for p in problems), problems
