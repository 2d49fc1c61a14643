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

Live streams (and files paced in real time) decode with low delay (no frame threading on the CPU, the lowest
display delay on NVDEC). The decoder's lifecycle across passes and sessions is the :class:`DecoderSlot`'s
(``decoder_slot.py``); indices, pts and arrival times are the :class:`Timeline`'s (``timeline.py``).
With ``detect_fps`` on NVDEC, the decoder's copy of a picture into its pool is deferred until the frame is
known to go on to the detector (``NvdecDecoder(defer_copy=True)``): a skipped frame is never copied.
``Frame.t_arrival`` is when the demuxer received the picture's packet (for paced files: when the pacer
released the picture), the start of ``latency_ms.arrival``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from streamd.config import StreamConfig
from streamd.ingest import log
from streamd.ingest.decode import DecodedPicture, DecoderFull
from streamd.ingest.decoder_slot import DecoderSlot
from streamd.ingest.sources import Demuxer, DemuxOptions, Packet, SourceError, VideoInfo, open_stream
from streamd.ingest.sources.backoff import Backoff, StallWatch
from streamd.ingest.sources.file import Pacer
from streamd.ingest.stats import StreamStats
from streamd.ingest.timeline import Stamp, Timeline
from streamd.types import Frame

if TYPE_CHECKING:
    from streamd.analytics.annotations import Output

_Picture = tuple[
    DecodedPicture, float
]  # a decoded picture and its decode time (ms), as the timeline holds it


class FrameQueue(Protocol):
    """Where a stream's decoded frames go (``streamd.pipeline.batcher.StreamQueue``): ``latest`` drops the
    oldest when really behind, ``block`` makes the decoder wait."""

    policy: str
    capacity: int
    hard_limit: int

    def put(self, frame: Frame, stop: threading.Event) -> bool: ...

    def close(self) -> None: ...


class PacketTap(Protocol):
    """Sees the stream's compressed packets before they are decoded (``streamd.clips.ClipRecorder``): per
    session ``begin``, then ``packet`` for each; ``place`` gets the session's timeline offset (a frame's pts
    minus its source pts) with every frame put out; ``end`` when the stream thread stops."""

    def begin(self, info: VideoInfo) -> None: ...
    def packet(self, packet: Packet) -> None: ...
    def place(self, offset: float) -> None: ...
    def end(self) -> None: ...


class _Stall(SourceError):
    """No packet or no decoded frame for stall_timeout_s on a live stream."""


class StreamReader:
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
        on_lines: Callable[[list[Output]], None] | None = None,
    ) -> None:
        """``analytics``: the stream's ``streamd.analytics.StreamAnalytics`` (detect_fps skips, predicted
        lines, the zone leaves when the stream ends); ``on_lines`` takes the lines it writes for skipped
        frames and at the end of the stream."""
        self.cfg = cfg
        self.analytics = analytics
        self.on_lines = on_lines
        self.on_frame: Callable[[Frame], None] | None = None  # the status page's copy of a GPU frame
        self.packet_tap: PacketTap | None = None  # event clips: the packets, before decode
        self.out = out
        self.stop = stop
        self.stats = StreamStats(decoder=decoder)
        self.nominal_fps = 0.0  # the source's own frame rate once known (0: the container states none)
        options = dict(decoder_options or {})
        options.setdefault("low_delay", cfg.is_live or cfg.realtime)
        if decoder == "cpu":  # pictures converted when batched: none for a frame dropped or skipped before
            options.setdefault("lazy", True)
        if decoder == "nvdec":
            options.setdefault("device", device)
            if analytics is not None and analytics.rate is not None:  # detect_fps: copy only what goes on
                options.setdefault("defer_copy", True)
            if "pool_size" in options and out.policy == "latest":
                # The queue may hold up to hard_limit pictures while it works off a burst.
                options["pool_size"] += max(0, out.hard_limit - out.capacity)
        self.slot = DecoderSlot(cfg, self.stats, decoder, options)
        self.timeline: Timeline[_Picture] = Timeline(cfg.is_live)
        self.demux = DemuxOptions.for_stream(cfg, backend=demux, annexb=decoder == "nvdec")
        # One pacer for all passes of a paced file: the timeline continues, so does the schedule.
        self._pacer = Pacer(stop) if cfg.realtime and not cfg.is_live else None
        self._thread = threading.Thread(target=self._run, name=f"stream-{cfg.id}", daemon=True)

    def position(self) -> tuple[int, float | None, float]:
        """Where the stream is: the next frame's index, the last frame's pts (None: none yet) and the
        ``time.monotonic()`` its packet arrived (0.0: no frame yet), for a successor to continue from."""
        tl = self.timeline
        if tl.last_arrival is None:
            return tl.index, tl.last_pts, 0.0
        return tl.index, tl.last_pts, time.monotonic() - (time.perf_counter() - tl.last_arrival)

    def resume_at(self, index: int, pts: float | None, wall_time: float) -> None:
        """Continue a stream whose worker process was restarted: frame indices from ``index``, timestamps
        after ``pts`` with the real outage (since ``wall_time``, Unix time) as the jump."""
        self.timeline.resume_at(index, pts, max(0.0, time.time() - wall_time))

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
            self.slot.close()
            if self.packet_tap is not None:
                self.packet_tap.end()
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
                outputs = analytics.stream_ended()
                if outputs and self.on_lines is not None:
                    self.on_lines(outputs)
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
                demuxer = open_stream(cfg, self.demux)
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
                    cfg.id,
                    cfg.redacted_url,
                    time.monotonic() - down_since,
                    backoff.failures,
                )
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
            if self.slot.no_decoder is not None:
                if not self.slot.wait(self.stop):
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
                cfg.id,
                cfg.redacted_url,
                reason,
                backoff.reopens,
                cfg.reconnect_attempts,
            )
            self.stats.state = "failed"
            return False
        self.stats.state = "reconnecting"
        left = f" of {cfg.reconnect_attempts}" if cfg.reconnect_attempts else ""
        log.warning(
            "stream %s (%s): %s; reopen attempt %d%s in %.1f s",
            cfg.id,
            cfg.redacted_url,
            reason,
            backoff.failures,
            left,
            delay,
        )
        return not self.stop.wait(delay)

    # -- one session: demux -> decode -> queue ---------------------------------------------------------------
    def _session(self, demuxer: Demuxer, backoff: Backoff) -> str:
        """Decode the input until it ends, fails or stalls; returns why it ended (for the log)."""
        cfg, slot, timeline = self.cfg, self.slot, self.timeline
        info = demuxer.info
        slot.get(info)
        tap = self.packet_tap
        if tap is not None:
            tap.begin(info)
        if info.fps:
            self.nominal_fps = float(info.fps)  # the rate the source promises (overload detection)
        timeline.begin(info.fps, info.time_base)
        watch = StallWatch(cfg.stall_timeout_s) if cfg.is_live else None
        pacer = self._pacer
        reason = "the server closed the stream"
        try:
            for packet in demuxer.packets():
                arrived = time.perf_counter()
                if self.stop.is_set():
                    return "stopped"
                self.stats.last_packet = time.monotonic()
                timeline.packet(packet.pts, arrived)
                if tap is not None:
                    tap.packet(packet)
                try:
                    pictures = slot.decode(packet)
                except DecoderFull as exc:  # handled below, the session ends
                    self._emit(exc.pictures, 0.0, pacer)  # decoded before the new session failed
                    raise
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
            reason = str(exc)
            slot.give_up(reason)
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
            if slot.no_decoder is None:
                self._end_session(pacer)
            timeline.end()
        return reason

    def _end_session(self, pacer: Pacer | None) -> None:
        """Flush the decoder (every picture it holds goes out, unless ``stop`` is set) and keep it. Runs
        however the pass or session ended (end of input, read error, truncated file, stall)."""
        if self._emit(self.slot.flush(), 0.0, pacer) and (held := self.timeline.release_held()) is not None:
            self._put(held, pacer)

    def _emit(self, pictures: list[DecodedPicture], decode_ms: float, pacer: Pacer | None) -> bool:
        """Queue the pictures as Frames; False when ``stop`` was set while waiting."""
        for pic in pictures:
            for stamp in self.timeline.picture((pic, decode_ms), pic.pts):
                if not self._put(stamp, pacer):
                    return False
        return True

    def _put(self, stamp: Stamp[_Picture], pacer: Pacer | None) -> bool:
        (pic, decode_ms), pts, arrived = stamp.item, stamp.pts, stamp.arrived
        if pacer is not None:
            if not pacer.wait(pts):
                return False
            arrived = time.perf_counter()  # a paced file "arrives" when the pacer releases it
        if self.packet_tap is not None and pts is not None and pic.pts is not None:
            self.packet_tap.place(pts - pic.pts)
        now = time.perf_counter()
        frame = Frame(
            self.cfg.id,
            self.timeline.commit(pts, arrived),
            pts,
            pic.width,
            pic.height,
            image=pic.image,
            surface=pic.surface,
            pending=pic.pending,
            wall_time=time.time(),
            t_decoded=now,
            decode_ms=decode_ms,
            t_arrival=arrived,
        )
        self.stats.decoded += 1
        deferred = pic.deferred
        if self.analytics is not None and not self._detect(frame):
            if deferred is not None:
                deferred.release()  # skipped: never copied out of the decoder
            return True
        if deferred is not None:
            frame.surface = deferred.take()
            if frame.surface is None:  # every pooled buffer held downstream: dropped, counted
                self.slot.count_dropped()
                return True
        if self.on_frame is not None:
            self.on_frame(frame)
        return self.out.put(frame, self.stop)

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
            frame.surface = frame.image = frame.pending = None
            outputs = analytics.skip(frame)
            if outputs and self.on_lines is not None:
                self.on_lines(outputs)
        return False
