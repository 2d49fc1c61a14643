"""Positions saved in etcd: a clean hand-over continues exactly; after a node died the successor skips past
whatever the dead node may have written since its last save."""

from __future__ import annotations

import math

from streamd.cluster.resume import SLACK_S, Position, RateMeter, continue_from
from streamd.protocol import Resume


def test_final_position_continues_exactly() -> None:
    pos = Position(Resume(161, 16.1, 1000.0), 10.0, "a", final=True)
    assert continue_from(pos, now=1013.0) == Resume(161, 16.1, 1000.0)


def test_after_a_death_the_successor_skips_the_unsaved_stretch() -> None:
    # saved at t=1000 at frame 400 (pts 40.0), 10 fps; the node died, the successor starts at t=1004
    pos = Position(Resume(400, 40.0, 1000.0), 10.0, "b", final=False)
    r = continue_from(pos, now=1004.0)
    # the dead node could have written frames up to t=1004 at 10 fps (plus the pacer's 1 s catch-up)
    assert r.index == 400 + math.ceil((4.0 + SLACK_S) * 10) == 450
    assert r.pts == 40.0 + 4.0 + SLACK_S and r.wall_time == 1004.0


def test_json_round_trip_and_garbage() -> None:
    pos = Position(Resume(5, None, 12.5), 2.5, "n", final=False)
    assert Position.from_json(pos.to_json()) == pos
    assert Position.from_json("not json") is None and Position.from_json('{"index": "x"}') is None


def test_rate_is_frames_per_second_of_real_time() -> None:
    meter = RateMeter()
    assert meter.update("s", Resume(0, 0.0, 100.0)) == 0.0
    assert meter.update("s", Resume(10, 1.0, 101.0)) == 10.0
    assert abs(meter.update("s", Resume(30, 3.0, 102.0)) - (0.7 * 10 + 0.3 * 20)) < 1e-9
