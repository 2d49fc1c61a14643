"""The sinks: section: new keys, their checks and their docs."""

from __future__ import annotations

import dataclasses

import pytest

from streamd.config import ConfigError, parse_config
from streamd.config.sinks import SINK_TYPES, JsonlSinkConfig
from tests.conftest import MODEL, ROOT


def parse(tmp_path, sinks: list) -> tuple:
    data = {"streams": [{"id": "a", "url": str(ROOT / "samples/vtest.mp4")}], "model": {"path": str(MODEL)}}
    return parse_config({**data, "sinks": sinks}, tmp_path).sinks


def problems(tmp_path, sinks: list) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(tmp_path, sinks)
    return info.value.problems


def test_jsonl_rotation_keys(tmp_path) -> None:
    (sink,) = parse(
        tmp_path,
        [{"type": "jsonl", "path": "o.jsonl", "rotate_bytes": 1000, "rotate_interval_s": 3600, "keep": 3,
          "fsync": "flush", "skip_empty": True, "drops_ok": True}],
    )  # fmt: skip
    assert sink == JsonlSinkConfig(
        path=tmp_path / "o.jsonl", rotate_bytes=1000, rotate_interval_s=3600.0, keep=3, fsync="flush",
        skip_empty=True, drops_ok=True,
    )  # fmt: skip


def test_bad_values_name_the_key(tmp_path) -> None:
    found = problems(tmp_path, [{"type": "jsonl", "path": "o.jsonl", "keep": 0, "fsync": "always"}])
    assert any("sinks[0].keep: expected an integer between 1 and 1000, got 0" in p for p in found), found
    assert any("sinks[0].fsync: expected one of 'never', 'rotate', 'flush'" in p for p in found), found


def test_docs_describe_every_sink_key() -> None:
    docs = (ROOT / "docs/config.md").read_text()
    for kind, cls in SINK_TYPES.items():
        assert f"`type: {kind}`" in docs
        for f in dataclasses.fields(cls):
            assert f"`{f.name}`" in docs, f"docs/config.md does not describe {cls.__name__}.{f.name}"
            assert f.metadata.get("doc") or not f.init, f"{cls.__name__}.{f.name} has no doc"


def test_edge_box_example_config_is_valid(tmp_path) -> None:
    """configs/edge-box.yaml, with its state folder and password file pointed at a temporary folder."""
    from streamd.config import load_config

    text = (ROOT / "configs" / "edge-box.yaml").read_text()
    (tmp_path / "mqtt-password").write_text("secret\n")
    text = text.replace("/var/lib/streamd/", f"{tmp_path}/").replace("/etc/streamd/", f"{tmp_path}/")
    path = tmp_path / "edge-box.yaml"
    path.write_text(text)
    config = load_config(path)
    assert [s.type for s in config.sinks] == ["jsonl", "mqtt", "http"] and config.metrics.enabled
    assert config.sinks[1].password_file == tmp_path / "mqtt-password"
