"""The stream timeline on its own: pts and arrival times in, pts, arrival times and indices out (no server, no
decoder, no real clock)."""

from __future__ import annotations

import pytest

from streamd.ingest.timeline import DEFAULT_PERIOD_S, Stamp, Timeline

TB = 1 / 25  # time base of the packets: one tick per frame at 25 fps
P = 1 / 25  # the frame period


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def session(
    tl: Timeline[str], ticks: list[int | None], arrivals: list[float], order: list[int] | None = None
) -> list[Stamp[str]]:
    """One pass/session: packets with pts ``ticks`` arriving at ``arrivals``; the decoder gives the pictures
    in ``order`` (display order; default: decode order), each at once. Every stamp is put out."""
    tl.begin(25.0, TB)
    for tick, t in zip(ticks, arrivals, strict=True):
        tl.packet(tick, t)
    out = []
    for k in order or range(len(ticks)):
        tick = ticks[k]
        out += put(tl, tl.picture(f"pic{k}", None if tick is None else tick * TB))
    if (held := tl.release_held()) is not None:
        out += put(tl, [held])
    tl.end()
    return out


def put(tl: Timeline[str], stamps: list[Stamp[str]]) -> list[Stamp[str]]:
    for s in stamps:
        tl.commit(s.pts, s.arrived)
    return stamps


def pts(stamps: list[Stamp[str]]) -> list[float | None]:
    return [None if s.pts is None else round(s.pts, 6) for s in stamps]


def test_the_first_pass_keeps_the_sources_own_pts_and_counts_frames() -> None:
    tl: Timeline[str] = Timeline(live=False, clock=Clock())
    out = session(tl, [10, 11, 12], [1.0, 2.0, 3.0])
    assert pts(out) == [0.4, 0.44, 0.48]
    assert [s.arrived for s in out] == [1.0, 2.0, 3.0]
    assert (tl.index, tl.last_pts, tl.last_arrival) == (3, pytest.approx(0.48), 3.0)


def test_a_live_sessions_first_picture_without_pts_is_held_and_takes_the_next_one_less_a_period() -> None:
    tl: Timeline[str] = Timeline(live=True, clock=Clock())
    tl.begin(25.0, TB)
    for tick, t in [(None, 1.0), (1, 2.0), (2, 3.0)]:
        tl.packet(tick, t)
    assert tl.picture("first", None) == []  # held: nothing to put out yet
    out = put(tl, tl.picture("second", 1 * TB))
    assert [s.item for s in out] == ["first", "second"]
    assert pts(out) == [0.0, 0.04]
    assert [s.arrived for s in out] == [1.0, 2.0]  # the held picture keeps its own packet's arrival
    assert tl.index == 2


def test_a_held_picture_at_the_end_of_a_session_comes_one_period_after_the_last_frame() -> None:
    tl: Timeline[str] = Timeline(live=True, clock=Clock())
    session(tl, [5, 6], [1.0, 2.0])  # pts 0.2, 0.24
    tl.begin(25.0, TB)
    tl.packet(None, 9.0)
    assert tl.picture("lonely", None) == []  # the session ends before another picture
    held = tl.release_held()
    assert held is not None and held.item == "lonely" and held.arrived == 9.0
    assert held.pts == pytest.approx(0.24 + P)
    assert tl.release_held() is None


def test_a_held_picture_of_a_first_session_that_ends_at_once_has_no_pts() -> None:
    tl: Timeline[str] = Timeline(live=True, clock=Clock())
    tl.begin(25.0, TB)
    tl.packet(None, 1.0)
    assert tl.picture("only", None) == []
    held = tl.release_held()
    assert held is not None and held.pts is None


def test_end_drops_a_held_picture() -> None:
    tl: Timeline[str] = Timeline(live=True, clock=Clock())
    tl.begin(25.0, TB)
    tl.packet(None, 1.0)
    tl.picture("held", None)
    tl.end()
    assert tl.release_held() is None


def test_a_file_picture_without_pts_is_not_held() -> None:
    tl: Timeline[str] = Timeline(live=False, clock=Clock())
    out = session(tl, [None, 1], [1.0, 2.0])
    assert pts(out) == [None, 0.04]  # nothing to guess from before the first pts of the first pass


def test_a_file_loop_continues_the_pts_one_period_after_the_last_frame() -> None:
    tl: Timeline[str] = Timeline(live=False, clock=Clock())
    first = session(tl, [0, 1, 2], [1.0, 1.1, 1.2])
    second = session(tl, [0, 1, 2], [500.0, 500.1, 500.2])  # much later: a file has no outage to show
    assert pts(first + second) == [0.0, 0.04, 0.08, 0.12, 0.16, 0.2]
    assert tl.index == 6


def test_a_picture_without_pts_after_the_first_on_a_pass_is_guessed_one_period_on() -> None:
    tl: Timeline[str] = Timeline(live=False, clock=Clock())
    out = session(tl, [0, None, 2], [1.0, 1.1, 1.2])
    assert pts(out) == [0.0, 0.04, 0.08]


def test_a_reconnect_jumps_by_the_real_outage() -> None:
    tl: Timeline[str] = Timeline(live=True, clock=Clock())
    first = session(tl, [100, 101, 102], [10.0, 10.04, 10.08])  # pts 4.0 .. 4.08
    # 7.5 s without frames; the server's new session starts its own timeline anywhere
    second = session(tl, [9000, 9001], [17.58, 17.62])
    assert pts(first) == [4.0, 4.04, 4.08]
    assert pts(second) == [pytest.approx(4.08 + 7.5), pytest.approx(4.08 + 7.5 + P)]


def test_a_quick_reconnect_still_advances_by_at_least_one_period() -> None:
    tl: Timeline[str] = Timeline(live=True, clock=Clock())
    session(tl, [0, 1], [10.0, 10.04])
    second = session(tl, [0], [10.05])  # 10 ms after the last frame's packet
    assert pts(second) == [pytest.approx(0.04 + P)]


def test_b_frames_take_the_arrival_of_their_own_packet() -> None:
    """Decode order I0 P3 B1 B2, display order 0 1 2 3: each picture is matched to its packet by pts."""
    tl: Timeline[str] = Timeline(live=True, clock=Clock())
    ticks: list[int | None] = [0, 3, 1, 2]
    out = session(tl, ticks, [1.0, 2.0, 3.0, 4.0], order=[0, 2, 3, 1])
    assert [s.item for s in out] == ["pic0", "pic2", "pic3", "pic1"]
    assert pts(out) == [0.0, 0.04, 0.08, 0.12]
    assert [s.arrived for s in out] == [1.0, 3.0, 4.0, 2.0]


def test_arrivals_without_a_match_take_the_oldest_packet_without_pts_then_the_oldest() -> None:
    tl: Timeline[str] = Timeline(live=False, clock=Clock(77.0))
    tl.begin(25.0, TB)
    tl.packet(7, 1.0)
    tl.packet(None, 2.0)
    tl.packet(8, 3.0)
    assert tl.picture("a", None)[0].arrived == 2.0  # the packet without pts
    assert tl.picture("b", 99 * TB)[0].arrived == 1.0  # no packet has its pts: the oldest
    assert tl.picture("c", 8 * TB)[0].arrived == 3.0
    assert tl.picture("d", 9 * TB)[0].arrived == 77.0  # no packet left: now, by the given clock


def test_a_stamp_that_is_not_put_out_takes_no_index() -> None:
    tl: Timeline[str] = Timeline(live=False, clock=Clock())
    tl.begin(25.0, TB)
    tl.packet(0, 1.0)
    tl.picture("stopped before it was queued", 0.0)  # no commit: the stream stopped
    assert (tl.index, tl.last_pts, tl.last_arrival) == (0, None, None)


def test_resume_after_a_worker_restart_continues_indices_and_jumps_by_the_outage() -> None:
    clock = Clock(1000.0)
    tl: Timeline[str] = Timeline(live=True, clock=clock)
    tl.resume_at(500, 20.0, outage_s=3.0)  # the old process's last frame: 3 s ago
    out = session(tl, [42, 43], [1000.5, 1000.54])
    assert [tl.index - 2, tl.index] == [500, 502]
    assert pts(out) == [pytest.approx(20.0 + 3.5), pytest.approx(20.0 + 3.5 + P)]


def test_resume_without_pts_continues_the_indices_only() -> None:
    tl: Timeline[str] = Timeline(live=True, clock=Clock())
    tl.resume_at(7, None, outage_s=3.0)
    out = session(tl, [10], [1.0])
    assert tl.index == 8 and pts(out) == [0.4]  # the source's own timeline, as on a first session


def test_the_period_is_the_stated_rate_else_the_last_known_else_the_default() -> None:
    tl: Timeline[str] = Timeline(live=False, clock=Clock())
    tl.begin(None, TB)
    assert tl.period == DEFAULT_PERIOD_S
    tl.begin(10.0, TB)
    assert tl.period == pytest.approx(0.1)
    tl.begin(None, TB)
    assert tl.period == pytest.approx(0.1)
