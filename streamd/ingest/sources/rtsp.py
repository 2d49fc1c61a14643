"""RTSP cameras: FFmpeg's RTSP client (through either demux backend) with our transport and probe options.

TCP (RTP interleaved in the RTSP connection) is the default: it survives NAT and loss; UDP is lower latency
but drops on lossy links. The probe is kept short (``analyzeduration`` 0.5 s, ``probesize`` 512 KiB) because
the SDP already carries codec and size; FFmpeg's default probe waits about 2 s for a 10 fps camera, which
would add to every reconnect. Timeouts are the demuxer's (FFmpeg interrupt callback), not FFmpeg's
``timeout`` option, whose meaning differs between FFmpeg versions (listen mode in old ones). A read on a hung
RTSP connection returns within about twice the read timeout (FFmpeg's RTSP client retries once).

Reconnecting (backoff, stall detection) is the stream thread's job (``streamd/ingest/reader.py``): it reopens
through :func:`open_rtsp` after every failure.
"""

from __future__ import annotations

from streamd.ingest.sources.base import Demuxer, DemuxOptions

ANALYZE_DURATION_US = 500_000
PROBE_SIZE = 512 * 1024


def rtsp_options(transport: str = "tcp") -> dict[str, str]:
    """FFmpeg demuxer options for one RTSP session (same keys for PyAV and OpenCV)."""
    if transport not in ("tcp", "udp"):
        raise ValueError(f"rtsp transport: expected 'tcp' or 'udp', got {transport!r}")
    return {
        "rtsp_transport": transport,
        "analyzeduration": str(ANALYZE_DURATION_US),
        "probesize": str(PROBE_SIZE),
    }


def open_rtsp(url: str, options: DemuxOptions) -> Demuxer:
    """Open one RTSP session; raises SourceError (SourceTimeout: silent server), credentials redacted."""
    from streamd.ingest.sources.backends import open_demuxer

    return open_demuxer(url, options, rtsp_options(options.transport))
