"""One thread per stream: Source -> Decoder -> the stream's bounded queue in the batcher.

Every packet is decoded (P/B frames never lose their references); frames are dropped only afterwards, by the
queue policy. File streams end or loop; errors are counted and logged with the redacted URL, never raised
into other streams.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import av

from streamd.config import StreamConfig
from streamd.decode.cpu import CpuDecoder
from streamd.pipeline.batcher import StreamQueue
from streamd.sources.base import SourceError
from streamd.sources.file import FileDemuxer
from streamd.types import Frame

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StreamStats:
    decoded: int = 0
    decode_errors: int = 0
    read_errors: int = 0
    state: str = "starting"  # starting | running | ended | failed


class StreamWorker:
    def __init__(self, cfg: StreamConfig, out: StreamQueue, stop: threading.Event) -> None:
        self.cfg = cfg
        self.out = out
        self.stop = stop
        self.stats = StreamStats()
        self._index = 0
        self._thread = threading.Thread(target=self._run, name=f"stream-{cfg.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("stream %s: unexpected failure; the stream stops, the others go on", self.cfg.id)
            self.stats.state = "failed"
        finally:
            if self.stats.state not in ("failed",):
                self.stats.state = "ended"
            self.out.close()

    def _loop(self) -> None:
        cfg = self.cfg
        pts_offset = 0.0
        while not self.stop.is_set():
            try:
                demuxer = FileDemuxer(cfg.path, open_timeout_s=cfg.open_timeout_s, read_timeout_s=cfg.read_timeout_s)
            except SourceError as exc:
                log.error("stream %s (%s): %s", cfg.id, cfg.redacted_url, exc)
                self.stats.state = "failed"
                return
            self.stats.state = "running"
            try:
                last_pts = self._pump(demuxer, pts_offset)
            finally:
                demuxer.close()
            if not cfg.loop or self.stop.is_set():
                return
            period = 1.0 / demuxer.info.fps if demuxer.info.fps else 0.0
            pts_offset = (last_pts if last_pts is not None else pts_offset) + period

    def _pump(self, demuxer: FileDemuxer, pts_offset: float) -> float | None:
        """Decode the whole input into the queue; returns the last pts seen (with the loop offset)."""
        cfg = self.cfg
        decoder = CpuDecoder(demuxer.stream)
        pace_start: float | None = None
        first_pts: float | None = None
        last_pts: float | None = None

        def emit(pictures: list, decode_ms: float) -> bool:
            nonlocal pace_start, first_pts, last_pts
            for pic in pictures:
                pts = None if pic.pts is None else pic.pts + pts_offset
                if cfg.realtime and pts is not None:
                    # Pace at the file's own rate, measured from its first frame.
                    if pace_start is None:
                        pace_start, first_pts = time.monotonic(), pts
                    delay = pace_start + (pts - first_pts) - time.monotonic()  # type: ignore[operator]
                    if delay > 0 and self.stop.wait(delay):
                        return False
                h, w = pic.image.shape[:2]
                frame = Frame(
                    cfg.id, self._index, pts, w, h, image=pic.image,
                    wall_time=time.time(), t_decoded=time.perf_counter(), decode_ms=decode_ms,
                )
                self._index += 1
                self.stats.decoded += 1
                last_pts = pts
                if not self.out.put(frame, self.stop):
                    return False
            return True

        try:
            for packet in demuxer.packets():
                if self.stop.is_set():
                    return last_pts
                t0 = time.perf_counter()
                try:
                    pictures = list(decoder.decode(packet))
                except av.InvalidDataError as exc:
                    self.stats.decode_errors += 1
                    log.warning("stream %s: undecodable packet skipped (%s)", cfg.id, exc)
                    continue
                if not emit(pictures, (time.perf_counter() - t0) * 1e3 / max(1, len(pictures))):
                    return last_pts
        except SourceError as exc:
            self.stats.read_errors += 1
            log.warning("stream %s (%s): %s; ending this pass", cfg.id, cfg.redacted_url, exc)
        try:
            emit(list(decoder.flush()), 0.0)
        except av.InvalidDataError:
            self.stats.decode_errors += 1
        return last_pts
