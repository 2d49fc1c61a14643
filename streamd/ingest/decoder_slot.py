"""A stream's decoder across file passes and live sessions: kept, restarted, replaced, or given up.

At the end of a pass or session the decoder is flushed (every picture it holds is delivered) and *kept* for
the next one when the stream's format (codec, size, extradata) is unchanged; only a changed format makes a
new decoder, and the old one is closed on a background thread. So neither a loop nor a reconnect creates or
tears down a decoder. A hardware decoder that cannot be made for another reason is replaced by a CPU one.
A GPU that holds no more hardware decoders (``DecoderFull``) is not the stream's fault: the decoder is given
up and the stream waits with backoff before it opens again.
"""

from __future__ import annotations

import threading
from typing import Any

from streamd.config import StreamConfig
from streamd.ingest import log
from streamd.ingest.decode import (
    DecodedPicture,
    DecodeError,
    Decoder,
    DecoderFull,
    close_later,
    create_decoder,
)
from streamd.ingest.sources import Packet, VideoInfo
from streamd.ingest.sources.backoff import Backoff
from streamd.ingest.stats import StreamStats

# First wait for a hardware decoder (up to reconnect_max_s): decoders free up only when other streams end, and
# many streams retrying every half second slow the running ones down (bench/RESULTS.md).
DECODER_WAIT_S = 5.0


class DecoderSlot:
    """The decoder of one stream (``kind``: ``cpu`` or ``nvdec``, made with ``options``); counts into
    ``stats`` (decode errors, decoders made, dropped surfaces, the decoder in use, the ``no_decoder`` state).
    """

    def __init__(self, cfg: StreamConfig, stats: StreamStats, kind: str, options: dict[str, Any]) -> None:
        self.cfg = cfg
        self.stats = stats
        self.kind = kind
        self.options = options
        self.decoder: Decoder | None = None
        self.no_decoder: str | None = None  # why the GPU gave no decoder (DecoderFull), until the wait
        self._surfaces_dropped = 0  # the decoder's own `dropped` count already added to the stats
        first = min(max(cfg.reconnect_initial_s, DECODER_WAIT_S), cfg.reconnect_max_s)
        self._wait = Backoff(first, cfg.reconnect_max_s)

    def get(self, info: VideoInfo) -> Decoder:
        """The decoder for the pass/session described by ``info``: the last one if the format is unchanged."""
        decoder = self.decoder
        if decoder is not None:
            if decoder.restart(info):
                return decoder
            log.info("stream %s: the stream's format changed; a new decoder takes over", self.cfg.id)
            self.decoder = None
            close_later(decoder)
        kind = self.kind
        try:
            decoder = create_decoder(kind, info, **self.options)
        except DecodeError as exc:
            if kind == "cpu":
                raise
            log.warning("stream %s: %s; decoding this stream on the CPU", self.cfg.id, exc)
            low_delay = self.options.get("low_delay", False)
            decoder = create_decoder("cpu", info, low_delay=low_delay, lazy=True)
        self.decoder = decoder
        self._surfaces_dropped = 0
        self.stats.decoders_created += 1
        self.stats.decoder = decoder.name
        return decoder

    def decode(self, packet: Packet) -> list[DecodedPicture]:
        """The pictures ``packet`` completes; a packet the decoder rejects is counted and logged, and gives
        none. Raises DecoderFull (the GPU has no room for the decoder)."""
        decoder = self.decoder
        assert decoder is not None
        skipped = decoder.skipped
        try:
            pictures = decoder.decode(packet)
        except DecoderFull:  # not a bad packet: the caller gives the decoder up
            raise
        except DecodeError as exc:
            self.stats.decode_errors += 1
            log.warning("stream %s: undecodable packet skipped (%s)", self.cfg.id, exc)
            pictures = []
        self._count_skipped(decoder, skipped, "stream %s: %d corrupt picture(s) skipped")
        self.count_dropped()
        if pictures and self.stats.state == "no_decoder":
            self._wait.success()
            self.stats.state = "running"
        return pictures

    def flush(self) -> list[DecodedPicture]:
        """Every picture the decoder still holds (end of a pass or session); the decoder is kept. What the
        flush cannot deliver is counted in ``decode_errors`` and logged."""
        decoder = self.decoder
        assert decoder is not None
        skipped = decoder.skipped
        try:
            pictures = decoder.flush()
        except DecodeError as exc:
            self.stats.decode_errors += 1
            log.warning(
                "stream %s: flushing the decoder failed; the pictures it held are lost (%s)", self.cfg.id, exc
            )
            pictures = []
        self._count_skipped(
            decoder, skipped, "stream %s: %d damaged picture(s) at the end of the input skipped"
        )
        self.count_dropped()
        return pictures

    def give_up(self, reason: str) -> None:
        """The GPU has no room for this decoder (DecoderFull): it holds nothing usable, so it is closed, not
        flushed; :meth:`wait` comes next."""
        decoder = self.decoder
        assert decoder is not None
        self.no_decoder = reason
        self.count_dropped()
        self.decoder = None
        close_later(decoder)

    def wait(self, stop: threading.Event) -> bool:
        """No hardware decoder to be had: wait (backoff) before the stream opens again. Never gives up, as
        another stream ending frees a decoder; no CPU fallback, as CPU-decoding 1080p costs about a core per
        few streams and would starve the streams that have decoders. False when ``stop`` is set."""
        reason, self.no_decoder = self.no_decoder or "", None
        self.stats.state = "no_decoder"
        self.stats.last_error = reason
        delay = self._wait.failure() or self.cfg.reconnect_max_s
        log.warning(
            "stream %s: %s; trying again in %.1f s (fewer streams per GPU, more GPUs in pipeline.devices, or "
            "decoder: cpu take the load)",
            self.cfg.id,
            reason,
            delay,
        )
        return not stop.wait(delay)

    def count_dropped(self) -> None:
        """Add the pictures the decoder dropped since the last count (NVDEC: every pooled surface was held
        downstream) to the stats; after each decode and flush, and when a deferred copy finds no buffer."""
        dropped = int(getattr(self.decoder, "dropped", 0))
        self.stats.dropped_surfaces += dropped - self._surfaces_dropped
        self._surfaces_dropped = dropped

    def close(self) -> None:
        """The stream ends: its decoder closes on the background thread (an NVDEC teardown must not hold up
        other streams' threads)."""
        decoder, self.decoder = self.decoder, None
        if decoder is not None:
            close_later(decoder)

    def _count_skipped(self, decoder: Decoder, before: int, message: str) -> None:
        """Pictures the decoder withheld as corrupt since ``before`` count as decode errors, logged."""
        if decoder.skipped != before:
            self.stats.decode_errors += decoder.skipped - before
            log.warning(message, self.cfg.id, decoder.skipped - before)
