"""What analytics hands back per stream, as typed values (the worker's output edge turns them into JSON lines:
``streamd.worker.output``).

- ``AnnotatedFrame``: a frame's result and the analytics of each of its detections (``Annotations``); a frame
  line. With ``tracking.fill_skipped`` a skipped frame's predicted boxes come as one too (``predicted``).
- ``FrameEvent``: a ``ZoneEvent`` (a track entering, dwelling in or leaving a zone) or a ``LineEvent`` (a
  track crossing a line) at the frame that decided it; an event line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from streamd.analytics.events import ZoneEvent
from streamd.analytics.lines import LineEvent
from streamd.types import Frame, FrameResult


@dataclass(frozen=True, slots=True)
class Annotations:
    """Per-detection analytics of one frame (arrays parallel to its detections); None = key not written.

    ``track_id`` (n,) int, -1 for a detection no track took (its keys are then left out); ``track_age`` (n,)
    int; ``zones`` (n, z) bool membership over ``zone_names``; ``predicted``: boxes the tracker predicted for
    a skipped frame."""

    track_id: np.ndarray | None = None
    track_age: np.ndarray | None = None
    zones: np.ndarray | None = None
    zone_names: Sequence[str] = ()
    predicted: bool = False


@dataclass(frozen=True, slots=True)
class AnnotatedFrame:
    """A frame line: the result (detections already filtered by tracking and ``zones_only``) and its notes."""

    result: FrameResult
    notes: Annotations


@dataclass(frozen=True, slots=True)
class FrameEvent:
    """An event line: ``event`` happened at ``frame`` (only its stream, index, pts and time are read)."""

    frame: Frame
    event: ZoneEvent | LineEvent


Output: TypeAlias = AnnotatedFrame | FrameEvent
