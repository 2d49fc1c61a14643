"""Event clips with pre-roll: a ring of each stream's compressed packets, remuxed into MP4s around events.

Hop: demuxed ``Packet`` (tapped in the stream thread, before decode) -> ``streamd.ingest.packet_ring`` ->
``ClipRecorder`` (events from the result thread) -> ``ClipJob`` -> ``ClipWriter`` (PyAV remux, its own
thread) -> ``dir/<stream>/<stream>-<UTC time>Z.mp4``. Decoded frames never come here: clips cost no decode,
no encode and no GPU work. ``ClipHooks`` is what a worker's pipeline holds.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from streamd.analytics.annotations import Output
from streamd.clips.recorder import ClipRecorder, with_clip
from streamd.clips.writer import ClipJob, ClipWriter, enforce_retention, write_mp4
from streamd.config.streams import StreamConfig
from streamd.exitcodes import EX_CANTCREAT, EX_CONFIG, StartupError
from streamd.types import FrameResult

__all__ = [
    "ClipHooks",
    "ClipJob",
    "ClipRecorder",
    "ClipWriter",
    "enforce_retention",
    "with_clip",
    "write_mp4",
]


class ClipHooks:
    """A worker's clips: one writer thread (started with the first stream that has clips) and a recorder
    per such stream."""

    def __init__(self) -> None:
        self.writer: ClipWriter | None = None
        self.recorders: dict[str, ClipRecorder] = {}

    def recorder(self, sc: StreamConfig) -> ClipRecorder | None:
        """The recorder of a stream (None: clips off); raises StartupError when its folder cannot be made
        (73) or PyAV, which writes the MP4s, is missing (78)."""
        old = self.recorders.pop(sc.id, None)
        if old is not None:  # a reload replaced the stream: its clips end with what they have
            old.finish_all()
        if not sc.clips.enabled:
            return None
        if importlib.util.find_spec("av") is None:
            raise StartupError(
                f"stream {sc.id}: clips.enabled: clips are written by PyAV, which is not installed; "
                "pip install av, or set clips: {enabled: false}",
                EX_CONFIG,
            )
        if self.writer is None:
            self.writer = ClipWriter()
            self.writer.start()
        try:
            rec = ClipRecorder(sc.id, sc.clips, self.writer)
        except OSError as exc:
            raise StartupError(
                f"stream {sc.id}: clips.dir: cannot create {sc.clips.dir}/{sc.id}: {exc.strerror or exc}",
                EX_CANTCREAT,
            ) from None
        self.recorders[sc.id] = rec
        return rec

    def result(
        self, result: FrameResult, outputs: Sequence[Output] = (), lines: Sequence[str] = ()
    ) -> list[str]:
        """A detected frame (and its analytics outputs and their lines): the lines, event lines naming their
        clip where one was written."""
        rec = self.recorders.get(result.frame.stream_id)
        return list(lines) if rec is None else rec.on_result(result, outputs, lines)

    def trigger(self, stream_id: str, reason: str = "api") -> str | None:
        """A clip of a stream from now back by its pre-roll (the control API's request); its path, or None
        (no clips on that stream, or nothing buffered yet)."""
        rec = self.recorders.get(stream_id)
        return None if rec is None or reason not in rec.cfg.on else rec.trigger(None, reason)

    def close(self, timeout: float = 10.0) -> None:
        """Finish every open clip and write what is queued (bounded by ``timeout``)."""
        for rec in list(self.recorders.values()):
            rec.finish_all()
        if self.writer is not None:
            self.writer.close(timeout)
