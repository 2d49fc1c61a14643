"""Transitional name for the frame-line encoder, which lives at the worker's output edge
(``streamd.worker.output``). Kept only while ``streamd.worker.pipeline`` and ``bench/bench_analytics.py``
still import ``to_json_line`` from here; delete this module once they import ``streamd.worker.output``
(tests/test_structure.py's ``TRANSITIONAL`` lists the import it needs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from streamd.types import FrameResult

if TYPE_CHECKING:
    from streamd.analytics.annotations import Annotations


def to_json_line(result: FrameResult, names: Sequence[str], notes: Annotations | None = None) -> str:
    from streamd.worker.output import frame_line  # transitional: see the module docstring

    return frame_line(result, names, notes)
