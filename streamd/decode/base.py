"""The decoder contract shared by the CPU (PyAV) and NVDEC (PyNvVideoCodec) twins.

Hop: ``Packet`` (compressed, decode order) -> ``Decoder.decode`` -> ``DecodedPicture`` (display order).
A decoder decodes *every* packet it is given and never skips one, so P/B frames keep their references;
dropping happens later, after decode, in the stream's queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from streamd.sources.base import Packet


class DecodeError(RuntimeError):
    """A packet could not be decoded (corrupt or truncated data); the caller counts it and goes on."""


@dataclass(slots=True)
class DecodedPicture:
    """One decoded picture.

    CPU decoder: ``image`` is a host BGR uint8 array (H, W, 3). NVDEC: ``surface`` is an
    :class:`~streamd.decode.nvdec.NV12Surface` in device memory and ``image`` is None. ``pts`` in seconds.
    ``luma`` is the host Y plane (H, W) uint8, filled only by ``CpuDecoder(keep_luma=True)`` (tests).
    """

    pts: float | None
    width: int
    height: int
    image: np.ndarray | None = None
    surface: Any = None
    luma: np.ndarray | None = None


class Decoder(Protocol):
    """Packets in, pictures out. ``decode`` may return 0..n pictures (reordering delay); ``flush`` returns
    what is still buffered at the end of a stream; ``close`` is safe to call twice. ``skipped`` counts
    pictures decoded but withheld as corrupt."""

    name: str
    skipped: int

    def decode(self, packet: Packet) -> list[DecodedPicture]: ...
    def flush(self) -> list[DecodedPicture]: ...
    def close(self) -> None: ...
