"""Decoders: compressed packets -> pictures. ``cpu`` (PyAV, host BGR) and ``nvdec`` (PyNvVideoCodec, device
NV12), same interface (:class:`~.base.Decoder`). Both are imported lazily, so importing this
package needs neither PyAV nor any GPU package.
"""

from __future__ import annotations

from typing import Any

from streamd.ingest.decode.base import (
    DecodedPicture,
    DecodeError,
    Decoder,
    DecoderFull,
    close_later,
    same_format,
    wait_closed,
)
from streamd.ingest.sources.base import VideoInfo

DECODERS = ("cpu", "nvdec")

__all__ = [
    "DECODERS",
    "DecodeError",
    "DecodedPicture",
    "Decoder",
    "DecoderFull",
    "close_later",
    "create_decoder",
    "same_format",
    "wait_closed",
]


def create_decoder(kind: str, info: VideoInfo, **options: Any) -> Decoder:
    """A decoder of ``kind`` (``cpu`` | ``nvdec``) for the stream described by ``info``.

    NVDEC needs Annex-B packets (open the source with ``annexb=True``). Options go to the decoder's
    constructor (``low_delay`` for both: live streams; ``threads`` for cpu; ``device``, ``pool_size`` ...
    for nvdec).
    """
    if kind == "cpu":
        try:
            from streamd.ingest.decode.cpu import CpuDecoder
        except ImportError as exc:
            raise DecodeError(f"the CPU decoder needs PyAV ({exc}); pip install av") from None
        return CpuDecoder(info, **options)
    if kind == "nvdec":
        from streamd.ingest.decode.nvdec import NvdecDecoder

        return NvdecDecoder(info, **options)
    raise ValueError(f"decoder: expected one of {', '.join(DECODERS)}, got {kind!r}")
