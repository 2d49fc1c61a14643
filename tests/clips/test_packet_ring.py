"""The packet ring on synthetic packets: what it keeps (by time and by bytes), sessions starting at a key
frame, packets stamped once their session is placed on the timeline."""

from __future__ import annotations

from streamd.ingest.packet_ring import PacketRing
from streamd.ingest.sources.base import Packet, VideoInfo

INFO = VideoInfo(codec="h264", width=64, height=48, fps=10.0, time_base=0.01)  # pts in 1/100 s


def packets(first: int, count: int, gop: int = 10, size: int = 100) -> list[Packet]:
    """``count`` packets at 10 fps from frame ``first`` (pts in 1/100 s), a key frame every ``gop``."""
    return [Packet(bytes([i % 256]) * size, i * 10, i % gop == 0) for i in range(first, first + count)]


def filled(n: int = 35, **kw) -> PacketRing:
    ring = PacketRing(kw.pop("max_bytes", 10**6))
    ring.begin(INFO)
    ring.place(0.0)
    for p in packets(0, n, **kw):
        ring.push(p)
    return ring


def test_stamps_on_the_timeline_and_keeps_everything_under_the_caps():
    ring = filled()
    assert [round(p.t, 6) for p in ring.packets] == [i / 10 for i in range(35)]
    assert ring.bytes == 3500 and ring.newest == 3.4


def test_trim_keeps_the_last_key_frame_before_the_pre_roll():
    ring = filled()
    ring.trim(2.5)  # key frames at 0, 1, 2, 3 s: 2.0 is the last one at or before 2.5
    assert ring.packets[0].t == 2.0 and ring.packets[0].key and len(ring.packets) == 15
    ring.trim(3.0)  # exactly on a key frame
    assert ring.packets[0].t == 3.0 and ring.bytes == 500
    ring.trim(10.0)  # never the last group
    assert ring.packets[0].t == 3.0


def test_bytes_cap_drops_whole_groups():
    # 100-byte packets in groups of 10: the 16th packet (1600 bytes) drops the first group, the 26th the
    # second; 20..34 are 1500 bytes, not over the cap
    ring = filled(max_bytes=1500)
    assert ring.packets[0].key and ring.packets[0].t == 2.0 and ring.bytes == 1500
    assert ring.trimmed == 2


def test_since_starts_on_the_key_frame_at_or_before():
    ring = filled()
    assert ring.since(1.7)[0].t == 1.0 and ring.since(1.7)[-1].t == 3.4
    assert ring.since(2.0)[0].t == 2.0
    assert ring.since(-5.0)[0].t == 0.0  # not that much history: the oldest key frame


def test_a_session_is_stored_from_its_first_key_frame_and_placed_later():
    ring = filled(20)
    ring.begin(INFO)  # a reconnect: source pts start again at 0.05 s, not at a key frame
    second = [Packet(b"x" * 100, 5 + 10 * i, i == 3) for i in range(6)]
    stored = [ring.push(p) for p in second]
    assert stored[:3] == [None] * 3 and all(e is not None and e.t is None for e in stored[3:])
    placed = ring.place(10.0)  # the timeline continues at 10 s + source pts
    assert [round(e.t, 6) for e in placed] == [10.35, 10.45, 10.55]
    assert ring.newest == 10.55 and len(ring.packets) == 23


def test_a_packet_without_pts_takes_its_neighbours_period():
    ring = PacketRing(10**6)
    ring.begin(INFO)
    ring.push(Packet(b"k" * 10, None, True))  # an RTSP session's first packet: no pts
    ring.push(Packet(b"p" * 10, 130, False))
    ring.place(-1.0)
    ring.push(Packet(b"q" * 10, None, False))
    assert [round(p.t, 6) for p in ring.packets] == [0.2, 0.3, 0.4]
