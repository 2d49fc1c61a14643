"""Config checking stays cheap and bounded: alias bombs, absurd numbers, limits that must match the
kernels."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from streamd.config import ConfigError, load_config
from streamd.config.model import MAX_TOP_K
from tests.conftest import CLIP, ROOT, run_streamd


def alias_bomb(levels: int = 9) -> str:
    """~600 bytes of YAML whose aliases expand to 9**levels strings, under an ignored x- key."""
    lines = ["x-a0: &a0 [" + ", ".join(['"lol"'] * 9) + "]"]
    lines += [f"x-a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nstreams:\n  - id: a\n    url: {CLIP}\n"


def test_nested_aliases_under_an_ignored_key_check_fast_and_small(tmp_path: Path) -> None:
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(alias_bomb())
    load_config(None)  # imports and the model's metadata read, outside the measurement
    t = time.perf_counter()
    config = load_config(cfg)
    seconds = time.perf_counter() - t
    tracemalloc.start()  # a second run for memory: tracing slows allocations down
    try:
        load_config(cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert config.stream_ids == ("a",)
    print(f"alias bomb: {seconds * 1e3:.0f} ms, peak {peak / 1e6:.1f} MB")
    assert seconds < 1.0 and peak < 100e6


def test_aliases_still_give_lines_and_duplicates(tmp_path: Path) -> None:
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        "x-cam: &cam\n  realtime: maybe\n"
        f"streams:\n  - <<: *cam\n    id: a\n    url: {CLIP}\n  - <<: *cam\n    id: b\n    url: {CLIP}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert [p.split(": ")[0].rsplit(":", 1)[1] for p in info.value.problems] == ["4", "7"]


def test_alias_bomb_through_the_cli(tmp_path: Path) -> None:
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(alias_bomb())
    proc = run_streamd("check", str(cfg), timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("section", "value", "expected"),
    [
        ("pipeline:\n  frame_queue: 1e23", "pipeline.frame_queue", "expected an integer between 1 and 256"),
        (
            "pipeline:\n  frame_queue: 99999999999999991611392",
            "pipeline.frame_queue",
            "expected an integer between 1 and 256",
        ),
        ("model:\n  top_k: 100000", "model.top_k", f"expected an integer between 1 and {MAX_TOP_K}"),
        (
            "engine:\n  threads: 1e23",
            "engine.threads",
            "expected an integer >= 0 (0 = the library's default)",
        ),
        ("engine:\n  threads: 99999999999999991611392", "engine.threads", "and at most 2147483647, got"),
        (
            "pipeline:\n  batch_timeout_ms: 1e23",
            "pipeline.batch_timeout_ms",
            "(0 = never wait) and at most 1000000000",
        ),
    ],
)
def test_absurd_numbers_are_refused(tmp_path: Path, section: str, value: str, expected: str) -> None:
    cfg = tmp_path / "n.yaml"
    cfg.write_text(f"streams:\n  - id: a\n    url: {CLIP}\n{section}\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    (problem,) = info.value.problems
    assert f": {value}: expected " in problem and expected in problem, problem
    assert "write 9999" not in problem


def test_top_k_limit_is_the_kernels() -> None:
    kernel = (ROOT / "kernels" / "postprocess.cu").read_text()
    assert f"(at most {MAX_TOP_K})" in kernel
    cfg_ok = load_config(None)
    assert cfg_ok.model.top_k <= MAX_TOP_K
