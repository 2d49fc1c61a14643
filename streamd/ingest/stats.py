"""The counters of one stream's thread."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(slots=True)
class StreamStats:
    """Counters of one stream, written by its thread (``streamd.ingest.reader``) and read from another thread
    by the worker's pipeline (``streamd.worker.pipeline``), which reports them to the supervisor (metrics,
    status line, status page)."""

    decoded: int = 0
    decode_errors: int = 0  # packets the decoder rejected (corrupt data); the stream went on
    read_errors: int = 0  # failed opens and reads (refused, timeout, truncated file, stall)
    state: str = "starting"  # starting | running | reconnecting | no_decoder | ended | failed
    reconnects: int = 0  # sessions reopened after a failure (live streams)
    stalls: int = 0  # sessions given up because nothing arrived for stall_timeout_s
    # NVDEC pictures dropped because downstream held every pooled buffer (with detect_fps they are counted
    # in `decoded` too: the copy is made after the decision, see NvdecDecoder(defer_copy))
    dropped_surfaces: int = 0
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
