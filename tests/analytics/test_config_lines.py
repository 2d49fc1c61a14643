"""``streams[].lines`` and ``zones[].dwell_s`` in the config: every bad value names its key path and line and
the fix, and exits 78 through the real CLI; good values load resolved (class names -> ids, defaults)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from streamd.config import EX_CONFIG, load_config
from streamd.config.lines import LineConfig
from tests.analytics.test_config_analytics import GOOD, ROOT, problems_of, run_check, stream_keys, write

TRACKED = GOOD + "tracking:\n  enabled: true\n"
TRIANGLE = "    zones:\n      - name: z\n        polygon: [[0, 0], [9, 0], [9, 9]]\n"


def tracked_stream(text: str) -> str:
    """TRACKED with ``text`` added under the first stream."""
    return TRACKED.replace("    url: video.mp4\n", "    url: video.mp4\n" + text)


def line(body: str) -> str:
    return tracked_stream("    lines:\n      - name: door\n" + body)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "video.mp4").write_bytes(b"\0")
    (tmp_path / "model.onnx").write_bytes(b"\0")
    return tmp_path


# (case id, YAML, key path, message fragments). The line ending in "# <-" is the line the problem points at.
BAD = [
    ("lines-not-a-list", tracked_stream("    lines: door  # <-\n"), "streams[0].lines", ["a list of lines"]),
    (
        "points-missing",
        tracked_stream("    lines:\n      - name: door  # <-\n        in_side: left\n"),
        "streams[0].lines[0].points",
        ["required key missing; add points:"],
    ),
    (
        "one-point",
        line("        points: [[1, 2]]  # <-\n"),
        "streams[0].lines[0].points",
        ["two points [[x1, y1], [x2, y2]]", "a list of 1 item"],
    ),
    (
        "same-points",
        line("        points: [[5, 5], [5, 5]]  # <-\n"),
        "streams[0].lines[0].points",
        ["two different points"],
    ),
    (
        "negative",
        line("        points: [[5, 5], [-1, 5]]  # <-\n"),
        "streams[0].lines[0].points[1]",
        [">= 0 (source pixels)"],
    ),
    (
        "not-numbers",
        line("        points: [[5, 5], [a, 5]]  # <-\n"),
        "streams[0].lines[0].points[1]",
        ["a point [x, y] of two numbers"],
    ),
    (
        "in-side",
        line("        points: [[0, 0], [9, 9]]\n        in_side: up  # <-\n"),
        "streams[0].lines[0].in_side",
        ["'left', 'right'"],
    ),
    (
        "margin-zero",
        line("        points: [[0, 0], [9, 9]]\n        margin_px: 0  # <-\n"),
        "streams[0].lines[0].margin_px",
        ["a number > 0"],
    ),
    (
        "unknown-class",
        line("        points: [[0, 0], [9, 9]]\n        classes: [persn]  # <-\n"),
        "streams[0].lines[0].classes[0]",
        ["unknown class name 'persn'", "did you mean 'person'?"],
    ),
    (
        "unknown-key",
        line("        points: [[0, 0], [9, 9]]\n        direction: in  # <-\n"),
        "streams[0].lines[0].direction",
        ["unknown key"],
    ),
    (
        "duplicate-name",
        line(
            "        points: [[0, 0], [9, 9]]\n      - name: door  # <-\n        points: [[0, 0], [5, 9]]\n"
        ),
        "streams[0].lines[1].name",
        ["duplicate line name 'door'", "streams[0].lines[0]"],
    ),
    (
        "lines-without-tracking",
        stream_keys("    lines:  # <-\n      - name: door\n        points: [[0, 0], [9, 9]]\n"),
        "streams[0].lines",
        ["tracking is off", "tracking: {enabled: true}"],
    ),
    (
        "dwell-zero",
        tracked_stream(TRIANGLE + "        dwell_s: 0  # <-\n"),
        "streams[0].zones[0].dwell_s",
        ["a number > 0"],
    ),
    (
        "dwell-without-tracking",
        stream_keys(TRIANGLE + "        dwell_s: 5  # <-\n"),
        "streams[0].zones[0].dwell_s",
        ["tracking is off", "or delete dwell_s"],
    ),
]


@pytest.mark.parametrize(("text", "key", "fragments"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_lines_config_names_key_line_and_fix(folder: Path, text: str, key: str, fragments: list[str]):
    path = write(folder, text)
    problems = problems_of(path)
    assert len(problems) == 1, problems
    (hit,) = problems
    assert f": {key}: " in hit, hit
    for fragment in fragments:
        assert fragment in hit, hit
    lines = [n for n, ln in enumerate(text.splitlines(), 1) if "# <-" in ln]
    assert hit.startswith(f"{path}:{lines[0]}: "), (lines, hit)


def test_cli_check_bad_lines_exit_78(folder: Path):
    for case in ("same-points", "lines-without-tracking", "dwell-without-tracking"):
        _, text, key, fragments = next(c for c in BAD if c[0] == case)
        result = run_check(write(folder, text))
        assert result.returncode == EX_CONFIG, (case, result.stderr)
        assert f": {key}: " in result.stderr and fragments[0] in result.stderr, (case, result.stderr)


def test_good_lines_load_with_defaults_and_class_ids(folder: Path):
    stream = load_config(write(folder, tracked_stream(
        "    lines:\n      - name: door\n        points: [[0, 300], [768, 300.5]]\n"
        "        classes: [person, car]\n        in_side: right\n"
        "      - name: gate\n        points: [[10, 10], [10, 500]]\n"
        + TRIANGLE + "        dwell_s: 2\n"
    ))).streams[0]  # fmt: skip
    door, gate = stream.lines
    assert door == LineConfig("door", ((0.0, 300.0), (768.0, 300.5)), "right", (0, 2), "bottom_center", 8.0)
    assert (gate.in_side, gate.classes, gate.margin_px) == ("left", None, 8.0)
    assert stream.zones[0].dwell_s == 2.0
    plain = load_config(write(folder, GOOD)).streams[0]
    assert plain.lines == () and all(z.dwell_s is None for z in plain.zones)


def test_docs_describe_every_line_key():
    docs = (ROOT / "docs/config.md").read_text()
    for f in dataclasses.fields(LineConfig):
        assert f"`{f.name}`" in docs, f"docs/config.md does not describe LineConfig.{f.name}"
    assert "`lines`" in docs and "`dwell_s`" in docs and "streamd_line_crossings_total" in docs
