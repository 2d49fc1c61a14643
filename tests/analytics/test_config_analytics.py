"""Analytics keys (detect_fps, classes, class_thresholds, zones, tracking): every bad value names its key path
and line and exits 78 through the real CLI; good values load resolved (class names -> ids)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamd.config import EX_CONFIG, ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent.parent

GOOD = """\
streams:
  - id: cam1
    url: video.mp4
model:
  path: model.onnx
"""
ZONE = """\
    zones:
      - name: door
        polygon: [[0, 0], [100, 0], [100, 100], [0, 100]]
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "video.mp4").write_bytes(b"\0")
    (tmp_path / "model.onnx").write_bytes(b"\0")
    return tmp_path


def write(folder: Path, text: str) -> Path:
    path = folder / "streamd.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def stream_keys(text: str) -> str:
    """GOOD with ``text`` added under the first stream."""
    return GOOD.replace("    url: video.mp4\n", "    url: video.mp4\n" + text)


# (case id, YAML, key path, message fragments). The line ending in "# <-" is the line the problem points at.
BAD = [
    ("detect-fps-zero", stream_keys("    detect_fps: 0  # <-\n"), "streams[0].detect_fps", ["a number > 0"]),
    (
        "detect-fps-string",
        stream_keys("    detect_fps: 5fps  # <-\n"),
        "streams[0].detect_fps",
        ["write a plain number"],
    ),
    (
        "unknown-class-name",
        stream_keys("    classes: [person, persn]  # <-\n"),
        "streams[0].classes[1]",
        ["unknown class name 'persn'", "did you mean 'person'?"],
    ),
    (
        "class-id-out-of-range",
        GOOD + "  classes: [0, 80]  # <-\n",
        "model.classes[1]",
        ["class id 80 is out of range", "80 classes"],
    ),
    ("classes-not-a-list", GOOD + "  classes: person  # <-\n", "model.classes", ["write [person]"]),
    (
        "class-threshold-too-high",
        GOOD + "  class_thresholds:\n    person: 1.5  # <-\n",
        "model.class_thresholds.person",
        ["a number > 0 and < 1", "1.5"],
    ),
    (
        "class-threshold-unknown-class",
        GOOD + "  class_thresholds:\n    peson: 0.5  # <-\n",
        "model.class_thresholds.peson",
        ["unknown class name 'peson'", "did you mean 'person'?"],
    ),
    (
        "class-thresholds-not-mapping",
        GOOD + "  class_thresholds: [0.5]  # <-\n",
        "model.class_thresholds",
        ["expected a mapping of class name -> score threshold"],
    ),
    (
        "polygon-two-points",
        stream_keys("    zones:\n      - name: a\n        polygon: [[0, 0], [10, 10]]  # <-\n"),
        "streams[0].zones[0].polygon",
        ["at least 3 points", "got 2"],
    ),
    (
        "polygon-self-intersecting",
        stream_keys(
            "    zones:\n      - name: a\n        polygon: [[0, 0], [10, 10], [10, 0], [0, 10]]  # <-\n"
        ),
        "streams[0].zones[0].polygon",
        ["intersects itself"],
    ),
    (
        "polygon-bad-point",
        stream_keys(
            "    zones:\n      - name: a\n        polygon:\n          - [0, 0]\n          - [10]  # <-\n"
            "          - [10, 10]\n"
        ),
        "streams[0].zones[0].polygon[1]",
        ["expected a point [x, y] of two numbers"],
    ),
    (
        "polygon-negative",
        stream_keys(
            "    zones:\n      - name: a\n        polygon:\n          - [0, 0]\n          - [-5, 3]  # <-\n"
            "          - [10, 10]\n"
        ),
        "streams[0].zones[0].polygon[1]",
        ["coordinates >= 0"],
    ),
    (
        "polygon-on-a-line",
        stream_keys("    zones:\n      - name: a\n        polygon: [[0, 0], [5, 5], [10, 10]]  # <-\n"),
        "streams[0].zones[0].polygon",
        ["on one line"],
    ),
    (
        "zone-missing-polygon",
        stream_keys("    zones:\n      - name: a  # <-\n"),
        "streams[0].zones[0].polygon",
        ["required key missing"],
    ),
    (
        "zone-duplicate-name",
        stream_keys(ZONE + "      - name: door  # <-\n        polygon: [[0, 0], [5, 0], [5, 5]]\n"),
        "streams[0].zones[1].name",
        ["duplicate zone name 'door'"],
    ),
    (
        "zone-bad-anchor",
        stream_keys(ZONE + "        anchor: bottom  # <-\n"),
        "streams[0].zones[0].anchor",
        ["'bottom_center'"],
    ),
    (
        "zone-unknown-class",
        stream_keys(ZONE + "        classes: [dragon]  # <-\n"),
        "streams[0].zones[0].classes[0]",
        ["unknown class name 'dragon'"],
    ),
    (
        "zones-only-without-zones",
        stream_keys("    zones_only: true  # <-\n"),
        "streams[0].zones_only",
        ["has no zones"],
    ),
    (
        "tracking-unknown-key",
        GOOD + "tracking:\n  enable: true  # <-\n",
        "tracking.enable",
        ["did you mean 'enabled'?"],
    ),
    (
        "tracking-yes",
        GOOD + "tracking:\n  enabled: yes  # <-\n",
        "tracking.enabled",
        ["true or false"],
    ),
    (
        "tracking-high-score-range",
        GOOD + "tracking:\n  high_score: 1.0  # <-\n",
        "tracking.high_score",
        ["> 0 and < 1"],
    ),
    (
        "tracking-lost-timeout-negative",
        GOOD + "tracking:\n  lost_timeout_s: -1  # <-\n",
        "tracking.lost_timeout_s",
        ["> 0"],
    ),
    (
        "fill-skipped-without-tracking",
        GOOD + "tracking:\n  fill_skipped: true  # <-\n",
        "tracking.fill_skipped",
        ["needs tracking (enabled: true)"],
    ),
    (
        "stream-tracking-bad-key",
        stream_keys("    tracking:\n      enabeld: false  # <-\n"),
        "streams[0].tracking.enabeld",
        ["did you mean 'enabled'?"],
    ),
    (
        "tracking-key-at-top",
        GOOD + "fill_skipped: true  # <-\n",
        "fill_skipped",
        ["belongs under tracking:"],
    ),
]


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return caught.value.problems


@pytest.mark.parametrize(("text", "key", "fragments"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_analytics_config_names_key_line_and_fix(folder: Path, text: str, key: str, fragments: list[str]):
    path = write(folder, text)
    problems = problems_of(path)
    assert len(problems) == 1, problems
    (hit,) = problems
    assert f": {key}: " in hit, hit
    for fragment in fragments:
        assert fragment in hit, hit
    lines = [n for n, line in enumerate(text.splitlines(), 1) if "# <-" in line]
    assert hit.startswith(f"{path}:{lines[0]}: "), (lines, hit)


def run_check(path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "streamd", "check", str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_cli_check_every_bad_analytics_config_exits_78(folder: Path):
    """All cases through the real CLI (one process per case would take ~1 s each; a few are enough here,
    the in-process test above covers every case's message)."""
    for case in (
        "detect-fps-zero",
        "unknown-class-name",
        "polygon-self-intersecting",
        "class-threshold-too-high",
        "fill-skipped-without-tracking",
    ):
        _, text, key, fragments = next(c for c in BAD if c[0] == case)
        result = run_check(write(folder, text))
        assert result.returncode == EX_CONFIG, (case, result.stderr)
        assert f": {key}: " in result.stderr and fragments[0] in result.stderr, (case, result.stderr)


def test_good_analytics_config_resolves_names(folder: Path):
    text = GOOD + textwrap.dedent("""\
      classes: [person, car]
      class_thresholds: {car: 0.6, 0: 0.4}
    tracking:
      enabled: true
      high_score: 0.6
    """)
    text = text.replace(
        "    url: video.mp4\n",
        "    url: video.mp4\n    detect_fps: 5\n    classes: [bus, 0]\n"
        "    tracking: {fill_skipped: true}\n" + ZONE + "        classes: [person]\n"
        "        anchor: center\n    zones_only: true\n",
    )
    config = load_config(write(folder, text))
    m, (s,) = config.model, config.streams
    assert m.classes == (0, 2) and m.class_thresholds == ((0, 0.4), (2, 0.6))
    row = m.thresholds()
    assert row[0] == 0.4 and row[2] == 0.6 and math.isinf(row[1]) and len(row) == 80
    row = m.thresholds(s.classes)
    assert s.classes == (0, 5) and row[0] == 0.4 and row[5] == m.score_threshold and math.isinf(row[2])
    assert s.detect_fps == 5.0 and s.zones_only
    (zone,) = s.zones
    assert zone.name == "door" and zone.classes == (0,) and zone.anchor == "center" and len(zone.polygon) == 4
    assert config.tracking.enabled and config.tracking.high_score == 0.6 and not config.tracking.fill_skipped
    assert s.tracking.enabled and s.tracking.fill_skipped and s.tracking.high_score == 0.6


def test_stream_may_turn_tracking_off_under_global_fill_skipped(folder: Path):
    text = (
        stream_keys("    tracking: {enabled: false}\n") + "tracking:\n  enabled: true\n  fill_skipped: true\n"
    )
    (s,) = load_config(write(folder, text)).streams
    assert not s.tracking.enabled


def test_defaults_leave_analytics_off(folder: Path):
    config = load_config(write(folder, GOOD))
    (s,) = config.streams
    assert s.detect_fps is None and s.classes is None and s.zones == () and not s.tracking.enabled
    assert config.model.classes is None and config.model.thresholds() == [config.model.score_threshold] * 80


def test_docs_describe_every_analytics_key():
    import dataclasses

    from streamd.config.streams import ZoneConfig
    from streamd.config.tracking import TrackingConfig

    docs = (ROOT / "docs/config.md").read_text()
    for cls in (TrackingConfig, ZoneConfig):
        for f in dataclasses.fields(cls):
            assert f"`{f.name}`" in docs, f"docs/config.md does not describe {cls.__name__}.{f.name}"
    for key in ("detect_fps", "classes", "class_thresholds", "zones", "zones_only", "tracking"):
        assert f"`{key}`" in docs


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("analytics-*.yaml")), ids=lambda p: p.name)
def test_example_analytics_configs_load(path: Path):
    config = load_config(path)
    assert config.streams
