"""Reload planning: what changed between the running config and the file as it is now."""

from __future__ import annotations

from streamd.config import load_config
from streamd.reload import plan_reload, reread
from tests.conftest import CLIP, CLIP_HEVC, MODEL


def write(path, streams: str, sinks: str = "  - type: stdout\n", extra: str = "") -> str:
    path.write_text(f"streams:\n{streams}model:\n  path: {MODEL}\nsinks:\n{sinks}{extra}")
    return str(path)


def test_plan_names_added_removed_changed_and_untouched_streams(tmp_path) -> None:
    old = load_config(write(tmp_path / "a.yaml", f"  - id: a\n    url: {CLIP}\n  - id: b\n    url: {CLIP}\n"))
    new = load_config(
        write(
            tmp_path / "b.yaml",
            f"  - id: a\n    url: {CLIP}\n  - id: b\n    url: {CLIP_HEVC}\n  - id: c\n    url: {CLIP}\n",
            sinks=f"  - type: jsonl\n    path: {tmp_path / 'o.jsonl'}\n",
            extra="pipeline:\n  batch_size: 2\n",
        )
    )
    plan = plan_reload(old, new)
    assert [s.id for s in plan.added] == ["c"] and [s.id for s in plan.changed] == ["b"]
    assert plan.unchanged == ("a",) and plan.removed == () and plan.sinks_changed
    assert not plan.model_changed and plan.needs_restart == ("pipeline",)
    assert plan.describe() == "added c; changed b; sinks changed; needs a restart to apply: pipeline"
    assert plan_reload(old, old).empty and plan_reload(new, old).removed == ("c",)


def test_a_bad_config_on_reload_gives_the_check_messages(tmp_path) -> None:
    good = load_config(write(tmp_path / "c.yaml", f"  - id: a\n    url: {CLIP}\n"))
    write(tmp_path / "c.yaml", f"  - id: a\n    url: {CLIP}\n  - id: a\n    url: nowhere.mp4\n")
    new, problems = reread(tmp_path / "c.yaml", good)
    assert new is None and problems
    assert all(p.startswith(f"{tmp_path / 'c.yaml'}:") for p in problems), problems
    assert any("streams[1]" in p for p in problems), problems
