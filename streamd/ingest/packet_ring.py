"""A stream's recent compressed packets, for event clips with pre-roll (``streamd.clips``).

The stream thread hands every demuxed packet over before it is decoded (``StreamReader.packet_tap``); a
copy of its bytes goes in, so the ring never holds a decoder's buffer or a decoded picture. Packets are in
decode order, each stamped on the stream's continuous timeline (the ``pts`` of its frame lines): a session's
source pts plus that session's offset, which the stream thread reports with its first frame (``place``);
until then a session's packets wait unstamped.

Bounded twice: by time — the ring keeps the last key frame at or before ``keep_from`` and everything after
it, so a clip can always start on a key frame — and by bytes: past ``max_bytes`` the oldest whole group of
pictures goes (the pre-roll then shrinks; counted in ``trimmed``). A session starts storing at its first key
frame, so every stored packet's references are in the ring.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from streamd.ingest.sources.base import Packet, VideoInfo


@dataclass(slots=True)
class RingPacket:
    """One compressed picture: ``data`` (its own bytes), ``t`` (seconds on the stream's timeline; None until
    its session is placed), ``key`` (a key frame), ``info`` (the session's stream parameters)."""

    data: bytes
    src: float | None  # the source's pts in seconds (None: the container gave none)
    t: float | None
    key: bool
    info: VideoInfo
    session: int


class PacketRing:
    """Recent packets of one stream, oldest first (see the module docstring). Not thread-safe: the caller
    (``streamd.clips.recorder.ClipRecorder``) holds its lock."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.packets: collections.deque[RingPacket] = collections.deque()
        self._keys: collections.deque[RingPacket] = collections.deque()  # the key frames in packets
        self.bytes = 0
        self.trimmed = 0  # groups of pictures dropped for max_bytes
        self._session = 0
        self._info: VideoInfo | None = None
        self._offset: float | None = None
        self._keyed = False  # this session has had its first key frame
        self._unplaced: list[RingPacket] = []  # this session's packets before its offset is known
        self._period = 0.04

    def begin(self, info: VideoInfo) -> None:
        """A new session (a reconnect, a file's next pass), stored from its first key frame on."""
        self._session += 1
        self._info = info
        self._offset = None
        self._keyed = False
        self._unplaced = []
        self._period = 1.0 / info.fps if info.fps else self._period

    def push(self, packet: Packet) -> RingPacket | None:
        """Store a packet (None: not stored, the session has had no key frame yet)."""
        if self._info is None or not (self._keyed or packet.is_key):
            return None
        self._keyed = True
        src = None if packet.pts is None else packet.pts * self._info.time_base
        entry = RingPacket(packet.view().tobytes(), src, None, bool(packet.is_key), self._info, self._session)
        if self._offset is None:
            self._unplaced.append(entry)
        else:
            last = self.packets[-1] if self.packets else None
            entry.t = self._stamp(src, last.t if last is not None and last.session == self._session else None)
        self.packets.append(entry)
        if entry.key:
            self._keys.append(entry)
        self.bytes += len(entry.data)
        while self.bytes > self.max_bytes and self._drop_group():
            self.trimmed += 1
        return entry

    def place(self, offset: float) -> list[RingPacket]:
        """The session's offset (timeline pts minus source pts), known from its first frame; returns the
        packets it stamped."""
        if self._offset is not None:
            return []
        self._offset = offset
        placed, self._unplaced = self._unplaced, []
        last = None
        for entry in placed:
            entry.t = last = self._stamp(entry.src, last)
        following = None  # a first packet without pts: one period before the next one
        for entry in reversed(placed):
            if entry.t is None and following is not None:
                entry.t = following - self._period
            following = entry.t
        return placed

    @property
    def newest(self) -> float | None:
        """The latest timeline time stamped so far."""
        for entry in reversed(self.packets):
            if entry.t is not None:
                return entry.t
        return None

    def trim(self, keep_from: float) -> None:
        """Drop what no clip starting at ``keep_from`` or later needs: everything before the last key frame at
        or before ``keep_from``."""
        while len(self._keys) > 1:
            t = self._keys[1].t
            if t is None or t > keep_from:
                return
            self._drop_group()

    def since(self, start: float) -> list[RingPacket]:
        """The packets from the last key frame at or before ``start`` (else the oldest key frame) on."""
        packets = list(self.packets)
        first = None
        for i, entry in enumerate(packets):
            if entry.key and (first is None or (entry.t is not None and entry.t <= start)):
                first = i
            if entry.t is not None and entry.t > start:
                break
        return [] if first is None else packets[first:]

    def _stamp(self, src: float | None, last: float | None) -> float | None:
        """Timeline time of a packet with source pts ``src``; without one (an RTSP session's first
        packet, a broken container): one period after the session's ``last`` packet."""
        if self._offset is None:
            return None
        if src is None:
            return None if last is None else last + self._period
        return src + self._offset

    def _drop_group(self) -> bool:
        """Drop the oldest group of pictures (its key frame up to the next); False when only one is left."""
        packets, keys = self.packets, self._keys
        if len(keys) < 2:
            return False
        keys.popleft()
        while packets and packets[0] is not keys[0]:
            self.bytes -= len(packets.popleft().data)
        return True
