"""One thread per stream: Source -> Decoder -> the stream's bounded queue in the batcher.

Hop: ``StreamConfig`` -> demuxer (``Packet``) -> decoder (``DecodedPicture``) -> ``Frame`` -> ``StreamQueue``.

Every packet is decoded (P/B frames never lose their references); frames are dropped only afterwards, by the
queue policy (``latest`` keeps the newest frames of a live stream, counted). Files end or loop, paced at their
own rate when ``realtime``. Live streams reconnect after any failure: a refused or silent server, a read
error, a server that closed the stream, or a stall (no packet or no decoded frame for ``stall_timeout_s``),
waiting with exponential backoff (jitter, capped at ``reconnect_max_s``) and giving up only after
``reconnect_attempts`` failures in a row (0 = never). Frame indices keep increasing across reconnects and
loops; so do timestamps. Errors are counted and logged with the redacted URL, never raised into other streams.
Every blocking call is bounded (open/read timeouts, queue waits that watch ``stop``), so ``stop`` is honoured
within about a second plus the open/read timeouts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamd.config import StreamConfig
from streamd.decode import DecodedPicture, DecodeError, Decoder, create_decoder
from streamd.pipeline.batcher import StreamQueue
from streamd.sources import Demuxer, SourceError, open_stream
from streamd.sources.backoff import Backoff, StallWatch
from streamd.sources.file import Pacer
from streamd.types import Frame

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StreamStats:
    """Counters of one stream, read by the daemon (metrics, status line) from another thread."""

    decoded: int = 0
    decode_errors: int = 0  # packets the decoder rejected (corrupt data); the stream went on
    read_errors: int = 0  # failed opens and reads (refused, timeout, truncated file, stall)
    state: str = "starting"  # starting | running | reconnecting | ended | failed
    reconnects: int = 0  # sessions reopened after a failure (live streams)
    stalls: int = 0  # sessions given up because nothing arrived for stall_timeout_s
    dropped_surfaces: int = 0  # NVDEC pictures dropped because downstream held every pooled buffer
    skipped: int = 0  # decoded frames not sent to the detector (streams[].detect_fps); not drops
    last_packet: float = 0.0  # time.monotonic() of the last packet read (0: none yet)
    last_error: str = ""  # the last failure, credentials redacted
    backend: str = ""  # demux backend in use: pyav | opencv
    decoder: str = ""  # cpu | nvdec

    @property
    def last_packet_age_s(self) -> float | None:
        """Seconds since the last packet arrived (None before the first)."""
        return time.monotonic() - self.last_packet if self.last_packet else None


class _Stall(SourceError):
    """No packet or no decoded frame for stall_timeout_s on a live stream."""


class StreamWorker:
    """Reads one configured stream on its own thread and puts decoded frames into ``out``.

    ``decoder``: ``cpu`` (PyAV, host BGR) or ``nvdec`` (device NV12, PyNvVideoCodec); ``demux``: ``auto``,
    ``pyav`` or ``opencv``. ``decoder_options`` go to the decoder (e.g. ``pool_size`` for nvdec).
    """

    def __init__(
        self,
        cfg: StreamConfig,
        out: StreamQueue,
        stop: threading.Event,
        *,
        decoder: str = "cpu",
        device: int = 0,
        demux: str = "auto",
        decoder_options: dict[str, Any] | None = None,
        analytics: Any = None,
        on_lines: Callable[[list[str]], None] | None = None,
    ) -> None:
        """``analytics``: the stream's ``streamd.analytics.StreamAnalytics`` (detect_fps skips, predicted
        lines); ``on_lines`` takes the lines it writes for skipped frames."""
        self.cfg = cfg
        self.analytics = analytics
        self.on_lines = on_lines
        self.out = out
        self.stop = stop
        self.stats = StreamStats(decoder=decoder)
        self._decoder_kind = decoder
        self._decoder_options = dict(decoder_options or {})
        if decoder == "nvdec":
            self._decoder_options.setdefault("device", device)
        self._demux = demux
        self._index = 0
        # Timestamps: pts_out = base + (pts - first), base and first set per live session or per file pass.
        self._base = 0.0
        self._first: float | None = None
        self._last_out: float | None = None
        self._last_frame_time = 0.0
        self._period = 0.0
        self._thread = threading.Thread(target=self._run, name=f"stream-{cfg.id}", daemon=True)

    def resume_at(self, index: int, pts: float | None, wall_time: float) -> None:
        """Continue a stream whose worker process was restarted: frame indices from ``index``, timestamps
        after ``pts`` with the real outage (since ``wall_time``, Unix time) as the jump."""
        self._index = index
        if pts is not None:
            self._last_out = pts
            self._last_frame_time = time.monotonic() - max(0.0, time.time() - wall_time)

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
            if self.stats.state != "failed":
                self.stats.state = "ended"
            self.out.close()

    # -- open / reconnect ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        cfg = self.cfg
        backoff = Backoff(cfg.reconnect_initial_s, cfg.reconnect_max_s, attempts=cfg.reconnect_attempts)
        down_since: float | None = None
        while not self.stop.is_set():
            try:
                demuxer = open_stream(cfg, annexb=self._decoder_kind == "nvdec", backend=self._demux)
            except SourceError as exc:
                self._failed(exc)
                if not cfg.is_live:
                    log.error("stream %s (%s): %s", cfg.id, cfg.redacted_url, exc)
                    self.stats.state = "failed"
                    return
                down_since = down_since or time.monotonic()
                if not self._retry(backoff, f"cannot open: {exc}"):
                    return
                continue
            if down_since is not None:
                log.info(
                    "stream %s (%s): reconnected after %.1f s (%d attempt(s))",
                    cfg.id, cfg.redacted_url, time.monotonic() - down_since, backoff.failures,
                )  # fmt: skip
                down_since = None
            self.stats.backend = demuxer.backend
            self.stats.state = "running"
            try:
                reason = self._session(demuxer, backoff)
            finally:
                demuxer.close()
            if self.stop.is_set():
                return
            if not cfg.is_live:
                if not cfg.loop:
                    return
                continue
            self.stats.reconnects += 1
            down_since = time.monotonic()
            if not self._retry(backoff, reason):
                return

    def _failed(self, exc: Exception) -> None:
        self.stats.read_errors += 1
        self.stats.last_error = str(exc)

    def _retry(self, backoff: Backoff, reason: str) -> bool:
        """Wait before the next attempt; False when the stream gives up or ``stop`` is set."""
        cfg = self.cfg
        delay = backoff.failure()
        if delay is None:
            log.error(
                "stream %s (%s): %s; giving up after %d failures in a row (reconnect_attempts)",
                cfg.id, cfg.redacted_url, reason, backoff.failures,
            )  # fmt: skip
            self.stats.state = "failed"
            return False
        self.stats.state = "reconnecting"
        log.warning(
            "stream %s (%s): %s; reconnecting in %.1f s (failure %d)",
            cfg.id, cfg.redacted_url, reason, delay, backoff.failures,
        )  # fmt: skip
        return not self.stop.wait(delay)

    # -- one session: demux -> decode -> queue ---------------------------------------------------------------
    def _make_decoder(self, demuxer: Demuxer) -> Decoder:
        kind = self._decoder_kind
        try:
            return create_decoder(kind, demuxer.info, **self._decoder_options)
        except DecodeError as exc:
            if kind == "cpu":
                raise
            log.warning("stream %s: %s; decoding this stream on the CPU", self.cfg.id, exc)
            return create_decoder("cpu", demuxer.info)

    def _session(self, demuxer: Demuxer, backoff: Backoff) -> str:
        """Decode the input until it ends, fails or stalls; returns why it ended (for the log)."""
        cfg = self.cfg
        info = demuxer.info
        decoder = self._make_decoder(demuxer)
        self.stats.decoder = decoder.name
        self._period = 1.0 / info.fps if info.fps else 0.0
        self._first = None
        if self._last_out is not None:  # continue the timeline: a loop pass, or a new live session
            gap = time.monotonic() - self._last_frame_time if cfg.is_live else 0.0
            self._base = self._last_out + max(self._period, gap)
        watch = StallWatch(cfg.stall_timeout_s) if cfg.is_live else None
        pacer = Pacer(self.stop) if cfg.realtime and not cfg.is_live else None
        reason = "the server closed the stream"
        try:
            for packet in demuxer.packets():
                if self.stop.is_set():
                    return "stopped"
                self.stats.last_packet = time.monotonic()
                t0 = time.perf_counter()
                skipped = decoder.skipped
                try:
                    pictures = decoder.decode(packet)
                except DecodeError as exc:
                    self.stats.decode_errors += 1
                    log.warning("stream %s: undecodable packet skipped (%s)", cfg.id, exc)
                    pictures = []
                if decoder.skipped != skipped:
                    self.stats.decode_errors += decoder.skipped - skipped
                    log.warning("stream %s: %d corrupt picture(s) skipped", cfg.id, decoder.skipped - skipped)
                if watch is not None:
                    watch.packet()
                    if pictures:
                        watch.frame()
                        backoff.success()
                    elif why := watch.stalled():
                        raise _Stall(f"stalled: {why}")
                decode_ms = (time.perf_counter() - t0) * 1e3 / max(1, len(pictures))
                if not self._emit(pictures, decode_ms, pacer):
                    return "stopped"
            if not cfg.is_live:
                backoff.success()
        except _Stall as exc:
            self.stats.stalls += 1
            self._failed(exc)
            reason = str(exc)
        except SourceError as exc:
            self._failed(exc)
            reason = str(exc)
            if not cfg.is_live:
                log.warning("stream %s (%s): %s; ending this pass", cfg.id, cfg.redacted_url, exc)
        finally:
            skipped = decoder.skipped
            try:
                self._emit(decoder.flush(), 0.0, pacer)
            except DecodeError:
                self.stats.decode_errors += 1
            self.stats.decode_errors += decoder.skipped - skipped
            self.stats.dropped_surfaces += getattr(decoder, "dropped", 0)
            decoder.close()
        return reason

    def _detect(self, frame: Frame) -> bool:
        """detect_fps: False when the frame skips the detector (counted as skipped; a GPU surface goes back
        to its pool at once; predicted lines, if any, go to ``on_lines``)."""
        analytics = self.analytics
        with analytics.lock:  # skipped-frame lines keep their order with the result thread's lines
            if analytics.should_detect(frame):
                return True
            self.stats.skipped += 1
            if frame.surface is not None and hasattr(frame.surface, "release"):
                frame.surface.release()  # nothing will read it
            frame.surface = frame.image = None
            lines = analytics.on_skipped(frame)
            if lines and self.on_lines is not None:
                self.on_lines(lines)
        return False

    def _pts(self, pts: float | None) -> float | None:
        """The decoder's pts (seconds, this session/pass) on the stream's continuous timeline."""
        if pts is None:
            if self._last_out is None or not self.cfg.is_live:
                return pts
            return self._last_out + self._period
        if self._first is None:
            self._first = pts if self.cfg.is_live or self._last_out is not None else 0.0
        return self._base + (pts - self._first)

    def _emit(self, pictures: list[DecodedPicture], decode_ms: float, pacer: Pacer | None) -> bool:
        """Queue the pictures as Frames; False when ``stop`` was set while waiting."""
        cfg = self.cfg
        for pic in pictures:
            pts = self._pts(pic.pts)
            if pacer is not None and not pacer.wait(pts):
                return False
            frame = Frame(
                cfg.id,
                self._index,
                pts,
                pic.width,
                pic.height,
                image=pic.image,
                surface=pic.surface,
                wall_time=time.time(),
                t_decoded=time.perf_counter(),
                decode_ms=decode_ms,
            )
            self._index += 1
            self.stats.decoded += 1
            self._last_out = pts if pts is not None else self._last_out
            self._last_frame_time = time.monotonic()
            if self.analytics is not None and not self._detect(frame):
                continue
            if not self.out.put(frame, self.stop):
                return False
        return True
