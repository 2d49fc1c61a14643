"""One thread per stream: Source -> Decoder -> the stream's bounded queue in the batcher.

Hop: ``StreamConfig`` -> demuxer (``Packet``) -> decoder (``DecodedPicture``) -> ``Frame`` -> ``StreamQueue``.

Every packet is decoded (P/B frames never lose their references); frames are dropped only afterwards, by the
queue policy (``latest`` drops only when the pipeline is really behind, counted). Files end or loop, paced at
their own rate when ``realtime``. Live streams reconnect after any failure: a refused or silent server, a read
error, a server that closed the stream, or a stall (no packet or no decoded frame for ``stall_timeout_s``),
waiting with exponential backoff (jitter, capped at ``reconnect_max_s``); after a failure up to
``reconnect_attempts`` reopens are tried before the stream is given up (0 = never give up). Errors are
counted and logged with the redacted URL, never raised into other streams. A stream that gets no hardware
decoder (the GPU holds no more: ``DecoderFull``) waits with backoff (state ``no_decoder``) and opens again —
a file from its beginning, as after a worker restart. Every blocking call is bounded
(open/read timeouts, queue waits that watch ``stop``), so ``stop`` is honoured within about a second plus
the open/read timeouts.

Decoders: live streams (and files paced in real time) decode with low delay (no frame threading on the CPU,
the lowest display delay on NVDEC). At the end of a file pass or a live session the decoder is flushed, so
every picture it holds is delivered, and then *kept* for the next pass or session when the stream's format
(codec, size, extradata) is unchanged; only a changed format makes a new decoder, and the old one is closed
on a background thread. So neither a loop nor a reconnect creates or tears down a decoder.

Timestamps: ``Frame.pts`` is the source's own presentation time on the first pass/session (equal to
ffprobe's ``pts_time`` for a file; FFmpeg's RTSP timeline for a camera). A picture without a pts at the start
of a live session (FFmpeg's RTSP client gives the first packet none) takes the next picture's pts minus one
frame period. A later pass or session continues the timeline: its first picture comes ``max(period, gap)``
after the last one, where ``gap`` is the real time between their packets' arrivals (live) — so pts keep
increasing and the jump shows the outage. Frame indices keep increasing across reconnects and loops.
``Frame.t_arrival`` is when the demuxer received the picture's packet (for paced files: when the pacer
released the picture), the start of ``latency_ms.arrival``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from streamd import logutil
from streamd.config import StreamConfig
from streamd.ingest.decode import (
    DecodedPicture,
    DecodeError,
    Decoder,
    DecoderFull,
    close_later,
    create_decoder,
)
from streamd.ingest.sources import Demuxer, SourceError, VideoInfo, open_stream
from streamd.ingest.sources.backoff import Backoff, StallWatch
from streamd.ingest.sources.file import Pacer
from streamd.types import Frame

log = logging.getLogger(__name__)
logutil.install(log)  # repeated warnings of a stream: 3 per 10 s, then one line with the count (ops)

DEFAULT_PERIOD_S = 0.04  # frame period assumed when the container states no frame rate
# First wait for a hardware decoder (up to reconnect_max_s): decoders free up only when other streams end, and
# 52 streams retrying from 0.5 s slowed 268 running ones for the first ~25 s on the H200 (bench/RESULTS.md).
DECODER_WAIT_S = 5.0


class FrameQueue(Protocol):
    """Where a stream's decoded frames go (``streamd.pipeline.batcher.StreamQueue``): ``latest`` drops the
    oldest when really behind, ``block`` makes the decoder wait."""

    policy: str
    capacity: int
    hard_limit: int

    def put(self, frame: Frame, stop: threading.Event) -> bool: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class StreamStats:
    """Counters of one stream, read by the daemon (metrics, status line) from another thread."""

    decoded: int = 0
    decode_errors: int = 0  # packets the decoder rejected (corrupt data); the stream went on
    read_errors: int = 0  # failed opens and reads (refused, timeout, truncated file, stall)
    state: str = "starting"  # starting | running | reconnecting | no_decoder | ended | failed
    reconnects: int = 0  # sessions reopened after a failure (live streams)
    stalls: int = 0  # sessions given up because nothing arrived for stall_timeout_s
    dropped_surfaces: int = 0  # NVDEC pictures dropped because downstream held every pooled buffer
    skipped: int = 0  # decoded frames not sent to the detector (streams[].detect_fps); not drops
    opens: int = 0  # open attempts: the first open, reopens after failures, file loop passes
    decoders_created: int = 0  # decoders made (1 unless the format changed or the GPU had no room)
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
        out: FrameQueue,
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
        lines, the zone leaves when the stream ends); ``on_lines`` takes the lines it writes for skipped
        frames and at the end of the stream."""
        self.cfg = cfg
        self.analytics = analytics
        self.on_lines = on_lines
        self.on_frame: Callable[[Frame], None] | None = None  # status page: GPU frame copy on request (ops)
        self.out = out
        self.stop = stop
        self.stats = StreamStats(decoder=decoder)
        self._decoder_kind = decoder
        self._decoder_options = dict(decoder_options or {})
        self._decoder_options.setdefault("low_delay", cfg.is_live or cfg.realtime)
        if decoder == "nvdec":
            self._decoder_options.setdefault("device", device)
            if "pool_size" in self._decoder_options and out.policy == "latest":
                # The queue may hold up to hard_limit pictures while it works off a burst.
                self._decoder_options["pool_size"] += max(0, out.hard_limit - out.capacity)
        self._demux = demux
        self._decoder: Decoder | None = None  # kept across file passes and live sessions (same format)
        self._surfaces_dropped = 0  # the decoder's own `dropped` count already added to the stats
        self._index = 0
        # Timeline: pts_out = pts + offset; offset set at the first picture of each pass/session.
        self._offset: float | None = None
        self._last_out: float | None = None  # pts of the last frame put out
        self._last_frame_time = 0.0  # time.monotonic() when the last frame's packet arrived
        self._period = 0.0
        self._time_base = 0.0
        self._held: tuple[DecodedPicture, float, float] | None = None  # first picture of a session, no pts
        self._arrivals: collections.deque[tuple[int | None, float]] = collections.deque(maxlen=64)
        # One pacer for all passes of a paced file: the timeline continues, so does the schedule.
        self._pacer = Pacer(stop) if cfg.realtime and not cfg.is_live else None
        # No hardware decoder to be had (DecoderFull): why, and the waits before trying again.
        self._no_decoder: str | None = None
        first = min(max(cfg.reconnect_initial_s, DECODER_WAIT_S), cfg.reconnect_max_s)
        self._decoder_wait = Backoff(first, cfg.reconnect_max_s)
        self._thread = threading.Thread(target=self._run, name=f"stream-{cfg.id}", daemon=True)

    nominal_fps = 0.0  # the source's own frame rate once known (0: the container states none)

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
        """Wait for the thread to end; True when it has (also when it never started: cleanup never raises)."""
        if self._thread.ident is not None:
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
            decoder, self._decoder = self._decoder, None
            if decoder is not None:
                close_later(decoder)  # NVDEC teardown must not hold up other streams' threads
            self._end_analytics()  # before the queue closes: the pipeline cannot finish without these lines
            self.out.close()

    def _end_analytics(self) -> None:
        """The stream's last frame is queued: its analytics closes what is open (tracks still in a zone
        leave it), after the results of the frames still in the detector. The lines go to ``on_lines``."""
        analytics = self.analytics
        if analytics is None:
            return
        try:
            with analytics.lock:  # in order with the result thread's lines of this stream
                lines = analytics.end_of_stream()
                if lines and self.on_lines is not None:
                    self.on_lines(lines)
        except Exception:
            log.exception("stream %s: closing its analytics failed", self.cfg.id)

    # -- open / reconnect ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        cfg = self.cfg
        backoff = Backoff(cfg.reconnect_initial_s, cfg.reconnect_max_s, attempts=cfg.reconnect_attempts)
        down_since: float | None = None
        while not self.stop.is_set():
            self.stats.opens += 1
            try:
                demuxer = open_stream(cfg, annexb=self._decoder_kind == "nvdec", backend=self._demux)
            except SourceError as exc:
                self._failed(exc)
                if not cfg.is_live:
                    log.error("stream %s (%s): %s", cfg.id, cfg.redacted_url, exc)
                    self.stats.state = "failed"
                    return
                down_since = down_since or time.monotonic()
                if not self._retry(backoff, str(exc)):
                    return
                continue
            if down_since is not None:
                log.info(
                    "stream %s (%s): reconnected after %.1f s (reopen attempt %d)",
                    cfg.id, cfg.redacted_url, time.monotonic() - down_since, backoff.failures,
                )  # fmt: skip
                down_since = None
            self.stats.backend = demuxer.backend
            # the open counts as a sign of life: a camera that then sends nothing goes stale from here
            self.stats.last_packet = time.monotonic()
            if self.stats.state != "no_decoder":  # running again once a picture comes (not "behind" before)
                self.stats.state = "running"
            try:
                reason = self._session(demuxer, backoff)
            finally:
                demuxer.close()
            if self.stop.is_set():
                return
            if self._no_decoder is not None:
                reason, self._no_decoder = self._no_decoder, None
                if not self._wait_for_decoder(reason):
                    return
                continue
            if not cfg.is_live:
                if not cfg.loop:
                    return
                continue
            self.stats.reconnects += 1
            down_since = time.monotonic()
            if not self._retry(backoff, reason):
                return

    def _wait_for_decoder(self, reason: str) -> bool:
        """No hardware decoder to be had: wait (backoff) and open the stream again. Never gives up, as
        another stream ending frees a decoder; no CPU fallback, as CPU-decoding 1080p costs about a core per
        few streams and would starve the streams that have decoders. False when ``stop`` is set."""
        cfg = self.cfg
        self.stats.state = "no_decoder"
        self.stats.last_error = reason
        delay = self._decoder_wait.failure() or cfg.reconnect_max_s
        log.warning(
            "stream %s: %s; trying again in %.1f s (fewer streams per GPU, more GPUs in pipeline.devices, or "
            "decoder: cpu take the load)",
            cfg.id, reason, delay,
        )  # fmt: skip
        return not self.stop.wait(delay)

    def _failed(self, exc: Exception) -> None:
        self.stats.read_errors += 1
        self.stats.last_error = str(exc)

    def _retry(self, backoff: Backoff, reason: str) -> bool:
        """Wait before the next attempt; False when the stream gives up or ``stop`` is set."""
        cfg = self.cfg
        delay = backoff.failure()
        if delay is None:
            log.error(
                "stream %s (%s): %s; giving up: %d reopen attempt(s) after the failure failed too "
                "(reconnect_attempts %d)",
                cfg.id, cfg.redacted_url, reason, backoff.reopens, cfg.reconnect_attempts,
            )  # fmt: skip
            self.stats.state = "failed"
            return False
        self.stats.state = "reconnecting"
        left = f" of {cfg.reconnect_attempts}" if cfg.reconnect_attempts else ""
        log.warning(
            "stream %s (%s): %s; reopen attempt %d%s in %.1f s",
            cfg.id, cfg.redacted_url, reason, backoff.failures, left, delay,
        )  # fmt: skip
        return not self.stop.wait(delay)

    # -- one session: demux -> decode -> queue ---------------------------------------------------------------
    def _decoder_for(self, info: VideoInfo) -> Decoder:
        """The stream's decoder, kept from the last pass/session when the format is the same."""
        decoder = self._decoder
        if decoder is not None:
            if decoder.restart(info):
                return decoder
            log.info("stream %s: the stream's format changed; a new decoder takes over", self.cfg.id)
            self._decoder = None
            close_later(decoder)
        kind = self._decoder_kind
        try:
            decoder = create_decoder(kind, info, **self._decoder_options)
        except DecodeError as exc:
            if kind == "cpu":
                raise
            log.warning("stream %s: %s; decoding this stream on the CPU", self.cfg.id, exc)
            low_delay = self._decoder_options.get("low_delay", False)
            decoder = create_decoder("cpu", info, low_delay=low_delay)
        self._decoder = decoder
        self._surfaces_dropped = 0
        self.stats.decoders_created += 1
        self.stats.decoder = decoder.name
        return decoder

    def _session(self, demuxer: Demuxer, backoff: Backoff) -> str:
        """Decode the input until it ends, fails or stalls; returns why it ended (for the log)."""
        cfg = self.cfg
        info = demuxer.info
        decoder = self._decoder_for(info)
        if info.fps:
            self._period = 1.0 / info.fps
            self.nominal_fps = float(info.fps)  # the rate the source promises (overload detection)
        self._period = self._period or DEFAULT_PERIOD_S
        self._time_base = info.time_base
        self._offset = None
        self._held = None
        self._arrivals.clear()
        watch = StallWatch(cfg.stall_timeout_s) if cfg.is_live else None
        pacer = self._pacer
        reason = "the server closed the stream"
        try:
            for packet in demuxer.packets():
                arrived = time.perf_counter()
                if self.stop.is_set():
                    return "stopped"
                self.stats.last_packet = time.monotonic()
                self._arrivals.append((packet.pts, arrived))
                skipped = decoder.skipped
                try:
                    pictures = decoder.decode(packet)
                except DecoderFull as exc:  # not a bad packet: handled below, the session ends
                    self._emit(exc.pictures, 0.0, pacer)  # decoded before the new session failed
                    raise
                except DecodeError as exc:
                    self.stats.decode_errors += 1
                    log.warning("stream %s: undecodable packet skipped (%s)", cfg.id, exc)
                    pictures = []
                if decoder.skipped != skipped:
                    self.stats.decode_errors += decoder.skipped - skipped
                    log.warning("stream %s: %d corrupt picture(s) skipped", cfg.id, decoder.skipped - skipped)
                if pictures and self.stats.state == "no_decoder":
                    self._decoder_wait.success()
                    self.stats.state = "running"
                if watch is not None:
                    watch.packet()
                    if pictures:
                        watch.frame()
                        backoff.success()
                    elif why := watch.stalled():
                        raise _Stall(f"stalled: {why}")
                decode_ms = (time.perf_counter() - arrived) * 1e3 / max(1, len(pictures))
                if not self._emit(pictures, decode_ms, pacer):
                    return "stopped"
            if not cfg.is_live:
                backoff.success()
        except DecoderFull as exc:  # the decoder is given up (it holds nothing usable), not flushed
            reason = self._no_decoder = str(exc)
            self._count_dropped(decoder)
            self._decoder = None
            close_later(decoder)
            if pacer is not None:  # the frames after the wait are due from then, not in a burst
                pacer.reset()
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
            if self._no_decoder is None:
                self._end_session(decoder, pacer)
            self._held = None
        return reason

    def _end_session(self, decoder: Decoder, pacer: Pacer | None) -> None:
        """Flush the decoder (every picture it holds goes out, unless ``stop`` is set) and keep it. Runs
        however the pass or session ended (end of input, read error, truncated file, stall); what the flush
        cannot deliver is counted in ``decode_errors`` and logged."""
        skipped = decoder.skipped
        try:
            pictures = decoder.flush()
        except DecodeError as exc:
            self.stats.decode_errors += 1
            log.warning(
                "stream %s: flushing the decoder failed; the pictures it held are lost (%s)", self.cfg.id, exc
            )
            pictures = []
        if decoder.skipped != skipped:
            self.stats.decode_errors += decoder.skipped - skipped
            log.warning(
                "stream %s: %d damaged picture(s) at the end of the input skipped",
                self.cfg.id,
                decoder.skipped - skipped,
            )
        if self._emit(pictures, 0.0, pacer) and self._held is not None:
            pic, arrived, decode_ms = self._held
            self._held = None
            guess = None if self._last_out is None else self._last_out + self._period
            self._put(pic, guess, arrived, decode_ms, pacer)
        self._held = None
        self._count_dropped(decoder)

    def _count_dropped(self, decoder: Decoder) -> None:
        dropped = int(getattr(decoder, "dropped", 0))
        self.stats.dropped_surfaces += dropped - self._surfaces_dropped
        self._surfaces_dropped = dropped

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

    # -- timestamps and arrival times ----------------------------------------------------------------------
    def _arrival(self, pts: float | None) -> float:
        """perf_counter() time the packet of the picture with ``pts`` (seconds) arrived."""
        arrivals = self._arrivals
        if not arrivals:
            return time.perf_counter()
        if pts is not None and self._time_base:
            key = round(pts / self._time_base)
            for i, (p, t) in enumerate(arrivals):
                if p == key:
                    del arrivals[i]
                    return t
        for i, (p, t) in enumerate(arrivals):  # no pts to match: the oldest packet without one
            if p is None:
                del arrivals[i]
                return t
        return arrivals.popleft()[1]

    def _timeline(self, pts: float, arrived: float) -> float:
        """The source's pts (seconds, this pass/session) on the stream's continuous timeline."""
        if self._offset is None:  # the first picture of this pass or session
            if self._last_out is None:
                self._offset = 0.0  # the source's own timeline
            else:
                gap = 0.0
                if self.cfg.is_live:
                    now_mono, now_perf = time.monotonic(), time.perf_counter()
                    gap = (now_mono - (now_perf - arrived)) - self._last_frame_time
                self._offset = self._last_out + max(self._period, gap) - pts
        return pts + self._offset

    def _emit(self, pictures: list[DecodedPicture], decode_ms: float, pacer: Pacer | None) -> bool:
        """Queue the pictures as Frames; False when ``stop`` was set while waiting."""
        live = self.cfg.is_live
        for pic in pictures:
            arrived = self._arrival(pic.pts)
            if pic.pts is None:
                if live and self._offset is None and self._held is None:
                    self._held = (pic, arrived, decode_ms)  # its pts comes from the next picture
                    continue
                guess = None
                if self._last_out is not None and (live or self._offset is not None):
                    guess = self._last_out + self._period
                if not self._put(pic, guess, arrived, decode_ms, pacer):
                    return False
                continue
            if self._held is not None:
                held, held_arrived, held_ms = self._held
                self._held = None
                first = self._timeline(pic.pts - self._period, held_arrived)
                if not self._put(held, first, held_arrived, held_ms, pacer):
                    return False
            if not self._put(pic, self._timeline(pic.pts, arrived), arrived, decode_ms, pacer):
                return False
        return True

    def _put(
        self, pic: DecodedPicture, pts: float | None, arrived: float, decode_ms: float, pacer: Pacer | None
    ) -> bool:
        if pacer is not None:
            if not pacer.wait(pts):
                return False
            arrived = time.perf_counter()  # a paced file "arrives" when the pacer releases it
        now = time.perf_counter()
        frame = Frame(
            self.cfg.id,
            self._index,
            pts,
            pic.width,
            pic.height,
            image=pic.image,
            surface=pic.surface,
            wall_time=time.time(),
            t_decoded=now,
            decode_ms=decode_ms,
            t_arrival=arrived,
        )
        self._index += 1
        self.stats.decoded += 1
        if pts is not None:
            self._last_out = pts
        self._last_frame_time = time.monotonic() - (now - arrived)
        if self.analytics is not None and not self._detect(frame):
            return True
        if self.on_frame is not None:
            self.on_frame(frame)
        return self.out.put(frame, self.stop)
